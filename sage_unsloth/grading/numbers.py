"""Plain numbers, read exactly (``fractions.Fraction``), so that numeric answers are compared without
sympy: integers, decimals, scientific notation (``4.5 \\times 10^{33}``), ``10^{-5}``, fractions
(``\\frac{3}{56}``, ``3/56``) and mixed numbers (``1\\frac{4}{5}``).

Equality (``numbers_equal``):
- a gold written with a decimal point or a power of ten is a measurement given to its last digit: an
  answer equals it when it rounds to it there *and* lies within 1% of it (so ``4.49e33`` equals ``4.5e33``,
  ``0.0000671`` does not equal ``0.0000672``, and a one-digit gold such as ``1e-5`` is not a 50% band);
- an exact gold (integer, fraction) against a decimal answer: equal at 6 decimal places (math-verify's rule);
- two exact numbers: equal values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_INT = r"\d+"
_DEC = r"(?:\d+(?:\.\d*)?|\.\d+)"
_EXP = r"\^\{{?(?P<{}>[+-]?\d+)\}}?"  # ^{33}, ^{-5}, ^2
_TIMES = r"(?:\\times|\\cdot|\\ast|\*|×)"
_NUMBER = re.compile(
    rf"(?P<sign>[+-])?(?:"
    rf"(?P<whole>{_INT})\\frac\{{(?P<mnum>{_INT})\}}\{{(?P<mden>{_INT})\}}"  # mixed number 1\frac{4}{5}
    rf"|\\frac\{{(?P<fsign>-)?(?P<fnum>{_INT})\}}\{{(?P<fden>{_INT})\}}"  # \frac{3}{56}
    rf"|(?P<snum>{_INT})/(?P<sden>{_INT})"  # 3/56
    rf"|(?P<mant>{_DEC})(?:{_TIMES}10{_EXP.format('mexp')})?"  # 4.5\times10^{33}, 0.15, 204
    rf"|10{_EXP.format('pexp')}"  # 10^{-5}
    rf")"
)
_SPACES = re.compile(r"\s+|\\[,;:! ]|~|\{\}")


@dataclass(frozen=True)
class Number:
    value: Fraction
    approximate: bool  # written with a decimal point or a power of ten
    half_ulp: Fraction | None = None  # half a unit in the last written digit (approximate numbers only)


def compact(text: str) -> str:
    return _SPACES.sub("", text)


def parse_number(text: str) -> Number | None:
    """The number ``text`` spells (after ``compact``), or None when it is anything else."""
    text = compact(text)
    match = _NUMBER.fullmatch(text)
    if not match or len(text) > 64:
        return None
    return _from_match(match)


def leading_number(text: str) -> tuple[str, str] | None:
    """(number text, rest) when ``text`` starts with a plain number, else None."""
    stripped = text.lstrip()
    match = _NUMBER.match(compact(stripped[:80]))
    if not match or not match.group(0) or match.group(0) in "+-":
        return None
    # Map the match back onto the uncompacted text: consume characters until the compact forms agree.
    wanted, i = match.group(0), 0
    while i <= len(stripped) and compact(stripped[:i]) != wanted:
        i += 1
    if i > len(stripped):
        return None
    return stripped[:i], stripped[i:]


def _from_match(m: re.Match) -> Number | None:
    sign = -1 if m.group("sign") == "-" else 1
    if m.group("whole") is not None:
        num, den = int(m.group("mnum")), int(m.group("mden"))
        if den == 0 or num >= den:
            return None  # 2\frac{5}{3} is not how anyone writes a mixed number: leave it to the algebra
        return Number(sign * (int(m.group("whole")) + Fraction(num, den)), False)
    if m.group("fnum") is not None:
        den = int(m.group("fden"))
        if den == 0:
            return None
        sign *= -1 if m.group("fsign") else 1
        return Number(sign * Fraction(int(m.group("fnum")), den), False)
    if m.group("snum") is not None:
        den = int(m.group("sden"))
        return None if den == 0 else Number(sign * Fraction(int(m.group("snum")), den), False)
    if m.group("pexp") is not None:
        exponent = int(m.group("pexp"))
        if abs(exponent) > 400:
            return None
        return Number(sign * Fraction(10) ** exponent, False)
    mantissa = m.group("mant")
    exponent_text = m.group("mexp")
    exponent = int(exponent_text) if exponent_text is not None else 0
    if abs(exponent) > 400:
        return None
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    scale = Fraction(10) ** exponent
    value = sign * Fraction(mantissa if not mantissa.endswith(".") else mantissa[:-1] or "0") * scale
    approximate = "." in mantissa or exponent_text is not None
    half_ulp = Fraction(1, 2) * Fraction(10) ** -decimals * scale if approximate else None
    return Number(value, approximate, half_ulp)


_SIX_PLACES = Fraction(1, 10**6)


def _round6(x: Fraction) -> Fraction:
    return Fraction(round(x / _SIX_PLACES)) * _SIX_PLACES


def numbers_equal(gold: Number, answer: Number) -> bool:
    """Whether ``answer`` is the number ``gold`` (rules in the module docstring)."""
    if gold.value == answer.value:
        return True
    if gold.approximate:
        tolerance = min(gold.half_ulp, abs(gold.value) / 100)
        return abs(answer.value - gold.value) <= tolerance
    if answer.approximate:
        return _round6(answer.value) == _round6(gold.value)
    return False


def value_equal(gold: Number, value: Fraction) -> bool:
    """``numbers_equal`` for an answer known only by its value (e.g. a radical evaluated numerically)."""
    return numbers_equal(gold, Number(value, True, Fraction(0)))
