"""Coverage of the lab's 95% interval (sage_unsloth/demo/intervals.py) on simulated labs of the lab's shape.

Each simulated lab: P problems with heterogeneous solve rates (logit a_i ~ N(-2, 1.5)), methods A and B
trained at S seeds; a seed moves every problem's logit by a shared u_s and a per-problem v_si (A's and B's
u_s correlated: the same training seed); A's logit is B's plus a per-problem effect delta_i; each run is
evaluated with n samples per problem (binomial draws) and scored by the unbiased pass@k. The truth is the
estimand the lab reports (docs/lab.md, "Intervals and power"): the mean over the lab's P problems of
E[pass@k(A) - pass@k(B)] over seeds and sampling, computed exactly by Gauss-Hermite quadrature over the seed
effect (E[unbiased pass@k | p] = 1 - (1 - p)^k).

The old two-level bootstrap (compare.two_level_ci) is measured on the same labs by the slow test at the end
(``pytest -m slow tests/test_lab_coverage.py -s`` prints its coverage: 83.3% at 3 seeds, 95.3% at 10).
"""

from functools import lru_cache
from math import comb

import numpy as np
import pytest

from sage_unsloth.demo import compare, intervals

LABS, PROBLEMS, SAMPLES, K = 600, 100, 64, 16
SEED_SD, INTERACTION_SD, RHO, EFFECT_SD = 0.5, 0.5, 0.5, 0.3


def passk_table(n: int, k: int) -> np.ndarray:
    """Unbiased pass@k for c = 0..n correct of n (Chen et al., arXiv 2107.03374), written out here."""
    return np.array([1.0 - comb(n - c, k) / comb(n, k) for c in range(n + 1)])


def expected_passk(logits: np.ndarray, sd: float, k: int) -> np.ndarray:
    """E[1 - (1 - sigmoid(x + w))^k] over w ~ N(0, sd^2), by 60-point Gauss-Hermite quadrature."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    p = 1.0 / (1.0 + np.exp(-(logits[..., None] + sd * nodes)))
    return (1.0 - (1.0 - p) ** k) @ (weights / weights.sum())


@lru_cache(maxsize=4)  # the tests below share the simulated labs
def simulate(seeds: int, effect: float, *, rng_seed: int = 0):
    """(labs, seeds, problems) per-problem pass@k differences A - B, and each lab's true mean difference."""
    rng = np.random.default_rng([rng_seed, seeds])
    a = rng.normal(-2.0, 1.5, size=(LABS, 1, PROBLEMS))
    delta = effect + rng.normal(0.0, EFFECT_SD, size=(LABS, 1, PROBLEMS))
    u_b = rng.normal(0.0, SEED_SD, size=(LABS, seeds, 1))
    u_a = RHO * u_b + np.sqrt(1 - RHO**2) * rng.normal(0.0, SEED_SD, size=(LABS, seeds, 1))
    logit_b = a + u_b + rng.normal(0.0, INTERACTION_SD, size=(LABS, seeds, PROBLEMS))
    logit_a = a + delta + u_a + rng.normal(0.0, INTERACTION_SD, size=(LABS, seeds, PROBLEMS))
    table = passk_table(SAMPLES, K)
    draw = lambda logit: table[rng.binomial(SAMPLES, 1.0 / (1.0 + np.exp(-logit)))]
    diff = draw(logit_a) - draw(logit_b)
    spread = np.hypot(SEED_SD, INTERACTION_SD)
    truth = (expected_passk((a + delta)[:, 0], spread, K) - expected_passk(a[:, 0], spread, K)).mean(axis=1)
    return diff, truth


def coverage(interval, seeds: int, effect: float = -0.3) -> float:
    diff, truth = simulate(seeds, effect)
    hits = [low <= t <= high for (_, low, high), t in zip(map(interval, diff), truth)]
    return float(np.mean(hits))


def lab_interval(values):
    return intervals.estimate(values, level=0.95).triple()


def bootstrap_interval(values):
    return compare.two_level_ci(values, resamples=1000, seed=0, level=0.95)


def test_the_simulated_labs_have_the_lab_s_shape():
    """The seed-level differences spread within what the beta pilot's pass@k differences did (sd 0.005 to
    0.09, results/demo-pilot-beta/lab/pairs.csv) and the truth is a real effect (a loss of a few points of
    pass@16), so the test is about the lab's regime."""
    diff, truth = simulate(10, -0.3)
    per_seed_sd = diff.mean(axis=2).std(axis=1, ddof=1)
    assert 0.02 < np.median(per_seed_sd) < 0.1
    assert -0.08 < truth.mean() < -0.01


@pytest.mark.parametrize("seeds", [3, 10])
def test_the_lab_interval_covers_the_truth_in_at_least_93_percent_of_labs(seeds):
    assert coverage(lab_interval, seeds) >= 0.93


def test_a_z_interval_or_an_interval_without_the_seed_spread_undercovers():
    """The two ways to get this wrong that the old interval combined, each caught by the 93% bar at 3 seeds."""

    def z_interval(values):
        d = values.mean(axis=1)
        half = 1.96 * d.std(ddof=1) / np.sqrt(len(d))
        return d.mean(), d.mean() - half, d.mean() + half

    def problems_only(values):  # the seeds pooled, as if they were one run: the seed spread is dropped
        return intervals.estimate(values.mean(axis=0, keepdims=True), level=0.95, resamples=300).triple()

    assert coverage(z_interval, 3) < 0.93
    assert coverage(problems_only, 3) < 0.93


@pytest.mark.slow
def test_the_old_two_level_bootstrap_undercovers_at_3_seeds(capsys):
    """Measured, docs/lab.md "Intervals and power": 83.3% at 3 seeds; at 10 seeds 95.3% in this regime
    (problem resampling adds about the width the seed level lacks; coverage(bootstrap_interval, 10) measures
    it, minutes of CPU), so only 3 seeds is asserted."""
    value = coverage(bootstrap_interval, 3)
    with capsys.disabled():
        print(f"\n[coverage] two-level bootstrap, 3 seeds: {value:.1%} of {LABS} labs")
    assert value < 0.93
