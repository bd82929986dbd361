"""The regression corpus: every slow or wrong input found (by hand, by issue 30's adversarial run, by the
Hypothesis suite), with its expected verdict. Every ``grade`` over it gives that verdict and stays within
its budget (CPU of this thread; the budget plus one deadline tick).

Measured maximum over the corpus (2026-12-02, warmed-up process, default 10 s budget, on a loaded 2-core
machine): MAX_MEASURED_CPU_S below (0.11 CPU s against a 10 s budget); before the fix the unit tail x24 never returned and the explosive
shapes took the whole budget or more.
"""

import json
import time
from pathlib import Path

import pytest

from sage_unsloth import grading

CORPUS = Path(__file__).parents[1].joinpath("data") / "grader_regressions.jsonl"
ROWS = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
MAX_MEASURED_CPU_S = (
    0.1115  # the slowest row (budget 10 s; 0.0016 s with budget 1 s), CPU s when last measured
)


def test_the_corpus_holds_every_issue_30_class():
    reasons = " ".join(r["why"] for r in ROWS)
    for word in ("unit tail", "explosive", "hedge", "bold"):
        assert word in reasons


@pytest.mark.parametrize("budget", [grading.DEFAULT_TIMEOUT_S, 1.0])
def test_every_corpus_row_keeps_its_verdict_within_its_budget(budget):
    grading.warm_up()
    slowest = 0.0
    for row in ROWS:
        start = time.thread_time()
        result = grading.grade(row["completion"], row["gold"], timeout_s=budget)
        spent = time.thread_time() - start
        slowest = max(slowest, spent)
        assert result.status == row["expected"], (row, result)
        assert spent <= budget + budget / 20 + 0.25, (row, spent)
    print(f"slowest corpus row: {slowest:.4f} CPU s (budget {budget} s)")
