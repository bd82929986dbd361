"""The sweep runner end to end on CPU (configs/sweep/tiny-cpu.yaml): 2 RLVR configs x 2 seeds, their
evaluations and the SFT baseline's, the report and the summary table; a rerun skips every finished job,
a killed job is redone (an RLVR run with --resume) with what reads it, and changed arguments never reuse
a finished folder."""

import csv
import json
import subprocess
from pathlib import Path

import pytest
from conftest import HUB_TOKEN, WANDB_KEY, files_holding, sweep_credentials

from sage_unsloth.jobs import sweep

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "sweep" / "tiny-cpu.yaml"
RUNS = ["sft", "grpo_seed3407", "grpo_branch_seed3407", "grpo_seed1", "grpo_branch_seed1"]


def _passk(path):
    with open(path) as fh:
        return {(r["dataset"], int(r["k"])): float(r["pass_at_k"]) for r in csv.DictReader(fh)}


@pytest.fixture
def swept(tiny_sweep):
    return tiny_sweep  # tests/conftest.py: run once on the local executor, shared with test_executors.py


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    sweep_credentials(monkeypatch)  # the reruns' credentials, as the first run's (tests/conftest.py)


def test_sweep_trains_evaluates_reports_and_summarises(swept, capsys):
    root, _ = swept
    results = root / "results" / "tiny-cpu"
    record = json.loads((root / "outputs" / "tiny-cpu" / "steps" / "grpo_seed3407.json").read_text())
    assert record["command"][:2] == ["sage_unsloth.rlvr", "configs/rlvr/tiny-cpu/grpo.yaml"]
    runs = sorted(p.name for p in results.glob("*/*") if (p / "passk.csv").is_file())
    assert runs == sorted(RUNS)
    assert (results / "report.md").is_file()
    with open(results / "summary.csv") as fh:
        rows = {r["run"]: r for r in csv.DictReader(fh)}
    assert sorted(rows) == sorted([*RUNS, "grpo (mean of 2 seeds)", "grpo_branch (mean of 2 seeds)"])
    for run in RUNS:
        row = rows[run]
        scores = _passk(next(results.glob(f"*/{run}/passk.csv")))
        assert float(row["amc23 pass@1"]) == round(scores[("amc23", 1)], 4)
        assert float(row["amc23 pass@2"]) == round(scores[("amc23", 2)], 4)
        assert row["status"] == "done"
    assert rows["grpo_seed3407"]["steps"] == rows["grpo_branch_seed3407"]["steps"] == "2"
    assert (
        rows["grpo_branch_seed3407"]["config"] == "grpo_branch"
        and rows["grpo_branch_seed3407"]["seed"] == "3407"
    )
    run_dirs = sorted(p.name for p in (root / "outputs" / "tiny-cpu").glob("*/*_seed*") if p.is_dir())
    assert run_dirs == ["grpo_branch_seed1", "grpo_branch_seed3407", "grpo_seed1", "grpo_seed3407"]
    mean = rows["grpo (mean of 2 seeds)"]  # over the two seeds' rows, recomputed here
    pair = [float(rows[r]["amc23 pass@1"]) for r in ("grpo_seed3407", "grpo_seed1")]
    assert float(mean["amc23 pass@1"]) == round((pair[0] + pair[1]) / 2, 4)
    assert (results / "summary.md").read_text().startswith("| run | config | seed | status |")


def test_no_credential_reaches_any_file_the_sweep_wrote(swept):
    """The tiny sweep carries a Hub token in rlvr_args and a W&B key in its environment (tests/conftest.py): no
    job record, log, run folder, result or report holds either (issue 42: the token was in the job's stamp)."""
    root, _ = swept
    assert files_holding(root, HUB_TOKEN, WANDB_KEY) == []
    record = json.loads((root / "outputs" / "tiny-cpu" / "steps" / "grpo_seed1.json").read_text())
    assert "--hub_token" not in record["command"] and "--max_steps" in record["command"]


def test_a_rerun_skips_every_finished_job(swept, monkeypatch, capsys):
    _, argv = swept
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail(f"started {a[0]}"))
    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    assert (
        out.count("finished before with the same inputs, reused") == 2 * 2 * 2 + 1 + 1
    )  # runs + evals, the SFT eval, report


def test_a_killed_run_resumes_and_what_reads_it_is_redone(swept, capsys):
    root, argv = swept
    cfg = sweep.parse_args(argv)
    jobs = {job.name: job for job in sweep.build_jobs(cfg, sweep.validate(cfg))}
    run_dir = jobs["grpo_seed3407"].manifest_dir
    slot = sweep.make_slots(cfg)[0]
    assert "--resume" not in sweep._argv(jobs["grpo_seed3407"], slot, cfg)  # finished: nothing to resume
    manifest = (run_dir / "manifest.json").read_bytes()
    (run_dir / "manifest.json").unlink()  # killed after checkpoint-2, before its final save
    assert sweep._argv(jobs["grpo_seed3407"], slot, cfg)[-1] == "--resume"
    (run_dir / "manifest.json").write_bytes(manifest)

    (
        jobs["eval_grpo_seed3407"].manifest_dir / "manifest.json"
    ).unlink()  # an evaluation killed before its CSVs
    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    assert "eval_grpo_seed3407: started" in out and "report: started" in out  # it, and what reads it
    for name in (
        "grpo_seed3407",
        "grpo_branch_seed3407",
        "eval_grpo_branch_seed3407",
        "eval_grpo_seed1",
        "eval_sft",
    ):
        assert f"{name}: finished before with the same inputs, reused" in out
    log = (root / "outputs" / "tiny-cpu" / "logs" / "eval_grpo_seed3407.log").read_text()
    assert (
        "2 problems already graded (0 chunks regraded), 0 chunks to sample" in log
    )  # resumed from its chunks, nothing sampled


def test_changed_arguments_never_reuse_a_finished_folder(swept, capsys):
    _, argv = swept
    assert sweep.main([*argv, "--rlvr_args", "--max_steps 3 --save_steps 1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "was written with" in err and "\n" not in err


@pytest.mark.parametrize(
    "override, needle",
    [
        (["--seeds", "1", "1"], "seeds=[1, 1]: give at least one seed, each once"),
        (["--jobs", "0"], "jobs=0 must be >= 1"),
        (["--gpus", "0,x"], "gpus='0,x': use 'auto', 'none' or GPU ids"),
        (["--configs", "a/grpo.yaml", "b/grpo.yaml"], "share a file name"),
    ],
)
def test_sweep_fields_are_checked_where_the_config_is_built(override, needle):
    # SweepConfig.__post_init__: no sft_dir, no files needed to refuse these
    with pytest.raises(ValueError, match=None) as caught:
        sweep.parse_args([str(CONFIG), *override])
    assert needle in str(caught.value), caught.value


@pytest.mark.parametrize(
    "override,needle",
    [
        (["--sft_dir", "/nonexistent/sft"], "error: sft_dir="),
        (["--gpus", "a,b"], "error: gpus="),
        (["--seeds", "1", "1"], "error: seeds="),
        (["--configs", "nope.yaml"], "error: config nope.yaml"),
    ],
)
def test_bad_sweep_input_is_one_line(override, needle, sft_dir, capsys):
    assert sweep.main([str(CONFIG), "--sft_dir", str(sft_dir), *override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(needle) and "\n" not in err
