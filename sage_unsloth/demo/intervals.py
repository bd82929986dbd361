"""The lab's interval, test and power for one quantity measured per (training seed, problem).

The estimand (docs/lab.md, "Intervals and power"): the mean over the lab's fixed problem set of the quantity,
in expectation over training seeds and evaluation sampling. Each seed s gives one value d_s, the mean over
the problems of its row (for a paired comparison: of A - B, runs paired by seed); the d_s are independent
draws around the estimand, and there are few of them, so

- with S >= 2 seeds the interval is Student's t with S - 1 degrees of freedom over the d_s
  (``t(seed)``), the test is the one-sample t-test of mean 0, and the minimum detectable effect is
  (t_{0.975, S-1} + t_{0.80, S-1}) sd / sqrt(S) (power_plan's formula, 80% power, two-sided 0.05);
  evaluation noise needs no term of its own: it is inside each d_s;
- with one seed nothing measures the seed spread: the interval is a percentile bootstrap over the problems
  (``bootstrap(problem)``), which says how precisely this one seed's evaluation pinned its mean, not how a
  fresh seed would land; its test and MDE use the bootstrap standard error with normal quantiles.

:func:`holm` adjusts a family of p-values (Holm 1979).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

PAPER_EFFECT = 0.015  # SAGE's gain on Qwen2.5-Math-7B (pass@256 +0.015; arXiv 2605.18864)
POWER = 0.8
ALPHA = 0.05
MAX_SEEDS = 100_000  # seeds_to_detect's search stops here (inf beyond)
T_SEED = "t(seed)"
BOOTSTRAP_PROBLEM = "bootstrap(problem)"


def mde(se: float, seeds: int, *, power: float = POWER, alpha: float = ALPHA) -> float:
    """Minimum detectable effect of a t-test on ``seeds`` values with standard error ``se``."""
    return mde_df(se, seeds - 1, power=power, alpha=alpha)


def mde_df(se: float, df: float, *, power: float = POWER, alpha: float = ALPHA) -> float:
    """Minimum detectable effect of a t-test with ``df`` degrees of freedom and standard error ``se``."""
    return float((stats.t.ppf(1.0 - alpha / 2.0, df) + stats.t.ppf(power, df)) * se)


def seeds_to_detect(sd: float, effect: float = PAPER_EFFECT, **power) -> float:
    """The fewest seeds (>= 2) whose MDE at seed-level sd ``sd`` is <= ``effect``; inf past MAX_SEEDS."""
    if not math.isfinite(sd):
        return math.nan

    def enough(s: int) -> bool:
        return mde(sd / math.sqrt(s), s, **power) <= effect

    # the normal-quantile answer is a lower bound (t quantiles exceed z ones); step up from it
    z = stats.norm.ppf(1.0 - power.get("alpha", ALPHA) / 2.0) + stats.norm.ppf(power.get("power", POWER))
    seeds = max(2, int((z * sd / effect) ** 2) if effect > 0 else MAX_SEEDS)
    while not enough(seeds):
        if seeds >= MAX_SEEDS:
            return math.inf
        seeds += 1
    return float(seeds)


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
    rng = np.random.default_rng([seed, len(row)])
    picks = rng.integers(0, len(row), size=(resamples, len(row)))
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
            mde(se, seeds), seeds_to_detect(sd),
        )  # fmt: skip
    samples = problem_bootstrap(values[0], resamples=resamples, seed=seed)
    alpha = (1.0 - level) / 2.0
    se = float(samples.std(ddof=1))
    z = stats.norm.ppf(1 - ALPHA / 2) + stats.norm.ppf(POWER)
    return Estimate(
        mean, float(np.quantile(samples, alpha)), float(np.quantile(samples, 1.0 - alpha)), BOOTSTRAP_PROBLEM,
        1, math.nan, se, _p_value(mean, se, math.inf), float(z * se), math.nan,
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


def stratified(groups, *, level: float = 0.95) -> Estimate:
    """The mean over strata (pre-training draws) of each stratum's mean of its seed-level values, with a
    t-interval: the estimand is conditional on the draws (docs/lab-plan.md), so its variance is
    sum_d sd_d^2 / S_d / D^2 (each draw's own seed spread; the draws' levels are fixed, not sampled) and its
    degrees of freedom Welch-Satterthwaite's, (sum v_d)^2 / sum v_d^2 / (S_d - 1) with v_d = sd_d^2 / S_d (one
    draw: the plain t with S - 1). ``sd`` is the pooled within-draw sd; ``seeds_for_effect`` the seeds per draw
    whose MDE at that sd reaches PAPER_EFFECT."""
    groups = [np.asarray(g, dtype=np.float64).ravel() for g in groups]
    if not groups or min(len(g) for g in groups) < 2:
        raise ValueError(f"stratified: every draw needs two seeds or more, got {[len(g) for g in groups]}")
    n_draws = len(groups)
    v = np.array([g.var(ddof=1) / len(g) for g in groups])
    dfs = np.array([len(g) - 1 for g in groups])
    mean = float(np.mean([g.mean() for g in groups]))
    se = float(np.sqrt(v.sum()) / n_draws)
    df = float(v.sum() ** 2 / np.sum(v**2 / dfs)) if v.sum() > 0 else float(dfs.sum())
    half = float(stats.t.ppf(0.5 + level / 2.0, df)) * se
    sd = float(np.sqrt(np.sum(dfs * np.array([g.var(ddof=1) for g in groups])) / dfs.sum()))

    def enough(per_draw: int) -> bool:
        return mde_df(sd / np.sqrt(n_draws * per_draw), n_draws * (per_draw - 1)) <= PAPER_EFFECT

    if not math.isfinite(sd):
        raise ValueError("stratified: the values hold NaN")
    z = stats.norm.ppf(1.0 - ALPHA / 2.0) + stats.norm.ppf(POWER)
    per_draw = max(2, int((z * sd / PAPER_EFFECT) ** 2 / n_draws))  # a lower bound: t quantiles exceed z ones
    while not enough(per_draw) and per_draw < MAX_SEEDS:
        per_draw += 1
    return Estimate(
        mean, mean - half, mean + half, STRATIFIED, int(sum(len(g) for g in groups)), sd, se,
        _p_value(mean, se, df), mde_df(se, df), float(per_draw) if enough(per_draw) else math.inf,
    )  # fmt: skip
