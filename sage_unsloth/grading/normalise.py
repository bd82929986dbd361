"""Gold values as strings, and the one LaTeX normalisation applied alike to golds and answers.

``normalise_math`` rewrites notations that mean the same number or expression into one spelling before
anything is parsed; each rule is a cause of a misgrade on the bundled golds:

- e-notation (``4.5e33``, ``1e-5``) becomes ``\\times 10^{k}``: a parser reads ``4.5e33`` as 4.5·e·33;
- currency (``\\$32,\\!348``, a lone ``$`` before a number), thousands separators (``10,\\!080``,
  ``10\\,080``, ``10{,}080``, ``1,234`` outside brackets) and degree signs are dropped;
- ``\\dfrac``/``\\tfrac``, brace-less fractions (``\\frac43``, ``\\frac{270}7``), ``10^33`` (an exponent of
  several digits means all of them);
- subscripts: ``E_1`` and ``E_{1}`` are one symbol; ``\\text{}`` inside one (``\\lambda_{\\text {red}}``) and
  symbol commands (``L_{\\odot}``) become plain names; a subscripted ``E`` is a symbol, not Euler's e;
- Python spellings in golds: ``-1./3``, ``np.arcsin(10/13)``;
- a trailing unit written as text (``\\text{ cm}^2``, ``\\mbox{ inches}^2``, ``\\mathrm{eV}``).

Units written as bare letters (``15 cm``, ``5.3\\times10^3 K``) are removed only when the gold is a number
(``strip_unit_tail``): in ``\\frac{37}{4} m`` or ``\\frac{1}{m} t`` the letter is a variable.
"""

from __future__ import annotations

import math
import re

from sage_unsloth.grading.extract import last_boxed
from sage_unsloth.grading.numbers import leading_number


def normalise_gold(gold) -> str:
    """A gold answer as a clean string: JSON floats ``27.0`` -> ``27``, AIME ``073`` -> ``73``. Strings keep
    their trailing zeros (Minerva's ``56.0`` states a precision)."""
    if isinstance(gold, bool):
        return str(gold)
    if isinstance(gold, float):
        return str(int(gold)) if math.isfinite(gold) and gold.is_integer() else repr(gold)
    text = str(gold).strip()
    if re.fullmatch(r"0\d+", text):
        text = text.lstrip("0") or "0"
    return text


def minerva_gold(solution: str) -> str:
    """Minerva has no answer field: the gold is the last ``\\boxed{}`` of the reference solution."""
    boxed = last_boxed(solution)
    if boxed is None:
        raise ValueError("Minerva solution has no \\boxed{} answer")
    return boxed.strip()


# ----------------------------------------------------------------------------------------------- rules
_THOUSANDS_EXPLICIT = r"(?:\s?\{\s*,\s*\}|,\\!\s*|\\,|\\;|\\:|\\!|(?<!\\)\\ |~|\u2009|\u202f)"
_THOUSANDS = re.compile(rf"(?<![\d.])\d{{1,3}}(?:{_THOUSANDS_EXPLICIT}\d{{3}})+(?!\d)")
_THOUSANDS_COMMA = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")
_E_NOTATION = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
_TIMES_TEN = re.compile(r"(\d)\s*(?:\\cdot|\\ast|\*|×|x|\\times)\s*10\s*\^")
_TEN_POWER = re.compile(r"(?<![\d.])10\s*\^\s*(-?\d{2,})")
_DEGREES = re.compile(r"\^\s*(?:\{\s*\\circ\s*\}|\\circ)|\\circ|°|\\degree|\^\{\\text\{o\}\}")
_FRAC_VARIANT = re.compile(r"\\[dtc]frac")
_FRAC_SHORT = re.compile(r"\\frac\s*(\{[^{}]*\}|\d)\s*(\{[^{}]*\}|\d)")
_SUBSCRIPT_TEXT = re.compile(
    r"_\s*\{\s*\\(?:text|mathrm|rm|mbox|textrm)\s*\{\s*([^{}]*?)\s*\}\s*\}|"
    r"_\s*\\(?:text|mathrm|rm|mbox)\s*\{\s*([^{}]*?)\s*\}"
)
_PYTHON_PREFIX = re.compile(r"\b(?:np|numpy|math|sp|sympy)\.(?=[a-z]+\()")
_PYTHON_FUNCTION = re.compile(r"(?<!\\)\b(arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|exp|log|sqrt)\(")
_TRAILING_DOT = re.compile(r"(\d)\.(?![\d.])")
_TEXT_UNIT = re.compile(
    r"\s*\\(?:text|textnormal|textup|textit|mbox|mathrm|textrm|rm)\s*\{\s*[^{}]*\}\s*(?:\^\s*\{?-?\d\}?)?\s*$"
)
_APPROX = re.compile(r"\\approx|\\simeq|\\sim(?![a-z])|≈")
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|~|\\q?quad\b")  # not the "\\" of a matrix row
_EULER_SUBSCRIPTED = re.compile(r"(?<![A-Za-z\\])([Ee])(?=\s*_)")  # E_{1} is a symbol, not Euler's e
_SUBSCRIPT_COMMAND = re.compile(r"_\s*\{?\s*\\(odot|oplus|star|ast|bullet|earth|sun)\s*\}?")
# "19, 46, and 82", "-1 \\text{ and } \\dfrac{15}{8}", "a \\quad\\text{or}\\quad b": a list, written with words.
_LIST_WORDS = re.compile(
    r"\s*,?\s*(?:\\q?quad\s*)?(?:\\text\s*\{\s*(?:and|or)\s*\}|(?<![A-Za-z\\])(?:and|or)(?![A-Za-z]))"
    r"(?:\s*\\q?quad)?\s*"
)
# A prime is part of a name: E' is not E, f'(x) is not f(x); the parser drops it, so it becomes a subscript.
_PRIMED = re.compile(r"(?<![A-Za-z\\])([A-Za-z])\s*((?:'|\^\s*\{?\s*\\prime\s*\}?)+)(?![A-Za-z])")
# A mixed number with a space, "1 1/2" (a proper fraction after a whole number).
_MIXED_SPACED = re.compile(r"(?<![\d.,/])(\d+)\s+(\d+)\s*/\s*(\d+)(?![\d./])")
# Degrees inside a trigonometric function: \cos 60^\circ is cos(pi/3), not cos(60 radians).
_TRIG_DEGREES = re.compile(
    r"(\\(?:sin|cos|tan|cot|sec|csc))\s*(\(?)\s*(\d+(?:\.\d+)?)\s*(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree)"
)
# A number written against an opening bracket multiplies it ("2(5)", "3\\left(x + 1\\right)"); latex2sympy
# read "2(5)" as 7. Not after a letter (f(5) is a function's value) or inside a subscript (x_{1}(t)).
_NUMBER_BRACKET = re.compile(r"(?<![\w.^_{])(\d+(?:\.\d+)?)\s*(\\left\s*\(|\()")
_SUBSCRIPT_BARE = re.compile(r"_\s*([A-Za-z0-9]|\\[A-Za-z]+)(?![A-Za-z0-9{])")


_POWER_OPERAND = re.compile(r"\*\*\s*(-?\d+(?:\.\d+)?|[A-Za-z])")


def _python_power(text: str) -> str:
    """Inside math ``**`` is a power (``2**10`` is 1024; extraction already dropped markdown bold): a
    number or a letter after it becomes a braced exponent (``2^10`` in LaTeX would be 2^1 * 0)."""
    if "**" not in text:
        return text
    return _POWER_OPERAND.sub(r"^{\1}", text).replace("**", "^")


def _currency(text: str) -> str:
    text = re.sub(r"\\\$|€|£|\\euro\b|\\pounds\b", "", text)
    # A lone "$" (no closing one) before a number is a dollar sign; paired ones are math delimiters.
    if text.count("$") == 1:
        text = re.sub(r"\$(?=\s*[\d.])", "", text)
    return text.replace("$", " ")


def _fix_fracs(text: str) -> str:
    def braced(part: str) -> str:
        return part if part.startswith("{") else "{" + part + "}"

    for _ in range(4):  # nested shorthand is rare; four passes settle any real answer
        new = _FRAC_SHORT.sub(lambda m: f"\\frac{braced(m.group(1))}{braced(m.group(2))}", text)
        if new == text:
            break
        text = new
    return text


def _primed(match: re.Match) -> str:
    return f"{match.group(1)}_{{p{match.group(2).count(chr(39)) + match.group(2).count('prime')}}}"


def _radians(match: re.Match) -> str:
    function, paren, degrees = match.groups()
    angle = f"\\frac{{{degrees}\\pi}}{{180}}"
    return f"{function}({angle}" if paren else f"{function}({angle})"


def _mixed(match: re.Match) -> str:
    whole, num, den = match.groups()
    if int(den) == 0 or int(num) >= int(den):
        return match.group(0)
    return f"{whole}\\frac{{{num}}}{{{den}}}"


def _exact_before_approximation(text: str) -> str:
    """``\\frac{14}{3} \\approx 4.67`` is the exact value 14/3; ``L \\approx 4.5e33`` (a name, or nothing,
    before the sign) is the value after it."""
    parts = _APPROX.split(text)
    if len(parts) == 1:
        return text
    before = parts[0].strip()
    if not before or re.fullmatch(r"(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?[\w\\]+\}?)?\s*=?", before):
        return parts[-1]
    return before


def _chain_ends(text: str) -> str:
    """A chain of equalities states its last member (``5+5+1 = 11`` is 11), assigned to its first when that
    is a name (``x = 5+5+1 = 1/3`` is ``x = 1/3``)."""
    if text.count("=") < 2 or re.search(r"[<>]|\\[lg]eq?|\\neq|,", text):
        return text
    members, depth, start = [], 0, 0
    for i, ch in enumerate(text):  # top-level "=" only: \sum_{k=0} is no member of the chain
        depth += (ch in "({[") - (ch in ")}]")
        if ch == "=" and depth == 0:
            members.append(text[start:i].strip())
            start = i + 1
    members.append(text[start:].strip())
    if len(members) < 3:
        return text
    if re.fullmatch(r"(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?[\w\\]+\}?)?", members[0]):
        return f"{members[0]} = {members[-1]}"  # x = 5+5+1 = 1/3 assigns 1/3 to x
    return members[-1]


# Every Unicode character that is a minus sign (or a hyphen-minus, as ASCII "-" is) reads as "-": the minus
# sign U+2212, full-width and small hyphen-minus (U+FF0D, U+FE63), the heavy minus U+2796, the modifier minus
# U+02D7, the hyphens U+2010 and U+2011.
_MINUS_SIGNS = "\u2212\uff0d\ufe63\u2796\u02d7\u2010\u2011"
_MINUS_TABLE = str.maketrans(dict.fromkeys(_MINUS_SIGNS, "-"))
# The figure dash and the en dash (U+2012, U+2013) stand for a minus everywhere except directly between two
# operands, where they are a range ("1", en dash, "5": one to five); the em dash is punctuation, never a minus.
_DASH_AS_MINUS = re.compile(r"(?<![\w)\]}])[\u2012\u2013]|[\u2012\u2013](?![\w(\[{\\])")
# A run of superscript characters is an exponent (10 with superscript minus three is 10^{-3}; x with a
# superscript two is x^2): its minus is the same minus.
_SUPERSCRIPTS = dict(
    zip(
        "\u207a\u207b\u207c\u207d\u207e\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079",
        "+-=()0123456789",
    )
)
_SUPERSCRIPT_RUN = re.compile(f"[{''.join(_SUPERSCRIPTS)}]+")


def minus_signs(text: str) -> str:
    """``text`` with every Unicode minus written "-" (the rule above) and superscript runs as exponents."""
    if text.isascii():
        return text
    text = _DASH_AS_MINUS.sub("-", text.translate(_MINUS_TABLE))
    return _SUPERSCRIPT_RUN.sub(_exponent, text)


def _exponent(match: re.Match) -> str:
    exponent = "".join(_SUPERSCRIPTS[c] for c in match.group(0))
    return f"^{exponent}" if len(exponent) == 1 else f"^{{{exponent}}}"  # x^2 keeps "1,000 m^2" a number


def normalise_math(text: str) -> str:
    """The rules of the module docstring, applied to a gold or to an answer's math."""
    text = minus_signs(_currency(text)).replace("\u00b7", "\\cdot ")  # every minus sign, middle dot
    text = _python_power(text)
    text = _LIST_WORDS.sub(", ", text)
    text = _TRIG_DEGREES.sub(_radians, text)
    text = _PRIMED.sub(_primed, text)
    text = _MIXED_SPACED.sub(_mixed, text)
    text = _FRAC_VARIANT.sub(r"\\frac", text)
    text = _THOUSANDS.sub(lambda m: re.sub(r"\D", "", m.group(0)), text)
    if not re.search(r"[(\[{]|\\begin", text):  # "(2,100)" is a pair, "2,100" outside brackets a number
        text = _THOUSANDS_COMMA.sub(lambda m: m.group(0).replace(",", ""), text)
    text = _E_NOTATION.sub(r"\1\\times 10^{\2}", text)
    text = _TIMES_TEN.sub(r"\1\\times 10^", text)
    text = _TEN_POWER.sub(r"10^{\1}", text)
    text = _DEGREES.sub("", text)
    text = _SUBSCRIPT_TEXT.sub(lambda m: "_{" + (m.group(1) or m.group(2) or "").replace(" ", "") + "}", text)
    text = _SUBSCRIPT_COMMAND.sub(r"_{\1}", text)  # L_{\odot}: the parser takes no symbol command there
    text = _SUBSCRIPT_BARE.sub(r"_{\1}", text)  # E_1 and E_{1} are one symbol
    text = _EULER_SUBSCRIPTED.sub(r"\\mathrm{\1}", text)
    text = _NUMBER_BRACKET.sub(r"\1 \\cdot \2", text)  # 2(5) is 10: the parser read it as 2 + 5
    text = _PYTHON_PREFIX.sub("", text)
    text = _PYTHON_FUNCTION.sub(r"\\\1(", text)
    text = _TRAILING_DOT.sub(r"\1", text)
    text = _fix_fracs(text)
    text = _chain_ends(_exact_before_approximation(text))
    text = _SPACING.sub(" ", text)
    while True:  # a unit in \text{} after the value ("5.4 \text{ cents}", "864 \mbox{ inches}^2")
        stripped = _TEXT_UNIT.sub("", text)
        if stripped == text or not stripped.strip():
            break
        text = stripped
    return re.sub(r"\s+", " ", text).strip()


# Bare-letter unit tails after a number: letters, /, ^k, \mathrm{...}, \mu, \Omega, \odot, \AA, \%-free.
_UNIT_TAIL = re.compile(
    r"(?>\s+|\\mathrm\s*\{|\\text\s*\{|\\mu|\\Omega|\\AA|\\odot"
    # written without a space, only a common unit: "1000.99m^2", "12cm", "3kg"
    r"|(?=(?:[kcm]?m|[km]?g|s|h|min|[mk]?L)(?:\^\s*\{?\s*\d\s*\}?)?$))"
    r"(?:[A-Za-z\u00b5\u03a9\u00c5/.\s{}()\-]|\\mathrm|\\text|\\mu|\\Omega|\\AA|\\odot|_|"
    r"\^\s*\{?\s*-?\d+\s*\}?|\\,|\\cdot)*+"
)  # possessive (*+): the space after "^ 1" fits the exponent and the letters alike, and backtracking over
# that choice was exponential ("5 m^ 1 ^ 1 ... +": 56 s of CPU at 14 repeats); every character of a tail
# has one alternative that takes it, so the greedy reading is the only one and nothing is lost.
_NOT_UNITS = frozenset(
    ["i", "e", "x", "y", "z", "n", "k", "t", "c"]
)  # letters that are math, never a unit, after a number


_ASSIGNED = re.compile(r"^\s*(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?[\w\\]+\}?)?\s*=\s*(?P<value>[^=]+)$")


def strip_unit_tail(text: str) -> str:
    """``text`` without a unit after its leading number ("15 cm^2" -> "15", "d = 5 km" -> "5"); unchanged
    otherwise. Only for a number gold: there the name an answer assigns to is no part of the value."""
    assigned = _ASSIGNED.match(text)
    if assigned and leading_number(assigned.group("value")) is not None:
        text = assigned.group("value")
    found = leading_number(text)
    if found is None:
        return text
    number, rest = found
    if not rest.strip():
        return text
    if not _UNIT_TAIL.fullmatch(rest):
        return text
    letters = re.sub(r"\\[A-Za-z]+|[^A-Za-z]", "", rest)
    if letters and letters in _NOT_UNITS:
        return text
    return number.strip()
