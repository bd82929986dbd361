"""A shortened `make demo` end to end: model -> data -> SFT -> RL methods -> eval -> analysis -> report -> lab.

The quick lab runs once for this module (:func:`quick_lab`) with the default methods, a method from a file outside
the kit and a --grid cell; every other method file of configs/demo/ trains one stage-2 step from that lab's SFT
folder and data, in-process, with the command the lab gives it (each step of the lab is a subprocess that pays
the import of torch, transformers and TRL, so the quick demo of every method cost about 45 of them)."""

import contextlib
import csv
import io
import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from sage_unsloth.demo.run import DEFAULT_METHODS, METHODS, MODEL_NAME, main

# a method of one's own, in a folder outside the kit: a config on the kit's demo base and a guide file
# beside it (issue 29: "Tried as a new user would"), run through --methods beside the default ones
USER_CONFIG = """\
base: demo:_grpo_base.yaml
guide: {name: first_tokens.py:first_tokens, gamma: 0.5, tokens: 16, q_max: 2.0}
"""
USER_GUIDE = """\
import torch


def first_tokens(signals, *, gamma: float = 0.5, tokens: int = 16):
    q = 1.0 + gamma * (-signals.logps).clamp(max=2.0)
    position = torch.arange(q.shape[1])[None, :]
    return torch.where(position < tokens, q, torch.ones_like(q))


first_tokens.needs = ("logps",)
"""
ADDED = ["my_guide", "grpo_branch-tau0.3"]  # the method from the file and the --grid cell


@dataclass(frozen=True)
class QuickLab:
    root: Path
    work: Path
    results: Path
    args: list[str]
    out: str  # what the first run printed


@pytest.fixture(scope="module")
def quick_lab(tmp_path_factory) -> QuickLab:
    """`python -m sage_unsloth.demo --quick --methods default,<my_guide.yaml> --grid grpo_branch:tau=0.3`, once
    for the module (tests/conftest.py keeps the module's tests on one pytest-xdist worker)."""
    root = tmp_path_factory.mktemp("quick_lab")
    work, results, mine = root / "work", root / "results", root / "elsewhere"
    mine.mkdir()
    (mine / "my_guide.yaml").write_text(USER_CONFIG)
    (mine / "first_tokens.py").write_text(USER_GUIDE)
    args = ["--quick", "--work-dir", str(work), "--results-dir", str(results), "--reference", ""]
    args += ["--methods", f"default,{mine / 'my_guide.yaml'}", "--grid", "grpo_branch:tau=0.3"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(args)
    assert code == 0, printed.getvalue()[-3000:]
    return QuickLab(root, work, results, args, printed.getvalue())


@pytest.mark.slow
def test_quick_demo_runs_every_step_reports_the_lab_and_reuses_steps_on_a_rerun(quick_lab, capsys):
    work, results, args = quick_lab.work, quick_lab.results, quick_lab.args
    assert DEFAULT_METHODS == ("grpo", "grpo_nokl", "grpo_branch")  # the lab's control, beta 0 and the branch
    methods = [*DEFAULT_METHODS, *ADDED]
    runs = ["sft_seed0", *[f"{m}_seed0" for m in methods]]

    for run in runs:
        passk = list(csv.DictReader((results / MODEL_NAME / run / "passk.csv").open()))
        assert {row["dataset"] for row in passk} == {"demo"}
        assert [int(row["k"]) for row in passk] == [1, 2, 4, 8]
        assert json.loads((results / MODEL_NAME / run / "manifest.json").read_text())["stage"] == "eval"
    # 01 -> 02: every RL run starts from the SFT stage's folder and the same base model, with its own seed
    sft_manifest = json.loads((work / MODEL_NAME / "sft" / "manifest.json").read_text())
    for method in methods:
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
    assert str(quick_lab.root) not in report.split("## The lab")[1]  # the lab section names no machine paths
    lab_methods = list(csv.DictReader((results / "lab" / "methods.csv").open()))
    assert {r["method"] for r in lab_methods} == {"sft", *methods}
    assert max(int(r["k"]) for r in lab_methods) == 2  # kmax = n / 4: the lab reports k <= 2 of n = 8
    out = quick_lab.out
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
    assert set(dose) == {"sft", *methods}
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
    rerun = capsys.readouterr().out
    assert "reused" in rerun and f"s CPU for the 0 steps that ran; {len(timings) - 1} reused" in rerun, rerun[
        -500:
    ]
    again = {r["step"]: r for r in csv.DictReader((results / "timings.csv").open())}
    assert {k: (v["wall_s"], v["cpu_s"]) for k, v in again.items()} == {
        k: (v["wall_s"], v["cpu_s"]) for k, v in timings.items()
    }
    assert all(again[k]["status"] == "reused" for k in again if k != "total")
    assert (results / "report.md").read_text() == report


# What the quick lab's runner passes to stage 2 on the command line (so a method file's value is not what runs),
# and report_to, which TRL turns from 'none' into [].
RUNNER_SETS = {"sft_dir", "output_root", "dataset_path", "max_steps", "seed", "variant", "report_to"}


@pytest.mark.slow
def test_every_method_file_trains_a_step_of_stage_2_with_its_keys_from_the_lab_s_sft(
    quick_lab, tmp_path, monkeypatch, varied_reward
):
    """Every method of configs/demo/ (``--methods all``) with the stage-2 command the quick lab builds for it, one
    step instead of two, in this process: it trains from the lab's SFT folder and base, every key of its config
    chain reaches stage 2, and it takes a gradient step (a reward that differs between completions gives every
    method a non-zero advantage: tests/conftest.py varied_reward; the quick lab's rewards are mostly 0)."""
    from safetensors.torch import load_file

    from sage_unsloth.demo.run import QUICK, REPO_ROOT, build_steps, resolve_method_config
    from sage_unsloth.rlvr.run import main as stage2

    every = replace(QUICK, methods=tuple(m.name for m in METHODS))
    steps = {s.name: s for s in build_steps(every, quick_lab.work, quick_lab.results, None)}
    sft = quick_lab.work / MODEL_NAME / "sft"
    base_model = json.loads((sft / "manifest.json").read_text())["base_model"]
    sft_lora = load_file(sft / "adapter_model.safetensors")
    monkeypatch.chdir(REPO_ROOT)  # the lab's commands name the kit's configs relative to the project
    assert len(METHODS) > 10
    for method in METHODS:
        run = f"{method.name}_seed0"
        argv = steps[run].argv
        assert argv[1:3] == ["-m", "sage_unsloth.rlvr"]
        argv = argv[3:]
        argv[argv.index("--output_root") + 1] = str(tmp_path)
        argv[argv.index("--max_steps") + 1] = "1"
        assert stage2(argv) == 0, method.name

        folder = tmp_path / MODEL_NAME / run
        manifest = json.loads((folder / "manifest.json").read_text())
        assert (manifest["stage"], manifest["anchor"], manifest["seed"], manifest["global_step"]) == (
            "rlvr",
            "sft",
            0,
            1,
        ), run
        assert Path(manifest["sft_dir"]).resolve() == sft.resolve() and manifest["base_model"] == base_model
        resolved = {k: v for part in manifest["config"].values() for k, v in part.items()}
        chain = resolve_method_config(method.config_path(quick_lab.work))[0]
        differ = {k: (v, resolved.get(k, "missing")) for k, v in chain.items() if k not in RUNNER_SETS}
        assert {k: v for k, v in differ.items() if not _same_setting(*v)} == {}, run
        lora = load_file(folder / "adapter_model.safetensors")
        assert lora.keys() == sft_lora.keys()
        # Adam's first step moves a weight with a gradient by about the learning rate (3e-4); weight decay
        # alone (0.01 x 3e-4 of the weight) by under 1e-5
        moved = max(float((lora[k] - sft_lora[k]).abs().max()) for k in lora)
        assert moved > 1e-4, f"{run}: no gradient step (the adapter moved at most {moved:.1e})"


def _same_setting(given, recorded) -> bool:
    """A plug-in node is recorded resolved (every argument, defaults filled): the method file's node, a bare name
    or {name: ..., <some arguments>}, holds when the recorded node has its name and each argument it gives."""
    if isinstance(recorded, dict) and "name" in recorded:
        node = given if isinstance(given, dict) else {"name": given}
        return all(recorded.get(k) == v for k, v in node.items())
    return given == recorded


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
