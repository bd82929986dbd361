"""The tests' own exact MDE, written from the definition and not from sage_unsloth/report/power.py: the effect
whose two-sided 0.05 t-test has power 0.8, by bisection on scipy's noncentral t."""

import numpy as np
from scipy import stats


def exact_mde(se: float, df: float) -> float:
    """The MDE at standard error ``se`` and ``df`` degrees of freedom (0 when there is no spread)."""
    crit = stats.t.ppf(0.975, df)

    def power(effect):
        # scipy's nct.cdf is NaN at a few far-tail points, where the term is below Phi(-effect / se) ~ 0
        return stats.nct.sf(crit, df, effect / se) + np.nan_to_num(stats.nct.cdf(-crit, df, effect / se))

    if se == 0:
        return 0.0  # no spread: any effect is seen
    low, high = 0.0, 40 * se
    for _ in range(60):  # 40 se / 2^60: far below the 1e-7 the tests compare at
        mid = (low + high) / 2
        low, high = (mid, high) if power(mid) < 0.8 else (low, mid)
    return (low + high) / 2
