"""The kit's one definition of power (sage_unsloth/report/power.py) against independent computations: Monte Carlo
t-tests on simulated seed-level differences (a paired design at 2, 3, 5 and 10 seeds, and a design blocked by
draws), a bisection on scipy's noncentral t written here, and the seed projection by brute force."""

import math

import numpy as np
import pytest
from power_oracle import exact_mde
from scipy import stats

from sage_unsloth.report import power as P

TRIALS = 100_000  # Monte Carlo standard error of a power near 0.8: 0.0013


def simulated_power(effect: float, sd: float, seeds: int, draws: int = 1, seed: int = 0) -> float:
    """The share of simulated labs whose two-sided 0.05 t-test rejects 0: ``draws`` blocks of ``seeds`` paired
    differences ~ N(effect + the block's own offset, sd), the blocks' offsets cancelling in the mean over blocks
    (fixed levels summing to 0); the test: the mean of the block means over the pooled within-block se, df N - D."""
    rng = np.random.default_rng(seed)
    offsets = np.linspace(-0.5, 0.5, draws) if draws > 1 else np.zeros(1)
    values = effect + offsets[None, :, None] + sd * rng.standard_normal((TRIALS, draws, seeds))
    means = values.mean(axis=2)
    within = values.var(axis=2, ddof=1).mean(axis=1)  # equal seeds per block: the pooled variance
    se = np.sqrt(within / (draws * seeds))
    t = means.mean(axis=1) / se
    df = draws * (seeds - 1)
    return float((np.abs(t) > stats.t.ppf(0.975, df)).mean())


@pytest.mark.parametrize("seeds", [2, 3, 5, 10])
def test_the_mde_has_80_percent_power_in_simulated_paired_labs(seeds):
    sd = 0.02
    effect = P.mde(sd / math.sqrt(seeds), seeds - 1)
    assert simulated_power(effect, sd, seeds) == pytest.approx(0.8, abs=0.005)


@pytest.mark.parametrize(("seeds", "real"), [(2, 0.731), (3, 0.766), (5, 0.791)])
def test_the_old_shortcut_has_less_power_than_it_says_and_the_simulation_sees_it(seeds, real):
    """(t_.975 + t_.8) se, the kit's MDE before: its real power at few seeds, by simulation and by the exact
    formula (the simulation tells the two definitions apart at 2, 3 and 5 seeds)."""
    sd = 0.02
    shortcut = P.approximate_mde(sd / math.sqrt(seeds), seeds - 1)
    assert simulated_power(shortcut, sd, seeds, seed=1) == pytest.approx(real, abs=0.005)
    assert P.power(shortcut, sd / math.sqrt(seeds), seeds - 1) == pytest.approx(real, abs=0.0005)
    assert P.mde(sd / math.sqrt(seeds), seeds - 1) > shortcut


def test_a_design_blocked_by_draws_has_df_pairs_minus_draws():
    """Two draws of 14 seeds (the confirmatory lab's design): design_mde's df 26 gives 80% power in simulation."""
    sd = 0.0264
    effect = P.design_mde(sd, 28, 2)
    assert simulated_power(effect, sd, 14, draws=2, seed=2) == pytest.approx(0.8, abs=0.005)


@pytest.mark.parametrize(
    ("se", "df"), [(0.01, 1), (0.01, 2), (0.004, 4), (0.002, 9), (0.005, 26), (0.01, 300)]
)
def test_the_mde_is_the_root_of_the_noncentral_t_power(se, df):
    assert P.mde(se, df) == pytest.approx(exact_mde(se, df), rel=1e-7)
    assert P.power(P.mde(se, df), se, df) == pytest.approx(0.8, abs=1e-9)


def test_one_seed_uses_the_normal_power():
    se = 0.01
    z = stats.norm.ppf(0.975)
    effect = P.mde(se, math.inf)
    assert stats.norm.sf(z - effect / se) + stats.norm.cdf(-z - effect / se) == pytest.approx(0.8)


@pytest.mark.parametrize(("sd", "draws"), [(0.005, 1), (0.02, 1), (0.05, 1), (0.0125, 3), (0.0264, 2)])
def test_seeds_to_detect_is_the_fewest_seeds_per_draw_whose_mde_reaches_the_effect(sd, draws):
    brute = next(
        s for s in range(2, 10_000) if exact_mde(sd / math.sqrt(draws * s), draws * (s - 1)) <= 0.015
    )
    assert P.seeds_to_detect(sd, 0.015, draws=draws) == brute
    assert P.seeds_to_detect(0.0, 0.015) == 2 and math.isnan(P.seeds_to_detect(math.nan))
