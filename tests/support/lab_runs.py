"""A small lab of runs for the lab-statistics tests (sage_unsloth.report.compare.RunCounts): each run's solved
counts per problem out of 4 samples."""

import numpy as np

from sage_unsloth.report import compare as C


def lab(**c_by_run) -> C.RunCounts:
    problems = [f"p{i}" for i in range(len(next(iter(c_by_run.values()))))]
    return C.RunCounts(
        problems,
        {r: np.full(len(problems), 4) for r in c_by_run},
        {r: np.array(c) for r, c in c_by_run.items()},
    )
