"""A verdict is a function of (gold, completion) alone: the same labelled cases graded in this process
(cold, then warm with every parse cached), in a pool of 1 and of 2 fresh workers (cold, another hash
seed), and in a pool while a busy-loop process runs on every core, give identical statuses; a pair out of budget is ``timeout`` (never
``wrong``) and the serial retry with the larger budget gives the verdict an unhurried grading gives."""

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from sage_unsloth import grading
from sage_unsloth.eval.benchmarks import load_benchmark
from sage_unsloth.eval.gradepool import GradingPool, retry_timeouts

CASES = Path(__file__).parents[1].joinpath("fixtures") / "grading_cases.jsonl"
HEAVY = {
    "symbolic",
    "equation",
    "complex",
    "trailing variable",
    "unparsable gold",
    "interval",
    "matrix",
    "set",
}


@pytest.fixture(scope="module")
def items():
    """The costliest kinds of the labelled set (long symbolic Minerva answers), plus a spread of the rest."""
    cases = [json.loads(line) for line in CASES.read_text(encoding="utf-8").splitlines()]
    heavy = [c for c in cases if c["category"] in HEAVY][::12]
    rest = [c for c in cases if c["category"] not in HEAVY][::60]
    problems = {(n, p.problem_id): p for n in {c["benchmark"] for c in cases} for p in load_benchmark(n)}
    out = []
    for c in heavy + rest:
        p = problems[(c["benchmark"], c["problem_id"])]
        out.append((c["completion"], (p.kk_solution, p.kk_names) if p.is_kk else p.gold))
    return out


def _spin(stop):
    while not stop.is_set():
        pass


@pytest.mark.slow
def test_same_statuses_in_process_in_pools_of_one_and_two_and_under_saturation(items):
    in_process = [grading.grade(c, g).status for c, g in items]
    warm = [grading.grade(c, g).status for c, g in items]  # again: every parse now cached in this process
    with GradingPool(workers=1, inline_threshold=0) as pool:
        one = [g.status for g in pool.grade(items)]
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    spinners = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
    for p in spinners:
        p.start()
    try:
        with GradingPool(workers=2, inline_threshold=0, chunk=8) as pool:
            saturated = [g.status for g in pool.grade(items)]
    finally:
        stop.set()
        for p in spinners:
            p.join(10)
    with GradingPool(workers=2, inline_threshold=0, chunk=8) as pool:
        two = [g.status for g in pool.grade(items)]
    assert len(items) >= 40 and grading.TIMEOUT not in in_process
    assert {"correct", "wrong"} <= set(in_process)
    assert warm == in_process
    assert one == in_process
    assert two == in_process
    assert saturated == in_process


def test_a_pair_out_of_budget_is_a_timeout_and_the_retry_settles_it(items):
    heavy = [(c, g) for c, g in items if not grading.is_kk_gold(g)][:12]
    expected = [grading.grade(c, g).status for c, g in heavy]
    rushed = [grading.grade(c, g, timeout_s=1e-5) for c, g in heavy]
    assert grading.TIMEOUT in {g.status for g in rushed}
    assert grading.WRONG not in {g.status for g, e in zip(rushed, expected) if e == grading.CORRECT}
    settled, retried = retry_timeouts(heavy, rushed, timeout_s=grading.RETRY_TIMEOUT_S)
    assert retried >= 1 and [g.status for g in settled] == expected
    still, _ = retry_timeouts(
        heavy, rushed, timeout_s=1e-5
    )  # a retry budget that is too small stays unresolved
    assert grading.TIMEOUT in {g.status for g in still}


def test_a_pair_whose_extraction_ran_out_of_budget_is_read_again_by_the_retry():
    """A timeout during extraction leaves no answer: the retry reads the completion again under its budget, instead
    of judging "no answer" and counting a right completion wrong (stage 3's end-of-run retry; a 1e-6 s budget in
    tests/eval/test_eval.py's rushed run met it only when extraction did not finish within a timer tick)."""
    items = [("so the total is <SOLUTION>8</SOLUTION>", "8"), ("<SOLUTION>7</SOLUTION>", "8")]
    rushed = [grading.Grade(None, grading.TIMEOUT), grading.Grade("7", grading.TIMEOUT)]
    settled, retried = retry_timeouts(items, rushed, timeout_s=grading.RETRY_TIMEOUT_S)
    assert [g.status for g in settled] == [grading.CORRECT, grading.WRONG] and retried == 2
    assert settled[0].answer == "8"
