"""The power planner (sage_unsloth/report/power_plan.py): the exact variance of the unbiased pass@k estimator against
simulation, and the multi-draw plan's pooled variance and MDE (the exact one, report/power.py)."""

from math import comb

import numpy as np
import pytest
from power_oracle import exact_mde
from scipy import stats

from sage_unsloth.report.power_plan import estimator_variance


@pytest.mark.parametrize(("p", "n", "k"), [(0.02, 64, 64), (0.02, 256, 64), (0.1, 64, 16), (0.5, 16, 1)])
def test_estimator_variance_matches_simulation(p, n, k):
    rng = np.random.default_rng(0)
    c = rng.binomial(n, p, size=200_000)
    # the estimator written out from Chen et al. (arXiv 2107.03374), independently of the planner
    values = np.array([1.0 - comb(n - x, k) / comb(n, k) for x in range(n + 1)])[c]
    assert estimator_variance(p, n, k) == pytest.approx(values.var(), rel=0.03)


def test_variance_falls_as_n_grows_past_k():
    assert estimator_variance(0.02, 256, 64) < 0.7 * estimator_variance(0.02, 64, 64)


def test_a_multi_draw_plan_pools_the_within_draw_variance_and_projects_the_mde(tmp_path):
    """Two draws x 3 seeds of A and B, n = 256: at (k, n) = (64, 256) the projection keeps the observed variance
    (same n; the seeds' spread is far above the evaluation noise, so nothing is clipped at 0), which is the within-draw variance pooled over the draws (4 df), and the MDE at S seeds per draw is
    the exact noncentral-t MDE with 2 (S - 1) df at se = the pooled sd / sqrt(2 S) (the root found here by
    bisection on scipy's nct, apart from report/power.py's solver)."""
    import pandas as pd

    from sage_unsloth.report.power_plan import draw_plan
    from sage_unsloth.runtime.results import pass_at_k_matrix

    rng = np.random.default_rng(0)
    diffs = {}
    for draw in (0, 1):
        for seed in (0, 1, 2):
            for method in ("a", "b"):
                out = tmp_path / f"draw{draw}" / f"{method}_seed{seed}"
                out.mkdir(parents=True)
                scale = rng.uniform(0.2, 2.0)  # a training seed's own level: seed spread well above the noise
                c = rng.binomial(256, scale * rng.uniform(0.005, 0.05, 20))
                pd.DataFrame(
                    {"dataset": "demo", "problem_id": [f"p{i}" for i in range(20)], "n": 256, "c": c}
                ).to_csv(out / "per_problem.csv", index=False)
                diffs.setdefault((draw, seed), {})[method] = pass_at_k_matrix(np.full(20, 256), c, [64])[
                    :, 0
                ].mean()
    rows = draw_plan([tmp_path / "draw0", tmp_path / "draw1"], [("a", "b")])
    at = {(r["k"], r["seeds_per_draw"]): r for r in rows}
    d = {draw: [diffs[(draw, s)]["a"] - diffs[(draw, s)]["b"] for s in range(3)] for draw in (0, 1)}
    pooled = np.sqrt((np.var(d[0], ddof=1) + np.var(d[1], ddof=1)) / 2)
    row = at[(64, 5)]
    assert row["df_measured"] == 4 and row["sd"] == pytest.approx(pooled, rel=1e-9)
    assert row["mde"] == pytest.approx(exact_mde(pooled / np.sqrt(10), 8), rel=1e-6)
    assert row["sd_observed"] == pytest.approx(pooled, rel=1e-9)  # n = 256 observed: no projection
    assert row["sd_low"] < row["sd"] < row["sd_high"]
    assert row["sd_high"] == pytest.approx(pooled * np.sqrt(4 / stats.chi2.ppf(0.025, 4)))
    assert 0 < row["eval_share"] <= 1 and at[(64, 8)]["mde"] < row["mde"]
