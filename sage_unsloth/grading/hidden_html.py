"""What a reader of a completion rendered as HTML (Markdown's inline HTML) never sees, removed before an
answer is looked for (``visible.py``).

- Elements whose content is never shown: ``script``, ``style``, ``template``, ``head``, ``title``,
  ``noscript``, embedded content's fallback (``iframe``, ``object``, ``video``, ``audio``, ``canvas``,
  ``svg``), ``select``, ``datalist``, ``rp``; a ``dialog`` or a ``details`` without ``open`` (a closed
  ``details`` shows its ``summary``); an element with the ``hidden`` attribute.
- An element whose style hides it (:func:`css_state`): ``display: none``, ``visibility: hidden``, a small
  ``opacity``, a colour on its background that cannot be read (``colours.readable``, ``color``,
  ``background``, ``<font color>``), a font size below ``colours.MIN_SIZE_PT``, a zero width or height, a
  shift off the page, and any property the kit does not know to be harmless (``transform``, ``clip-path``,
  ``position: absolute``, ``direction``, ...). A ``class`` may name a style sheet's rule (``sr-only``,
  ``hidden``): an element with one is not read.
- Attributes are never text: a visible element is kept as its bare tag (``<span title="\\boxed{8}">`` becomes
  ``<span>``).

An unclosed hidden element hides the rest of the text, as a browser does. A completion with a ``<style>`` or a
``<script>`` element can restyle anything (:func:`restyles`): it has no answer. Tags that are not HTML
(``<SOLUTION>``, ``a<b>c``) are text. One forward scan: linear in the text.
"""

from __future__ import annotations

import re

from sage_unsloth.grading.colours import BODY_PT, Look, blend, css_colour


def _words(text: str) -> list[str]:
    return text.split()


_TAGS = frozenset(
    _words(
        """a abbr acronym address area article aside audio b base bdi bdo big blink blockquote body br
        button canvas caption center cite code col colgroup data datalist dd del details dfn dialog dir div
        dl dt em embed fieldset figcaption figure font footer form frame frameset h1 h2 h3 h4 h5 h6 head
        header hgroup hr html i iframe img input ins kbd label legend li link main map mark marquee math menu
        meta meter nav nobr noframes noscript object ol optgroup option output p param picture pre progress q
        rp rt ruby s samp script search section select slot small source span strike strong style sub summary
        sup svg table tbody td template textarea tfoot th thead time title tr track tt u ul var video wbr"""
    )
)
_VOID = frozenset(_words("area base br col embed hr img input link meta param source track wbr"))
_NEVER_SHOWN = frozenset(
    _words(
        "script style template head title noscript iframe object video audio canvas svg select datalist rp"
    )
)
# A tag with its attributes; a quoted value may hold "<" and ">" (bounded, so a stray quote costs little).
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]*)((?:\s(?:[^<>\"']|\"[^\"]{0,1024}\"|'[^']{0,1024}')*+)?)>")
_TAG_NAME = re.compile(r"</?([A-Za-z][A-Za-z0-9]*)(?=[\s/>])")
_RESTYLE = re.compile(r"<(?:style|script)(?=[\s/>])", re.IGNORECASE)
_ATTRIBUTE = re.compile(r"([A-Za-z_:][-\w:.]*)(?:\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s\"'=<>`]+))?")
MAX_OPEN = 256  # a closing tag is matched among this many open elements (else it is ignored): stays linear


def restyles(text: str) -> bool:
    """Whether ``text`` holds a ``<style>`` or ``<script>`` element (module docstring)."""
    return _RESTYLE.search(text) is not None


def without_hidden_elements(text: str) -> str:
    """``text`` without the content of its hidden HTML elements and without attributes (module docstring)."""
    if "<" not in text or not any(m.group(1).lower() in _TAGS for m in _TAG_NAME.finditer(text)):
        return text
    stack, kept, position = [Look()], [], 0
    for match in _TAG.finditer(text):
        name = match.group(2).lower()
        if name not in _TAGS:
            continue
        top = stack[-1]
        if top.shown:
            kept.append(text[position : match.start()])
        position = match.end()
        if match.group(1):  # a closing tag
            for depth in range(len(stack) - 1, max(0, len(stack) - 1 - MAX_OPEN), -1):
                if stack[depth].closer == name:
                    if stack[depth].kept_open:
                        kept.append(f"</{name}>")
                    del stack[depth:]
                    break
            continue
        look = element_look(name, match.group(3), top)
        keep = top.shown and look.shown
        if keep:
            kept.append(f"<{name}>")
        if name not in _VOID and not match.group(3).rstrip().endswith("/"):
            stack.append(look.becomes(closer=name, kept_open=keep))
    if stack[-1].shown:
        kept.append(text[position:])
    return "".join(kept)


def element_look(name: str, attributes: str, parent: Look) -> Look:
    """How an element ``<name attributes>`` inside ``parent`` looks."""
    if name == "summary" and parent.closer == "details" and parent.summary is not None:
        parent = parent.summary
    values = {key.lower(): (value or "").strip("\"'") for key, value in _ATTRIBUTE.findall(attributes)}
    if name in _NEVER_SHOWN or "hidden" in values or "class" in values:
        return parent.becomes(hidden=True)
    if name == "dialog" and "open" not in values:
        return parent.becomes(hidden=True)
    look = parent
    if "color" in values:  # <font color=...>
        look = _with_colour(look, values["color"], text=True)
    if "bgcolor" in values:
        look = _with_colour(look, values["bgcolor"], text=False)
    if "style" in values:
        look = css_state(values["style"], look)
    if name == "details" and "open" not in values:
        return look.becomes(hidden=True, summary=look)
    return look


# ----------------------------------------------------------------------------------------------- CSS
_HARMLESS = re.compile(
    r"(?:font-(?:weight|style|family|variant|stretch)|text-(?:decoration|align|transform|overflow|shadow)"
    r"|vertical-align|border|outline|padding|list-style|cursor|white-space|word-(?:break|wrap)"
    r"|overflow(?:-[xy]|-wrap)?|box-(?:shadow|sizing)|float|clear|display|line-height|tab-size|hyphens"
    r"|user-select|pointer-events|transition|animation|quotes|caret-color|accent-color|font-feature-settings)"
    r"(?:-[a-z-]+)?"
)
_LENGTH = re.compile(r"([-+]?(?:\d+\.?\d*|\.\d+))\s*(px|pt|pc|em|rem|ex|ch|%|vw|vh|vmin|vmax|cm|mm|in|q)?")
_PX = {"px": 1.0, "pt": 4 / 3, "pc": 16.0, "em": 16.0, "rem": 16.0, "ex": 8.0, "ch": 8.0, "vw": 12.8,
       "vh": 8.0, "vmin": 8.0, "vmax": 12.8, "cm": 37.8, "mm": 3.78, "in": 96.0, "q": 0.945, "%": 0.16,
       None: 1.0}  # fmt: skip
OFF_PAGE_PX = 800.0  # a shift larger than a screen's width puts the text out of sight
MIN_BOX_PX = 6.0  # a box narrower or lower than this shows no character


def css_state(style: str, look: Look) -> Look:
    """``look`` under the CSS declarations of ``style`` (a ``style`` attribute, MathJax's ``\\style``)."""
    for declaration in style.split(";"):
        if ":" not in declaration:
            continue
        prop, value = (part.strip().lower() for part in declaration.split(":", 1))
        value = value.replace("!important", "").strip()
        look = _declaration(prop, value, look)
        if look.hidden:
            return look
    return look


def _declaration(prop: str, value: str, look: Look) -> Look:
    lengths = [float(n) * _PX[unit or None] for n, unit in _LENGTH.findall(value)]
    if prop == "display":
        return look.becomes(hidden=value == "none")
    if prop in ("visibility", "content-visibility"):
        return look.becomes(hidden=value in ("hidden", "collapse"))
    if prop == "opacity":
        found = _LENGTH.fullmatch(value)
        share = float(found.group(1)) / (100 if found.group(2) == "%" else 1) if found else None
        return look.becomes(opacity=look.opacity * share) if share is not None else look.becomes(hidden=True)
    if prop in ("color", "-webkit-text-fill-color"):
        return _with_colour(look, value, text=True)
    if prop in ("background", "background-color"):
        return _with_background(look, value)
    if prop in ("font-size", "font"):
        return _with_font_size(look, value, prop == "font")
    if prop in ("transform", "clip", "clip-path", "mask", "filter", "backdrop-filter", "translate", "scale"):
        return look.becomes(hidden=value not in ("none", "auto", "initial", "unset"))
    if prop == "position":
        return look.becomes(hidden=value not in ("static", "relative", "sticky", "initial", "unset"))
    if prop == "z-index":
        return look.becomes(hidden=value.startswith("-"))
    if prop in ("width", "height", "max-width", "max-height"):
        return look.becomes(hidden=any(abs(n) < MIN_BOX_PX for n in lengths))
    if re.fullmatch(r"(?:margin|top|left|right|bottom|inset|text-indent)(?:-[a-z-]+)?", prop):
        return look.becomes(hidden=any(abs(n) > OFF_PAGE_PX for n in lengths))
    if prop in ("letter-spacing", "word-spacing"):
        return look.becomes(hidden=any(abs(n) > 50 for n in lengths))
    if prop == "min-width" or prop == "min-height" or _HARMLESS.fullmatch(prop):
        return look
    return look.becomes(hidden=True)  # a property the kit does not know to be harmless


_INHERIT = ("inherit", "currentcolor", "initial", "unset", "revert", "")


def _with_colour(look: Look, value: str, *, text: bool) -> Look:
    if value in _INHERIT:
        return look
    colour = css_colour(value)
    if colour is None:
        return look.becomes(fg=None) if text else look.becomes(hidden=True)
    rgb, alpha = colour
    if text:
        return look.becomes(fg=rgb, opacity=look.opacity * alpha)
    return look.becomes(bg=blend(rgb, look.bg, alpha) if look.bg is not None else None)


def _with_background(look: Look, value: str) -> Look:
    if "url(" in value or "gradient(" in value or "image(" in value:
        return look.becomes(hidden=True)  # an image may cover the text
    compact = re.sub(r"\(\s*([^()]*?)\s*\)", lambda m: "(" + re.sub(r"\s+", "", m.group(1)) + ")", value)
    for token in reversed(compact.split()):
        if css_colour(token) is not None:
            return _with_colour(look, token, text=False)
    return look


def _with_font_size(look: Look, value: str, shorthand: bool) -> Look:
    keywords = ("xx-small", "x-small", "small", "medium", "large", "x-large", "xx-large", "xxx-large")
    if value in keywords or value in ("smaller", "larger", *_INHERIT):
        return look
    tokens = value.replace("/", " ").split() if shorthand else [value]
    for token in tokens:
        found = _LENGTH.fullmatch(token)
        if found and (found.group(2) or not shorthand):
            number, unit = float(found.group(1)), found.group(2)
            if unit in ("em", "%"):
                return look.becomes(size=look.size * number / (100 if unit == "%" else 1))
            return look.becomes(size=number * _PX[unit] * BODY_PT / 16)
        if shorthand and token in keywords:
            return look
    return look if shorthand else look.becomes(hidden=True)
