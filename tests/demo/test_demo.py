"""A shortened `make demo` end to end: model -> data -> SFT -> RL methods -> eval -> analysis -> report -> lab."""

import csv
import json
from pathlib import Path

import pytest

from sage_unsloth.demo.run import METHODS, MODEL_NAME, main

# a method of one's own, in a folder outside the kit: a config on the kit's demo base and a guide file
# beside it (issue 29: "Tried as a new user would"), run through --methods beside every built-in one
USER_CONFIG = """\
base: demo:_grpo_base.yaml
sage_guide: first_tokens.py:first_tokens
sage_guide_args: {gamma: 0.5, tokens: 16}
sage_q_max: 2.0
"""
USER_GUIDE = """\
import torch


def first_tokens(signals, *, gamma: float = 0.5, tokens: int = 16):
    q = 1.0 + gamma * (-signals.logps).clamp(max=2.0)
    position = torch.arange(q.shape[1])[None, :]
    return torch.where(position < tokens, q, torch.ones_like(q))


first_tokens.needs = ("logps",)
"""


@pytest.mark.slow
def test_quick_demo_runs_every_step_reports_the_lab_and_reuses_steps_on_a_rerun(tmp_path, capsys):
    work, results, mine = tmp_path / "work", tmp_path / "results", tmp_path / "elsewhere"
    mine.mkdir()
    (mine / "my_guide.yaml").write_text(USER_CONFIG)
    (mine / "first_tokens.py").write_text(USER_GUIDE)
    args = ["--quick", "--work-dir", str(work), "--results-dir", str(results), "--reference", ""]
    args += ["--methods", f"all,{mine / 'my_guide.yaml'}", "--grid", "grpo_branch:tau=0.3"]
    assert main(args) == 0
    added = ["my_guide", "grpo_branch-tau0.3"]
    runs = ["sft_seed0", *[f"{m}_seed0" for m in [*(m.name for m in METHODS), *added]]]

    for run in runs:
        passk = list(csv.DictReader((results / MODEL_NAME / run / "passk.csv").open()))
        assert {row["dataset"] for row in passk} == {"demo"}
        assert [int(row["k"]) for row in passk] == [1, 2, 4, 8]
        assert json.loads((results / MODEL_NAME / run / "manifest.json").read_text())["stage"] == "eval"
    # 01 -> 02: every RL run starts from the SFT stage's folder and the same base model, with its own seed
    sft_manifest = json.loads((work / MODEL_NAME / "sft" / "manifest.json").read_text())
    for method in [*(m.name for m in METHODS), *added]:
        rl_manifest = json.loads((work / MODEL_NAME / f"{method}_seed0" / "manifest.json").read_text())
        assert rl_manifest["stage"] == "rlvr" and rl_manifest["anchor"] == "sft" and rl_manifest["seed"] == 0
        assert Path(rl_manifest["sft_dir"]).resolve() == (work / MODEL_NAME / "sft").resolve()
        assert rl_manifest["base_model"] == sft_manifest["base_model"] and rl_manifest["global_step"] == 2

    plans = list(csv.DictReader((results / "analysis" / "strategies.csv").open()))
    for run in runs:
        shares = [float(r["fraction"]) for r in plans if r["run"] == run and r["strategy"] != "minority"]
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
    assert {r["method"] for r in lab_methods} == {"sft", *(m.name for m in METHODS), *added}
    assert max(int(r["k"]) for r in lab_methods) == 2  # kmax = n / 4: the lab reports k <= 2 of n = 8
    out = capsys.readouterr().out
    assert "q > 1 at" in out and "GRPO + Branch - GRPO" in out and "s CPU over all steps" in out
    assert "Support against SFT at k = 2" in out and (results / "lab" / "headline.png").stat().st_size > 0
    support = list(csv.DictReader((results / "lab" / "support.csv").open()))
    assert {int(r["k"]) for r in support} == {1, 2}  # support movement at every k of the lab
    # the method from a file outside the kit: compared with SFT and GRPO, in the plan shares and the headline
    pairs = {(r["a"], r["b"]) for r in csv.DictReader((results / "lab" / "pairs.csv").open())}
    assert {("my_guide", "sft"), ("my_guide", "grpo"), ("grpo_branch-tau0.3", "grpo")} <= pairs
    assert "my_guide" in {r["method"] for r in csv.DictReader((results / "lab" / "plans.csv").open())}
    assert "my_guide" in {r["method"] for r in support} and "my_guide" in out
    # knob values from the runs' stage-2 manifests, in runs.csv and the dose-response table
    by_run = {r["run"]: r for r in csv.DictReader((results / "lab" / "runs.csv").open())}
    assert (by_run["my_guide_seed0"]["guide"], float(by_run["my_guide_seed0"]["q_max"])) == (
        "first_tokens.py:first_tokens",
        2.0,
    )
    assert float(by_run["grpo_branch-tau0.3_seed0"]["tau"]) == 0.3 and by_run["grpo_seed0"]["tau"] == ""
    assert float(by_run["grpo_nokl_seed0"]["beta"]) == 0.0 and float(by_run["grpo_seed0"]["beta"]) == 0.05
    dose = {r["method"]: r for r in csv.DictReader((results / "lab" / "dose_response.csv").open())}
    assert set(dose) == {"sft", *(m.name for m in METHODS), *added}
    assert float(dose["grpo_branch-tau0.3"]["tau"]) == 0.3 and float(dose["grpo_branch"]["tau"]) == 0.5
    assert (results / "lab" / "dose_response.png").stat().st_size > 0
    # the results folder's manifest: budget, seeds, n, kmax, methods with their files' sha256, commit, knobs
    manifest = json.loads((results / "demo_budget.json").read_text())
    assert (manifest["seeds"], manifest["eval_n"], manifest["kmax"]) == ([0], 8, 2)
    assert manifest["eval_seeds"] == {run: 0 for run in runs} and "commit" in manifest
    files = manifest["method_configs"]["my_guide"]["sha256"]
    assert (
        any(name.endswith("first_tokens.py") for name in files) and len(files) == 4
    )  # +yaml, base, resolved
    assert manifest["knobs"]["grpo_branch-tau0.3"]["tau"] == 0.3

    timings = {r["step"]: r for r in csv.DictReader((results / "timings.csv").open())}
    assert set(timings) == {
        "model",
        "data",
        "sft",
        *(r for r in runs if not r.startswith("sft")),
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
        (["--seeds", "2-1"], "--seeds '2-1': write a count"),
        (["--eval-n", "64", "--kmax", "32"], "--eval-n 64 with --kmax 32: the lab reports pass@k up to kmax"),
        (["--grid", "grpo:beta"], "--grid 'grpo:beta': 'beta' is not key=v1,v2"),
    ):
        assert main(["--quick", *bad]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err


def test_methods_select_runs_and_pairs_by_name():
    from sage_unsloth.demo.run import DEFAULT_METHODS, DemoBudget, lab_pairs, run_names, select_methods

    assert select_methods("default") == DEFAULT_METHODS and len(select_methods("all")) == len(METHODS)
    budget = DemoBudget(methods=select_methods("grpo_branch,grpo"), seeds=(0, 1))  # kept in METHODS order
    assert run_names(budget) == [
        "sft_seed0",  # SFT evaluated once per training seed, with that seed (paired, independent noise)
        "sft_seed1",
        "grpo_seed0",
        "grpo_seed1",
        "grpo_branch_seed0",
        "grpo_branch_seed1",
    ]
    assert ("grpo_branch", "grpo") in lab_pairs(budget) and ("grpo_nokl", "grpo") not in lab_pairs(budget)
    # a method whose card names no pairs (a new baseline) is compared with SFT and the control, GRPO
    new = DemoBudget(methods=("grpo", "new"))
    assert lab_pairs(new) == [("grpo", "sft"), ("new", "sft"), ("new", "grpo")]
