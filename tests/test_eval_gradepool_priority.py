"""Grading workers yield the CPU to the sampler: they run niced by WORKER_NICE (verdicts use CPU-time budgets,
so priority cannot change them)."""

import os

from sage_unsloth.eval.gradepool import WORKER_NICE, GradingPool


def test_workers_run_nicer_than_the_run():
    expected = min(19, os.nice(0) + WORKER_NICE)
    with GradingPool(workers=1) as pool:
        assert pool._executor().submit(os.nice, 0).result() == expected
    with GradingPool(workers=1, nice=0) as pool:
        assert pool._executor().submit(os.nice, 0).result() == os.nice(0)
