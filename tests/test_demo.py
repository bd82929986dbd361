"""A shortened `make demo` end to end: model -> data -> SFT -> RL methods -> eval -> analysis -> report -> lab."""

import csv
import json
from pathlib import Path

import pytest

from sage_unsloth.demo.run import METHODS, MODEL_NAME, QUICK, main, run_names


@pytest.mark.slow
def test_quick_demo_runs_every_step_reports_the_lab_and_reuses_steps_on_a_rerun(tmp_path, capsys):
    work, results = tmp_path / "work", tmp_path / "results"
    args = ["--quick", "--work-dir", str(work), "--results-dir", str(results), "--reference", ""]
    assert main(args) == 0
    runs = run_names(QUICK)
    assert runs == ["sft", *[f"{m.name}_seed0" for m in METHODS]]  # the quick run has every method

    for run in runs:
        passk = list(csv.DictReader((results / MODEL_NAME / run / "passk.csv").open()))
        assert {row["dataset"] for row in passk} == {"demo"}
        assert [int(row["k"]) for row in passk] == [1, 2, 4]
        assert json.loads((results / MODEL_NAME / run / "manifest.json").read_text())["stage"] == "eval"
    # 01 -> 02: every RL run starts from the SFT stage's folder and the same base model, with its own seed
    sft_manifest = json.loads((work / MODEL_NAME / "sft" / "manifest.json").read_text())
    for method in METHODS:
        rl_manifest = json.loads((work / MODEL_NAME / f"{method.name}_seed0" / "manifest.json").read_text())
        assert rl_manifest["stage"] == "rlvr" and rl_manifest["anchor"] == "sft" and rl_manifest["seed"] == 0
        assert Path(rl_manifest["sft_dir"]).resolve() == (work / MODEL_NAME / "sft").resolve()
        assert rl_manifest["base_model"] == sft_manifest["base_model"] and rl_manifest["global_step"] == 2

    plans = list(csv.DictReader((results / "analysis" / "strategies.csv").open()))
    for run in runs:
        shares = [float(r["fraction"]) for r in plans if r["run"] == run and r["strategy"] != "rare"]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    branch = {r["run"]: r for r in csv.DictReader((results / "analysis" / "branch.csv").open())}
    assert set(branch) == set(runs) and all(
        0 <= float(r["branch_q_gt1_fraction"]) <= 1 for r in branch.values()
    )

    report = (results / "report.md").read_text()
    for section in (
        "## demo",
        "## Support against the reference run",
        "## The lab: ",
        "### The branch point",
    ):
        assert report.count(section) == 1, section
    assert str(tmp_path) not in report.split("## The lab")[1]  # the lab section names no machine paths
    lab_methods = list(csv.DictReader((results / "lab" / "methods.csv").open()))
    assert {r["method"] for r in lab_methods} == {"sft", *(m.name for m in METHODS)}
    out = capsys.readouterr().out
    assert "q > 1 at" in out and "GRPO + Branch - GRPO" in out and "s CPU over all steps" in out
    assert "Support against SFT at k = 4" in out and (results / "lab" / "headline.png").stat().st_size > 0
    support = list(csv.DictReader((results / "lab" / "support.csv").open()))
    assert {int(r["k"]) for r in support} == {1, 2, 4}  # support movement at every k of the lab

    timings = {r["step"]: r for r in csv.DictReader((results / "timings.csv").open())}
    assert set(timings) == {
        "model",
        "data",
        "sft",
        *runs[1:],
        *(f"eval_{r}" for r in runs),
        "analysis",
        "report",
        "lab",
        "total",
    }
    assert float(timings["sft"]["cpu_s"]) > 0 and timings["total"]["wall_s"]

    # a rerun reuses every step, keeps each step's measured times, and rewrites the same lab section
    assert main(args) == 0
    assert "reused" in capsys.readouterr().out
    again = {r["step"]: r for r in csv.DictReader((results / "timings.csv").open())}
    assert {k: (v["wall_s"], v["cpu_s"]) for k, v in again.items()} == {
        k: (v["wall_s"], v["cpu_s"]) for k, v in timings.items()
    }
    assert all(again[k]["status"] == "reused" for k in again if k != "total")
    assert (results / "report.md").read_text() == report


def test_bad_budget_arguments_fail_in_one_line(capsys):
    for bad in (["--seeds", "0"], ["--rl-steps", "-1"]):
        assert main(["--quick", *bad]) == 2
        assert "at least 1" in capsys.readouterr().err
    for bad, says in (
        (["--methods", "grpo,nope"], "--methods: unknown ['nope']"),
        (
            ["--mix", "left=0.9,right=0.2,pairs=0,outer=0,middle=0"],
            "mix: shares must be >= 0 and add up to 1",
        ),
        (["--mix", "left:1"], "--mix 'left:1': write plan=share pairs"),
    ):
        assert main(["--quick", *bad]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err


def test_methods_select_runs_and_pairs_by_name():
    from sage_unsloth.demo.run import DEFAULT_METHODS, DemoBudget, lab_pairs, select_methods

    assert select_methods("default") == DEFAULT_METHODS and len(select_methods("all")) == len(METHODS)
    budget = DemoBudget(methods=select_methods("grpo_branch,grpo"), seeds=(0, 1))  # kept in METHODS order
    assert run_names(budget) == ["sft", "grpo_seed0", "grpo_seed1", "grpo_branch_seed0", "grpo_branch_seed1"]
    assert ("grpo_branch", "grpo") in lab_pairs(budget) and ("grpo_nokl", "grpo") not in lab_pairs(budget)
    # a method PAIRS does not name (a new baseline) is compared with SFT and GRPO without another line
    new = DemoBudget(methods=("grpo", "new"))
    assert lab_pairs(new) == [("grpo", "sft"), ("new", "sft"), ("new", "grpo")]
