"""How the kit writes a number in a table or a sentence: the one set of formatters (the report stage, the lab's
tables, its outcome paragraphs and the frontier's all write through these, so one figure reads the same
everywhere; README and docs/lab.md quote them and tests/docs ties the quotes to the CSVs)."""

from __future__ import annotations

import math


def missing(value) -> bool:
    """None or NaN: a cell with nothing in it."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def number(value, digits: int = 3, *, signed: bool = False, empty: str = "missing") -> str:
    """0.604, or +0.004 with ``signed``; ``empty`` for a missing value."""
    if missing(value):
        return empty
    return f"{float(value):{'+' if signed else ''}.{digits}f}"


def interval(low, high, digits: int = 3, *, signed: bool = False, empty: str = "n/a") -> str:
    """[0.542, 0.660], or [-0.014, +0.024] with ``signed``; ``empty`` when an end is missing."""
    if missing(low) or missing(high):
        return empty
    return f"[{number(low, digits, signed=signed)}, {number(high, digits, signed=signed)}]"


def estimate(value, low, high, digits: int = 3, *, signed: bool = False, empty: str = "n/a") -> str:
    """'+0.005 [-0.014, +0.024]': the value and its interval; the value alone when the interval is missing."""
    if missing(value):
        return empty
    if missing(low) or missing(high):
        return number(value, digits, signed=signed)
    return f"{number(value, digits, signed=signed)} {interval(low, high, digits, signed=signed)}"


def p_value(p) -> str:
    """'0.119', '< 1e-3' below a thousandth, 'n/a' when missing."""
    if missing(p):
        return "n/a"
    return "< 1e-3" if p < 0.001 else f"{p:.3f}"


def seeds(value) -> str:
    """A seed count from a projection: '14', '> 100000' past the search, 'n/a (one seed)' when unknown."""
    if missing(value):
        return "n/a (one seed)"
    return "> 100000" if math.isinf(value) else f"{int(value)}"


def knob(value) -> str:
    """A knob's value as its config writes it (0.03, 2, 1e-05); '' when missing."""
    return "" if missing(value) else f"{float(value):g}"
