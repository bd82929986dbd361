"""The lab's interval, test, power and multiple-comparison adjustment (sage_unsloth/report/intervals.py),
each against an independent computation: t tables, scipy's noncentral t, Holm's procedure done by hand
(the power itself: tests/report/test_power.py)."""

import math

import numpy as np
import pytest
from lab_runs import lab
from scipy import stats

from sage_unsloth.report import compare as C
from sage_unsloth.report import intervals as I
from sage_unsloth.report import power


def test_the_interval_is_t_with_s_minus_1_df_over_the_seed_level_means():
    # per-seed means 0.1, 0.2, 0.6 (each row's problems average to it): mean 0.3, sd sqrt(0.07)
    values = np.array([[0.0, 0.2], [0.1, 0.3], [0.5, 0.7]])
    est = I.estimate(values)
    half = 4.303 * math.sqrt(0.07) / math.sqrt(3)  # t_{0.975, 2} = 4.303 (tables)
    assert est.interval == "t(seed)" and est.mean == pytest.approx(0.3)
    assert (est.low, est.high) == pytest.approx((0.3 - half, 0.3 + half), abs=1e-3)
    # the t-test: t = 0.3 / (sd / sqrt 3) = 1.964 on 2 df, two-sided p = 0.188
    assert est.p == pytest.approx(0.188, abs=2e-3)
    assert I.estimate(values, bounds=(0.0, 1.0)).low == 0.0  # cut to the quantity's range
    assert I.estimate(np.full((4, 3), 0.5)).triple() == (0.5, 0.5, 0.5)


def test_one_seed_falls_back_to_a_problem_bootstrap_and_says_so():
    one = np.array([[0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]])
    est = I.estimate(one, resamples=4000)
    assert est.interval == "bootstrap(problem)" and est.low < est.mean < est.high
    assert est.se == pytest.approx(one.std() / math.sqrt(8), rel=0.1)
    assert math.isnan(est.seeds_for_effect) and math.isnan(est.sd)


@pytest.mark.parametrize(("sd", "seeds"), [(0.02, 10), (0.05, 3), (0.01, 20)])
def test_an_estimates_mde_has_80_percent_power_by_the_noncentral_t(sd, seeds):
    values = np.linspace(-1.0, 1.0, seeds)[:, None]
    values = values / values.std(ddof=1) * sd  # seed-level sd exactly sd
    est = I.estimate(values)
    df, crit, nc = seeds - 1, stats.t.ppf(0.975, seeds - 1), est.mde / est.se
    power = stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc)
    assert power == pytest.approx(0.8, abs=1e-6)  # exact (report/power.py; tests/report/test_power.py)


def test_holm_against_a_hand_computed_example():
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> max(0.06, 0.04) = 0.06
    adjusted = I.holm([0.01, 0.04, 0.03, 0.005, math.nan])
    assert adjusted[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(adjusted[4])
    assert I.holm([0.6, 0.9]).tolist() == [1.0, 1.0]  # capped at 1


def test_pair_rows_carry_the_interval_method_p_mde_and_seeds_for_the_paper_s_effect():
    runs = lab(
        grpo_seed0=[4, 0], grpo_seed1=[2, 2], grpo_seed2=[0, 4],
        grpo_branch_seed0=[4, 2], grpo_branch_seed1=[4, 2], grpo_branch_seed2=[1, 4], sft=[2, 2],
    )  # fmt: skip
    table = C.pair_table(
        runs, [("grpo_branch", "grpo"), ("grpo", "sft")], [1], resamples=200, seed=0, level=0.95
    )
    row = table.iloc[0]
    d = np.array([0.25, 0.25, 0.125])  # per seed, the mean over problems of (c_branch - c_grpo) / 4
    se = d.std(ddof=1) / math.sqrt(3)
    assert row["diff"] == pytest.approx(d.mean()) and row["interval"] == "t(seed)"
    assert row["mde"] == pytest.approx(power.mde(se, 2))
    assert row["seeds_for_0.015"] == power.seeds_to_detect(d.std(ddof=1), 0.015)
    assert row["p"] == pytest.approx(2 * stats.t.sf(d.mean() / se, 2))
    assert table.iloc[1]["interval"] == "t(seed), B shared"  # every GRPO seed against one seedless SFT


def test_a_lab_of_the_confirmatory_shape_gets_t_intervals_holm_and_an_outcome(tmp_path):
    """10 seeds, SFT evaluated per seed (sft_seed<s>), n = 256, a --grid cell name with dots and dashes."""
    from sage_unsloth.demo import lab as L
    from sage_unsloth.demo import outcome

    rng = np.random.default_rng(0)
    methods = ["sft", "grpo", "grpo_branch_paper", "grpo_ref_branch-tau0.3-gamma4-q_max3"]
    runs = {
        f"{m}_seed{s}": rng.binomial(256, rng.uniform(0, 0.2, 30)) for m in methods for s in range(10, 20)
    }
    lab = C.RunCounts([f"p{i}" for i in range(30)], {r: np.full(30, 256) for r in runs}, runs)
    pairs = [(m, b) for m in methods[1:] for b in ("sft", "grpo") if m != b]
    table = C.pair_table(lab, pairs, [1, 64], resamples=100, seed=0, level=0.95)
    family = L.adjust_family(table, {"sft": "SFT", "grpo": "GRPO"})
    assert len(family) == 10 and set(family["interval"]) == {"t(seed)"} and (family["seeds"] == 10).all()
    assert (family["p_holm"] >= family["p"]).all()
    assert family["family"].iloc[0] == "pairs.csv: 10 comparisons, Holm"
    support = C.support_method_table(lab, 64, resamples=100, seed=0, level=0.95)
    assert {"mde", "seeds_for_0.015", "net_p"} <= set(support.columns)
    assert set(support["interval"]) == {"t(seed)"}
    family.to_csv(tmp_path / "pairs.csv", index=False)
    text = outcome.outcome_block(tmp_path)
    assert "10 training seeds x 30 problems" in text and "| GRPO - SFT | pass@64 |" in text


def test_the_headline_draws_no_bands_and_intervals_at_three_k_only(figures, tmp_path):
    """Issue 28 item 9: with every method the intervals must not hide the lines."""
    import pandas as pd
    from matplotlib.collections import PolyCollection

    from sage_unsloth.demo import lab as L

    methods = [
        "sft",
        "grpo",
        "grpo_nokl",
        "grpo_branch",
        "grpo_fkl",
        "grpo_reward",
        "grpo_passk",
        "grpo-beta2",
    ]
    ks = [1, 2, 4, 8, 16, 32, 64]
    rows = [
        {"method": m, "k": k, "pass_at_k": 0.5, "ci_low": 0.4, "ci_high": 0.6, "interval": "t(seed)"}
        for m in methods
        for k in ks
    ]
    support = pd.DataFrame(
        [{"method": m, "k": 64, "shrunk": 0.1, "expanded": 0.0, "net": -0.1, "net_ci_low": -0.2,
          "net_ci_high": 0.0} for m in methods[1:]]
    )  # fmt: skip
    L.plot_headline(pd.DataFrame(rows), support, {m: m for m in methods}, 64, tmp_path / "h.png")
    (fig,) = figures
    ax = fig.axes[0]
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]  # no fill_between bands
    bars = [c for c in ax.collections if c.__class__.__name__ == "LineCollection"]
    assert len(bars) == len(methods) and all(len(c.get_segments()) == 3 for c in bars)  # k = 1, 8, 64
    assert L.interval_ks(ks) == [1, 8, 64] and fig.legends  # the legend is the figure's, under both panels


def test_the_reading_of_each_interval_shape():
    """outcome.reading, case by case; an interval of width 0 (a quick one-seed run whose every value is 0) claims
    nothing, where it used to read as excluding the paper's gain."""
    from sage_unsloth.demo.outcome import reading

    def row(low, high, metric="pass@16"):
        return {"ci_low": low, "ci_high": high, "metric": metric}

    assert reading(row(0.0, 0.0)) == "no spread (an interval of width 0): no verdict"
    assert reading(row(0.01, 0.05)) == "excludes 0 (higher with A)"
    assert reading(row(-0.05, -0.01)).startswith("excludes 0 (lower with A); excludes the paper's")
    assert "a gain above +0.010 is excluded" in reading(row(-0.05, 0.01))
    assert reading(row(-0.05, 0.08)).startswith("includes 0 and the paper's")
    assert reading(row(-0.05, 0.08, metric="pair-plan share")) == "includes 0"


@pytest.mark.parametrize(
    "high, expected",
    [
        (0.0151, "includes 0 and the paper's +0.015: a gain above +0.0151 is excluded"),
        (0.01503, "includes 0 and the paper's +0.015: a gain above +0.01503 is excluded"),
        (0.015, "includes 0 and, at its upper end, the paper's +0.015"),
        (0.01496, "includes 0; excludes the paper's +0.015 (a gain above +0.01496 is excluded)"),
        (0.0139, "includes 0; excludes the paper's +0.015 (a gain above +0.014 is excluded)"),
        (0.08, "includes 0 and the paper's +0.015: a gain above +0.080 is excluded"),
    ],
)
def test_a_reading_never_contradicts_itself_after_rounding(high, expected):
    """Main 0298207 read an upper end of +0.0151 as "includes 0 and the paper's +0.015: a gain above +0.015 is
    excluded". The upper end is printed to as many decimals as it takes to differ from the paper's effect, so a
    reading never names the paper's effect as both inside and beyond the interval (and every number it prints
    is its CSV's, rounded: tests/demo/test_lab_numbers.py)."""
    from sage_unsloth.demo.outcome import reading

    assert reading({"ci_low": -0.02, "ci_high": high, "metric": "pass@64"}) == expected
