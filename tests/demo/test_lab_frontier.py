"""The frontier lab's statistics (sage_unsloth/report/intervals.py: hodges_lehmann, stratified; frontier.py) and the
reproduction check (sage_unsloth/demo/reproduce.py), each against an independent computation: scipy's exact
Wilcoxon test, the sign patterns enumerated, the Welch-Satterthwaite formula written out, hand-built labs."""

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from sage_unsloth.demo import frontier as F
from sage_unsloth.demo import reproduce as R
from sage_unsloth.report import intervals as I


def test_the_signed_rank_null_counts_every_sign_pattern():
    n = 8
    counts = I.signed_rank_null(n)
    by_hand = np.zeros(n * (n + 1) // 2 + 1, dtype=int)
    for signs in itertools.product((0, 1), repeat=n):
        by_hand[sum(rank for rank, s in zip(range(1, n + 1), signs) if s)] += 1
    assert [int(c) for c in counts] == by_hand.tolist() and sum(counts) == 2**n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hodges_lehmann_interval_is_the_inversion_of_scipys_exact_signed_rank_test(seed):
    rng = np.random.default_rng(seed)
    d = rng.normal(0.01, 0.02, 15)
    hl = I.hodges_lehmann(d)
    assert hl.p == pytest.approx(stats.wilcoxon(d, method="exact").pvalue)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(15) for j in range(i, 15))
    assert hl.estimate == pytest.approx(np.median(walsh))
    # the interval is every shift theta the exact test does not reject at 5% (scipy's test, a fine grid)
    grid = np.linspace(hl.low - 0.01, hl.high + 0.01, 2001)
    kept = [t for t in grid if stats.wilcoxon(d - t, method="exact").pvalue > 0.05]
    step = grid[1] - grid[0]
    assert min(kept) == pytest.approx(hl.low, abs=step) and max(kept) == pytest.approx(hl.high, abs=step)
    assert 0.95 <= hl.level < 0.97


def test_six_differences_are_the_fewest_with_a_95_percent_interval_the_whole_walsh_range():
    d = np.array([0.03, -0.01, 0.02, 0.05, 0.01, 0.04])
    hl = I.hodges_lehmann(d)
    assert (hl.low, hl.high) == (d.min(), d.max()) and hl.level == pytest.approx(1 - 2 / 64)
    with pytest.raises(ValueError, match="need 6 or more"):
        I.hodges_lehmann(d[:5])


def test_the_stratified_interval_is_welch_satterthwaite_over_the_draw_means():
    groups = [np.array([0.1, 0.2, 0.3]), np.array([0.0, 0.4, 0.2, 0.2]), np.array([0.5, 0.6])]
    est = I.stratified(groups)
    v = [np.var(g, ddof=1) / len(g) for g in groups]  # written out from the formula
    se = math.sqrt(sum(v)) / 3
    df = sum(v) ** 2 / sum(vi**2 / (len(g) - 1) for vi, g in zip(v, groups))
    mean = np.mean([g.mean() for g in groups])
    assert est.mean == pytest.approx(mean) and est.se == pytest.approx(se)
    assert (est.low, est.high) == pytest.approx(
        (mean - stats.t.ppf(0.975, df) * se, mean + stats.t.ppf(0.975, df) * se)
    )
    assert est.p == pytest.approx(2 * stats.t.sf(abs(mean) / se, df))
    # one draw: the plain t over its seeds, as intervals.estimate gives it
    one = I.stratified([groups[1]])
    plain = I.estimate(groups[1][:, None])
    assert (one.low, one.high, one.p) == pytest.approx((plain.low, plain.high, plain.p))
    with pytest.raises(ValueError, match="two seeds or more"):
        I.stratified([np.array([0.1]), np.array([0.2, 0.3])])


# ------------------------------------------------------------------------------------ a hand-built lab
KNOB_COLUMNS = ["beta", "tau", "gamma", "q_max", "guide", "kl_estimator", "kl_placement", "guide_args"]
ARMS = {  # method -> (guide, beta)
    "grpo": ("none", 0.05),
    "grpo_beta1": ("none", 1.0),
    "grpo_branch_paper": ("branch", 0.05),
    "grpo_branch_paper-beta1": ("branch", 1.0),
}


def write_lab(folder, draw, solved):
    """A draw's lab folder as the runner writes it: per run per_problem.csv (4 problems, n = 8), lab/runs.csv with
    the knobs, demo_budget.json with the draw. ``solved[(method, seed)]`` = correct counts per problem."""
    rows = []
    for (method, seed), counts in solved.items():
        run = f"{method}_seed{seed}"
        out = folder / "demo-tiny" / run
        out.mkdir(parents=True)
        pd.DataFrame(
            {"dataset": "demo", "problem_id": [f"p{i}" for i in range(4)], "n": 8, "c": counts}
        ).to_csv(out / "per_problem.csv", index=False)
        guide, beta = ARMS.get(method, ("", math.nan))
        knobs = {"beta": beta, "tau": 0.03 if guide == "branch" else math.nan, "gamma": 0.3 if guide == "branch" else math.nan,
                 "q_max": 1.4 if guide == "branch" else math.nan, "guide": guide, "kl_estimator": "k3" if guide else "",
                 "kl_placement": "" , "guide_args": ""}  # fmt: skip
        rows.append({"run": run, "method": method, "seed": seed, "pair_share": 0.01 * seed, **knobs})
    (folder / "lab").mkdir(parents=True)
    pd.DataFrame(rows).to_csv(folder / "lab" / "runs.csv", index=False)
    (folder / "demo_budget.json").write_text(json.dumps({"draw": draw}))


def hand_lab(tmp_path):
    """Two draws x 3 seeds; at beta 1 Branch solves one more sample than GRPO on problem 0 at every seed; GRPO
    at beta 0.05 seed 2 of draw 1 loses every sample (a collapse)."""
    folders = []
    for draw in (0, 1):
        solved = {}
        for seed in (0, 1, 2):
            solved[("sft", seed)] = [4, 4, 2, seed]  # each seed's own SFT evaluation
            solved[("grpo", seed)] = [0, 0, 0, 0] if (draw, seed) == (1, 2) else [8, 6, 1, 0]
            solved[("grpo_branch_paper", seed)] = [8, 6, 1, seed % 2]
            solved[("grpo_beta1", seed)] = [5 + seed, 4, 2, draw]
            solved[("grpo_branch_paper-beta1", seed)] = [6 + seed, 4, 2, draw]
        folder = tmp_path / f"draw{draw}"
        write_lab(folder, draw, solved)
        folders.append(folder)
    return folders


def test_arms_are_matched_by_their_knobs_and_paired_by_draw_and_seed(tmp_path):
    seeds = F.seed_table(hand_lab(tmp_path), k=1)
    assert set(seeds["arm"]) == {
        "SFT",
        "GRPO, beta 0.05",
        "GRPO, beta 1",
        "Branch, beta 0.05",
        "Branch, beta 1",
    }
    pairs = F.pairings(seeds)
    assert [
        (seeds.set_index("key").loc[a, "arm"].iloc[0], seeds.set_index("key").loc[b, "arm"].iloc[0])
        for a, b in pairs
    ] == [
        ("Branch, beta 0.05", "GRPO, beta 0.05"),
        ("Branch, beta 1", "GRPO, beta 1"),
    ]
    arms = F.arm_table(seeds, 1)
    paired = F.paired_table(seeds, 1, arms)
    row = paired[
        (paired["beta"] == 1.0) & (paired["metric"] == "pass@1") & (paired["draw"] == F.POOLED)
    ].iloc[0]
    # one more correct sample of 8 on one problem of 4 at every seed: +1/32, no spread
    # (at k = 1 the primary metric, pass@k, is pass@1: the row is in the primary family)
    assert row["diff"] == pytest.approx(1 / 32) and row["pairs"] == 6 and row["family"] == "primary"
    assert row["positive_pairs"] == 6 and row["negative_pairs"] == 0
    assert row["hl"] == pytest.approx(1 / 32)


def test_net_support_is_against_the_same_seeds_sft_and_a_collapse_is_counted_with_its_exact_interval(
    tmp_path,
):
    seeds = F.seed_table(hand_lab(tmp_path), k=1, collapse=0.15)
    grpo = seeds[seeds["arm"] == "GRPO, beta 0.05"].set_index(["draw", "seed"])
    for seed in (0, 1):  # against its own seed's SFT run, not another seed's
        sft_p1 = np.mean([4, 4, 2, seed]) / 8
        assert grpo.loc[(0, seed), "net_support"] == pytest.approx(np.mean([8, 6, 1, 0]) / 8 - sft_p1)
    assert grpo["collapsed"].tolist() == [False, False, False, False, False, True]
    arms = F.arm_table(seeds, 1)
    pooled = arms[(arms["arm"] == "GRPO, beta 0.05") & (arms["draw"] == F.POOLED)].iloc[0]
    assert (pooled["collapses"], pooled["runs"]) == (1, 6)
    assert (pooled["collapse_ci_low"], pooled["collapse_ci_high"]) == pytest.approx(
        (stats.beta.ppf(0.025, 1, 6), stats.beta.ppf(0.975, 2, 5))
    )
    # pooled = the mean of the two draws' means (the draws weigh the same)
    by_draw = [grpo.loc[d, "net_support"].mean() for d in (0, 1)]
    assert pooled["net_support"] == pytest.approx(np.mean(by_draw))


def test_holm_runs_over_the_primary_family_only_and_the_share_of_loss_uses_grpos_loss(tmp_path):
    seeds = F.seed_table(hand_lab(tmp_path), k=2)
    arms = F.arm_table(seeds, 2)
    paired = F.paired_table(seeds, 2, arms)
    primary = paired[paired["family"] == "primary"]
    assert set(primary["beta"]) == {1.0} and set(primary["draw"]) == {F.POOLED}  # beta above 0.05, pooled
    assert primary["p_holm"].tolist() == pytest.approx(primary["p"].tolist())  # a family of one
    row = primary.iloc[0]
    grpo = arms[(arms["arm"] == "GRPO, beta 1") & (arms["draw"] == F.POOLED)].iloc[0]
    assert row["b_support_loss"] == pytest.approx(-grpo["net_support"])
    if row["b_support_loss"] > 0:
        assert row["target_share"] == pytest.approx(0.015 / row["b_support_loss"])
    assert paired[paired["draw"] != F.POOLED]["p_holm"].isna().all()


def test_the_frontier_step_writes_its_tables_figure_and_outcome(tmp_path):
    folders = hand_lab(tmp_path)
    out = tmp_path / "frontier"
    assert F.main(["--labs", ",".join(map(str, folders)), "--out", str(out), "--kmax", "2"]) == 0
    for name in F.FILES:
        assert (out / name).stat().st_size > 0, name
    text = (out / "outcome.md").read_text()
    assert "| Branch, beta 1 - GRPO, beta 1 | pass@2 |" in text and "pairs without a collapse" in text
    assert text == F.outcome_block(out)


# --------------------------------------------------------------------------------- the reproduction check
def regime(rows):
    return pd.DataFrame(rows, columns=["run", "metric", "value"])


def write_reference(folder, rows, prints):
    (folder / "lab").mkdir(parents=True)
    regime(rows).to_csv(folder / "lab" / R.REGIME_FILE, index=False)
    (folder / "demo_budget.json").write_text(json.dumps({"fingerprints": prints}))


def test_an_identical_run_is_quiet_and_a_run_beyond_tolerance_is_a_loud_warning(tmp_path):
    ref = tmp_path / "ref"
    rows = [("sft_seed0", "sft_pass_at_1", 0.604), ("sft_seed0", "sft_gap_pass_at_1", 0.061),
            ("grpo_seed0", "grpo_minority_share", 0.028)]  # fmt: skip
    write_reference(ref, rows, {"base": "a" * 64, "sft": "b" * 64})
    same = R.compare(regime(rows), {"base": "a" * 64, "sft": "b" * 64}, ref)
    assert set(same["status"]) == {"identical"} and R.warning_lines(same, "ref") == []
    # the fresh clone of issue 39: SFT 0.731, gap 0.345, GRPO's rare plans 0.26, another SFT adapter
    ours = [("sft_seed0", "sft_pass_at_1", 0.731), ("sft_seed0", "sft_gap_pass_at_1", 0.345),
            ("grpo_seed0", "grpo_minority_share", 0.26)]  # fmt: skip
    table = R.compare(regime(ours), {"base": "a" * 64, "sft": "c" * 64}, ref)
    status = dict(zip(table["metric"], table["status"]))
    assert status["sft_sha256"] == "DIFFERENT" and status["sft_pass_at_1"] == "BEYOND TOLERANCE"
    lines = R.banner(R.warning_lines(table, "demo-reference"))
    assert lines[0] == lines[-1] == "!" * 100 and "does NOT reproduce" in lines[1]
    assert sum("BEYOND" not in line and "+0.127" in line for line in lines) == 1  # 0.731 - 0.604
    # within tolerance (another CPU type's SFT, same regime): no warning
    near = [("sft_seed0", "sft_pass_at_1", 0.61), ("grpo_seed0", "grpo_minority_share", 0.03)]
    table = R.compare(regime(near), {"base": "a" * 64, "sft": "c" * 64}, ref)
    assert R.warning_lines(table, "ref") == [] and "within tolerance" in set(table["status"])


def test_a_different_base_is_a_warning_even_when_the_regime_holds(tmp_path):
    ref = tmp_path / "ref"
    write_reference(ref, [("sft_seed0", "sft_pass_at_1", 0.6)], {"base": "a" * 64, "sft": "b" * 64})
    table = R.compare(regime([("sft_seed0", "sft_pass_at_1", 0.6)]), {"base": "d" * 64, "sft": "b" * 64}, ref)
    assert "pre-trained base is not the reference's" in " ".join(R.warning_lines(table, "ref"))


def test_a_reference_written_with_the_old_metric_name_is_compared(tmp_path):
    """Labs written before the minority plans had their name call GRPO's metric grpo_rare_share (regime.csv) or
    rare_share (runs.csv); both are read as the minority-plan share, so the comparison still covers it."""
    ref = tmp_path / "ref"
    old = regime([("grpo_seed0", "grpo_minority_share", 0.028)]).replace(
        "grpo_minority_share", "grpo_rare_share"
    )
    (ref / "lab").mkdir(parents=True)
    old.to_csv(ref / "lab" / R.REGIME_FILE, index=False)
    table = R.compare(regime([("grpo_seed0", "grpo_minority_share", 0.26)]), {}, ref)
    assert dict(zip(table["metric"], table["status"]))["grpo_minority_share"] == "BEYOND TOLERANCE"
    (ref / "lab" / R.REGIME_FILE).unlink()
    pd.DataFrame({"run": ["grpo_seed0"], "method": ["grpo"], "rare_share": [0.028]}).to_csv(
        ref / "lab" / "runs.csv", index=False
    )
    table = R.compare(regime([("grpo_seed0", "grpo_minority_share", 0.028)]), {}, ref)
    assert dict(zip(table["metric"], table["status"]))["grpo_minority_share"] == "identical"


def test_the_blocked_interval_has_the_pooled_within_draw_df():
    """intervals.stratified(blocked=True): the draw-blocked t of the confirmatory lab's plan, written out: se =
    s_p sqrt(sum 1 / S_d) / D with s_p the pooled within-draw sd, df = N - D; its MDE is the exact one at that df."""
    from sage_unsloth.report import power

    groups = [np.array([0.1, 0.2, 0.3, 0.5]), np.array([0.0, 0.4, 0.2, 0.2, 0.1])]
    est = I.stratified(groups, blocked=True)
    pooled = math.sqrt((3 * np.var(groups[0], ddof=1) + 4 * np.var(groups[1], ddof=1)) / 7)
    se = pooled * math.sqrt(1 / 4 + 1 / 5) / 2
    mean = np.mean([g.mean() for g in groups])
    half = stats.t.ppf(0.975, 7) * se
    assert est.interval == I.BLOCKED and est.se == pytest.approx(se) and est.sd == pytest.approx(pooled)
    assert (est.low, est.high) == pytest.approx((mean - half, mean + half))
    assert est.p == pytest.approx(2 * stats.t.sf(abs(mean) / se, 7))
    assert est.mde == pytest.approx(power.mde(se, 7))


def test_the_pair_plan_share_is_paired_post_hoc_by_default_and_primary_when_a_plan_registers_it(tmp_path):
    seeds = F.seed_table(hand_lab(tmp_path), k=2)
    arms = F.arm_table(seeds, 2)
    default = F.paired_table(seeds, 2, arms)
    share = default[(default["metric"] == F.PAIR_SHARE) & (default["draw"] == F.POOLED)]
    assert set(share["family"]) == {"post hoc"} and len(share) == 2  # beta 0.05 and 1
    # the registered families keep their members and so their Holm adjustment
    assert set(default.loc[default["family"] == "primary", "metric"]) == {"pass@2"}
    registered = F.paired_table(seeds, 2, arms, primary=("pass@2", F.PAIR_SHARE), blocked=True)
    primary = registered[registered["family"] == "primary"]
    assert sorted(primary["metric"]) == ["pair-plan share", "pass@2"] and set(primary["beta"]) == {1.0}
    assert set(registered.loc[registered["draw"] == F.POOLED, "interval"]) == {I.BLOCKED}
    assert (primary["p_holm"] >= primary["p"]).all() and not (registered["family"] == "post hoc").any()
    # the share's difference is Branch's minus GRPO's pair share, seed by seed (0.01 x seed in both: 0)
    row = primary[primary["metric"] == F.PAIR_SHARE].iloc[0]
    assert row["diff"] == pytest.approx(0.0) and row["pairs"] == 6
    with pytest.raises(ValueError, match="pair_share for the share"):
        F.parse_primary("pass@2,pairs", 2)
    assert F.parse_primary("pass@2,pair_share", 2) == ("pass@2", F.PAIR_SHARE)


def test_every_run_is_compared_by_method_whatever_its_seed_and_a_missing_method_is_said(tmp_path):
    """The frontier lab's seeds 20-22 matched no reference run name, so its regime check compared nothing (issue
    50); now each run meets the mean of the references' runs of its method, and a method no reference ran is a row
    that says so."""
    ref = tmp_path / "ref"
    write_reference(ref, [("sft_seed0", "sft_pass_at_1", 0.60), ("sft_seed1", "sft_pass_at_1", 0.62),
                          ("grpo_seed0", "grpo_pair_share", 0.004)], {"base": "a" * 64, "sft": "b" * 64})  # fmt: skip
    ours = regime([("sft_seed20", "sft_pass_at_1", 0.61), ("sft_seed21", "sft_pass_at_1", 0.70),
                   ("grpo_beta2_seed20", "grpo_pair_share", 0.025)])  # fmt: skip
    table = R.compare(ours, {"base": "a" * 64, "sft": "b" * 64}, [ref])
    by_run = table.set_index("run")
    assert (
        by_run.loc["sft_seed20", "reference"] == "0.6100" and by_run.loc["sft_seed20", "reference_runs"] == 2
    )
    assert by_run.loc["sft_seed20", "status"] == "identical"  # 0.61 against the mean of 0.60 and 0.62
    assert by_run.loc["sft_seed21", "status"] == "BEYOND TOLERANCE"
    assert by_run.loc["grpo_beta2_seed20", "status"] == R.NO_REFERENCE
    assert R.warning_lines(table, "ref") and not R.agreement_line(table, ["ref"])
    # two references of one draw pool their runs of a method; the agreement is one line
    other = tmp_path / "other"
    write_reference(
        other, [("grpo_beta2_seed21", "grpo_pair_share", 0.027)], {"base": "a" * 64, "sft": "b" * 64}
    )
    good = R.compare(ours[ours["run"] != "sft_seed21"], {"base": "a" * 64, "sft": "b" * 64}, [ref, other])
    line = R.agreement_line(good, ["ref", "other"])
    assert not R.warning_lines(good, "ref") and line.startswith(
        "reproduces its draw's reference (ref, other)"
    )
    assert "2 regime checks of 2 runs within tolerance (1 identical)" in line


def test_each_draw_finds_the_committed_labs_of_its_draw_and_a_smoke_run_is_compared_with_none(tmp_path):
    from sage_unsloth.demo import run as D

    results = D.REPO_ROOT / "results"
    assert D.draw_references(D.REFERENCE_LABS, 0, tmp_path) == [
        results / "demo-reference",
        results / "demo-frontier" / "draw0",
    ]
    assert D.draw_references(D.REFERENCE_LABS, 2, tmp_path) == [results / "demo-frontier" / "draw2"]
    assert D.draw_references(D.REFERENCE_LABS, 0, results / "demo-reference") == [
        results / "demo-frontier" / "draw0"
    ]
    assert D.smoke_text(D.FULL) == "" and "2 RL steps" in D.smoke_text(D.QUICK)
    folders = D.LabFolders(tmp_path / "w", tmp_path / "r")
    quick = D.lab_step(D.QUICK, folders, [results / "demo-reference"]).argv
    assert "--smoke" in quick and "--reference" not in quick
    full = D.lab_step(D.FULL, folders, [results / "demo-reference", results / "demo-frontier" / "draw0"]).argv
    assert "--smoke" not in full and full.count("--reference") == 2


def test_the_committed_references_hold_every_regime_metric_of_their_draws():
    """demo-reference predates regime.csv: its tables give the four metrics; the frontier draws' regime.csv held the
    control only: their runs.csv gives every GRPO arm (beta 2 included), so the confirmatory lab's runs meet one."""
    from sage_unsloth.demo import run as D

    wanted = {"sft_pass_at_1", "sft_gap_pass_at_1", "grpo_minority_share", "grpo_pair_share"}
    reference = R.reference_regime(D.REFERENCE_DIR)
    assert set(reference["metric"]) == wanted
    assert reference.loc[reference["metric"] == "grpo_pair_share", "value"].iloc[0] == pytest.approx(
        0.00328125 + 0.0007291666666666667  # plans.csv: GRPO's pairs + outer
    )
    draw2 = R.reference_regime(D.REPO_ROOT / "results" / "demo-frontier" / "draw2")
    beta2 = draw2[draw2["method"] == "grpo_beta2"]
    assert set(beta2["metric"]) == {"grpo_minority_share", "grpo_pair_share"} and len(beta2) == 6
