"""The sweep runner end to end on CPU (configs/sweep/tiny-cpu.yaml): 2 RLVR configs x 1 seed, their
evaluations and the SFT baseline's, the report and the summary table; a rerun skips every finished job,
a run killed before its final save resumes from its checkpoint, and changed arguments never reuse a
finished folder."""

import csv
import json
import subprocess
from pathlib import Path

import pytest

from sage_unsloth import sweep

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "sweep" / "tiny-cpu.yaml"
RUNS = ["sft", "grpo_s3407", "grpo_branch_s3407"]


def _passk(path):
    with open(path) as fh:
        return {(r["dataset"], int(r["k"])): float(r["pass_at_k"]) for r in csv.DictReader(fh)}


@pytest.fixture(scope="module")
def swept(sft_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    argv = [str(CONFIG), "--sft_dir", str(sft_dir), "--output_root", str(root / "outputs"),
            "--results_dir", str(root / "results")]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # the sweep config names the kit's configs relative to the repository
        assert sweep.main(argv) == 0
    return root, argv


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_sweep_trains_evaluates_reports_and_summarises(swept, capsys):
    root, _ = swept
    results = root / "results" / "tiny-cpu"
    record = json.loads((root / "outputs" / "tiny-cpu" / "jobs" / "grpo_s3407.json").read_text())
    assert record["command"][:2] == ["sage_unsloth.rlvr", "configs/rlvr/tiny-cpu/grpo.yaml"]
    runs = sorted(p.name for p in results.glob("*/*") if (p / "passk.csv").is_file())
    assert runs == sorted(RUNS)
    assert (results / "report.md").is_file()
    with open(results / "summary.csv") as fh:
        rows = {r["run"]: r for r in csv.DictReader(fh)}
    assert sorted(rows) == sorted(RUNS)
    for run, row in rows.items():
        scores = _passk(next(results.glob(f"*/{run}/passk.csv")))
        assert float(row["amc23 pass@1"]) == round(scores[("amc23", 1)], 4)
        assert float(row["amc23 pass@2"]) == round(scores[("amc23", 2)], 4)
        assert row["status"] == "done"
    assert rows["grpo_s3407"]["steps"] == rows["grpo_branch_s3407"]["steps"] == "2"
    assert rows["grpo_branch_s3407"]["config"] == "grpo_branch" and rows["grpo_branch_s3407"]["seed"] == "3407"
    run_dirs = sorted(p.name for p in (root / "outputs" / "tiny-cpu").glob("*/*_s3407"))
    assert run_dirs == ["grpo_branch_s3407", "grpo_s3407"]
    assert (results / "summary.md").read_text().startswith("| run | config | seed | status |")


def test_a_rerun_skips_every_finished_job(swept, monkeypatch, capsys):
    _, argv = swept
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail(f"started {a[0]}"))
    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("finished before, skipped") == 2 * 2 + 1 + 1  # runs + their evals, the SFT eval, report


def test_a_run_killed_before_its_final_save_resumes(swept, capsys):
    root, argv = swept
    run_dir = next((root / "outputs" / "tiny-cpu").glob("*/grpo_s3407"))
    (run_dir / "manifest.json").unlink()  # killed after checkpoint-2, before the final adapter and manifest
    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    assert "grpo_branch_s3407: finished before, skipped" in out and "grpo_s3407: started" in out
    assert "resuming from checkpoint-2" in (root / "outputs" / "tiny-cpu" / "logs" / "grpo_s3407.log").read_text()
    assert "eval_grpo_s3407: started" in out and "report: started" in out  # what reads it is redone
    assert "eval_grpo_branch_s3407: finished before, skipped" in out


def test_changed_arguments_never_reuse_a_finished_folder(swept, capsys):
    _, argv = swept
    assert sweep.main([*argv, "--rlvr_args", "--max_steps 3 --save_steps 1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "was written with" in err and "\n" not in err


@pytest.mark.parametrize("override,needle", [(["--sft_dir", "/nonexistent/sft"], "error: sft_dir="),
                                             (["--gpus", "a,b"], "error: gpus="),
                                             (["--seeds", "1", "1"], "error: seeds="),
                                             (["--configs", "nope.yaml"], "error: config nope.yaml")])
def test_bad_sweep_input_is_one_line(override, needle, sft_dir, capsys):
    assert sweep.main([str(CONFIG), "--sft_dir", str(sft_dir), *override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(needle) and "\n" not in err
