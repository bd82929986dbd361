"""The frontier lab's pre-registered robust secondary: the Hodges-Lehmann estimate of a paired difference with
its exact interval, and the exact Wilcoxon signed-rank p-value (docs/lab-plan.md).

For N seed-level differences d_1..d_N the Walsh averages are (d_i + d_j) / 2 for i <= j (N (N + 1) / 2 of
them); the Hodges-Lehmann estimate is their median. Under the sharp null that the two arms are exchangeable
within a seed (same training seed, same SFT, arms swapped), each d_i is symmetric about 0 and the signed-rank
statistic W+ (the sum of the ranks of |d_i| over the positive d_i) has an exact null distribution: each of the
2^N sign patterns is equally likely. :func:`signed_rank_null` counts it by dynamic programming; the interval
inverts the test: [the (c + 1)-th smallest Walsh average, the (c + 1)-th largest], c the largest value with
P(W+ <= c) <= (1 - level) / 2 (Hollander and Wolfe, Nonparametric Statistical Methods, ch. 3). Its coverage of
the pseudo-median is exact for continuous, symmetric differences; it is robust to a few extreme seeds (a
collapsed run moves one rank, not the mean), which is why it stands beside the t-interval of the mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def signed_rank_null(n: int) -> np.ndarray:
    """counts[w] = the number of the 2^n sign patterns whose signed-rank sum W+ is w (w = 0 .. n (n + 1) / 2)."""
    counts = np.zeros(n * (n + 1) // 2 + 1, dtype=object)  # exact integers (2^n overflows float at n > 53)
    counts[0] = 1
    for rank in range(1, n + 1):
        shifted = np.zeros_like(counts)
        shifted[rank:] = counts[:-rank]
        counts = counts + shifted
    return counts


def walsh_averages(d: np.ndarray) -> np.ndarray:
    d = np.asarray(d, dtype=np.float64)
    i, j = np.triu_indices(len(d))
    return np.sort((d[i] + d[j]) / 2.0)


@dataclass(frozen=True)
class HodgesLehmann:
    estimate: float
    low: float
    high: float
    p: float  # exact two-sided Wilcoxon signed-rank p of 0
    level: float  # the interval's exact confidence (>= the asked level: the distribution is discrete)


def signed_rank_p(d: np.ndarray) -> float:
    """Exact two-sided p of the signed-rank test of symmetry about 0 (zeros dropped; ties by average ranks
    would need the permutation distribution: differences of continuous pass@k means do not tie)."""
    d = np.asarray(d, dtype=np.float64)
    d = d[d != 0]
    n = len(d)
    if n == 0:
        return 1.0
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    w_plus = int(ranks[d > 0].sum())
    counts = signed_rank_null(n)
    total = 2**n
    low = sum(counts[: w_plus + 1]) / total
    high = sum(counts[w_plus:]) / total
    return float(min(1.0, 2.0 * min(low, high)))


def hodges_lehmann(d, level: float = 0.95) -> HodgesLehmann:
    """The Hodges-Lehmann estimate of ``d`` (seed-level paired differences), its exact interval at >= level
    and the exact signed-rank p (see the module doc). Needs 6 differences or more for a 95% interval."""
    d = np.asarray(d, dtype=np.float64)
    n = len(d)
    walsh = walsh_averages(d)
    m = len(walsh)
    counts = signed_rank_null(n)
    cdf = np.cumsum(counts) / 2**n
    alpha = (1.0 - level) / 2.0
    below = np.flatnonzero(cdf <= alpha)
    if below.size == 0:
        raise ValueError(
            f"hodges_lehmann: {n} differences cannot give a {level:.0%} interval (need 6 or more)"
        )
    # P(W+ <= c) <= alpha: the interval runs from the (c + 1)-th smallest to the (c + 1)-th largest
    c = int(below[-1])
    exact = 1.0 - 2.0 * float(cdf[c])
    return HodgesLehmann(
        float(np.median(walsh)), float(walsh[c]), float(walsh[m - 1 - c]), signed_rank_p(d), exact
    )
