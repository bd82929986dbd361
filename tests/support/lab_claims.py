"""Claims as data: what a lab sentence says about its numbers (an ordering, a point inside or outside an interval,
a sign in every draw, "moves" / "does not move", "replicates"), checked against the CSVs by a named predicate.

A tag before the words, ``<!-- claim NAME(ARGS) results/<folder>/<file>.csv SELECTOR [| SELECTOR] -->``, names
the predicate, its arguments (column names, a number), the CSV and the rows: ``key=value`` and ``key!=value``
items (shlex quoting, as the number tags of tests/demo/test_lab_numbers.py); a second selector after ``|``
picks the rows the first set is compared with, its keys laid over the first's. A predicate holds or the tag is a
problem that says what the rows hold, so a CSV edit that makes a sentence false fails the suite.

The predicates (every row of A; B is one row):

- ``inside(col)`` / ``outside(col)``: A's ``col`` lies inside / outside B's ``[col_ci_low, col_ci_high]``
  (``col`` = diff reads ``ci_low`` / ``ci_high``);
- ``excludes_zero(col)`` / ``includes_zero(col)``: A's interval of ``col`` excludes / includes 0;
- ``positive(col)`` / ``negative(col)``: A's ``col`` above / below 0; ``same_sign(col)``: every A row on one
  side of 0 (none at 0); ``mixed_sign(col)``: not so;
- ``below(col, x)`` / ``above(col, x)``: A's ``col`` below / above x; ``within(col, x)``: |A's col| <= x;
- ``greater(col)`` / ``less(col)``: A's ``col`` above / below B's; ``exceeds_all(col)``: above every B row's (B
  may be several rows here); ``near(col, x)``: within x of B's; ``ratio_below(col, x)``: A's over B's below x;
- ``increasing(col, by)``: A's ``col`` rises strictly with ``by``;
- ``rejects()`` / ``does_not_reject()``: A's ``p_holm`` below / not below 0.05;
- ``equals(col, value)``: A's ``col`` is ``value`` (text, or a number to 1e-9);
- ``count(col, value, n)``: exactly ``n`` rows of A have ``col`` = ``value``;
- ``sd_below(col, x)``: the sample sd of A's ``col`` over its rows below x (a spread, e.g. over seeds).

A claim that is not about a CSV (what a simulation or the power module shows) names the test that asserts it:
``<!-- tested tests/<area>/<file>.py::<test function> -->``; the test must exist (:func:`tested_problems`).
"""

from __future__ import annotations

import ast
import math
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd

TESTED = re.compile(r"<!-- tested (?P<path>tests/\S+\.py)::(?P<test>\w+) -->")
TAG = re.compile(r"<!-- claim (?P<name>\w+)\((?P<args>[^)]*)\) (?P<path>\S+\.csv)(?P<rows>[^>]*?) -->")
ALPHA = 0.05
PREDICATES: dict = {}


def predicate(name: str):
    def register(fn):
        PREDICATES[name] = fn
        return fn

    return register


def _bounds(col: str) -> tuple[str, str]:
    return ("ci_low", "ci_high") if col == "diff" else (f"{col}_ci_low", f"{col}_ci_high")


def _one(b: pd.DataFrame | None, name: str) -> pd.Series:
    if b is None or len(b) != 1:
        raise ValueError(f"{name} compares with one row after '|', got {0 if b is None else len(b)}")
    return b.iloc[0]


@predicate("inside")
def inside(a, b, col):
    low, high = _bounds(col)
    ref = _one(b, "inside")
    return all(ref[low] <= v <= ref[high] for v in a[col]), f"{list(a[col])} vs [{ref[low]}, {ref[high]}]"


@predicate("outside")
def outside(a, b, col):
    low, high = _bounds(col)
    ref = _one(b, "outside")
    return all(v < ref[low] or v > ref[high] for v in a[col]), f"{list(a[col])} vs [{ref[low]}, {ref[high]}]"


@predicate("excludes_zero")
def excludes_zero(a, b, col="diff"):
    low, high = _bounds(col)
    return all(lo > 0 or hi < 0 for lo, hi in zip(a[low], a[high])), f"{list(zip(a[low], a[high]))}"


@predicate("includes_zero")
def includes_zero(a, b, col="diff"):
    low, high = _bounds(col)
    return all(lo <= 0 <= hi for lo, hi in zip(a[low], a[high])), f"{list(zip(a[low], a[high]))}"


@predicate("positive")
def positive(a, b, col):
    return bool((a[col] > 0).all()), f"{list(a[col])}"


@predicate("negative")
def negative(a, b, col):
    return bool((a[col] < 0).all()), f"{list(a[col])}"


@predicate("same_sign")
def same_sign(a, b, col):
    return bool((a[col] > 0).all() or (a[col] < 0).all()), f"{list(a[col])}"


@predicate("mixed_sign")
def mixed_sign(a, b, col):
    return not same_sign(a, b, col)[0], f"{list(a[col])}"


@predicate("below")
def below(a, b, col, x):
    return bool((a[col] < float(x)).all()), f"{list(a[col])} vs {x}"


@predicate("above")
def above(a, b, col, x):
    return bool((a[col] > float(x)).all()), f"{list(a[col])} vs {x}"


@predicate("within")
def within(a, b, col, x):
    return bool((a[col].abs() <= float(x)).all()), f"{list(a[col])} vs +-{x}"


@predicate("greater")
def greater(a, b, col):
    ref = _one(b, "greater")
    return bool((a[col] > ref[col]).all()), f"{list(a[col])} vs {ref[col]}"


@predicate("less")
def less(a, b, col):
    ref = _one(b, "less")
    return bool((a[col] < ref[col]).all()), f"{list(a[col])} vs {ref[col]}"


@predicate("exceeds_all")
def exceeds_all(a, b, col):
    return bool(
        b is not None and len(b) and all(v > b[col].max() for v in a[col])
    ), f"{list(a[col])} vs max {b[col].max()}"


@predicate("near")
def near(a, b, col, x):
    ref = _one(b, "near")
    return bool(((a[col] - ref[col]).abs() <= float(x)).all()), f"{list(a[col])} vs {ref[col]} +- {x}"


@predicate("ratio_below")
def ratio_below(a, b, col, x):
    ref = _one(b, "ratio_below")
    return bool((a[col] / ref[col] < float(x)).all()), f"{list(a[col] / ref[col])} vs {x}"


@predicate("increasing")
def increasing(a, b, col, by):
    ordered = a.assign(_by=a[by].astype(float)).sort_values("_by")[col].to_numpy(dtype=float)
    return bool(len(ordered) > 1 and (np.diff(ordered) > 0).all()), f"{list(ordered)} by {by}"


@predicate("rejects")
def rejects(a, b):
    return bool((a["p_holm"] < ALPHA).all()), f"p_holm {list(a['p_holm'])}"


@predicate("does_not_reject")
def does_not_reject(a, b):
    return bool((a["p_holm"] >= ALPHA).all()), f"p_holm {list(a['p_holm'])}"


def _same(cell, value: str) -> bool:
    try:
        return abs(float(cell) - float(value)) <= 1e-9
    except (TypeError, ValueError):
        return str(cell) == value


@predicate("equals")
def equals(a, b, col, value):
    return all(_same(c, value) for c in a[col]), f"{list(a[col])}"


@predicate("count")
def count(a, b, col, value, n):
    found = sum(_same(c, value) for c in a[col])
    return found == int(n), f"{found} of {len(a)} rows have {col} = {value}"


@predicate("sd_below")
def sd_below(a, b, col, x):
    sd = float(a[col].astype(float).std(ddof=1))
    return bool(len(a) > 1 and sd < float(x)), f"sd {sd} over {len(a)} rows vs {x}"


def tested_problems(text: str, root: Path) -> list[str]:
    """Every ``<!-- tested FILE::TEST -->`` of ``text`` whose file or test function does not exist."""
    problems = []
    for tag in TESTED.finditer(text):
        path = root / tag["path"]
        names = (
            {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
            if path.is_file()
            else set()
        )
        if tag["test"] not in names or not tag["test"].startswith("test"):
            problems.append(f"{tag.group(0)}: no test {tag['test']} in {tag['path']}")
    return problems


def select(frame: pd.DataFrame, items: list[str]) -> pd.DataFrame:
    """The rows where every ``key=value`` holds and every ``key!=value`` does not."""
    mask = np.ones(len(frame), dtype=bool)
    for item in items:
        negate = "!=" in item
        key, value = item.split("!=" if negate else "=", 1)
        hit = frame[key].map(lambda c, v=value: _same(c, v)).to_numpy(dtype=bool)
        mask &= ~hit if negate else hit
    return frame[mask]


def _merge(first: list[str], second: list[str]) -> list[str]:
    keys = {re.split("!?=", item, maxsplit=1)[0] for item in second}
    return [item for item in first if re.split("!?=", item, maxsplit=1)[0] not in keys] + second


def evaluate(tag: re.Match, root: Path) -> str | None:
    """None when the tag's predicate holds, else the problem in one line."""
    path = root / tag["path"]
    if not path.is_file():
        return f"{tag.group(0)}: no file {tag['path']}"
    if tag["name"] not in PREDICATES:
        return f"{tag.group(0)}: no predicate {tag['name']!r} (known: {sorted(PREDICATES)})"
    frame = pd.read_csv(path, comment="#", keep_default_na=False, na_values=[""])
    parts = shlex.split(tag["rows"])
    first = parts[: parts.index("|")] if "|" in parts else parts
    a = select(frame, first)
    b = select(frame, _merge(first, parts[parts.index("|") + 1 :])) if "|" in parts else None
    if a.empty:
        return f"{tag.group(0)}: no row matches"
    args = [x.strip() for x in tag["args"].split(",") if x.strip()]
    try:
        holds, what = PREDICATES[tag["name"]](a, b, *args)
    except (KeyError, ValueError, TypeError) as exc:
        return f"{tag.group(0)}: {exc}"
    return None if holds else f"{tag.group(0)}: false ({what})"


def check(text: str, root: Path) -> list[str]:
    """Every claim tag of ``text`` evaluated: the problems (empty: every claim holds)."""
    return [p for p in (evaluate(m, root) for m in TAG.finditer(text)) if p]


# ------------------------------------------------------------------------------------------ falsifiers
# For each predicate, an edit of the rows it reads that makes it false: the suite's proof that every claim tag can
# fail (tests/demo/test_lab_claims.py applies each to a copy of the CSV and checks that the tag then fails).
def falsify(name: str, frame: pd.DataFrame, a_index, b_index, args: list[str]) -> pd.DataFrame:
    frame = frame.copy()
    first = a_index[0]
    col = args[0] if args else "diff"
    low, high = _bounds(col)

    def put(index, column, value):
        if isinstance(value, str) or frame[column].dtype == bool:
            frame[column] = frame[column].astype(object)
        elif not pd.api.types.is_numeric_dtype(frame[column]):
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
        frame.loc[index, column] = value

    ref = frame.loc[b_index[0]] if b_index is not None and len(b_index) else None
    edits = {
        "inside": lambda: put(first, col, float(ref[high]) + 1.0),
        "outside": lambda: put(first, col, (float(ref[low]) + float(ref[high])) / 2),
        "excludes_zero": lambda: (put(first, low, -1.0), put(first, high, 1.0)),
        "includes_zero": lambda: (put(first, low, 0.5), put(first, high, 1.0)),
        "positive": lambda: put(first, col, -1.0),
        "negative": lambda: put(first, col, 1.0),
        "same_sign": lambda: put(first, col, -float(frame.loc[a_index[-1], col]) or 1.0),
        "mixed_sign": lambda: [put(i, col, 1.0) for i in a_index],
        "below": lambda: put(first, col, float(args[1]) + 1.0),
        "above": lambda: put(first, col, float(args[1]) - 1.0),
        "within": lambda: put(first, col, float(args[1]) + 1.0),
        "greater": lambda: put(first, col, float(ref[col]) - 1.0),
        "exceeds_all": lambda: put(first, col, float(frame.loc[b_index, col].max()) - 1.0),
        "near": lambda: put(first, col, float(ref[col]) + float(args[1]) + 1.0),
        "ratio_below": lambda: put(first, col, float(ref[col]) * (float(args[1]) + 1.0)),
        "less": lambda: put(first, col, float(ref[col]) + 1.0),
        "increasing": lambda: put(
            frame.loc[a_index, args[1]].astype(float).idxmin(),
            col,
            float(frame.loc[a_index, col].max()) + 1.0,
        ),
        "rejects": lambda: put(first, "p_holm", 0.5),
        "does_not_reject": lambda: put(first, "p_holm", 0.001),
        "equals": lambda: put(first, col, _other(frame.loc[first, col])),
        "count": lambda: _recount(frame, a_index, col, args[1], put),
        "sd_below": lambda: put(first, col, _spread_breaker(frame.loc[a_index, col], float(args[1]))),
    }
    edits[name]()
    return frame


def _spread_breaker(values: pd.Series, x: float) -> float:
    """A value that, put in place of one of ``values``, gives them an sd above x (one outlier of d: sd ~ d / sqrt(n))."""
    return float(values.astype(float).mean()) + 3 * x * math.sqrt(len(values)) + x


def _recount(frame, a_index, col, value, put):
    """One more or one fewer row of A with ``col`` = ``value``: a matching row changed, else the first set."""
    matching = [i for i in a_index if _same(frame.loc[i, col], value)]
    if matching:
        put(matching[0], col, _other(value))
    else:
        put(a_index[0], col, value)


def _other(value):
    try:
        return float(value) + 1.0
    except (TypeError, ValueError):
        return f"not {value}"


def rows_of(tag: re.Match, root: Path):
    """(frame, A's index, B's index or None) of a claim tag."""
    frame = pd.read_csv(root / tag["path"], comment="#", keep_default_na=False, na_values=[""])
    parts = shlex.split(tag["rows"])
    first = parts[: parts.index("|")] if "|" in parts else parts
    a = select(frame, first).index
    b = select(frame, _merge(first, parts[parts.index("|") + 1 :])).index if "|" in parts else None
    return frame, a, b
