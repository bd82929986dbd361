"""The demo's synthetic verifiable task: add four numbers, by one of five plans named in the first word.

A problem reads ``What is 5+8+6+7?``; its gold answer is the sum (``26``). The working out starts with
the plan's name, one word, then three additions, one per line, each ``x+y=z``:

==========  ==========================================  =============================
plan        order of the additions                        working for 5+8+6+7
==========  ==========================================  =============================
``left``    a+b, then + c, then + d (running total)      ``5+8=13`` ``13+6=19`` ``19+7=26``
``right``   d+c, then + b, then + a                      ``7+6=13`` ``13+8=21`` ``21+5=26``
``middle``  b+c, then + a, then + d                      ``8+6=14`` ``14+5=19`` ``19+7=26``
``pairs``   a+b and c+d, then their sum                  ``5+8=13`` ``6+7=13`` ``13+13=26``
``outer``   a+d and b+c, then their sum                  ``5+7=12`` ``8+6=14`` ``12+14=26``
==========  ==========================================  =============================

Every plan is valid and reaches the right sum; they differ from the first token of the working on (the
plan word, one token of the demo tokenizer each), so the *branch point* of a completion is that token and
its label is known by rule (:func:`label_strategy`). The SFT data uses them at 74/9/5/3/9 (``left``
common, the pair plans rarest; :mod:`sage_unsloth.demo.data`), so the SFT policy's entropy at the branch
point is high (the data's plan distribution has 0.91 nats) while the arithmetic after it is close to
deterministic.

Numbers are 5..9 by default, so that every partial sum has two digits: each line then has the same
length whatever the numbers, and every number the model copies sits at a fixed distance from where it is
written, which a two-layer model learns in a few hundred steps (with numbers 1..9 and one- or two-digit
partial sums it had not learned to copy after 800; measured).
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass

from ..data.prompts import REASONING_END, REASONING_START, SOLUTION_END, SOLUTION_START, format_completion

N_TERMS = 4
RUN, FIRST, SECOND = "run", "first", "second"  # operands that refer to earlier lines' results
# plan -> the three additions: indices into the problem's numbers, or references to earlier results
PLANS: dict[str, tuple[tuple[int | str, int | str], ...]] = {
    "left": ((0, 1), (RUN, 2), (RUN, 3)),
    "right": ((3, 2), (RUN, 1), (RUN, 0)),
    "pairs": ((0, 1), (2, 3), (FIRST, SECOND)),
    "outer": ((0, 3), (1, 2), (FIRST, SECOND)),
    "middle": ((1, 2), (RUN, 0), (RUN, 3)),
}
STRATEGIES = tuple(PLANS)
COMMON = "left"
OTHER = "other"
STRATEGY_NAMES = {
    "left": "running total, left to right",
    "right": "running total, right to left",
    "pairs": "two pairs, then their sum",
    "outer": "outer and inner pair, then their sum",
    "middle": "middle pair first, then the ends",
    OTHER: "other / malformed",
}


@dataclass(frozen=True)
class SumTask:
    """Problems are all 4-tuples of integers in [low, high]; 2 * low >= 10 keeps partial sums two-digit."""

    low: int = 5
    high: int = 9

    def __post_init__(self):
        if not 0 <= self.low <= self.high:
            raise ValueError(f"low={self.low}, high={self.high}: need 0 <= low <= high")
        if 2 * self.low < 10:
            raise ValueError(
                f"low={self.low}: use at least 5 so that every partial sum has two digits "
                "(fixed-width lines; see the module doc)"
            )
        if N_TERMS * self.high >= 100:
            raise ValueError(f"high={self.high}: keep the sum of {N_TERMS} numbers below 100")

    def all_problems(self) -> list[tuple[int, ...]]:
        """Every problem of the task, in a fixed (lexicographic) order."""
        return list(itertools.product(range(self.low, self.high + 1), repeat=N_TERMS))


def problem_text(numbers: tuple[int, ...]) -> str:
    return "What is " + "+".join(map(str, numbers)) + "?"


_PROBLEM_RE = re.compile(r"What is (\d+(?:\+\d+)+)\?")


def parse_problem(text: str) -> tuple[int, ...]:
    """The numbers of a problem (also when wrapped in the evaluator's user template)."""
    match = _PROBLEM_RE.search(text)
    if match is None:
        raise ValueError(f"not a demo problem: {text[:80]!r}")
    return tuple(int(x) for x in match.group(1).split("+"))


def gold_answer(numbers: tuple[int, ...]) -> str:
    return str(sum(numbers))


def additions(strategy: str, numbers: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """The plan's three additions (x, y, x + y) for ``numbers``."""
    if len(numbers) != N_TERMS:
        raise ValueError(f"{numbers}: the demo adds {N_TERMS} numbers")
    results: list[int] = []
    steps = []
    for left, right in PLANS[strategy]:
        x, y = (_operand(ref, numbers, results) for ref in (left, right))
        results.append(x + y)
        steps.append((x, y, x + y))
    return steps


def _operand(ref: int | str, numbers: tuple[int, ...], results: list[int]) -> int:
    if ref == RUN:
        return results[-1]
    if ref == FIRST:
        return results[0]
    if ref == SECOND:
        return results[1]
    return numbers[ref]


def working(strategy: str, numbers: tuple[int, ...]) -> str:
    """The plan word, then one ``x+y=z`` line per addition."""
    return "\n".join([strategy, *(f"{x}+{y}={z}" for x, y, z in additions(strategy, numbers))])


def solution(numbers: tuple[int, ...], strategy: str) -> str:
    """The full completion the SFT stage teaches for ``strategy`` (kit format)."""
    return format_completion(working(strategy, numbers), gold_answer(numbers))


# --- the base model's gap ---------------------------------------------------------------------------
# The pre-training never shows a two-digit number plus a one-digit number whose ones digits add up to
# one of GAP_ONES_SUMS (13+9, 24+8, 15+7, ...), and the SFT data never uses a plan on a problem where it would need
# one. The running-total plans (left, right, middle) each need such a step on 22% of the problems, all three
# on 10%; the pair plans (pairs, outer) never do (their steps add one-digit to one-digit and two-digit to two-digit
# numbers). So on those problems the common plan is unreliable and the rare pair plans are not: which plan a
# policy keeps decides which problems it can still solve (the support that pass@k at large k measures).
# Measured: with (11, 12) the gap hits 43% of the problems, SFT pass@1 falls to 0.44 and GRPO switches the
# common plan to pairs (0.87 of the completions); with (12,) the common plan stays common and GRPO shrinks the
# pair plans instead, the setting in which an anchor that keeps the plan prior could matter.
GAP_ONES_SUMS = (12,)


def in_gap(x: int, y: int) -> bool:
    """Whether the addition x + y is one the base model never saw (see GAP_ONES_SUMS)."""
    return x >= 10 and y < 10 and x % 10 + y in GAP_ONES_SUMS


def plan_needs_gap(strategy: str, numbers: tuple[int, ...]) -> bool:
    return any(in_gap(x, y) for x, y, _ in additions(strategy, numbers))


# --- labelling -------------------------------------------------------------------------------------
_LINE = re.compile(r"(\d+)\+(\d+)=(\d+)")


def extract_working(completion: str) -> str | None:
    """The text between the reasoning markers; None when the block is not closed.

    Completions sampled after the kit's generation prompt do not repeat ``<start_working_out>``
    (it ends the prompt); a leading one is accepted and stripped.
    """
    text = completion.lstrip()
    text = text.removeprefix(REASONING_START)
    if REASONING_START in text or REASONING_END not in text:
        return None
    return text.split(REASONING_END, 1)[0].strip()


def label_strategy(completion: str) -> str:
    """One of :data:`STRATEGIES` or ``"other"`` for one completion, by these rules:

    1. The working out is the text before the first ``<end_working_out>`` (a leading
       ``<start_working_out>`` is ignored). No ``<end_working_out>``, or a second
       ``<start_working_out>`` -> ``other``.
    2. Split it into lines (each stripped, empty lines dropped). The first line must be a plan word
       (``left``, ``right``, ``pairs``, ``outer``, ``middle``), followed by exactly three lines
       ``x+y=z`` (digits only).
    3. The lines must have the plan's shape: for ``left``, ``right`` and ``middle`` the second and third
       lines start from the result written on the line before; for ``pairs`` and ``outer`` the third line
       adds the results written on the first two lines.
    4. Anything else -> ``other``. Wrong arithmetic, or a number not copied right from the problem,
       does not change the label (correctness is graded separately): the label says which plan the
       completion carried out, as written.
    """
    text = extract_working(completion)
    if text is None:
        return OTHER
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 4 or lines[0] not in PLANS:
        return OTHER
    matches = [_LINE.fullmatch(line) for line in lines[1:]]
    if not all(matches):
        return OTHER
    values = [tuple(int(g) for g in m.groups()) for m in matches]
    results = [z for _, _, z in values]
    for (ref_x, ref_y), (x, y, _), index in zip(PLANS[lines[0]], values, range(3)):
        for ref, value in ((ref_x, x), (ref_y, y)):
            if ref == RUN and value != results[index - 1]:
                return OTHER
            if ref == FIRST and value != results[0]:
                return OTHER
            if ref == SECOND and value != results[1]:
                return OTHER
    return lines[0]


def extract_answer(completion: str) -> str | None:
    """The text inside the first ``<SOLUTION>...</SOLUTION>``, or None.

    A missing ``</SOLUTION>`` is accepted at the very end of the text: the samplers stop on it and
    drop it (vLLM's default, mirrored by the kit's HF sampler).
    """
    start = completion.find(SOLUTION_START)
    if start < 0:
        return None
    rest = completion[start + len(SOLUTION_START) :]
    end = rest.find(SOLUTION_END)
    return (rest if end < 0 else rest[:end]).strip()


def is_correct(completion: str, gold: str) -> bool:
    """Exact integer match of the solution block (the demo's own fast check; the kit grades with
    math-verify, which agrees on these plain integers)."""
    answer = extract_answer(completion)
    return answer is not None and answer.isdigit() and int(answer) == int(gold)


def split_problems(task: SumTask, *, seed: int, n_eval: int, n_rl: int) -> dict[str, list[tuple[int, ...]]]:
    """Disjoint eval / RL / SFT problem sets from one seeded shuffle of every problem of the task."""
    problems = task.all_problems()
    if n_eval + n_rl >= len(problems):
        raise ValueError(f"n_eval + n_rl = {n_eval + n_rl} leaves no SFT problems out of {len(problems)}")
    random.Random(seed).shuffle(problems)
    return {
        "eval": problems[:n_eval],
        "rl": problems[n_eval : n_eval + n_rl],
        "sft": problems[n_eval + n_rl :],
    }
