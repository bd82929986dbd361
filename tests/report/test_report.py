"""Stage 4 report on hand-made eval CSVs (tests/fixtures/report/results), expected numbers computed by hand.

Fixture (n = 4 samples per problem, correct counts c per problem):
  tiny/grpo:        aime24 [2,0]  aime25 [4,1]  amc23 [1,3]  math500 [0,2,4,1]  minerva [1]
  tiny/grpo_branch: aime24 [3,1]  aime25 [4,2]  amc23 [2,3]  math500 [1,2,4,2]  (no minerva)
  qwen2.5-math-7b/grpo_branch: same counts as tiny/grpo without minerva; reports k = 1, 2, 4 only.
pass@1 = c/4; pass@2 = 1 - C(4-c, 2)/6 -> c=0: 0, 1: 1/2, 2: 5/6, 3+: 1; pass@4 = [c > 0].
"""

import math
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from sage_unsloth.report.run import main
from sage_unsloth.report.stage import ReportArguments, build_report, parse_args
from sage_unsloth.report.tables import parse_pairs

FIXTURE = Path(__file__).parents[1] / "fixtures" / "report" / "results"
PAPER_DIR = Path(__file__).resolve().parents[2] / "results" / "paper"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    results = tmp_path_factory.mktemp("report") / "results"
    shutil.copytree(FIXTURE, results)
    args = ReportArguments(
        results=str(results),
        paper_dir=str(PAPER_DIR),
        resamples=400,
        plot_width=640,
        plot_height=400,
        completions=str(results / "none" / "*.jsonl.gz"),
    )
    return build_report(args, console=False)


def _cell(frame, run, dataset, metric, column="value"):
    row = frame[
        (frame["model"] + "/" + frame["run"] == run)
        & (frame["dataset"] == dataset)
        & (frame["metric"] == metric)
    ]
    assert len(row) == 1, (run, dataset, metric)
    return row[column].iloc[0]


def test_fixture_table_numbers_are_exact(report):
    cmp_ = report.comparison
    # per-set pass@1 and pass@4 of tiny/grpo
    assert _cell(cmp_, "tiny/grpo", "aime24", "pass@1") == pytest.approx(0.25)
    assert _cell(cmp_, "tiny/grpo", "math500", "pass@1") == pytest.approx(0.4375)
    assert _cell(cmp_, "tiny/grpo", "math500", "pass@k") == pytest.approx(0.75)
    # AIME pooled as one 4-problem set: (2 + 0 + 4 + 1) / 16
    assert _cell(cmp_, "tiny/grpo", "aime", "pass@1") == pytest.approx(7 / 16)
    # paper average = mean of (aime pooled, amc23, math500): (7/16 + 1/2 + 7/16) / 3
    assert _cell(cmp_, "tiny/grpo", "avg_paper", "pass@1") == pytest.approx(1.375 / 3, abs=1e-9)
    assert _cell(cmp_, "tiny/grpo", "avg_paper", "pass@k") == pytest.approx(2.5 / 3, abs=1e-9)
    assert _cell(cmp_, "tiny/grpo", "avg_paper", "pass@k", "k") == 4  # unmapped model: largest reported k
    assert _cell(cmp_, "tiny/grpo_branch", "avg_paper", "pass@1") == pytest.approx(
        (10 / 16 + 5 / 8 + 9 / 16) / 3
    )
    # pass@2 curve point of the pooled AIME set: (5/6 + 0 + 1 + 1/2) / 4
    curves = report.curves
    aime2 = curves[(curves["run"] == "grpo") & (curves["dataset"] == "aime") & (curves["k"] == 2)]["value"]
    assert aime2.iloc[0] == pytest.approx(7 / 12, abs=1e-9)
    # beside the paper: Qwen2.5-Math-7B GRPO + Branch avg pass@1 = 0.284
    assert _cell(cmp_, "qwen2.5-math-7b/grpo_branch", "avg_paper", "pass@1", "paper") == 0.284
    assert _cell(cmp_, "qwen2.5-math-7b/grpo_branch", "avg_paper", "pass@1", "diff") == pytest.approx(
        1.375 / 3 - 0.284, abs=1e-9
    )
    md = report.markdown
    assert "| qwen2.5-math-7b/grpo_branch | GRPO + Branch | 0.458 |" in md and "| 0.284 | +0.174 |" in md


def test_confidence_intervals_bracket_the_point(report):
    frame = report.comparison[report.comparison["status"] == "ok"]
    assert (frame["ci_low"] <= frame["value"] + 1e-12).all() and (
        frame["value"] <= frame["ci_high"] + 1e-12
    ).all()
    # a set where every problem has the same value has a zero-width interval
    assert _cell(report.comparison, "tiny/grpo", "amc23", "pass@k", "ci_low") == 1.0


def test_paired_difference_of_the_fixture_runs(report):
    pairs = report.pairs
    row = pairs[
        (pairs["run_a"] == "grpo_branch")
        & (pairs["run_b"] == "grpo")
        & (pairs["dataset"] == "avg_paper")
        & (pairs["metric"] == "pass@1")
    ].iloc[0]
    assert row["diff"] == pytest.approx((10 / 16 + 5 / 8 + 9 / 16) / 3 - 1.375 / 3)
    assert row["ci_low"] <= row["diff"] <= row["ci_high"]
    # aime24: grpo_branch beats grpo by exactly 1/4 on both problems, so every resample gives 0.25
    row = pairs[(pairs["dataset"] == "aime24") & (pairs["metric"] == "pass@1")].iloc[0]
    assert (row["diff"], row["ci_low"], row["ci_high"]) == pytest.approx((0.25, 0.25, 0.25))


def test_missing_dataset_and_k_are_reported_as_missing_not_zero(report):
    cmp_ = report.comparison
    # tiny/grpo_branch has no minerva; the Qwen run has no k = 256 (the paper's k for that model)
    for run, dataset, metric in (
        ("tiny/grpo_branch", "minerva", "pass@1"),
        ("qwen2.5-math-7b/grpo_branch", "avg_paper", "pass@k"),
    ):
        assert _cell(cmp_, run, dataset, metric, "status") == "missing"
        assert math.isnan(_cell(cmp_, run, dataset, metric))
    assert _cell(cmp_, "qwen2.5-math-7b/grpo_branch", "avg_paper", "pass@k", "paper") == 0.729
    md = report.markdown
    assert "| qwen2.5-math-7b/grpo_branch | GRPO + Branch | 0.458 | [" in md
    assert "| 256 | missing | n/a | 0.729 |  |" in md
    minerva = [
        line for line in md.splitlines() if line.startswith("| tiny/grpo_branch |") and "missing" in line
    ]
    assert minerva and all("0.000" not in line for line in minerva)
    pairs = report.pairs
    assert (pairs[pairs["dataset"] == "minerva"]["status"] == "missing").all()


def test_a_k_dropped_from_passk_csv_is_missing_even_with_per_problem_data(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURE / "tiny", results / "tiny")
    passk = results / "tiny" / "grpo" / "passk.csv"
    frame = pd.read_csv(passk)
    frame[~((frame["dataset"] == "amc23") & (frame["k"] == 4))].to_csv(passk, index=False)
    result = build_report(
        ReportArguments(
            results=str(results), paper_dir=str(PAPER_DIR), resamples=100, completions=str(tmp_path / "x")
        ),
        console=False,
    )
    assert _cell(result.comparison, "tiny/grpo", "amc23", "pass@k", "status") == "missing"
    assert _cell(result.comparison, "tiny/grpo", "amc23", "pass@1") == pytest.approx(0.5)
    pair = result.pairs[(result.pairs["dataset"] == "amc23") & (result.pairs["metric"] == "pass@k")]
    assert (pair["status"] == "missing").all()


def test_plots_have_the_requested_pixel_size(report):
    assert set(report.images) >= {"avg_paper", "aime", "amc23", "math500", "minerva"}
    for path in report.images.values():
        with Image.open(path) as img:
            assert img.size == (640, 400)
    assert "![pass@k on avg_paper](report/passk_avg_paper.png)" in report.markdown


def test_cli_writes_report_and_tables(tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    out = tmp_path / "out" / "my_report.md"
    assert (
        main(
            [
                "--results",
                str(results),
                "--out",
                str(out),
                "--paper-dir",
                str(PAPER_DIR),
                "--resamples",
                "200",
                "--pairs",
                "grpo_branch:grpo",
            ]
        )
        == 0
    )
    assert out.is_file() and (out.parent / "my_report" / "comparison.csv").is_file()
    assert (out.parent / "my_report" / "manifest.json").is_file()
    assert not list(out.parent.glob(".*.tmp"))  # atomic writes left no temp files
    assert "SAGE report" in capsys.readouterr().out  # the rich console table
    pairs = pd.read_csv(out.parent / "my_report" / "pairs.csv")
    assert set(pairs["model"]) == {"tiny"}  # pairs stay within one model


def test_the_report_is_readable_by_group_and_others_under_umask_022(tmp_path, capsys):
    """Every file stage 4 writes (markdown, CSVs, manifest, plots) is 0644 under the usual umask: a shared results
    folder (a lab group's, a cluster's) is readable by the teammates."""
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    out = tmp_path / "out" / "report.md"
    old = os.umask(0o022)
    try:
        args = [
            "--results",
            str(results),
            "--out",
            str(out),
            "--paper-dir",
            str(PAPER_DIR),
            "--resamples",
            "100",
        ]
        assert main(args) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    written = [p for p in out.parent.rglob("*") if p.is_file()]
    assert {p.suffix for p in written} >= {".md", ".csv", ".json", ".png"}
    modes = {str(p.relative_to(out.parent)): oct(stat.S_IMODE(p.stat().st_mode)) for p in written}
    assert set(modes.values()) == {"0o644"}, modes


def test_bad_input_fails_with_a_clear_message(tmp_path):
    run = tmp_path / "results" / "m" / "r"
    run.mkdir(parents=True)
    (run / "passk.csv").write_text("dataset,kk,pass_at_k\naime24,1,0.5\n")
    with pytest.raises(ValueError, match=r"passk.csv: missing column\(s\) \['k'\]"):
        build_report(
            ReportArguments(results=str(tmp_path / "results"), paper_dir=str(PAPER_DIR)), console=False
        )
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="run the eval stage first"):
        build_report(
            ReportArguments(results=str(tmp_path / "empty"), paper_dir=str(PAPER_DIR)), console=False
        )
    with pytest.raises(ValueError, match="run_a:run_b"):
        parse_pairs("a-b")
    with pytest.raises(ValueError, match="resamples=10"):
        build_report(parse_args(["--results", str(tmp_path), "--resamples", "10"]), console=False)


def test_published_csvs_have_a_source_for_every_row():
    passk = pd.read_csv(PAPER_DIR / "published_passk.csv")
    patterns = pd.read_csv(PAPER_DIR / "published_reasoning_patterns.csv")
    for frame in (passk, patterns):
        assert frame["source"].notna().all() and frame["primary"].isin([True, False]).all()
    avg = passk[passk["dataset"] == "avg_paper"].set_index(["model", "method", "k"])["value"]
    assert avg[("Qwen2.5-Math-7B", "GRPO + Branch", 256)] == 0.729
    assert avg[("DeepSeek-R1-Distill-Qwen-7B", "Base", 64)] == 0.778
    assert len(avg) == 20 and passk[passk["dataset"] == "avg_paper"]["primary"].all()
    assert not passk[passk["dataset"] != "avg_paper"]["primary"].any()  # the partial quotes
    pbc = patterns[patterns["pattern"] == "proof_by_contradiction"].set_index("method")["value"]
    assert (pbc["GRPO"], pbc["GRPO + Branch"]) == (0.008, 0.033)


def test_run_to_paper_mapping_rule_and_override_file(tmp_path):
    from sage_unsloth.report.paper import load_mapping, map_run

    assert map_run("qwen2.5-math-7b", "GRPO-Branch_seed3").method == "GRPO + Branch"
    assert map_run("Qwen2.5-Math-7B", "sft").method == "Base"
    assert map_run("deepseek-r1-distill-qwen-7b", "grpo").k == 64
    assert map_run("qwen2.5-math-7b", "grpo_token").method is None  # no paper row
    assert map_run("llama", "grpo").model is None
    mapping_file = tmp_path / "map.yaml"
    mapping_file.write_text("runs:\n  qwen2.5-math-7b/try3: {method: BNPO + Branch}\n  odd: DAPO\n")
    mapping = load_mapping(mapping_file)
    assert map_run("qwen2.5-math-7b", "try3", mapping) == map_run("qwen2.5-math-7b", "bnpo_branch")
    assert map_run("other", "odd", mapping).method == "DAPO"
    with pytest.raises(TypeError, match="runs:"):
        mapping_file.write_text("- a\n")
        load_mapping(mapping_file)


def test_runs_table_shows_sampling_and_reported_ks(report):
    line = next(li for li in report.markdown.splitlines() if li.startswith("| tiny/grpo |"))
    assert "n=4, temperature=0.6, top_p=0.95" in line and "| 1–4 |" in line


def test_contract_with_the_eval_stage_tables(tmp_path, caplog):
    """passk.csv written by the eval stage's own passk_rows agrees with our per-problem bootstrap input."""
    from sage_unsloth.eval.passk import passk_rows

    rng = np.random.default_rng(5)
    sizes = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 50}
    per_problem = [
        {
            "dataset": ds,
            "problem_id": str(i),
            "n": 16,
            "c": int(rng.integers(0, 17)),
            "mean_completion_tokens": 1.0,
        }
        for ds, size in sizes.items()
        for i in range(size)
    ]
    run = tmp_path / "results" / "qwen2.5-math-7b" / "grpo"
    run.mkdir(parents=True)
    pd.DataFrame(per_problem).to_csv(run / "per_problem.csv", index=False)
    pd.DataFrame(passk_rows(per_problem, [1, 2, 4, 8, 16])).to_csv(run / "passk.csv", index=False)
    with caplog.at_level("WARNING"):
        result = build_report(
            ReportArguments(results=str(tmp_path / "results"), paper_dir=str(PAPER_DIR), resamples=200),
            console=False,
        )
    assert "per_problem.csv gives" not in caplog.text  # point values and per-problem data agree
    curves = result.curves
    assert set(curves["dataset"]) == {"avg_paper", "aime", "aime24", "aime25", "amc23", "math500"}
    aime = curves[(curves["dataset"] == "aime") & (curves["k"] == 1)]["value"].item()
    assert aime == pytest.approx(sum(r["c"] for r in per_problem[:60]) / (60 * 16))
    assert _cell(result.comparison, "qwen2.5-math-7b/grpo", "avg_paper", "pass@1", "paper") == 0.266


def test_dataset_section_shows_dash_for_runs_without_a_paper_method():
    import pandas as pd

    from sage_unsloth.report.stage import dataset_section

    rows = [
        {
            "dataset": "demo",
            "model": "m",
            "run": run,
            "metric": metric,
            "method": method,
            "value": 0.5,
            "ci_low": 0.4,
            "ci_high": 0.6,
            "paper": float("nan"),
            "paper_primary": False,
            "diff": float("nan"),
            "k": 1 if metric == "pass@1" else 16,
        }
        for run, method in (("grpo_nokl", float("nan")), ("grpo", "GRPO"))
        for metric in ("pass@1", "pass@k")
    ]
    table = dataset_section(pd.DataFrame(rows), "demo")
    nokl_line = next(line for line in table.splitlines() if "grpo_nokl" in line)
    assert "nan" not in nokl_line and "| — |" in nokl_line
    assert "| GRPO |" in next(line for line in table.splitlines() if "m/grpo |" in line)


def test_a_pair_naming_a_missing_run_is_an_error_not_a_smaller_report(tmp_path):
    args = ReportArguments(
        results=str(FIXTURE),
        out=str(tmp_path / "report.md"),
        paper_dir=str(PAPER_DIR),
        resamples=100,
        pairs="grpo_branch:nope",
        completions=str(tmp_path / "none" / "*.jsonl.gz"),
    )
    with pytest.raises(ValueError, match=r"--pairs grpo_branch:nope: no run named 'nope'"):
        build_report(args, console=False)
    assert not (tmp_path / "report.md").exists()
