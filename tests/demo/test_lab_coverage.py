"""Coverage of the lab's 95% interval (sage_unsloth/report/intervals.py) on simulated labs of the lab's shape.

Each simulated lab: P problems with heterogeneous solve rates (logit a_i ~ N(-2, 1.5)), methods A and B
trained at S seeds; a seed moves every problem's logit by a shared u_s and a per-problem v_si (A's and B's
u_s correlated: the same training seed); A's logit is B's plus a per-problem effect delta_i; each run is
evaluated with n samples per problem (binomial draws) and scored by the unbiased pass@k. The truth is the
estimand the lab reports (docs/lab.md, "Intervals and power"): the mean over the lab's P problems of
E[pass@k(A) - pass@k(B)] over seeds and sampling, computed exactly by Gauss-Hermite quadrature over the seed
effect (E[unbiased pass@k | p] = 1 - (1 - p)^k).

The lab's earlier interval, a two-level percentile bootstrap (:func:`two_level_ci`, kept here only for this
comparison), is measured on the same labs by the slow test at the end (``pytest -m slow tests/demo/test_lab_coverage.py
-s`` prints its coverage: 83.3% at 3 seeds, 95.3% at 10).
"""

import zlib
from functools import lru_cache
from math import comb

import numpy as np
import pytest

from sage_unsloth.report import intervals

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


def two_level_samples(values: np.ndarray, *, resamples: int, seed: int, stream: str = "") -> np.ndarray:
    """(B,) means of ``values`` (seeds, problems) over resampled problems (drawn from (seed, number of problems))
    and then resampled seeds (from (seed, stream, number of seeds)): the lab's interval before issue 28."""
    values = np.asarray(values, dtype=np.float64)
    n_seeds, n_problems = values.shape
    picks = np.random.default_rng([seed, n_problems]).integers(0, n_problems, size=(resamples, n_problems))
    counts = np.zeros((resamples, n_problems))
    np.add.at(counts, (np.repeat(np.arange(resamples), n_problems), picks.reshape(-1)), 1.0)
    per_seed = counts @ values.T / n_problems  # (B, S): problem-resampled mean per seed
    seed_rng = np.random.default_rng([seed, zlib.crc32(stream.encode()), n_seeds])
    seeds = seed_rng.integers(0, n_seeds, size=(resamples, n_seeds))
    return np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)


def two_level_ci(
    values: np.ndarray, *, resamples: int, seed: int, level: float
) -> tuple[float, float, float]:
    """(mean, low, high): the percentile interval of :func:`two_level_samples`."""
    samples = two_level_samples(values, resamples=resamples, seed=seed)
    alpha = (1.0 - level) / 2.0
    return (
        float(np.mean(values)),
        float(np.quantile(samples, alpha)),
        float(np.quantile(samples, 1.0 - alpha)),
    )


def bootstrap_interval(values):
    return two_level_ci(values, resamples=1000, seed=0, level=0.95)


def test_the_two_level_bootstrap_draws_seeds_and_problems():
    # values differ by seed only: every resample is a mean of 3 seed values drawn with replacement
    by_seed = np.array([[0.0] * 5, [0.3] * 5, [0.9] * 5])
    samples = two_level_samples(by_seed, resamples=4000, seed=0)
    possible = {
        round((a + b + c) / 3, 9) for a in (0, 0.3, 0.9) for b in (0, 0.3, 0.9) for c in (0, 0.3, 0.9)
    }
    assert {round(s, 9) for s in samples} <= possible and len(set(np.round(samples, 9))) > 5
    # one seed: the plain bootstrap over problems, whose mean is the sample mean
    one = np.array([[0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]])
    samples = two_level_samples(one, resamples=4000, seed=0)
    assert samples.mean() == pytest.approx(one.mean(), abs=0.01) and samples.std() == pytest.approx(
        one.std() / np.sqrt(8), rel=0.1
    )


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


# ------------------------------------------------------------------------- the frontier lab's structure
# Issue 39: the confirmatory frontier lab (docs/lab-plan.md) has 3 pre-training draws x SEEDS_PER_DRAW training
# seeds per arm, n = 256 samples, pass@64, and its two arms are trained independently at each seed (their
# seed-level results correlated about 0: r = -0.47 over results/demo-confirm's ten seeds). Its interval is
# intervals.stratified (each draw a fixed level, Welch-Satterthwaite t). A seed now and then lands in a second
# mode, a collapse (results/demo-confirm's GRPO seed 14: pass@64 0.749 against 0.91-0.96): here a run collapses
# with probability pi_arm and then loses COLLAPSE_DROP on the logits of the 22 gap problems. The truth is the
# estimand: the mean over the lab's draws and problems of E[pass@k(A) - pass@k(B)], the collapse mixture
# included, by Gauss-Hermite quadrature.
DRAWS, SEEDS_PER_DRAW, LAB_N, LAB_K, FRONTIER_LABS = 3, 3, 128, 32, 3000  # the frontier lab as run
GAP, COLLAPSE_DROP, SEED_SHIFT_SD, SEED_PROBLEM_SD = 22, 6.0, 0.6, 0.3


def chunked_expected_passk(logits: np.ndarray, sd: float, k: int, *, rows: int = 100) -> np.ndarray:
    """:func:`expected_passk` over the first axis in blocks of ``rows``: the same values, with temporaries of
    ~15 MB instead of ~0.4 GB each (3000 labs x 3 draws x 100 problems x 60 nodes), so the frontier's truth
    costs a fraction of the time (page faults and memory traffic, not arithmetic, dominated)."""
    return np.concatenate([expected_passk(logits[i : i + rows], sd, k) for i in range(0, len(logits), rows)])


@lru_cache(maxsize=4)
def frontier_labs(pi_a: float, pi_b: float, *, effect: float = 0.1, rng_seed: int = 0):
    """(labs, draws, seeds) seed-level pass@k differences A - B, and a function giving each lab's true mean
    difference (the quadrature is most of the cost; a test that reads only the differences skips it)."""
    rng = np.random.default_rng([rng_seed, int(pi_a * 1000), int(pi_b * 1000)])
    labs, gap = FRONTIER_LABS, np.arange(PROBLEMS) < GAP
    easy = rng.normal(3.0, 1.5, size=(labs, 1, 1, PROBLEMS)) - 5.0 * gap  # the gap problems are the hard ones
    base = easy + rng.normal(0.0, 0.7, size=(labs, DRAWS, 1, PROBLEMS))  # each draw its own problem offsets
    table = passk_table(LAB_N, LAB_K)

    def seed_level(shift: float, pi: float) -> np.ndarray:
        u = rng.normal(0.0, SEED_SHIFT_SD, size=(labs, DRAWS, SEEDS_PER_DRAW, 1))
        v = rng.normal(0.0, SEED_PROBLEM_SD, size=(labs, DRAWS, SEEDS_PER_DRAW, PROBLEMS))
        collapsed = rng.random((labs, DRAWS, SEEDS_PER_DRAW, 1)) < pi
        logit = base + shift + u + v - COLLAPSE_DROP * collapsed * gap
        return table[rng.binomial(LAB_N, 1.0 / (1.0 + np.exp(-logit)))].mean(axis=-1)

    def expected(shift: float, pi: float) -> np.ndarray:
        spread, logit = np.hypot(SEED_SHIFT_SD, SEED_PROBLEM_SD), base[:, :, 0, :] + shift
        kept = chunked_expected_passk(logit, spread, LAB_K)
        if pi == 0:  # the collapse term's weight is 0: the mixture is the kept term
            return kept.mean(axis=(1, 2))
        collapsed = kept.copy()  # a collapse moves only the gap problems' logits (the first GAP)
        collapsed[..., :GAP] = chunked_expected_passk(logit[..., :GAP] - COLLAPSE_DROP, spread, LAB_K)
        return ((1 - pi) * kept + pi * collapsed).mean(axis=(1, 2))

    diff = seed_level(effect, pi_a) - seed_level(0.0, pi_b)  # independent training: arm correlation 0
    return diff, lru_cache(maxsize=1)(lambda: expected(effect, pi_a) - expected(0.0, pi_b))


def simulate_frontier(pi_a: float, pi_b: float) -> tuple[np.ndarray, np.ndarray]:
    """(labs, draws, seeds) seed-level pass@k differences A - B and each lab's true mean difference."""
    diff, truth = frontier_labs(pi_a, pi_b)
    return diff, truth()


def frontier_coverage(pi_a: float, pi_b: float) -> tuple[float, float]:
    """(coverage of the lab's stratified t-interval, of a z-interval with the same centre and standard error)."""
    diff, truth = simulate_frontier(pi_a, pi_b)
    t_hits, z_hits = [], []
    for lab, true in zip(diff, truth):
        est = intervals.stratified(list(lab))
        t_hits.append(est.low <= true <= est.high)
        z_hits.append(abs(est.mean - true) <= 1.96 * est.se)
    return float(np.mean(t_hits)), float(np.mean(z_hits))


@pytest.mark.slow
def test_the_simulated_frontier_labs_have_the_lab_s_shape():
    """Seed-level differences spread like the binding betas' (sd about 0.02 of pass@k) and a collapse costs a
    run more than the 0.15 of net support that defines it (docs/lab-plan.md)."""
    diff, truth = simulate_frontier(0.0, 0.0)
    assert 0.01 < np.median(diff.std(axis=2, ddof=1)) < 0.04 and 0.0 < truth.mean() < 0.02
    with_collapses, _ = frontier_labs(0.0, 1.0)  # every B run collapsed (its truth is not needed)
    assert np.median(with_collapses) - np.median(diff) > 0.15


@pytest.mark.slow
def test_at_the_lab_s_seed_count_the_stratified_t_covers_and_a_z_interval_does_not():
    t_cover, z_cover = frontier_coverage(0.0, 0.0)
    assert t_cover >= 0.94 and z_cover < 0.94


@pytest.mark.slow
def test_with_collapse_mixtures_a_z_interval_fails_and_the_t_interval_loses_less(capsys):
    """Both arms collapse now and then, at different rates (3% and 10%): the mean difference then holds the
    collapse rates' difference, which 9 seeds per arm pin down poorly. Measured (docs/lab.md, 'Intervals and
    power'): the t-interval covers about 94%, a z-interval about 85%."""
    t_cover, z_cover = frontier_coverage(0.03, 0.10)
    with capsys.disabled():
        print(f"\n[coverage] collapses 3% / 10%: stratified t {t_cover:.1%}, z {z_cover:.1%}")
    assert z_cover < 0.90 and t_cover >= 0.90 and t_cover - z_cover >= 0.03


@pytest.mark.slow
def test_a_rare_collapse_in_one_arm_only_is_beyond_any_mean_interval_at_this_seed_count(capsys):
    """The limitation docs/lab-plan.md states and the robust secondary answers: when only B collapses, 7% of its
    runs, most labs see no collapse at all and the mean difference's interval misses the truth far more often
    than 5%. Pinned so that the docs' figure stays true."""
    t_cover, _ = frontier_coverage(0.0, 0.07)
    with capsys.disabled():
        print(f"\n[coverage] B alone collapses 7%: stratified t {t_cover:.1%}")
    assert t_cover < 0.90
