"""Is an answer the gold? One verdict per (gold, answer), the same in every process and under any load.

Order of the checks (the cheap, exact ones first; sympy only when they cannot decide):

1. a text or letter gold is compared as text (``sage_unsloth.grading.words``);
2. the math of the answer is read (``math_candidate``: prose, "The answer is not 5, it is 4.") and both
   sides get the same normalisation (``normalise_math``); a number gold also drops the answer's unit; of
   several assignments ("m = 100, n = 13, m + n = 113") against a single-value gold the last one counts;
3. equal spellings are equal; two plain numbers are compared exactly (``sage_unsloth.grading.numbers``);
4. otherwise math-verify parses both (its unit stripping off: it removes ``m``, ``t``, ``c`` from
   ``\\frac{37}{4} m``) and compares; a measured gold (``4.5e33``) is compared with the answer's numeric
   value instead of math-verify's 6-decimal rounding (which calls ``5e-10`` equal to ``3.89e-10``);
5. two expressions with variables are compared by value at fixed random positive points of their
   variables, equations by the ratio of their sides (``_equal_by_value``), before any simplification:
   ``2 r_0 \\sqrt{\\pi G \\rho_0}`` is ``\\sqrt{4 \\pi G \\rho_0 r_0^2}`` for the positive physical quantities
   Minerva's variables are, which sympy's real symbols cannot show; and evaluation costs milliseconds where
   ``simplify``/``solve`` took seconds (16 s of CPU for one wrong equation of Minerva's).

Statuses: ``correct``, ``wrong``, ``no_answer`` (nothing to grade), ``timeout`` (the CPU budget ran out:
not a verdict; callers retry it with a larger budget, ``RETRY_TIMEOUT_S``, and count what stays unresolved).
The budget is CPU time of the grading thread (``sage_unsloth.grading.deadline``); its value comes from the
measured cost of every bundled gold against typical answers (``benchmarks/bench_grading.py --budget``).
"""

from __future__ import annotations

import atexit
import cmath
import contextlib
import functools
import hashlib
import logging
import math
import random
import re
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from sage_unsloth.grading.deadline import GradingTimeout, armed, can_interrupt, cpu_deadline, wall_limit_s
from sage_unsloth.grading.extract import extract_answer, math_candidate, top_level_parts
from sage_unsloth.grading.kk import format_assignments, kk_read
from sage_unsloth.grading.normalise import normalise_gold, normalise_math, strip_unit_tail
from sage_unsloth.grading.numbers import Number, compact, numbers_equal, parse_number, value_equal
from sage_unsloth.grading.visible import visible
from sage_unsloth.grading.words import word_gold, words_match

CORRECT, WRONG, NO_ANSWER, TIMEOUT = "correct", "wrong", "no_answer", "timeout"
STATUSES = (CORRECT, WRONG, NO_ANSWER, TIMEOUT)

# CPU seconds of the grading thread per (gold, answer) pair; see the module docstring for where they come from.
DEFAULT_TIMEOUT_S = 10.0
RETRY_TIMEOUT_S = 60.0
MAX_ANSWER_CHARS = 512  # the math of an answer longer than this is rambling, not a final answer
MAX_PROSE_CHARS = (
    4_096  # an answer written as sentences, from which the math is read (extract.MAX_BLOCK_CHARS)
)
MAX_NESTING_DEPTH = 32  # brackets deeper than this never occur in a real final answer
RANDOM_POINTS = 3

logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns once when its own timeouts are off


@dataclass(frozen=True)
class Grade:
    answer: str | None  # what was graded: the extracted answer (K&K: the roles read from it)
    status: str

    @property
    def correct(self) -> bool:
        return self.status == CORRECT


# ----------------------------------------------------------------------------------------------- golds
@dataclass(frozen=True)
class GoldForm:
    text: str  # normalise_math of the gold (the gold itself for text golds)
    words: tuple[str, str] | None = None  # ("letter", "C") or ("words", "evelyn")
    number: Number | None = None  # when the gold is a plain number


# A gold's unit written in words ("10 square units", "125 miles"); a lone letter ("\\frac{37}{4} m", "7.6 Z")
# is a variable of the answer, not a unit.
_UNIT_WORDS = re.compile(r"\d\s+[a-z]{2,}(?:\s+[a-z]{2,})*\s*$")


@functools.lru_cache(maxsize=8192)
def gold_form(gold: str) -> GoldForm:
    words = word_gold(gold)
    if words is not None:
        return GoldForm(gold, words)
    text = normalise_math(gold)
    number = parse_number(text)
    if number is None and _UNIT_WORDS.search(text):  # "10 square units", "$125$ miles": unit in words
        unitless = strip_unit_tail(text)
        number = parse_number(unitless)
        text = unitless if number is not None else text
    return GoldForm(text, None, number)


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "})]":
            depth = max(depth - 1, 0)
    return deepest


def _acceptable(text: str, limit: int = MAX_ANSWER_CHARS) -> bool:
    return len(text) <= limit and "\x00" not in text and _nesting_depth(text) <= MAX_NESTING_DEPTH


_ASSIGNED_NAME = re.compile(r"^\s*([^=<>]+?)\s*=")


def _assignments_to_distinct_names(parts: list[str]) -> bool:
    """ "m = 100, n = 13, m + n = 113" names three quantities (the last is the one asked for); "x = 1, x = 5"
    is a list of candidate values for one unknown, graded as the list it is (a hedge, never the last one)."""
    names = [_ASSIGNED_NAME.match(p) for p in parts]
    if not all(names):
        return False
    keys = [re.sub(r"\s+", "", n.group(1)) for n in names]
    return len(set(keys)) == len(keys)


# Shapes whose evaluation explodes (power towers, huge exponents, factorials or binomials of huge numbers):
# sympy evaluates them in C (an integer power, a factorial), where no deadline signal reaches it. Real golds
# have none; when the gold has none, such an answer cannot equal it, so it is refused before parsing.
_EXPLOSIVE = re.compile(r"\^\s*\{?\s*-?\d{5,}|\d{4,}\s*\)?\s*!(?!=)|[)}\]]\s*!(?!=)|\*\*[^*]*\*\*")
# An exponent holding another power, a factorial or an exponential is a tower.
_GROWS = re.compile(r"\^|\*\*|!(?!=)|\\exp(?![A-Za-z])|\\[dt]?binom(?![A-Za-z])|\\choose(?![A-Za-z])")
# Functions whose value at a huge argument is computed exactly (in C) by sympy.
_HUGE_FUNCTION = re.compile(
    r"\\(?:Gamma|[dt]?binom|choose)(?![A-Za-z])|\\operatorname\s*\{\s*(?:[Gg]amma|factorial)|factorial\s*\("
)
_HUGE_ARGUMENT = re.compile(r"\^|\*\*|\d{6,}|(?:\\cdot|\\times|\*)\s*10")
_OPENERS, _CLOSERS = "({[", ")}]"


def _operand_after(text: str, i: int) -> str:
    """The operand starting at ``text[i]``: a bracketed group (``{...}``, ``(...)``, ``\\left(...``) with
    its brackets, else a run of digits, a letter or a command; '' at the end."""
    n = len(text)
    while i < n and text[i].isspace():
        i += 1
    if text.startswith("\\left", i):
        i += 5
        while i < n and text[i].isspace():
            i += 1
    if i >= n:
        return ""
    if text[i] in _OPENERS:
        depth, j = 0, i
        while j < n:
            if text[j] in _OPENERS:
                depth += 1
            elif text[j] in _CLOSERS:
                depth -= 1
                if depth == 0:
                    return text[i : j + 1]
            j += 1
        return text[i:]
    j = i + 1
    if text[i] == "\\":
        while j < n and text[j].isalpha():
            j += 1
    elif text[i].isdigit():
        while j < n and (text[j].isdigit() or text[j] == "."):
            j += 1
    return text[i:j]


def _explosive(text: str) -> bool:
    """Whether ``text`` has a shape whose exact evaluation explodes (linear scans over a capped answer)."""
    if _EXPLOSIVE.search(text):
        return True
    for match in re.finditer(r"\^|\*\*", text):  # a tower: 9^(9^9), 10^{10^{10}}, e^{e^{10}}, 2^{3}^{4}
        exponent = _operand_after(text, match.end())
        after = match.end() + _gap(text, match.end()) + len(exponent)
        if _GROWS.search(exponent) or _GROWS.match(text, after + _gap(text, after)):
            return True
    for match in _HUGE_FUNCTION.finditer(text):  # \Gamma(10^{10}), \binom{10^{10}}{5\cdot 10^9}
        rest = text[match.end() :]
        first = _operand_after(rest, 0)
        second = _operand_after(rest, _gap(rest, 0) + len(first))
        if _HUGE_ARGUMENT.search(first + second):
            return True
    return False


def _gap(text: str, i: int) -> int:
    """How many spaces (and a ``\\left``) stand at ``text[i]`` before the operand."""
    j = i
    while j < len(text) and text[j].isspace():
        j += 1
    if text.startswith("\\left", j):
        j += 5
        while j < len(text) and text[j].isspace():
            j += 1
    return j - i


def _same_spelling(a: str, b: str) -> bool:
    def key(t: str) -> str:
        return compact(re.sub(r"\\left|\\right|\\displaystyle", "", t))

    return key(a) == key(b)


# ----------------------------------------------------------------------------------------------- verdicts
_SYMBOLIC = object()  # the cheap checks could not decide: math-verify and sympy must


_DANGLING = re.compile(r"(?:\s*(?:[-+*/=^,;:.]|\\cdot|\\times))+$")


def _split_parts(text: str) -> list[str]:
    """The top-level comma (or semicolon) parts of ``text`` that hold a value (a trailing "," or "7 +" alone is no part)."""
    parts = [q for p in top_level_parts(text) for q in top_level_parts(p, ";")]
    return [p for p in parts if p.strip(" +-*/=.,;:")]


def _cheap_verdict(answer: str, gold: str):
    """Every check before sympy: a status, or (candidate, form) for the symbolic comparison. The regular
    expressions here are linear or run on capped text (``MAX_PROSE_CHARS``, ``MAX_ANSWER_CHARS``)."""
    if not gold or not _acceptable(gold) or not _acceptable(answer, MAX_PROSE_CHARS):
        return WRONG
    answer = visible(answer).strip()  # an answer handed in directly: its hidden parts are not read either
    if not answer:
        return NO_ANSWER
    form = gold_form(gold)
    if form.words is not None:
        return CORRECT if words_match(*form.words, answer) else WRONG
    candidate = math_candidate(answer)
    if not candidate or not _acceptable(candidate):
        return WRONG
    candidate = normalise_math(candidate)
    parts = _split_parts(candidate)
    if len(parts) > 1:
        # A dangling operator ends no part: "5, 7 +" is the list 5, 7 (math-verify read it as 7).
        parts = [_DANGLING.sub("", p) for p in parts]
        candidate = ", ".join(parts)
        if len(_split_parts(form.text)) <= 1:
            if _assignments_to_distinct_names(parts):
                candidate = parts[-1]  # "m = 100, n = 13, m + n = 113": the last assignment is asked for
            elif form.number is not None:
                return WRONG  # several values against one number: a hedge ("5 or 7", "x = 5, x = 7")
    if form.number is not None:
        candidate = strip_unit_tail(candidate)
    if not candidate:
        return WRONG
    if _same_spelling(candidate, form.text):
        return CORRECT
    if form.number is not None:
        number = parse_number(candidate)
        if number is not None:
            return CORRECT if numbers_equal(form.number, number) else WRONG
    if _explosive(candidate) and not _explosive(form.text):
        return WRONG
    return _SYMBOLIC, candidate, form


def judge(
    answer: str | None, gold, *, timeout_s: float = DEFAULT_TIMEOUT_S, wall_s: float | None = None
) -> str:
    """The status of ``answer`` against ``gold`` (a math gold); never raises. Every step runs under one
    budget: ``timeout_s`` CPU seconds of the grading thread and ``wall_s`` wall seconds (default
    ``deadline.wall_limit_s(timeout_s)``); a pair over it is ``timeout``."""
    try:
        if answer is None or not str(answer).strip():
            return NO_ANSWER
        answer = str(answer).strip()
        gold = normalise_gold(gold)
        if not can_interrupt():  # no signal reaches this thread: the cheap checks are bounded by the caps
            verdict = _cheap_verdict(answer, gold)
            return verdict if isinstance(verdict, str) else _judge_in_helper_process(answer, gold, timeout_s)
        wall_s = wall_limit_s(timeout_s) if wall_s is None else wall_s
        cpu0, wall0 = time.thread_time(), time.monotonic()
        with cpu_deadline(timeout_s, wall_s):
            verdict = _cheap_verdict(answer, gold)
        if isinstance(verdict, str):
            return verdict
        warm_up()  # once per process, outside any budget: a cold process must not spend it on imports
        _, candidate, form = verdict
        spent_cpu, spent_wall = time.thread_time() - cpu0, time.monotonic() - wall0
        with cpu_deadline(max(timeout_s - spent_cpu, 0.0), max(wall_s - spent_wall, 0.0)):
            return CORRECT if _symbolic_equal(candidate, form) else WRONG
    except GradingTimeout:
        return TIMEOUT
    except Exception:  # noqa: BLE001 - a grader never raises; a broken answer is a wrong answer
        return WRONG


def verify_answer(answer: str | None, gold, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """True when ``answer`` equals ``gold`` (a timeout is not a yes)."""
    return judge(answer, gold, timeout_s=timeout_s) == CORRECT


def is_kk_gold(gold) -> bool:
    """K&K golds are (solution booleans, names); math golds are strings or numbers."""
    return isinstance(gold, (tuple, list)) and len(gold) == 2 and not isinstance(gold[0], str)


def extract_within(completion: str | None, *, timeout_s: float, wall_s: float | None = None, extract=None):
    """(answer, CPU seconds spent, wall seconds spent) of ``extract`` (default ``extract_answer``) under the
    pair's budget; the answer is ``TIMEOUT_ANSWER`` when extraction ran out of it."""
    read = extract or extract_answer
    cpu0, wall0 = time.thread_time(), time.monotonic()
    try:
        if not can_interrupt():
            answer = read(completion)
        else:
            with cpu_deadline(timeout_s, wall_limit_s(timeout_s) if wall_s is None else wall_s):
                answer = read(completion)
    except GradingTimeout:
        answer = TIMEOUT_ANSWER
    return answer, time.thread_time() - cpu0, time.monotonic() - wall0


TIMEOUT_ANSWER = "\x00timeout\x00"  # extract_within's answer for an extraction over budget (never a real one)


def judge_rest(answer, gold, timeout_s: float, wall_s: float | None, spent: tuple[float, float]) -> str:
    """``judge`` of an answer ``extract_within`` returned, with what extraction spent taken off the budget."""
    if answer == TIMEOUT_ANSWER:
        return TIMEOUT
    wall_s = wall_limit_s(timeout_s) if wall_s is None else wall_s
    return judge(answer, gold, timeout_s=max(timeout_s - spent[0], 0.0), wall_s=max(wall_s - spent[1], 0.0))


def grade(
    completion: str | None, gold, *, timeout_s: float = DEFAULT_TIMEOUT_S, wall_s: float | None = None
) -> Grade:
    """Extract the final answer of ``completion`` and grade it against ``gold`` (math or K&K), extraction
    and judgement under one budget (``judge``)."""
    if is_kk_gold(gold):
        return _grade_kk(completion, gold, timeout_s, wall_s)
    with armed(timeout_s):  # one arming for the pair's two or three deadlines
        answer, cpu, wall = extract_within(completion, timeout_s=timeout_s, wall_s=wall_s)
        status = judge_rest(answer, gold, timeout_s, wall_s, (cpu, wall))
    return Grade(None if answer == TIMEOUT_ANSWER else answer, status)


def _grade_kk(completion, gold, timeout_s: float, wall_s: float | None) -> Grade:
    solution, names = gold
    if not completion or len(solution) != len(names) or not names:
        return Grade(None, NO_ANSWER)
    try:
        with cpu_deadline(timeout_s, wall_s) if can_interrupt() else contextlib.nullcontext():
            said = kk_read(completion, names)
    except GradingTimeout:
        return Grade(None, TIMEOUT)
    if not said:
        return Grade(None, NO_ANSWER)
    right = all(said.get(n) is bool(k) for n, k in zip(names, solution))
    return Grade(format_assignments(said, names), CORRECT if right else WRONG)


def grade_completion(completion: str | None, gold, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Extract the final answer of a completion and verify it against ``gold``."""
    return grade(completion, gold, timeout_s=timeout_s).correct


# ----------------------------------------------------------------------------------------------- math-verify
@functools.lru_cache(maxsize=1)
def _extraction_configs():
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    latex = LatexExtractionConfig(
        normalization_config=NormalizationConfig(
            basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all", equations=False
        )
    )
    return (latex,), (ExprExtractionConfig(),)


def _parse(text: str) -> list:
    """math-verify's reading of ``text`` as LaTeX; as a plain expression ("1/2") only when it holds no LaTeX
    command: on LaTeX the expression reader finds some number inside (``\\frac{1}{3} E_{1}+...`` -> 2/3)."""
    import sympy
    from math_verify import parse

    latex, plain = _extraction_configs()
    parsed = parse(f"\\boxed{{{text}}}", extraction_config=latex, parsing_timeout=None)
    if not any(isinstance(p, sympy.Basic) for p in parsed) and "\\" not in text:
        parsed = parse(text, extraction_config=plain, parsing_timeout=None) + parsed
    return parsed


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold_text: str) -> tuple:
    # Cached: every sample of a problem shares its gold. Only called under the deadline.
    return tuple(_parse(gold_text))


def _symbolic_equal(candidate: str, form: GoldForm) -> bool:
    from math_verify import verify

    gold_parsed = list(_parse_gold(form.text))
    parsed = _parse(candidate)
    if not gold_parsed or not parsed:
        return False
    gold_parsed, parsed = _aligned(gold_parsed, parsed)
    if form.number is not None and form.number.approximate:
        value = _numeric_value(parsed)
        return value is not None and value_equal(form.number, value)
    by_value = _equal_by_value(_first_expr(gold_parsed), _first_expr(parsed))
    if by_value is not None:
        return by_value
    if _surely_different(gold_parsed, parsed):
        return False
    return bool(verify(gold_parsed, parsed, timeout_seconds=None))


_VARIABLE = re.compile(r"[A-Za-z]+(?:_\{?[A-Za-z0-9]+\}?)?")  # x, p, alpha, r_0, E_{1}: a variable's name


def _surely_different(gold_parsed, parsed) -> bool:
    """Whether the gold and the answer, each one expression, cannot be equal: two constants whose values differ
    by more than 1e-6 of their size (math-verify's numeric test rounds to 6 places, and simplify does not change
    a value), or a constant against an expression that takes two different values at two points (no constant).
    Then math-verify's verdict is wrong without its simplify, which took half the CPU of the symbolic pairs of
    benchmarks/bench_grading.py (profiled; 138 ms for 478 against p - q). Expressions over the same variables
    were decided by ``_equal_by_value`` already; tests/grading/test_grading_shortcut.py checks that no verdict moves."""
    import sympy

    gold = [g for g in gold_parsed if isinstance(g, sympy.Basic)]
    answer = [a for a in parsed if isinstance(a, sympy.Basic)]
    if len(gold) != 1 or len(answer) != 1:
        return False
    gold, answer = gold[0], answer[0]
    if not (isinstance(gold, sympy.Expr) and isinstance(answer, sympy.Expr)):
        return False
    if gold.free_symbols and answer.free_symbols:
        return False
    if gold.free_symbols or answer.free_symbols:  # a constant against an expression: is the expression one?
        varying = gold if gold.free_symbols else answer
        if not all(_VARIABLE.fullmatch(s.name) for s in varying.free_symbols):
            return False  # \textbf{113} parses as a symbol named 113, which math-verify equates with 113
        first, second = (_value(varying, point) for point in _points(varying.free_symbols, 2))
        return first is not None and second is not None and abs(first - second) > 1e-6 * max(1.0, abs(first))
    g, a = _value(gold, {}), _value(answer, {})
    return g is not None and a is not None and abs(g - a) > 1e-6 * max(1.0, abs(g), abs(a))


def _aligned(gold_parsed: list, parsed: list) -> tuple[list, list]:
    """Both readings over the same symbols: a symbol of the answer becomes the gold's symbol of the same
    name (the parser gives symbols of complex-looking strings other assumptions), ``i`` is the imaginary
    unit when the gold uses it so, and a derivative or an unknown function's value is an unknown of its own:
    the parser reads ``dM/dt`` as the derivative of a *constant* M, which simplification turns into 0
    (making ``dM/dt = M^5`` equal to ``dM/dt = M^6``)."""
    import sympy
    from sympy.core.function import AppliedUndef

    def frozen(item):
        if not isinstance(item, sympy.Basic):
            return item
        if item.has(sympy.Derivative):
            item = item.replace(lambda e: isinstance(e, sympy.Derivative), lambda e: sympy.Symbol(f"D[{e}]"))
        if item.atoms(AppliedUndef):  # f(t), \theta(t), I(0): unknowns of their own, compared by name
            item = item.replace(lambda e: isinstance(e, AppliedUndef), lambda e: sympy.Symbol(str(e)))
        return item

    gold_parsed, parsed = [frozen(g) for g in gold_parsed], [frozen(p) for p in parsed]
    by_name = {}
    for item in gold_parsed:
        if isinstance(item, sympy.Basic):
            by_name.update({s.name: s for s in item.free_symbols if isinstance(s, sympy.Symbol)})
    imaginary = "i" in by_name

    def fix(item, is_gold: bool):
        if not isinstance(item, sympy.Basic):
            return item
        mapping = {}
        for s in item.free_symbols:
            if not isinstance(s, sympy.Symbol):
                continue
            if imaginary and s.name == "i":
                mapping[s] = sympy.I
            elif not is_gold and s.name in by_name and by_name[s.name] != s:
                mapping[s] = by_name[s.name]
        return item.xreplace(mapping) if mapping else item

    return [fix(g, True) for g in gold_parsed], [fix(p, False) for p in parsed]


def _first_expr(parsed):
    import sympy

    for item in parsed:
        if isinstance(item, sympy.Basic):
            return item
    return None


def _unwrap_assignment(expr):
    import sympy

    if isinstance(expr, sympy.Eq) and isinstance(expr.lhs, sympy.Symbol):
        return expr.rhs
    return expr


def _numeric_value(parsed) -> Fraction | None:
    import sympy

    expr = _first_expr(parsed)
    if expr is None:
        return None
    expr = _unwrap_assignment(expr)
    if not isinstance(expr, sympy.Expr) or expr.free_symbols:
        return None
    value = sympy.N(expr, 30)
    if not (value.is_real and value.is_finite):
        return None
    return Fraction(str(sympy.Float(value, 30)))


def _points(symbols, count: int, seed: int = 20240615) -> list[dict]:
    """Fixed pseudo-random points, every variable in [1.1, 2.9]: away from 0 and 1, positive as the physical
    quantities of Minerva are; fixed so that a verdict never depends on the run."""
    import sympy

    rng = random.Random(seed)
    order = sorted(symbols, key=lambda s: s.name)
    return [{s: sympy.Rational(rng.randint(110, 290), 100) for s in order} for _ in range(count)]


def _value(expr, point) -> complex | None:
    import sympy

    try:
        value = complex(sympy.N(expr.xreplace(point), 30))
    except (TypeError, ValueError, ArithmeticError):  # something that does not evaluate to a number
        return None
    return value if cmath.isfinite(value) else None


def _equal_by_value(gold, answer) -> bool | None:
    """Two expressions (or two equations) over the same variables, decided by evaluation; None when not
    applicable (numbers, sets, intervals, matrices, inequalities, different variables), left to math-verify.

    - expressions: equal iff equal at ``RANDOM_POINTS`` points (cheaper and more faithful than simplify:
      ``sqrt(r_0^2) = r_0`` for the positive quantities they stand for);
    - equations ``a = b`` and ``c = d``: equivalent iff ``(a - b) / (c - d)`` is a nonzero constant, or a
      monomial in the parameters (``LC v'' + v = v_i`` is ``v'' + v/(LC) = v_i/(LC)``); a derivative or an
      unknown function may not be in that factor.
    """
    import sympy

    if gold is None or answer is None:
        return None
    if not isinstance(gold, sympy.Eq):
        answer = _unwrap_assignment(answer)
    elif not isinstance(answer, sympy.Eq):
        gold = _unwrap_assignment(gold)
    equations = isinstance(gold, sympy.Eq) and isinstance(answer, sympy.Eq)
    if equations and not all(
        isinstance(side, sympy.Expr) for eq in (gold, answer) for side in (eq.lhs, eq.rhs)
    ):
        return None  # x \in [-2, 7] reads as an equation with a set on one side
    if equations:
        gold, answer = gold.lhs - gold.rhs, answer.lhs - answer.rhs
    if not (isinstance(gold, sympy.Expr) and isinstance(answer, sympy.Expr)):
        return None
    symbols = gold.free_symbols
    if not symbols or {s.name for s in symbols} != {s.name for s in answer.free_symbols}:
        return None
    if not equations:
        for point in _points(symbols, RANDOM_POINTS):
            g, a = _value(gold, point), _value(answer, point)
            if g is None or a is None:
                return None
            if abs(g - a) > 1e-9 * max(1.0, abs(g), abs(a)):
                return False
        return True
    return _proportional(gold, answer, symbols)


def _proportional(gold, answer, symbols) -> bool | None:
    """Whether gold = k * answer with k a nonzero constant times a monomial in the parameters."""

    def ratio(point):
        g, a = _value(gold, point), _value(answer, point)
        if g is None or a is None or abs(a) < 1e-12 or abs(g) < 1e-12:
            return None
        return g / a

    base = _points(symbols, 1)[0]
    r0 = ratio(base)
    if r0 is None:
        return None
    exponents = {}
    for s in sorted(symbols, key=lambda s: s.name):  # the factor's power of s: double s, watch the ratio
        r1 = ratio({**base, s: base[s] * 2})
        if r1 is None:
            return None
        k = math.log2(abs(r1 / r0))
        if abs(k - round(k)) > 1e-6 or abs(round(k)) > 4 or (round(k) and not _parameter(s)):
            return False
        exponents[s] = round(k)
    for point in _points(symbols, RANDOM_POINTS, seed=7):  # the monomial model must hold everywhere
        r = ratio(point)
        if r is None:
            return None
        model = r0
        for s, k in exponents.items():
            model *= (point[s] / base[s]) ** k
        if abs(r - complex(model)) > 1e-9 * max(1.0, abs(r)):
            return False
    return True


def _parameter(symbol) -> bool:
    """A symbol an equation may be multiplied through by: not a derivative or an unknown function."""
    return not symbol.name.startswith("D[") and "(" not in symbol.name


# Every parser and simplifier path the bundled golds take: run once per process, outside any deadline, so
# that a cold process spends on a pair what a warm one does (imports, grammar, sympy's lazily built tables).
WARM_UP_PAIRS = (
    ("\\frac{1}{2}", "0.5"),
    ("3\\sqrt{13}", "\\sqrt{117}"),
    ("\\frac{3\\sqrt{3}}{4}", "\\frac34\\sqrt3"),
    ("288 \\pi", "\\pi \\cdot 288"),
    ("(3,4]", "(3, 4]"),
    ("(0,9) \\cup (9,36)", "(0,9)\\cup(9,36)"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("\\{1\\pm\\sqrt{5},-2\\}", "-2, 1+\\sqrt5, 1-\\sqrt5"),
    (
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}",
        "\\begin{pmatrix} -\\frac13 \\\\ \\frac23 \\end{pmatrix}",
    ),
    ("y = 2x + 3", "y = 3 + 2x"),
    ("5x - 7y + 11z + 4 = 0", "5x-7y+11z=-4"),
    ("6 - 5i", "-5i + 6"),
    ("\\cot x", "\\frac{\\cos x}{\\sin x}"),
    ("-\\tau \\ln \\Delta", "\\tau \\ln(1/\\Delta)"),
    ("\\frac{1}{2a}(\\exp{a*t} - \\exp{-a*t})", "\\frac{\\sinh(at)}{a}"),
    ("e^{t} / 3", "\\frac{e^t}{3}"),
    ("\\sqrt{4 \\pi G \\rho_{0} r_{0}^{2}}", "2 r_0 \\sqrt{\\pi G \\rho_0}"),
    ("MR=SRMC", "SRMC = MR"),
    ("\\frac{dM}{dt}=\\frac{L}{c^{2}} M^{6}", "\\frac{dM}{dt} = \\frac{L M^6}{c^2}"),
    ("I(0) e^{-t}", "I(0)e^{-t}"),
    (
        "x_{0} \\cos (\\omega t)+\\dot{x}_{0} \\sin (\\omega t)",
        "\\dot{x}_0 \\sin(\\omega t) + x_0 \\cos(\\omega t)",
    ),
    ("\\frac{4 A}{3+3 i} e^{i t}", "\\frac{2A(1-i)}{3} e^{it}"),
    ("\\arcsin(10/13)", "\\sin^{-1}(10/13)"),
    ("4.5\\times 10^{33}", "\\frac{9}{2} \\cdot 10^{33}"),
    ("E_{1},E_{2}", "E_2, E_1"),
    ("52_8", "52_{8}"),
    ("x^5 - x^4 + x - 1", "-1 + x - x^4 + x^5"),
    ("(a+5)(b+2)", "(b+2)(a+5)"),
    ("25\\%", "25"),
)


@functools.lru_cache(maxsize=1)
def warm_up() -> bool:
    """Build math-verify's parsers and sympy's caches once per process (seconds, cold; never timed)."""
    from math_verify import parse, verify

    verify(
        parse("$\\frac{1}{2}$", parsing_timeout=None),
        parse("$0.5$", parsing_timeout=None),
        timeout_seconds=None,
    )
    for gold, answer in WARM_UP_PAIRS:
        with contextlib.suppress(Exception):  # a warm-up pair that fails still warmed what it reached
            _symbolic_equal(normalise_math(answer), gold_form(normalise_gold(gold)))
    return True


# ----------------------------------------------------------------------------------------------- off the main thread
_helper_pool = None
_helper_lock = threading.Lock()


def _judge_in_helper_process(answer: str, gold: str, timeout_s: float) -> str:
    """Off the main thread no signal can reach us: a helper process (its own main thread) grades."""
    global _helper_pool
    import concurrent.futures as cf
    import multiprocessing as mp

    with _helper_lock:
        if _helper_pool is None:
            _helper_pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("forkserver"))
            # Shut it down before interpreter teardown, when its manager thread would find modules gone.
            atexit.register(_helper_pool.shutdown, wait=False, cancel_futures=True)
        pool = _helper_pool
    try:
        return pool.submit(judge, answer, gold, timeout_s=timeout_s).result(
            timeout=wall_limit_s(timeout_s) + 60
        )
    except Exception:  # noqa: BLE001 - a lost helper is not a verdict
        return TIMEOUT


# ----------------------------------------------------------------------------------------------- identity
@functools.lru_cache(maxsize=1)
def grader_fingerprint() -> str:
    """Identifies the grading rules: this package's sources and the parser versions (stored with results)."""
    from importlib import metadata

    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for package in ("math-verify", "latex2sympy2_extended", "sympy"):
        try:
            digest.update(f"{package}=={metadata.version(package)}\0".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{package}==?\0".encode())
    return digest.hexdigest()[:16]
