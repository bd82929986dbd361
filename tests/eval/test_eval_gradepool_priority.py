"""Grading workers yield the CPU to the sampler: they run niced by WORKER_NICE (verdicts use CPU-time budgets,
so priority cannot change them)."""

import os

from sage_unsloth.eval.gradepool import WORKER_NICE, GradingPool

ITEMS = [(f"<SOLUTION>{i}</SOLUTION>", str(i % 7)) for i in range(64)]  # past the inline threshold: the pool


def _worker_nice(pool) -> list[int]:
    return [os.getpriority(os.PRIO_PROCESS, w.process.pid) for w in pool._workers if w.process.is_alive()]


def test_workers_run_nicer_than_the_run():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with GradingPool(workers=1, warm_up=False) as pool:
        pool.grade(ITEMS)
        assert _worker_nice(pool) == [min(19, base + WORKER_NICE)]
    with GradingPool(workers=1, warm_up=False, nice=0) as pool:
        pool.grade(ITEMS)
        assert _worker_nice(pool) == [base]
