"""Colours as a reader sees them: a LaTeX (xcolor) or CSS colour read to RGB, and whether text in one colour
can be read on a background of another.

Readable means a WCAG contrast ratio of at least ``MIN_CONTRAST`` (1.3:1) between the text, blended with the
background by its opacity, and the background: on a white page white, yellow, a 10% tint of black
(``black!10``) and cyan text are hidden (1.0, 1.07, 1.25, 1.25); green (CSS ``lime``) and a 20% tint of black
are read (1.37, 1.6). A colour that
cannot be read (an unknown name, a model the kit does not know, a malformed value) is ``None``, which is never
readable: text whose colour cannot be established is not graded.

LaTeX: the xcolor base names, dvipsnames and svgnames (every name case-insensitively), colours defined in the
text itself (``\\definecolor``, ``\\colorlet``: the caller's ``defined``), mixes (``red!30``, ``red!30!blue``,
``-red``) and the models ``rgb``, ``RGB``, ``HTML``, ``gray``, ``Gray``, ``cmyk``, ``cmy``, ``hsb``, ``Hsb``,
``HSB``. CSS: the 148 named colours, ``#rgb[a]``, ``#rrggbb[aa]``, ``rgb[a]()``, ``hsl[a]()``,
``transparent``.
"""

from __future__ import annotations

import colorsys
import re
from dataclasses import dataclass, replace

RGB = tuple[float, float, float]
WHITE: RGB = (1.0, 1.0, 1.0)
BLACK: RGB = (0.0, 0.0, 0.0)
MIN_CONTRAST = 1.3
BODY_PT = 10.0  # the size of body text (16 px in HTML), which scaling and font sizes change
MIN_SIZE_PT = 4.0  # text smaller than this is not read

_XCOLOR_BASE = {
    "red": (1, 0, 0), "green": (0, 1, 0), "blue": (0, 0, 1), "brown": (0.75, 0.5, 0.25), "lime": (0.75, 1, 0),
    "orange": (1, 0.5, 0), "pink": (1, 0.75, 0.75), "purple": (0.75, 0, 0.25), "teal": (0, 0.5, 0.5),
    "violet": (0.5, 0, 0.5), "cyan": (0, 1, 1), "magenta": (1, 0, 1), "yellow": (1, 1, 0),
    "olive": (0.5, 0.5, 0), "black": (0, 0, 0), "darkgray": (0.25, 0.25, 0.25), "gray": (0.5, 0.5, 0.5),
    "lightgray": (0.75, 0.75, 0.75), "white": (1, 1, 1),
}  # fmt: skip
# dvipsnames (xcolor's dvipsnam.def), CMYK in per cent.
_DVIPS_CMYK = """
Apricot:0,32,52,0 Aquamarine:82,0,30,0 Bittersweet:0,75,100,24 Black:0,0,0,100 Blue:100,100,0,0
BlueGreen:85,0,33,0 BlueViolet:86,91,0,4 BrickRed:0,89,94,28 Brown:0,81,100,60 BurntOrange:0,51,100,0
CadetBlue:62,57,23,0 CarnationPink:0,63,0,0 Cerulean:94,11,0,0 CornflowerBlue:65,13,0,0 Cyan:100,0,0,0
Dandelion:0,29,84,0 DarkOrchid:40,80,20,0 Emerald:100,0,50,0 ForestGreen:91,0,88,12 Fuchsia:47,91,0,8
Goldenrod:0,10,84,0 Gray:0,0,0,50 Green:100,0,100,0 GreenYellow:15,0,69,0 JungleGreen:99,0,52,0
Lavender:0,48,0,0 LimeGreen:50,0,100,0 Magenta:0,100,0,0 Mahogany:0,85,87,35 Maroon:0,87,68,32
Melon:0,46,50,0 MidnightBlue:98,13,0,43 Mulberry:34,90,0,2 NavyBlue:94,54,0,0 OliveGreen:64,0,95,40
Orange:0,61,87,0 OrangeRed:0,100,50,0 Orchid:32,64,0,0 Peach:0,50,70,0 Periwinkle:57,55,0,0
PineGreen:92,0,59,25 Plum:50,100,0,0 ProcessBlue:96,0,0,0 Purple:45,86,0,0 RawSienna:0,72,100,45
Red:0,100,100,0 RedOrange:0,77,87,0 RedViolet:7,90,0,34 Rhodamine:0,82,0,0 RoyalBlue:100,50,0,0
RoyalPurple:75,90,0,0 RubineRed:0,100,13,0 Salmon:0,53,38,0 SeaGreen:69,0,50,0 Sepia:0,83,100,70
SkyBlue:62,0,12,0 SpringGreen:26,0,76,0 Tan:14,42,56,0 TealBlue:86,0,34,2 Thistle:12,59,0,0
Turquoise:85,0,20,0 Violet:79,88,0,0 VioletRed:0,81,0,0 White:0,0,0,0 WildStrawberry:0,96,39,0
Yellow:0,0,100,0 YellowGreen:44,0,74,0 YellowOrange:0,42,100,0
"""
# The CSS named colours (also xcolor's svgnames, whose names are these capitalised).
_CSS_HEX = """
aliceblue:f0f8ff antiquewhite:faebd7 aqua:00ffff aquamarine:7fffd4 azure:f0ffff beige:f5f5dc
bisque:ffe4c4 black:000000 blanchedalmond:ffebcd blue:0000ff blueviolet:8a2be2 brown:a52a2a
burlywood:deb887 cadetblue:5f9ea0 chartreuse:7fff00 chocolate:d2691e coral:ff7f50
cornflowerblue:6495ed cornsilk:fff8dc crimson:dc143c cyan:00ffff darkblue:00008b darkcyan:008b8b
darkgoldenrod:b8860b darkgray:a9a9a9 darkgreen:006400 darkgrey:a9a9a9 darkkhaki:bdb76b
darkmagenta:8b008b darkolivegreen:556b2f darkorange:ff8c00 darkorchid:9932cc darkred:8b0000
darksalmon:e9967a darkseagreen:8fbc8f darkslateblue:483d8b darkslategray:2f4f4f
darkslategrey:2f4f4f darkturquoise:00ced1 darkviolet:9400d3 deeppink:ff1493 deepskyblue:00bfff
dimgray:696969 dimgrey:696969 dodgerblue:1e90ff firebrick:b22222 floralwhite:fffaf0
forestgreen:228b22 fuchsia:ff00ff gainsboro:dcdcdc ghostwhite:f8f8ff gold:ffd700 goldenrod:daa520
gray:808080 green:008000 greenyellow:adff2f grey:808080 honeydew:f0fff0 hotpink:ff69b4
indianred:cd5c5c indigo:4b0082 ivory:fffff0 khaki:f0e68c lavender:e6e6fa lavenderblush:fff0f5
lawngreen:7cfc00 lemonchiffon:fffacd lightblue:add8e6 lightcoral:f08080 lightcyan:e0ffff
lightgoldenrodyellow:fafad2 lightgray:d3d3d3 lightgreen:90ee90 lightgrey:d3d3d3 lightpink:ffb6c1
lightsalmon:ffa07a lightseagreen:20b2aa lightskyblue:87cefa lightslategray:778899
lightslategrey:778899 lightsteelblue:b0c4de lightyellow:ffffe0 lime:00ff00 limegreen:32cd32
linen:faf0e6 magenta:ff00ff maroon:800000 mediumaquamarine:66cdaa mediumblue:0000cd
mediumorchid:ba55d3 mediumpurple:9370db mediumseagreen:3cb371 mediumslateblue:7b68ee
mediumspringgreen:00fa9a mediumturquoise:48d1cc mediumvioletred:c71585 midnightblue:191970
mintcream:f5fffa mistyrose:ffe4e1 moccasin:ffe4b5 navajowhite:ffdead navy:000080 oldlace:fdf5e6
olive:808000 olivedrab:6b8e23 orange:ffa500 orangered:ff4500 orchid:da70d6 palegoldenrod:eee8aa
palegreen:98fb98 paleturquoise:afeeee palevioletred:db7093 papayawhip:ffefd5 peachpuff:ffdab9
peru:cd853f pink:ffc0cb plum:dda0dd powderblue:b0e0e6 purple:800080 rebeccapurple:663399 red:ff0000
rosybrown:bc8f8f royalblue:4169e1 saddlebrown:8b4513 salmon:fa8072 sandybrown:f4a460
seagreen:2e8b57 seashell:fff5ee sienna:a0522d silver:c0c0c0 skyblue:87ceeb slateblue:6a5acd
slategray:708090 slategrey:708090 snow:fffafa springgreen:00ff7f steelblue:4682b4 tan:d2b48c
teal:008080 thistle:d8bfd8 tomato:ff6347 turquoise:40e0d0 violet:ee82ee wheat:f5deb3 white:ffffff
whitesmoke:f5f5f5 yellow:ffff00 yellowgreen:9acd32
"""


def _cmyk(c: float, m: float, y: float, k: float) -> RGB:
    return ((1 - c) * (1 - k), (1 - m) * (1 - k), (1 - y) * (1 - k))


def _hex(value: str) -> RGB:
    return tuple(int(value[i : i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


CSS_NAMES: dict[str, RGB] = {
    name: _hex(value) for name, value in (item.split(":") for item in _CSS_HEX.split())
}
_DVIPS: dict[str, RGB] = {
    name.lower(): _cmyk(*(float(v) / 100 for v in values.split(",")))
    for name, values in (item.split(":") for item in _DVIPS_CMYK.split())
}
LATEX_NAMES: dict[str, RGB] = {
    **CSS_NAMES,
    **_DVIPS,
    **{k: tuple(map(float, v)) for k, v in _XCOLOR_BASE.items()},
}


def luminance(rgb: RGB) -> float:
    """WCAG relative luminance of an sRGB colour (channels in [0, 1])."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: RGB, b: RGB) -> float:
    """WCAG contrast ratio of two colours, from 1 (the same) to 21 (black on white)."""
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def blend(top: RGB, bottom: RGB, opacity: float) -> RGB:
    return tuple(opacity * t + (1 - opacity) * b for t, b in zip(top, bottom))  # type: ignore[return-value]


def readable(text: RGB | None, background: RGB | None, opacity: float = 1.0) -> bool:
    """Whether text of colour ``text`` at ``opacity`` can be read on ``background`` (module docstring)."""
    if text is None or background is None:
        return False
    return contrast(blend(text, background, min(max(opacity, 0.0), 1.0)), background) >= MIN_CONTRAST


# ----------------------------------------------------------------------------------------------- LaTeX
_NUMBER = re.compile(r"\s*[-+]?(?:\d+\.?\d*|\.\d+)\s*")


def _numbers(values: str, count: int) -> list[float] | None:
    parts = re.split(r"[,\s]+", values.strip())
    if len(parts) != count or not all(_NUMBER.fullmatch(p) for p in parts):
        return None
    return [float(p) for p in parts]


def _clamp(rgb) -> RGB:
    return tuple(min(max(float(c), 0.0), 1.0) for c in rgb)  # type: ignore[return-value]


def _latex_model(model: str, values: str) -> RGB | None:
    """A colour given in an xcolor model (``[rgb]{1,1,1}``); None for a model or value the kit cannot read."""
    model, values = model.split("/")[0].strip(), values.split("/")[0].strip()
    if model == "HTML":
        return _hex(values.lower()) if re.fullmatch(r"[0-9A-Fa-f]{6}", values) else None
    sizes = {"rgb": 3, "RGB": 3, "gray": 1, "Gray": 1, "cmyk": 4, "cmy": 3, "hsb": 3, "Hsb": 3, "HSB": 3}
    numbers = _numbers(values, sizes[model]) if model in sizes else None
    if numbers is None:
        return None
    if model == "rgb":
        return _clamp(numbers)
    if model == "RGB":
        return _clamp(n / 255 for n in numbers)
    if model in ("gray", "Gray"):
        level = numbers[0] / (15 if model == "Gray" else 1)
        return _clamp((level, level, level))
    if model == "cmyk":
        return _clamp(_cmyk(*numbers))
    if model == "cmy":
        return _clamp(1 - n for n in numbers)
    hue = numbers[0] / {"hsb": 1, "Hsb": 360, "HSB": 240}[model]
    scale = 240 if model == "HSB" else 1
    return _clamp(colorsys.hsv_to_rgb(hue % 1.0, numbers[1] / scale, numbers[2] / scale))


def latex_colour(spec: str, model: str | None = None, defined: dict[str, RGB] | None = None) -> RGB | None:
    """The RGB of an xcolor colour: ``spec`` in ``model`` (``\\color[rgb]{1,1,1}``), else a name or a mix
    of names (``white``, ``White``, ``red!30!blue``, ``-red``, a name ``defined`` earlier in the text)."""
    if model:
        return _latex_model(model, spec)
    expression = spec.strip()
    complement = False
    while expression.startswith("-"):
        complement, expression = not complement, expression[1:].strip()
    parts = [p.strip() for p in expression.split("!")]
    colour = _named(parts[0], defined)
    for index in range(1, len(parts), 2):
        share = _numbers(parts[index], 1)
        following = _named(parts[index + 1], defined) if index + 1 < len(parts) else WHITE
        if colour is None or share is None or following is None:
            return None
        colour = blend(colour, following, min(max(share[0], 0.0), 100.0) / 100)
    if colour is None:
        return None
    return tuple(1 - c for c in colour) if complement else colour  # type: ignore[return-value]


def _named(name: str, defined: dict[str, RGB] | None) -> RGB | None:
    if defined and name in defined:
        return defined[name]
    return LATEX_NAMES.get(name.lower())


# ----------------------------------------------------------------------------------------------- CSS
_CSS_FUNCTION = re.compile(r"(rgba?|hsla?)\(([^()]*)\)")


def css_colour(value: str) -> tuple[RGB, float] | None:
    """(RGB, alpha) of a CSS colour value; None when it cannot be read."""
    value = value.strip().lower()
    if value == "transparent":
        return WHITE, 0.0
    if value in CSS_NAMES:
        return CSS_NAMES[value], 1.0
    if re.fullmatch(r"#[0-9a-f]{3,4}", value):
        value = "#" + "".join(ch * 2 for ch in value[1:])
    if re.fullmatch(r"#[0-9a-f]{6}(?:[0-9a-f]{2})?", value):
        alpha = int(value[7:9], 16) / 255 if len(value) == 9 else 1.0
        return _hex(value[1:7]), alpha
    match = _CSS_FUNCTION.fullmatch(value)
    if not match:
        return None
    parts = [p for p in re.split(r"[\s,/]+", match.group(2).strip()) if p]
    if len(parts) not in (3, 4):
        return None
    try:
        numbers = [_css_number(p, 255 if match.group(1).startswith("rgb") else 100) for p in parts[:3]]
        alpha = _css_number(parts[3], 1) if len(parts) == 4 else 1.0
    except ValueError:
        return None
    if match.group(1).startswith("rgb"):
        return _clamp(n / 255 for n in numbers), min(max(alpha, 0.0), 1.0)
    hue = _css_number(parts[0].removesuffix("deg"), 360) / 360
    rgb = colorsys.hls_to_rgb(hue % 1.0, numbers[2] / 100, numbers[1] / 100)
    return _clamp(rgb), min(max(alpha, 0.0), 1.0)


def _css_number(text: str, full: float) -> float:
    """A CSS number, a percentage of ``full`` when written with %."""
    if text.endswith("%"):
        return float(text[:-1]) / 100 * full
    return float(text)


@dataclass(frozen=True)
class Look:
    """How the text of one group (LaTeX braces, an environment, math; an HTML element) looks, and whether a
    reader sees it (``shown``)."""

    closer: str | None = None  # what ends the group ("}", "$", "end:<env>", an HTML tag name); None: the text
    fg: RGB | None = BLACK
    bg: RGB | None = WHITE
    opacity: float = 1.0
    size: float = BODY_PT
    hidden: bool = False  # hidden whatever its colours (a phantom, display: none, ...)
    kept_open: bool = True  # whether the group's opening token was kept (its closer is kept with it)
    summary: Look | None = None  # an HTML <details> left closed: how its <summary> looks
    shown: bool = True

    def becomes(self, **changes) -> Look:
        look = replace(self, **changes)
        if changes.keys() <= {"closer", "kept_open", "summary"}:
            return look
        shown = not look.hidden and look.size >= MIN_SIZE_PT and readable(look.fg, look.bg, look.opacity)
        return replace(look, shown=shown)
