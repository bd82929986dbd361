"""A shortened `make demo` end to end: model -> data -> SFT -> 3 RL variants -> eval -> report + strategies."""

import csv
import json
from pathlib import Path

import pytest

from sage_unsloth.demo.run import EVAL_RUNS, MODEL_NAME, main


@pytest.mark.slow
def test_quick_demo_runs_every_stage_and_reports_strategies(tmp_path):
    work, results = tmp_path / "work", tmp_path / "results"
    assert main(["--quick", "--work-dir", str(work), "--results-dir", str(results)]) == 0

    for run in EVAL_RUNS:
        passk = list(csv.DictReader((results / MODEL_NAME / run / "passk.csv").open()))
        assert {row["dataset"] for row in passk} == {"demo"}
        assert [int(row["k"]) for row in passk] == [1, 2, 4]
        manifest = json.loads((results / MODEL_NAME / run / "manifest.json").read_text())
        assert manifest["stage"] == "eval"
    # 01 -> 02: every RL run starts from the SFT stage's folder and the same base model
    sft_manifest = json.loads((work / MODEL_NAME / "sft" / "manifest.json").read_text())
    assert sft_manifest["stage"] == "sft"
    for variant in ("grpo", "grpo_nokl", "grpo_branch"):
        rl_manifest = json.loads((work / MODEL_NAME / variant / "manifest.json").read_text())
        assert rl_manifest["stage"] == "rlvr" and rl_manifest["anchor"] == "sft"
        assert Path(rl_manifest["sft_dir"]).resolve() == (work / MODEL_NAME / "sft").resolve()
        assert rl_manifest["base_model"] == sft_manifest["base_model"] and rl_manifest["global_step"] == 2

    strategies = list(csv.DictReader((results / "strategies.csv").open()))
    assert [(r["run"], r["strategy"]) for r in strategies] == [(run, s) for run in EVAL_RUNS for s in ("A", "B", "other")]
    for run in EVAL_RUNS:
        shares = [float(r["fraction"]) for r in strategies if r["run"] == run]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3)
        assert sum(int(r["completions"]) for r in strategies if r["run"] == run) == 6 * 4

    report = (results / "report.md").read_text()
    assert "## demo" in report and "## Demo: strategy frequencies" in report
    assert (results / "report" / "strategies.png").stat().st_size > 1000
    timings = (results / "timings.csv").read_text()
    assert "total" in timings and "eval_grpo_branch" in timings

    # a rerun skips every finished step and rewrites the same strategy table
    before = (results / "strategies.csv").read_text()
    assert main(["--quick", "--work-dir", str(work), "--results-dir", str(results)]) == 0
    assert (results / "strategies.csv").read_text() == before
    assert report.count("## Demo: strategy frequencies") == (results / "report.md").read_text().count(
        "## Demo: strategy frequencies") == 1
