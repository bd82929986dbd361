"""The demo's synthetic verifiable task: add a short list of one-digit numbers, two ways.

A problem reads ``What is 3+8+5+6?``; its gold answer is the sum (``22``). The working out is written
with one of two strategies whose surface forms differ from the very first token, so every completion
can be labelled by rule (see :func:`label_strategy`):

- ``A`` running total (common in the SFT data), one addition per line, each line starting from the
  previous result::

      3+8=11
      11+5=16
      16+6=22

- ``B`` pairing (rare in the SFT data): add adjacent pairs first, then add the partial sums::

      (3+8)+(5+6)
      =11+11
      =22

Numbers are written without spaces so that every number below 100 is one token of the demo tokenizer
(:mod:`sage_unsloth.demo.model`): each step is then a single-token lookup a tiny model can learn.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass

from ..prompts import REASONING_END, REASONING_START, SOLUTION_END, SOLUTION_START, format_completion

STRATEGIES = ("A", "B")
OTHER = "other"
STRATEGY_NAMES = {"A": "running total", "B": "pairing", OTHER: "other / malformed"}


@dataclass(frozen=True)
class SumTask:
    """Problems are all tuples of ``n_terms`` integers in [low, high]; sums stay below 100."""

    n_terms: int = 4
    low: int = 1
    high: int = 9

    def __post_init__(self):
        if self.n_terms < 3:
            raise ValueError(f"n_terms={self.n_terms}: use at least 3 so the two strategies differ")
        if not 0 <= self.low <= self.high:
            raise ValueError(f"low={self.low}, high={self.high}: need 0 <= low <= high")
        if self.n_terms * self.high >= 100:
            raise ValueError(f"n_terms * high = {self.n_terms * self.high}: keep every sum below 100 "
                             "(one token per number)")

    def all_problems(self) -> list[tuple[int, ...]]:
        """Every problem of the task, in a fixed (lexicographic) order."""
        return list(itertools.product(range(self.low, self.high + 1), repeat=self.n_terms))


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


def working_running_total(numbers: tuple[int, ...]) -> str:
    """Strategy A: ``a+b=s1``, ``s1+c=s2``, ... one line per addition."""
    lines, total = [], numbers[0]
    for x in numbers[1:]:
        lines.append(f"{total}+{x}={total + x}")
        total += x
    return "\n".join(lines)


def working_pairing(numbers: tuple[int, ...]) -> str:
    """Strategy B: ``(a+b)+(c+d)[+e]``, then ``=p+q[+e]``, then ``=sum``."""
    pairs = [numbers[i:i + 2] for i in range(0, len(numbers), 2)]
    grouped = "+".join(f"({p[0]}+{p[1]})" if len(p) == 2 else str(p[0]) for p in pairs)
    partial = "+".join(str(sum(p)) for p in pairs)
    return f"{grouped}\n={partial}\n={sum(numbers)}"


WORKING = {"A": working_running_total, "B": working_pairing}


def solution(numbers: tuple[int, ...], strategy: str) -> str:
    """The full completion the SFT stage teaches for ``strategy`` (kit format)."""
    return format_completion(WORKING[strategy](numbers), gold_answer(numbers))


# --- labelling -------------------------------------------------------------------------------------
# Rules (documented in label_strategy). Numbers may be any digits: the label says which strategy was
# attempted, not whether its arithmetic is right (correctness is graded separately).
_STEP_A = re.compile(r"\d+\+\d+=\d+")
_GROUPS_B = re.compile(r"(?:\(\d+\+\d+\)|\d+)(?:\+(?:\(\d+\+\d+\)|\d+))+")
_PARTIAL_B = re.compile(r"=\d+(?:\+\d+)+")
_TOTAL_B = re.compile(r"=\d+")


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
    """``"A"``, ``"B"`` or ``"other"`` for one completion, by these rules:

    1. The working out is the text before the first ``<end_working_out>`` (a leading
       ``<start_working_out>`` is ignored). No ``<end_working_out>``, or a second
       ``<start_working_out>`` -> ``other``.
    2. Split the stripped working into lines (each line stripped, empty lines dropped).
    3. ``A`` (running total): at least two lines, every line ``x+y=z`` (digits only), and each line
       after the first starts with the previous line's result ``z``.
    4. ``B`` (pairing): exactly three lines: ``(a+b)+(c+d)...`` (``+``-joined groups, each
       ``(x+y)`` or a bare number, at least one parenthesised pair), then ``=p+q...``, then ``=s``.
    5. Anything else -> ``other``. Arithmetic mistakes do not change the label.
    """
    working = extract_working(completion)
    if working is None:
        return OTHER
    lines = [line.strip() for line in working.splitlines() if line.strip()]
    if len(lines) >= 2 and all(_STEP_A.fullmatch(line) for line in lines):
        results = [line.split("=")[1] for line in lines]
        starts = [line.split("+")[0] for line in lines]
        if all(starts[i + 1] == results[i] for i in range(len(lines) - 1)):
            return "A"
        return OTHER
    if (len(lines) == 3 and _GROUPS_B.fullmatch(lines[0]) and "(" in lines[0]
            and _PARTIAL_B.fullmatch(lines[1]) and _TOTAL_B.fullmatch(lines[2])):
        return "B"
    return OTHER


def extract_answer(completion: str) -> str | None:
    """The text inside the first ``<SOLUTION>...</SOLUTION>``, or None.

    A missing ``</SOLUTION>`` is accepted at the very end of the text: the samplers stop on it and
    drop it (vLLM's default, mirrored by the kit's HF sampler).
    """
    start = completion.find(SOLUTION_START)
    if start < 0:
        return None
    rest = completion[start + len(SOLUTION_START):]
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
        "rl": problems[n_eval:n_eval + n_rl],
        "sft": problems[n_eval + n_rl:],
    }
