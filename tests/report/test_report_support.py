"""Support metrics (report/support.py) on hand-computed cases, and their place in the report stage."""

import math

import numpy as np
import pandas as pd
import pytest

from sage_unsloth.report import support
from sage_unsloth.report.loading import RunResults


def run(name: str, n, c, ids=None, dataset="bench", model="m") -> RunResults:
    ids = ids or [f"p{i}" for i in range(len(c))]
    per_problem = pd.DataFrame({"dataset": dataset, "problem_id": ids, "n": n, "c": c})
    passk = pd.DataFrame({"dataset": [dataset], "k": [1], "pass_at_k": [0.0]})
    return RunResults(model=model, run=name, path=None, passk=passk, per_problem=per_problem)


def row(table, run_name, k, dataset="bench"):
    hit = table[(table["run"] == run_name) & (table["k"] == k) & (table["dataset"] == dataset)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_at_k_equal_n_counts_problems_solved_by_any_sample():
    # reference solves p0, p2; the run solves p1, p2; nobody solves p3
    table = support.support_table(
        [run("sft", [4] * 4, [4, 0, 2, 0]), run("grpo", [4] * 4, [0, 1, 4, 0])], resamples=200
    )
    r = row(table, "grpo", 4)
    assert r["reference"] == "sft" and r["n_problems"] == 4
    assert (r["preserved"], r["shrunk"], r["expanded"], r["unsolved"]) == (0.25, 0.25, 0.25, 0.25)
    assert (r["solved_ref"], r["solved_run"], r["net"]) == (0.5, 0.5, 0.0)
    assert sorted(table["k"].unique()) == [1, 2, 4]
    assert set(table["run"]) == {"grpo"}  # the reference is not compared with itself


def test_below_n_uses_the_unbiased_pass_at_k_of_each_run_as_independent_draws():
    table = support.support_table(
        [run("sft", [4] * 4, [4, 0, 2, 0]), run("grpo", [4] * 4, [0, 1, 4, 0])], resamples=200
    )
    # k = 1: p_ref = (1, 0, 1/2, 0), p_run = (0, 1/4, 1, 0)
    r = row(table, "grpo", 1)
    assert r["preserved"] == pytest.approx((0 + 0 + 0.5 + 0) / 4)
    assert r["shrunk"] == pytest.approx((1 + 0 + 0 + 0) / 4)
    assert r["expanded"] == pytest.approx((0 + 0.25 + 0.5 + 0) / 4)
    assert r["unsolved"] == pytest.approx((0 + 0.75 + 0 + 1) / 4)
    assert r["net"] == pytest.approx(r["expanded"] - r["shrunk"])
    # k = 2: pass@2 of (n=4, c=2) is 1 - C(2,2)/C(4,2) = 5/6, of (n=4, c=1) is 1 - C(3,2)/C(4,2) = 1/2
    r = row(table, "grpo", 2)
    p_ref, p_run = np.array([1, 0, 5 / 6, 0]), np.array([0, 1 / 2, 1, 0])
    assert r["preserved"] == pytest.approx(np.mean(p_ref * p_run))
    assert r["shrunk"] == pytest.approx(np.mean(p_ref * (1 - p_run)))
    assert r["expanded"] == pytest.approx(np.mean((1 - p_ref) * p_run))
    assert r["solved_ref"] == pytest.approx(np.mean(p_ref)) and r["solved_run"] == pytest.approx(
        np.mean(p_run)
    )


def test_problems_are_matched_by_id_not_by_row_order():
    ref = run("sft", [2, 2, 2], [2, 0, 0], ids=["a", "b", "c"])
    other = run("grpo", [2, 2, 2, 2], [2, 0, 2, 2], ids=["c", "b", "a", "extra"])  # c gained, a kept
    r = row(support.support_table([ref, other], resamples=200), "grpo", 2)
    assert r["n_problems"] == 3
    assert (r["preserved"], r["shrunk"], r["expanded"]) == pytest.approx((1 / 3, 0.0, 1 / 3))


def test_cis_bracket_the_share_and_shrink_to_a_point_without_spread():
    rng = np.random.default_rng(0)
    c_ref, c_run = rng.integers(0, 9, 60), rng.integers(0, 9, 60)
    table = support.support_table([run("sft", [8] * 60, c_ref), run("grpo", [8] * 60, c_run)], resamples=500)
    for _, r in table.iterrows():
        for name in support.SHARES:
            assert r[f"{name}_ci_low"] <= r[name] + 1e-12 <= r[f"{name}_ci_high"] + 2e-12
    same = support.support_table([run("sft", [4] * 5, [4] * 5), run("grpo", [4] * 5, [4] * 5)], resamples=200)
    r = row(same, "grpo", 4)
    assert r["preserved_ci_low"] == r["preserved_ci_high"] == 1.0 and r["shrunk_ci_high"] == 0.0


def test_reference_is_the_base_run_by_default_or_the_named_one_and_missing_is_a_note():
    runs = [run("grpo", [2], [1]), run("grpo_branch", [2], [2]), run("sft", [2], [0])]
    assert set(support.support_table(runs, resamples=100)["reference"]) == {"sft"}
    named = support.support_table(runs, reference="grpo", resamples=100)
    assert set(named["reference"]) == {"grpo"} and set(named["run"]) == {"grpo_branch", "sft"}
    notes = []
    table = support.support_table(runs[:2], resamples=100, notes=notes)
    assert table.empty and notes and "no reference run" in notes[0]
    section = support.markdown_section(table, {}, str, notes)
    assert "No support metrics" in section and "no reference run" in section


def test_each_model_folder_uses_its_own_reference_and_benchmarks_stay_apart():
    runs = [
        run("sft", [2, 2], [2, 0], model="m1"),
        run("grpo", [2, 2], [0, 2], model="m1"),
        run("sft", [2], [0], model="m2", dataset="other"),
        run("grpo", [2], [2], model="m2", dataset="other"),
    ]
    table = support.support_table(runs, resamples=100)
    assert set(zip(table["model"], table["dataset"])) == {("m1", "bench"), ("m2", "other")}
    m2 = table[(table["model"] == "m2") & (table["k"] == 2)].iloc[0]
    assert (m2["expanded"], m2["shrunk"]) == (1.0, 0.0)


def test_largest_k_is_the_smallest_n_of_the_two_runs():
    table = support.support_table([run("sft", [8, 8], [1, 0]), run("grpo", [6, 6], [0, 6])], resamples=100)
    assert sorted(table["k"].unique()) == [1, 2, 4, 6]
    top = support.headline_rows(table)
    # pass@6 of the reference's (n=8, c=1) problem is 1 - C(7,6)/C(8,6) = 3/4; the run never solves it
    assert list(top["k"]) == [6] and math.isclose(top.iloc[0]["shrunk"], 0.75 / 2)


def test_report_stage_writes_the_support_table_section_and_plot(tmp_path):
    from sage_unsloth.report.stage import ReportArguments, build_report

    results = tmp_path / "results"
    for name, cs in (("sft", [4, 0, 2, 0]), ("grpo", [0, 1, 4, 0])):
        folder = results / "m" / name
        folder.mkdir(parents=True)
        pd.DataFrame({"dataset": "bench", "problem_id": [f"p{i}" for i in range(4)], "n": 4, "c": cs}).to_csv(
            folder / "per_problem.csv", index=False
        )
        from sage_unsloth.runtime.results import pass_at_k_matrix

        values = pass_at_k_matrix([4] * 4, cs, [1, 2, 4]).mean(axis=0)
        pd.DataFrame({"dataset": "bench", "k": [1, 2, 4], "pass_at_k": values}).to_csv(
            folder / "passk.csv", index=False
        )
    result = build_report(ReportArguments(results=str(results), resamples=100), console=False)
    written = pd.read_csv(results / "report" / "support.csv")
    assert len(written) == 3 and set(written["run"]) == {"grpo"}
    assert "## Support against the reference run" in result.markdown
    assert "| m | grpo | sft | bench | 4 | 4 | 0.500 [" in result.markdown
    assert (results / "report" / "support_bench.png").stat().st_size > 1000
