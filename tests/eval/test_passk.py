"""Unbiased pass@k (sage_unsloth/runtime/results.py, shared by eval and report) against exact rational arithmetic
and math.comb, the k list, and the per-set / paper-average rows."""

import math
import random
from fractions import Fraction
from math import comb

import numpy as np
import pytest

from sage_unsloth.eval.passk import check_ks, default_ks, mean_pass_at_k, passk_rows
from sage_unsloth.runtime.results import pass_at_k, pass_at_k_matrix


def _exact(n, c, k):
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def test_pass_at_k_matches_exact_fractions():
    rng = random.Random(0)
    cases = [(n, c, k) for n in (1, 2, 3, 5, 8, 16) for c in range(n + 1) for k in range(1, n + 1)]
    cases += [(n, rng.randint(0, n), rng.randint(1, n)) for n in (64, 100, 256, 257, 1024) for _ in range(60)]
    cases += [(256, 1, 1), (256, 1, 256), (256, 255, 1), (256, 0, 128), (256, 128, 128), (1024, 3, 512)]
    for n, c, k in cases:
        assert pass_at_k(n, c, k) == pytest.approx(float(_exact(n, c, k)), rel=1e-12, abs=1e-15), (n, c, k)


def test_pass_at_k_matches_the_binomial_formula():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 300, 200)
    c = rng.integers(0, n + 1)
    ks = [1, 2, 5, 64, 256]
    got = pass_at_k_matrix(n, c, ks)
    for i in range(len(n)):
        for j, k in enumerate(ks):
            want = math.nan if k > n[i] else 1 - math.comb(int(n[i] - c[i]), k) / math.comb(int(n[i]), k)
            assert (math.isnan(want) and math.isnan(got[i, j])) or got[i, j] == pytest.approx(want, abs=1e-12)
    assert pass_at_k_matrix([4], [1], [2])[0, 0] == pytest.approx(0.5)


def test_pass_at_1_is_the_fraction_correct_and_pass_at_n_is_any_correct():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(256, 1, 256) == 1.0 and pass_at_k(256, 0, 256) == 0.0


def test_k_above_n_is_one_clear_error():
    with pytest.raises(ValueError, match=r"1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match=r"k=\[8\]"):
        check_ks([1, 2, 8], 4)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_default_ks_are_powers_of_two_then_n():
    assert default_ks(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert default_ks(6) == [1, 2, 4, 6]
    assert default_ks(1) == [1]


def test_rows_pool_aime_and_average_the_paper_sets():
    rows = (
        [{"dataset": "aime24", "n": 4, "c": c} for c in (0, 4)]
        + [{"dataset": "aime25", "n": 4, "c": 1}]
        + [
            {"dataset": "amc23", "n": 4, "c": 2},
            {"dataset": "math500", "n": 4, "c": 3},
            {"dataset": "kk", "n": 4, "c": 4},
        ]
    )
    table = {(r["dataset"], r["k"]): r for r in passk_rows(rows, [1, 2, 4])}
    aime = table[("aime", 1)]
    assert aime["pass_at_k"] == pytest.approx((0 + 1 + 0.25) / 3) and aime["n_problems"] == 3
    assert aime["n_samples"] == 12
    expected = (mean_pass_at_k([(4, 0), (4, 4), (4, 1)], 2) + pass_at_k(4, 2, 2) + pass_at_k(4, 3, 2)) / 3
    assert table[("avg_paper", 2)]["pass_at_k"] == pytest.approx(expected)
    assert table[("avg_paper", 1)]["n_problems"] == 5  # kk is not in the paper's average
    assert ("avg_paper", 4) in table and ("kk", 4) in table


def test_no_paper_average_without_all_its_sets():
    rows = [{"dataset": "math500", "n": 2, "c": 1}]
    assert {r["dataset"] for r in passk_rows(rows, [1, 2])} == {"math500"}
