"""Grading workers yield the CPU to the sampler: they run niced by WORKER_NICE (verdicts use CPU-time budgets,
so priority cannot change them), and ``start`` spawns them before the first chunk needs them."""

import os

from sage_unsloth.eval.gradepool import WORKER_NICE, GradingPool


def test_workers_run_nicer_than_the_run_and_start_early():
    expected = min(19, os.nice(0) + WORKER_NICE)
    with GradingPool(workers=1) as pool:
        pool.start()
        assert pool._pool is not None and len(pool._pool._processes) == 1  # spawned before any grading
        assert pool._executor().submit(os.nice, 0).result() == expected
    with GradingPool(workers=1, nice=0) as pool:
        assert pool._executor().submit(os.nice, 0).result() == os.nice(0)
