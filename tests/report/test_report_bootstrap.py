"""Statistical behaviour of the bootstrap: coverage in simulation, paired differences, stratified average."""

import numpy as np

from sage_unsloth.report import intervals as bs
from sage_unsloth.runtime.results import pass_at_k_matrix


def _simulate_problem_counts(rng, n_problems, n_samples, a, b):
    p = rng.beta(a, b, size=n_problems)
    return rng.binomial(n_samples, p)


def test_bootstrap_ci_covers_the_true_mean_about_95_percent():
    # Problems drawn from a population with per-problem solve rate p ~ Beta(a, b), n samples each.
    # True pass@k of the population: E[1 - (1-p)^k] = 1 - prod_{j<k} (b + j) / (a + b + j).
    rng = np.random.default_rng(1234)
    a, b, n_problems, n_samples, ks = 0.6, 1.2, 120, 8, [1, 4]
    truth = np.array([1 - np.prod([(b + j) / (a + b + j) for j in range(k)]) for k in ks])
    covered = np.zeros(len(ks))
    n_datasets = 400
    for d in range(n_datasets):
        c = _simulate_problem_counts(rng, n_problems, n_samples, a, b)
        values = pass_at_k_matrix(np.full(n_problems, n_samples), c, ks)
        low, high = bs.bootstrap_mean_ci(values, resamples=500, seed=d)
        covered += (low <= truth) & (truth <= high)
    coverage = covered / n_datasets
    assert np.all((coverage >= 0.90) & (coverage <= 0.99)), coverage


def test_paired_ci_excludes_zero_for_a_better_run_and_includes_it_for_identical_runs():
    rng = np.random.default_rng(7)
    n_problems, n_samples = 200, 16
    p = rng.beta(0.8, 1.5, size=n_problems)
    worse = rng.binomial(n_samples, p)
    better = rng.binomial(n_samples, np.clip(p + 0.05, 0, 1))
    vals = {
        name: pass_at_k_matrix(np.full(n_problems, n_samples), c, [1])[:, 0]
        for name, c in (("worse", worse), ("better", better))
    }
    diff = bs.paired_difference_samples({"set": vals["better"]}, {"set": vals["worse"]}, resamples=2000)
    low, high = bs.percentile_ci(diff)
    assert low > 0 and high > low
    # the unpaired intervals overlap although the paired one excludes 0: pairing is what gives the power
    low_a, _ = bs.bootstrap_mean_ci(vals["better"], stream="x")
    _, high_b = bs.bootstrap_mean_ci(vals["worse"], stream="x")
    assert low_a < high_b
    same = bs.paired_difference_samples({"set": vals["worse"]}, {"set": vals["worse"].copy()})
    low, high = bs.percentile_ci(same)
    assert low <= 0 <= high
    # two independent draws of the same model also include 0
    twin = rng.binomial(n_samples, p)
    twin_vals = pass_at_k_matrix(np.full(n_problems, n_samples), twin, [1])[:, 0]
    low, high = bs.percentile_ci(bs.paired_difference_samples({"s": twin_vals}, {"s": vals["worse"]}))
    assert low <= 0 <= high


def test_same_problems_get_the_same_resamples():
    a = bs.resample_counts(50, resamples=300, seed=3, stream="math500")
    b = bs.resample_counts(50, resamples=300, seed=3, stream="math500")
    c = bs.resample_counts(50, resamples=300, seed=3, stream="amc23")
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.all(a.sum(axis=1) == 50)


def test_stratified_average_resamples_within_each_set():
    # set "x" constant -> contributes no variance; the average's spread is half that of set "y" alone.
    rng = np.random.default_rng(0)
    y = rng.random(40)
    avg = bs.stratified_average_samples([("x", np.full(10, 0.3)), ("y", y)], resamples=1000)
    alone = bs.stratified_average_samples([("y", y)], resamples=1000)
    np.testing.assert_allclose(avg, 0.5 * 0.3 + 0.5 * alone)
