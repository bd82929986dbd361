"""The lab's power planner: the exact variance of the unbiased pass@k estimator against simulation, and the MDE."""

from math import comb

import numpy as np
import pytest
from scipy import stats

from sage_unsloth.demo.power_plan import estimator_variance, mde


@pytest.mark.parametrize(("p", "n", "k"), [(0.02, 64, 64), (0.02, 256, 64), (0.1, 64, 16), (0.5, 16, 1)])
def test_estimator_variance_matches_simulation(p, n, k):
    rng = np.random.default_rng(0)
    c = rng.binomial(n, p, size=200_000)
    # the estimator written out from Chen et al. (arXiv 2107.03374), independently of the planner
    values = np.array([1.0 - comb(n - x, k) / comb(n, k) for x in range(n + 1)])[c]
    assert estimator_variance(p, n, k) == pytest.approx(values.var(), rel=0.03)


def test_variance_falls_as_n_grows_past_k():
    assert estimator_variance(0.02, 256, 64) < 0.7 * estimator_variance(0.02, 64, 64)


def test_mde_is_t_quantiles_times_se():
    assert mde(0.01, 10) == pytest.approx((stats.t.ppf(0.975, 9) + stats.t.ppf(0.8, 9)) * 0.01)
    assert mde(0.01, 10) == pytest.approx(0.03145, abs=1e-4)  # 2.262 + 0.883 = 3.145 (t tables)
