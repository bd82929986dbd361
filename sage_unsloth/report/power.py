"""The kit's one definition of power: the minimum detectable effect (MDE) of a t-test and the seeds it needs.

A comparison over training seeds is a t-test of mean 0 on seed-level values (a paired design: one value per
seed, A - B; several pre-training draws are blocks, each a fixed level). With N values in D blocks the
statistic mean / se has N - D degrees of freedom (one block: the paired t's N - 1), and when the true mean is
delta it follows the noncentral t with those degrees of freedom and noncentrality delta / se (se at the true
sd). Its power at two-sided level alpha is

    power(delta) = P(T > t_{1 - alpha/2, df}) + P(T < -t_{1 - alpha/2, df}),  T ~ nct(df, delta / se),

exactly (scipy.stats.nct; statsmodels' TTestPower computes the same). The MDE is the delta whose power is
POWER (80%): :func:`mde`. The textbook shortcut (t_{1 - alpha/2} + t_{power}) se understates it at few seeds
(its real power is 0.73 at 2 seeds, 0.77 at 3, 0.79 at 5): :func:`approximate_mde` keeps it only to state the
difference. With df = inf (one seed, a bootstrap standard error) the noncentral t is the normal.

:func:`seeds_to_detect` is the fewest seeds per block whose MDE at a seed-level sd reaches an effect: the one
projection every table, plan and doc of the kit uses (docs/lab.md, "Intervals and power").
"""

from __future__ import annotations

import math

from scipy import optimize, stats

POWER = 0.8
ALPHA = 0.05
PAPER_EFFECT = 0.015  # SAGE's gain on Qwen2.5-Math-7B (pass@256 +0.015; arXiv 2605.18864)
MAX_SEEDS = 100_000  # seeds_to_detect's search stops here (inf beyond)


def power(effect: float, se: float, df: float, *, alpha: float = ALPHA) -> float:
    """The exact power of the two-sided t-test of mean 0 at level ``alpha`` when the true mean is ``effect``,
    the standard error (at the true sd) ``se`` and the degrees of freedom ``df`` (inf: the z-test)."""
    if se <= 0:
        return 1.0 if effect != 0 else alpha
    shift = abs(effect) / se  # the power is symmetric in the effect's sign
    if math.isinf(df):
        z = stats.norm.ppf(1.0 - alpha / 2.0)
        return float(stats.norm.sf(z - shift) + stats.norm.cdf(-z - shift))
    crit = stats.t.ppf(1.0 - alpha / 2.0, df)
    far = float(stats.nct.cdf(-crit, df, shift))
    if not math.isfinite(far):
        # scipy's nct.cdf returns NaN at a few far-tail points; T < -crit needs Z + shift < 0, so the term is
        # at most Phi(-shift), below 1e-15 wherever the NaN occurs (seen from shift 7.99 up)
        far = float(stats.norm.cdf(-shift))
        if far > 1e-12:
            raise ArithmeticError(f"power: scipy's nct.cdf is NaN at df {df}, noncentrality {shift}")
    return float(stats.nct.sf(crit, df, shift) + far)


def mde(se: float, df: float, *, power_wanted: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest effect the two-sided t-test (``df`` degrees of freedom, standard error ``se``) detects with
    power ``power_wanted`` at level ``alpha``: the root of power(effect) = power_wanted (power rises with the
    effect, so the root is unique)."""
    if not math.isfinite(se):
        return math.nan
    if se == 0:
        return 0.0
    if not df > 0:
        return math.inf
    # the shortcut is a lower bound of the root; bracket above it
    low = max(approximate_mde(se, df, power_wanted=power_wanted, alpha=alpha), 1e-12 * se)
    high = 2.0 * low
    while power(high, se, df, alpha=alpha) < power_wanted:
        high *= 2.0
    return float(
        optimize.brentq(lambda e: power(e, se, df, alpha=alpha) - power_wanted, 0.0, high, xtol=1e-12 * se)
    )


def approximate_mde(se: float, df: float, *, power_wanted: float = POWER, alpha: float = ALPHA) -> float:
    """(t_{1 - alpha/2, df} + t_{power, df}) se: the shortcut the kit used before (kept to state the change)."""
    if math.isinf(df):
        return float((stats.norm.ppf(1.0 - alpha / 2.0) + stats.norm.ppf(power_wanted)) * se)
    return float((stats.t.ppf(1.0 - alpha / 2.0, df) + stats.t.ppf(power_wanted, df)) * se)


def design_mde(sd: float, pairs: int, draws: int = 1, **kw) -> float:
    """The MDE of the mean over ``draws`` blocks of ``pairs`` seed-level values in all (equal seeds per block)
    with seed-level sd ``sd``: se = sd / sqrt(pairs), df = pairs - draws."""
    return mde(sd / math.sqrt(pairs), pairs - draws, **kw)


def seeds_to_detect(sd: float, effect: float = PAPER_EFFECT, *, draws: int = 1, **kw) -> float:
    """The fewest seeds per block (>= 2) whose :func:`design_mde` at seed-level sd ``sd`` is <= ``effect``;
    inf past MAX_SEEDS, nan for an unknown sd."""
    if not math.isfinite(sd):
        return math.nan
    if sd == 0:
        return 2.0

    def enough(per_draw: int) -> bool:
        # design_mde(...) <= effect, read as the power at the effect (power rises with the effect): one
        # evaluation of the noncentral t instead of a root search
        pairs = draws * per_draw
        if not pairs - draws > 0:
            return False
        alpha, wanted = kw.get("alpha", ALPHA), kw.get("power_wanted", POWER)
        return power(effect, sd / math.sqrt(pairs), pairs - draws, alpha=alpha) >= wanted

    # the normal answer is a lower bound (t quantiles and the exact power both ask for more); step up from it
    z = stats.norm.ppf(1.0 - kw.get("alpha", ALPHA) / 2.0) + stats.norm.ppf(kw.get("power_wanted", POWER))
    low = max(2, int((z * sd / effect) ** 2 / draws) if effect > 0 else MAX_SEEDS)
    if low >= MAX_SEEDS:
        return math.inf
    high = low
    while not enough(high):
        if high >= MAX_SEEDS:
            return math.inf
        low, high = high, min(2 * high, MAX_SEEDS)
    while low < high:  # the fewest enough in (low, high]; enough is monotone in the seeds
        mid = (low + high) // 2
        if enough(mid):
            high = mid
        else:
            low = mid + 1
    return float(high)
