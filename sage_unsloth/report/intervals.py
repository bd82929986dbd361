"""Stage 4's intervals, the one module for them: a single run's score over problems, and a method's score
over training seeds (the multi-seed mode, sage_unsloth/report/compare.py, which the demo lab uses).

**One run** (the report's tables; :func:`bootstrap_mean_ci` and below). A benchmark score is the mean over
problems of a per-problem value (pass@k from (n, c)). Its sampling uncertainty is dominated by which problems
happen to be in the benchmark, so problems are resampled with replacement and the score recomputed (percentile
interval). Resampling is a (B, N) matrix of multiplicities, so all k are handled by one matrix product.

* Paired difference: both runs are scored with the SAME resampled problem multiplicities. The multiplicities
  depend only on (seed, set name, problem count), so two runs over the same problems always see the same draws,
  also across separate calls.
* Paper average (avg_paper): the mean of per-set scores; each set is resampled within itself (a stratified
  bootstrap), then the per-set means are averaged.

**Several training seeds** (:func:`estimate`; docs/lab.md, "Intervals and power"). The estimand: the mean over
a fixed problem set of the quantity, in expectation over training seeds and evaluation sampling. Each seed s
gives one value d_s, the mean over the problems of its row (for a paired comparison: of A - B, runs paired by
seed); the d_s are independent draws around the estimand, and there are few of them, so

- with S >= 2 seeds the interval is Student's t with S - 1 degrees of freedom over the d_s (``t(seed)``), the
  test is the one-sample t-test of mean 0, and the minimum detectable effect is that test's, by its exact power
  (sage_unsloth.report.power: the noncentral t, 80% power, two-sided 0.05, se = sd / sqrt(S)); evaluation
  noise needs no term of its own: it is inside each d_s;
- with one seed nothing measures the seed spread: the interval is a percentile bootstrap over the problems
  (``bootstrap(problem)``), which says how precisely this one seed's evaluation pinned its mean, not how a fresh
  seed would land; its test and MDE use the bootstrap standard error with normal quantiles.

:func:`stratified` pools seeds across strata (pre-training draws), :func:`hodges_lehmann` is the robust
secondary of a paired difference, :func:`holm` adjusts a family of p-values (Holm 1979), :func:`clopper_pearson`
is the exact interval of a count (collapsed runs).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from . import power
from .power import PAPER_EFFECT  # noqa: F401 - the effect every table's power is stated against

T_SEED = "t(seed)"
BOOTSTRAP_PROBLEM = "bootstrap(problem)"


# ------------------------------------------------------------- one run: the bootstrap over problems
DEFAULT_RESAMPLES = 2000


def problem_draws(n_problems: int, resamples: int, entropy: list[int]) -> np.ndarray:
    """(resamples, n_problems) indices of problems drawn with replacement, the same for the same ``entropy``:
    every bootstrap of this module draws its problems here."""
    return np.random.default_rng(entropy).integers(0, n_problems, size=(resamples, n_problems))


def resample_counts(
    n_problems: int, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0, stream: str = ""
) -> np.ndarray:
    """(resamples, n_problems) multiplicities of a with-replacement resample; deterministic per stream."""
    idx = problem_draws(n_problems, resamples, [seed, zlib.crc32(stream.encode()), n_problems])
    counts = np.zeros((resamples, n_problems), dtype=np.float64)
    np.add.at(counts, (np.repeat(np.arange(resamples), n_problems), idx.reshape(-1)), 1.0)
    return counts


def resampled_means(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Means of the (N,) or (N, K) per-problem ``values`` under each resample: (B,) or (B, K)."""
    return counts @ values / counts.shape[1]


def percentile_ci(samples: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    alpha = (1.0 - level) / 2.0
    return np.quantile(samples, alpha, axis=0), np.quantile(samples, 1.0 - alpha, axis=0)


def bootstrap_mean_ci(
    values: np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    stream: str = "",
    level: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile CI of the mean of per-problem ``values`` ((N,) or (N, K)) over problems."""
    values = np.asarray(values, dtype=np.float64)
    counts = resample_counts(values.shape[0], resamples=resamples, seed=seed, stream=stream)
    return percentile_ci(resampled_means(values, counts), level)


def stratified_average_samples(
    sets: Sequence[tuple[str, np.ndarray]], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> np.ndarray:
    """Resampled values of mean_s(mean_i values_s[i]), each set resampled within itself."""
    per_set = []
    for name, values in sets:
        counts = resample_counts(np.asarray(values).shape[0], resamples=resamples, seed=seed, stream=name)
        per_set.append(resampled_means(np.asarray(values, dtype=np.float64), counts))
    return np.mean(per_set, axis=0)


def paired_difference_samples(
    sets_a: Mapping[str, np.ndarray],
    sets_b: Mapping[str, np.ndarray],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> np.ndarray:
    """Resampled values of score(a) - score(b), the score being the average over the given sets.

    ``sets_a[name]`` and ``sets_b[name]`` must be aligned on the same problems (same order).
    """
    if set(sets_a) != set(sets_b):
        raise ValueError(
            f"paired bootstrap needs the same sets for both runs: {sorted(sets_a)} vs {sorted(sets_b)}"
        )
    diffs = {
        name: np.asarray(sets_a[name], dtype=np.float64) - np.asarray(sets_b[name], dtype=np.float64)
        for name in sets_a
    }
    return stratified_average_samples(sorted(diffs.items()), resamples=resamples, seed=seed)


# ------------------------------------------------------- several seeds: t over seeds, power, Holm


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float
    high: float
    interval: str  # T_SEED or BOOTSTRAP_PROBLEM
    seeds: int
    sd: float  # of the seed-level values (nan with one seed)
    se: float
    p: float  # two-sided, of mean 0
    mde: float
    seeds_for_effect: float  # seeds that would detect PAPER_EFFECT (nan with one seed)

    def triple(self) -> tuple[float, float, float]:
        return self.mean, self.low, self.high


def _p_value(mean: float, se: float, df: float) -> float:
    """Two-sided p of mean 0: Student's t with df degrees of freedom (normal for df = inf)."""
    if se == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    tail = stats.norm.sf(abs(mean) / se) if math.isinf(df) else stats.t.sf(abs(mean) / se, df)
    return float(2.0 * tail)


def problem_bootstrap(row: np.ndarray, *, resamples: int, seed: int) -> np.ndarray:
    """(B,) means of ``row`` (problems,) over problems drawn with replacement (the draw depends only on the
    seed and the number of problems, so every statistic of a lab sees the same problem draws)."""
    picks = problem_draws(len(row), resamples, [seed, len(row)])
    return np.asarray(row, dtype=np.float64)[picks].mean(axis=1)


def estimate(
    values: np.ndarray,
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    bounds: tuple[float, float] | None = None,
    **_,
) -> Estimate:
    """The lab's interval of the mean of ``values`` (seeds, problems); see the module doc. ``bounds``: the
    quantity's range (a share: (0, 1)); the interval is cut to it (the truth lies inside, so coverage holds)."""
    est = _estimate(np.asarray(values, dtype=np.float64), level, resamples, seed)
    if bounds is None:
        return est
    low, high = bounds
    return replace(est, low=min(max(est.low, low), high), high=max(min(est.high, high), low))


def _estimate(values: np.ndarray, level: float, resamples: int, seed: int) -> Estimate:
    if values.ndim != 2 or values.size == 0:
        raise ValueError(
            f"estimate: values must be (seeds, problems) and non-empty, got shape {values.shape}"
        )
    seeds = values.shape[0]
    mean = float(values.mean())
    if seeds >= 2:
        per_seed = values.mean(axis=1)
        sd = float(per_seed.std(ddof=1))
        se = sd / math.sqrt(seeds)
        half = float(stats.t.ppf(0.5 + level / 2.0, seeds - 1)) * se
        return Estimate(
            mean, mean - half, mean + half, T_SEED, seeds, sd, se, _p_value(mean, se, seeds - 1),
            power.mde(se, seeds - 1), power.seeds_to_detect(sd),
        )  # fmt: skip
    samples = problem_bootstrap(values[0], resamples=resamples, seed=seed)
    low, high = percentile_ci(samples, level)
    se = float(samples.std(ddof=1))
    return Estimate(
        mean, float(low), float(high), BOOTSTRAP_PROBLEM, 1, math.nan, se, _p_value(mean, se, math.inf),
        power.mde(se, math.inf), math.nan,
    )  # fmt: skip


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values of one family (NaN entries are not members and stay NaN)."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full_like(p, np.nan)
    members = np.flatnonzero(~np.isnan(p))
    order = members[np.argsort(p[members], kind="stable")]
    m = len(order)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[index]))
        out[index] = running
    return out


STRATIFIED = "t(seed), draws stratified"
BLOCKED = "t(seed), draws blocked"


def stratified(groups, *, level: float = 0.95, blocked: bool = False) -> Estimate:
    """The mean over strata (pre-training draws) of each stratum's mean of its seed-level values, with a
    t-interval: the estimand is conditional on the draws (docs/lab-plan.md), so its variance is
    sum_d sd_d^2 / S_d / D^2 (each draw's own seed spread; the draws' levels are fixed, not sampled).

    Degrees of freedom: Welch-Satterthwaite's, (sum v_d)^2 / sum v_d^2 / (S_d - 1) with v_d = sd_d^2 / S_d
    (``t(seed), draws stratified``, the frontier lab's registered interval), or with ``blocked`` the pooled
    within-draw df N - D of the draw-blocked t (``t(seed), draws blocked``, the confirmatory lab's; its se is then
    s_p sqrt(sum 1 / S_d) / D, s_p the pooled within-draw sd, the same as above when the draws have equal
    seeds). One draw: the plain t with S - 1 either way.

    ``sd`` is the pooled within-draw sd; ``mde`` the exact-power MDE (sage_unsloth.report.power) of the design's
    t-test, df = N - D, at this se; ``seeds_for_effect`` the seeds per draw whose MDE at ``sd`` reaches
    PAPER_EFFECT (the plan's formula; docs/lab.md, "Intervals and power")."""
    groups = [np.asarray(g, dtype=np.float64).ravel() for g in groups]
    if not groups or min(len(g) for g in groups) < 2:
        raise ValueError(f"stratified: every draw needs two seeds or more, got {[len(g) for g in groups]}")
    n_draws = len(groups)
    sizes = np.array([len(g) for g in groups])
    dfs = sizes - 1
    variances = np.array([g.var(ddof=1) for g in groups])
    if not np.isfinite(variances).all():
        raise ValueError("stratified: the values hold NaN")
    mean = float(np.mean([g.mean() for g in groups]))
    sd = float(np.sqrt(np.sum(dfs * variances) / dfs.sum()))
    if blocked:
        se = float(sd * np.sqrt(np.sum(1.0 / sizes)) / n_draws)
        df = float(dfs.sum())
    else:
        v = variances / sizes
        se = float(np.sqrt(v.sum()) / n_draws)
        df = float(v.sum() ** 2 / np.sum(v**2 / dfs)) if v.sum() > 0 else float(dfs.sum())
    half = float(stats.t.ppf(0.5 + level / 2.0, df)) * se
    return Estimate(
        mean, mean - half, mean + half, BLOCKED if blocked else STRATIFIED, int(sizes.sum()), sd, se,
        _p_value(mean, se, df), power.mde(se, float(dfs.sum())), power.seeds_to_detect(sd, draws=n_draws),
    )  # fmt: skip


# ------------------------------------------------- robust secondary: Hodges-Lehmann and the signed-rank test
# The frontier lab's pre-registered robust secondary: the Hodges-Lehmann estimate of a paired difference with
# its exact interval, and the exact Wilcoxon signed-rank p-value (docs/lab-plan.md).
#
# For N seed-level differences d_1..d_N the Walsh averages are (d_i + d_j) / 2 for i <= j (N (N + 1) / 2 of
# them); the Hodges-Lehmann estimate is their median. Under the sharp null that the two arms are exchangeable
# within a seed (same training seed, same SFT, arms swapped), each d_i is symmetric about 0 and the signed-rank
# statistic W+ (the sum of the ranks of |d_i| over the positive d_i) has an exact null distribution: each of the
# 2^N sign patterns is equally likely. :func:`signed_rank_null` counts it by dynamic programming; the interval
# inverts the test: [the (c + 1)-th smallest Walsh average, the (c + 1)-th largest], c the largest value with
# P(W+ <= c) <= (1 - level) / 2 (Hollander and Wolfe, Nonparametric Statistical Methods, ch. 3). Its coverage of
# the pseudo-median is exact for continuous, symmetric differences; it is robust to a few extreme seeds (a
# collapsed run moves one rank, not the mean), which is why it stands beside the t-interval of the mean.


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


def clopper_pearson(count: int, total: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a proportion: ``count`` events of ``total`` trials."""
    alpha = 1.0 - level
    low = 0.0 if count == 0 else float(stats.beta.ppf(alpha / 2, count, total - count + 1))
    high = 1.0 if count == total else float(stats.beta.ppf(1 - alpha / 2, count + 1, total - count))
    return low, high
