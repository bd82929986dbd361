"""What a LaTeX reader of a completion never sees, removed before an answer is looked for (``visible.py``).

- **Conditionals' dead branches.** ``\\iftrue A \\else B \\fi`` shows A, ``\\iffalse A \\else B \\fi`` B
  (``\\unless`` swaps them); a conditional whose test the kit does not evaluate (``\\ifnum``, ``\\ifx``,
  ``\\ifcase``, ...) shows neither branch to the grader, and a conditional macro
  (``\\ifthenelse{..}{..}{..}``, any ``\\If...``/``\\if...`` command that is not a TeX primitive;
  ``\\iff`` is the symbol) loses its braced arguments. An unclosed conditional runs to the end of the text.
- **After the end.** Nothing after ``\\end{document}`` (or ``\\enddocument``, ``\\bye``, ``\\endinput``,
  ``\\stop``) is typeset.
- **Groups a reader cannot see** (one scan, :func:`without_hidden_groups`): text whose colour has too little
  contrast with its background (``colours.readable``: ``\\color`` declarations to the end of their group,
  ``\\textcolor``, ``\\colorbox``/``\\fcolorbox`` backgrounds, ``\\pagecolor``, ``\\transparent``, colours
  ``\\definecolor``-d in the text, every xcolor spelling; a colour that cannot be read counts as unseen),
  text scaled or sized below ``MIN_SIZE_PT`` (``\\scalebox{0}``, ``\\resizebox{0pt}{!}``, ``\\fontsize{0}``),
  invisible or unrendered boxes (``\\phantom`` and its kin, beamer's ``\\invisible``, ``\\sbox``/``\\savebox``
  /``lrbox``, ``\\label``, ``\\typeout``, ...), a box raised or a space larger than a page (``\\raisebox``,
  ``\\hspace``, ``\\kern``, ...: the rest of the text is off the page) and MathJax's ``\\style`` with a CSS
  that hides (``hidden_html.css_state``).
- **Definitions.** A completion that defines or redefines a command (``\\def``, ``\\newcommand``,
  ``\\renewcommand``, ``\\let``, ``\\catcode``, ``\\csname``, ...) can make anything render as anything
  (``\\renewcommand{\\boxed}[1]{8}``): :func:`redefines` finds one, and the completion has no answer.

Every step moves forward through the text once (parameters are read within ``PARAMETER_CHARS``; one not closed
there hides the rest), so the cost stays linear.
"""

from __future__ import annotations

import re

from sage_unsloth.grading.colours import BLACK, MIN_SIZE_PT, RGB, Look, latex_colour
from sage_unsloth.grading.hidden_html import css_state

OFF_PAGE_PT = 600.0  # a shift larger than a page's text block puts what follows off the page
MAX_OPEN = 256  # a closer is matched among this many open groups (else it is text): stays linear
PARAMETER_CHARS = 256  # a colour, a scale or a dimension is short; one not closed within this hides the rest

# ----------------------------------------------------------------------------------------------- the end
_END = re.compile(r"\\end\s*\{document\}|\\(?:enddocument|bye|endinput|stop)(?![A-Za-z@])")


def before_end_of_document(text: str) -> str:
    """``text`` up to its ``\\end{document}`` (or another command that ends typesetting)."""
    end = _END.search(text)
    return text if end is None else text[: end.start()]


# ----------------------------------------------------------------------------------------------- definitions
_DEFINITION = re.compile(
    r"\\(?:[egx]?def|let|futurelet|(?:new|renew|provide)command|DeclareRobustCommand|(?:new|renew)environment"
    r"|(?:New|Renew|Provide|Declare)(?:Expandable)?Document(?:Command|Environment)|newif|catcode|mathcode"
    r"|csname|expandafter|setbox|write|immediate|aftergroup|afterassignment|everypar|everymath)(?![A-Za-z@])"
)


def redefines(text: str) -> bool:
    """Whether ``text`` defines or redefines a command (see the module docstring)."""
    return _DEFINITION.search(text) is not None


# ----------------------------------------------------------------------------------------------- conditionals
_PRIMITIVE_IFS = (
    "true|false|num|dim|odd|vmode|hmode|mmode|inner|void|hbox|vbox|x|eof|case|cat|defined|csname|fontchar"
)
_CONDITIONAL = re.compile(
    rf"(?P<unless>\\unless\s*)?\\if(?P<test>{_PRIMITIVE_IFS})?(?![A-Za-z@])"
    r"|\\(?P<word>else|or|fi)(?![A-Za-z@])"
    r"|(?P<macro>\\(?!iff(?![A-Za-z@]))[Ii]f[A-Za-z@]+)"
)


def live_branches(text: str) -> str:
    """``text`` with only the branches of its conditionals that TeX would typeset (module docstring)."""
    if "\\if" not in text and "\\If" not in text:
        return text
    kept, position = [], 0
    stack: list[list] = []  # per open conditional: [its test (True, False, None: not evaluated), in \else]
    dead = 0  # how many open conditionals are in a branch that is not typeset

    def typeset(entry: list) -> bool:
        return entry[0] is not None and entry[0] != entry[1]

    while (match := _CONDITIONAL.search(text, position)) is not None:
        if dead == 0:
            kept.append(text[position : match.start()])
        position, word = match.end(), match.group("word")
        if match.group("macro"):  # \ifthenelse{test}{a}{b}: neither branch is read
            position = _after_braced_arguments(text, position)
        elif word is None:
            test = {"true": True, "false": False}.get(match.group("test") or "")
            if test is not None and match.group("unless"):
                test = not test
            stack.append([test, False])
            dead += not typeset(stack[-1])
        elif stack and word in ("else", "or"):
            before = typeset(stack[-1])
            stack[-1] = [stack[-1][0] if word == "else" else None, True]
            dead += before - typeset(stack[-1])
        elif stack and word == "fi":
            dead -= not typeset(stack.pop())
    if dead == 0:
        kept.append(text[position:])
    return "".join(kept)


def _after_braced_arguments(text: str, position: int) -> int:
    """The position after the braced arguments that follow ``position`` (spaces between them skipped); the end
    of the text when one is not closed."""
    while True:
        start = position
        while start < len(text) and text[start] in " \t\n":
            start += 1
        if start >= len(text) or text[start] != "{":
            return position
        end = _closing(text, start, "{", "}", len(text))
        if end is None:
            return len(text)
        position = end


def _closing(text: str, start: int, opener: str, closer: str, limit: int) -> int | None:
    """Position after the ``closer`` that balances ``text[start] == opener`` (escaped characters skipped), or
    None when it is not within ``limit`` characters."""
    depth, i, stop = 0, start, min(len(text), start + limit)
    while i < stop:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == opener:
            depth += 1
        elif ch == closer:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


# ----------------------------------------------------------------------------------------------- groups
_REST_HIDDEN = object()  # an effect's answer: what follows is off the page, or a parameter is not closed
_UNITS_PT = {
    "pt": 1.0, "bp": 1.00375, "mm": 2.84528, "cm": 28.4528, "in": 72.27, "pc": 12.0, "dd": 1.07, "cc": 12.84,
    "sp": 1 / 65536, "em": 10.0, "ex": 4.3, "mu": 10.0 / 18, "px": 1.0,
}  # fmt: skip
_LENGTHS_PT = {"textwidth": 345.0, "linewidth": 345.0, "columnwidth": 345.0, "hsize": 345.0,
               "paperwidth": 614.0, "textheight": 550.0, "paperheight": 795.0, "vsize": 550.0,
               "baselineskip": 12.0, "parindent": 15.0, "fill": 0.0, "hfill": 0.0, "vfill": 0.0,
               "thinmuskip": 10.0 / 6, "medmuskip": 20.0 / 9, "thickmuskip": 25.0 / 9,
               "stretch": 0.0}  # fmt: skip
_DIMENSION = re.compile(
    r"\s*=?\s*([-+]?\s*(?:\d+\.?\d*|\.\d+)?)\s*(?:(true\s*)?(pt|bp|mm|cm|in|pc|dd|cc|sp|em|ex|mu|px)"
    r"|\\([A-Za-z]+))(?:\s*(?:plus|minus)\s*[-+]?[\d.]*\s*(?:fil+|[a-z]{2}))*\s*"
)


def dimension_pt(text: str) -> float | None:
    """A TeX dimension in points (``0pt``, ``-2cm``, ``.5\\linewidth``); None when it cannot be read; ``!`` is
    0 (``\\resizebox``'s "keep the ratio" is decided by its caller)."""
    match = _DIMENSION.fullmatch(text)
    if not match:
        return None
    number = match.group(1).replace(" ", "")
    factor = float(number) if number not in ("", "+", "-") else (-1.0 if number == "-" else 1.0)
    if match.group(3):
        return factor * _UNITS_PT[match.group(3)] if number not in ("", "+", "-") else None
    length = _LENGTHS_PT.get(match.group(4))
    return None if length is None else factor * length


def _colour(args, defined):
    model, spec = args[-2], args[-1]
    return latex_colour(spec, model, defined)


def _number(text: str | None) -> float | None:
    try:
        return float(text.strip()) if text is not None else None
    except ValueError:
        return None


def _fg(frame, args, defined):
    return frame.becomes(fg=_colour(args, defined))


def _bg(frame, args, defined):
    colour = _colour(args, defined)
    return frame.becomes(bg=colour) if colour is not None else frame.becomes(hidden=True)


def _fbg(frame, args, defined):
    colour = latex_colour(args[3], args[2] or args[0], defined)
    return frame.becomes(bg=colour) if colour is not None else frame.becomes(hidden=True)


def _opacity(frame, args, defined):
    value = _number(args[0])
    return frame.becomes(opacity=value) if value is not None else frame.becomes(hidden=True)


def _font_size(frame, args, defined):
    size = dimension_pt(args[0])
    size = _number(args[0]) if size is None else size
    return frame.becomes(size=size if size is not None else 0.0)


def _scale(frame, args, defined):
    factors = [_number(a) for a in args if a is not None]
    if any(f is None for f in factors):
        return frame.becomes(hidden=True)
    return frame.becomes(size=frame.size * min(abs(f) for f in factors))


def _resize(frame, args, defined):
    sizes = [dimension_pt(a.strip()) for a in args if a.strip() != "!"]  # "!": keep the aspect ratio
    return frame.becomes(hidden=not sizes or any(s is None or abs(s) < MIN_SIZE_PT for s in sizes))


def _hide(frame, args, defined):
    return frame.becomes(hidden=True)


def _raise(frame, args, defined):
    shift = dimension_pt(args[0].strip())
    return frame.becomes(hidden=shift is None or abs(shift) > OFF_PAGE_PT)


def _space(frame, args, defined):
    length = dimension_pt(args[0].strip()) if args[0] is not None else None
    return _REST_HIDDEN if length is None or abs(length) > OFF_PAGE_PT else frame


def _normal_colour(frame, args, defined):
    return frame.becomes(fg=BLACK)


def _style(frame, args, defined):
    return css_state(args[0], frame)


# name -> (parameters, effect). Parameters: o an optional [...], a a beamer <...>, m a mandatory {...} or one
# token, d a bare TeX dimension (\kern-5pt), and last c the content the effect applies to; without c the
# effect is a declaration, which lasts to the end of the group.
_COMMANDS = {
    "color": ("om", _fg), "textcolor": ("omc", _fg), "mathcolor": ("omc", _fg),
    "colorbox": ("omc", _bg), "fcolorbox": ("omomc", _fbg), "normalcolor": ("", _normal_colour),
    "transparent": ("m", _opacity), "texttransparent": ("mc", _opacity), "fontsize": ("mm", _font_size),
    "scalebox": ("moc", _scale), "resizebox": ("mmc", _resize), "raisebox": ("mooc", _raise),
    "phantom": ("c", _hide), "hphantom": ("c", _hide), "vphantom": ("c", _hide), "invisible": ("ac", _hide),
    "sbox": ("mc", _hide), "savebox": ("mooc", _hide), "label": ("c", _hide), "index": ("c", _hide),
    "typeout": ("c", _hide), "message": ("c", _hide), "nocite": ("c", _hide), "ref": ("c", _hide),
    "eqref": ("c", _hide), "pageref": ("c", _hide), "class": ("mc", _hide), "cssId": ("mc", _hide),
    "style": ("mc", _style), "hspace": ("m", _space), "vspace": ("m", _space), "kern": ("d", _space),
    "hskip": ("d", _space), "vskip": ("d", _space), "mkern": ("d", _space), "mskip": ("d", _space),
    "mspace": ("m", _space), "moveleft": ("d", _space), "moveright": ("d", _space), "raise": ("d", _space),
    "lower": ("d", _space),
}  # fmt: skip
_DEFINE_COLOUR = {"definecolor": "ommm", "colorlet": "omom"}
_HIDING_ENVIRONMENTS = frozenset(["lrbox"])
_TRIGGER = re.compile(
    r"\\(?:" + "|".join(_COMMANDS) + r"|pagecolor|definecolor|colorlet|begin\s*\{lrbox\})(?![A-Za-z@])"
)
_TOKEN = re.compile(
    r"\\(?:begin|end)\s*\{([^{}]{0,64})\}|\\([A-Za-z@]+)\*?|\\[()\[\]]|\\.|[{}]|\$\$?", re.DOTALL
)
_MATH_CLOSERS = {"$": "$", "$$": "$$", "\\(": "\\)", "\\[": "\\]"}


def without_hidden_groups(text: str) -> str:
    """``text`` without what its colours, sizes, boxes and shifts hide (module docstring)."""
    if not _TRIGGER.search(text):
        return text
    scan = _Scan(text)
    return scan.run()


class _Scan:
    """One pass over the text with a stack of groups; text is kept where the innermost group is shown."""

    def __init__(self, text: str):
        self.text = text
        self.stack = [Look()]
        self.defined: dict[str, RGB] = {}
        self.kept: list[str] = []
        self.opened: list[int] = []  # per open group (self.stack[1:]): len(self.kept) when it opened

    @property
    def top(self) -> Look:
        return self.stack[-1]

    def run(self) -> str:
        text, position = self.text, 0
        while (match := _TOKEN.search(text, position)) is not None:
            if self.top.shown:
                self.kept.append(text[position : match.start()])
            position = self.token(match)
            if position is None:
                return "".join(self.kept)
        if self.top.shown:
            self.kept.append(text[position:])
        return "".join(self.kept)

    def token(self, match: re.Match) -> int | None:
        """Handle one token; the position to go on from (None: the rest is hidden)."""
        token, shown = match.group(0), self.top.shown
        if token == "{":
            self.open(self.top.becomes(closer="}", kept_open=shown), token)
        elif token == "}" or token in ("\\)", "\\]"):
            self.close(token, token)
        elif token in ("$", "$$"):
            if self.top.closer == token:
                self.close(token, token)
            else:
                self.open(self.top.becomes(closer=token, kept_open=shown), token)
        elif token in _MATH_CLOSERS:
            self.open(self.top.becomes(closer=_MATH_CLOSERS[token], kept_open=shown), token)
        elif token.startswith("\\begin"):
            name = match.group(1).strip()
            frame = self.top.becomes(hidden=self.top.hidden or name in _HIDING_ENVIRONMENTS)
            self.open(frame.becomes(closer=f"end:{name}", kept_open=shown and frame.shown), token)
        elif token.startswith("\\end") and match.group(1) is not None:
            self.close(f"end:{match.group(1).strip()}", token)
        elif match.group(2) is not None:
            return self.command(match)
        elif shown:
            self.kept.append(token)
        return match.end()

    def open(self, frame: Look, token: str) -> None:
        self.stack.append(frame)
        self.opened.append(len(self.kept))
        if frame.kept_open:
            self.kept.append(token)

    def close(self, closer: str, token: str) -> None:
        """Pop the innermost group closed by ``closer`` (and any left open inside it; looked for among the
        last ``MAX_OPEN``); keep ``token`` with its opener. A closer without a group is text. Math left
        empty (its content hidden) goes with its delimiters: a bare "$$" would open display math."""
        for depth in range(len(self.stack) - 1, max(0, len(self.stack) - 1 - MAX_OPEN), -1):
            if self.stack[depth].closer == closer:
                frame, opened = self.stack[depth], self.opened[depth - 1]
                del self.stack[depth:], self.opened[depth - 1 :]
                if frame.kept_open and closer in ("$", "$$") and not "".join(self.kept[opened + 1 :]).strip():
                    del self.kept[opened + 1 :]
                    self.kept[opened] = " "
                elif frame.kept_open:
                    self.kept.append(token)
                return
        if self.top.shown:
            self.kept.append(token)

    def command(self, match: re.Match) -> int | None:
        name, outer = match.group(2), self.top
        if name == "pagecolor" or name in _DEFINE_COLOUR:
            return self.colour_definition(match, name)
        if name not in _COMMANDS:
            if outer.shown:
                self.kept.append(match.group(0))
            return match.end()
        spec, effect = _COMMANDS[name]
        parsed = _parameters(self.text, match.end(), spec.rstrip("c"))
        if parsed is None:
            return None
        args, position = parsed
        state = effect(outer, args, self.defined)
        if state is _REST_HIDDEN:
            return None
        if not spec.endswith("c"):  # a declaration (its markup shows nothing): the rest of this group
            self.stack[-1] = state
            return position
        return self.content(match.start(), position, outer, state)

    def content(self, start: int, position: int, outer: Look, state: Look) -> int:
        """The content argument at ``position`` of the command at ``start``, shown as ``state``."""
        keep = outer.shown and state.shown
        while position < len(self.text) and self.text[position] in " \t\n":
            position += 1
        if keep:
            self.kept.append(self.text[start:position])
        if position < len(self.text) and self.text[position] == "{":
            self.open(state.becomes(closer="}", kept_open=keep), "{")
            return position + 1
        single = _ONE_TOKEN.match(self.text, position)
        end = single.end() if single else position
        if keep:
            self.kept.append(self.text[position:end])
        return end

    def colour_definition(self, match: re.Match, name: str) -> int | None:
        spec = "om" if name == "pagecolor" else _DEFINE_COLOUR[name]
        parsed = _parameters(self.text, match.end(), spec)
        if parsed is None:
            return None
        args, position = parsed
        if name == "pagecolor":
            colour = latex_colour(args[1], args[0], self.defined)
            self.stack = [f.becomes(bg=colour) if colour else f.becomes(hidden=True) for f in self.stack]
        elif name == "definecolor":
            self.defined[args[1].strip()] = latex_colour(args[3], args[2], self.defined)
        else:  # \colorlet{name}[model]{expression}: the model is a conversion, the colour the expression's
            self.defined[args[1].strip()] = latex_colour(args[3], None, self.defined)
        if self.top.shown:
            self.kept.append(self.text[match.start() : position])
        return position


_ONE_TOKEN = re.compile(r"\\[A-Za-z@]+|\\.|.", re.DOTALL)
_SINGLE = re.compile(r"\s*(\\[A-Za-z@]+|[^\s{}])")


def _parameters(text: str, position: int, spec: str) -> tuple[list, int] | None:
    """The parameters ``spec`` names, read from ``position``: (values, the position after them); None when one
    is not closed within ``PARAMETER_CHARS`` (the rest of the text is then hidden)."""
    values: list = []
    for kind in spec:
        start = position
        while start < len(text) and text[start] in " \t\n":
            start += 1
        brackets = {"o": ("[", "]"), "a": ("<", ">"), "m": ("{", "}")}.get(kind)
        if kind == "d":
            found = _DIMENSION.match(text, position)
            values.append(found.group(0) if found else None)
            position = found.end() if found else position
        elif brackets and start < len(text) and text[start] == brackets[0]:
            end = _closing(text, start, *brackets, PARAMETER_CHARS)
            if end is None:
                return None
            values.append(text[start + 1 : end - 1])
            position = end
        elif kind == "m":
            single = _SINGLE.match(text, position)
            if single is None:
                return None
            values.append(single.group(1))
            position = single.end()
        else:  # an optional parameter left out
            values.append(None)
    return values, position
