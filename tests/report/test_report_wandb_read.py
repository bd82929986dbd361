"""The report's W&B side without a model: the reader's rules (sage_unsloth/report/wandb_read.py) on hand-made rows,
the runs-vs-paper table the report logs (sage_unsloth/report/wandb_log.py) against values written out by hand, and
the kit without the wandb package. The round trip through real offline runs: tests/kit/test_wandb_stages.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sage_unsloth.report import wandb_read
from sage_unsloth.report.wandb_log import runs_vs_paper

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "report" / "results"


def test_log_history_is_rebuilt_one_entry_per_step_the_later_kept():
    """transformers logs entry keys as train/<key> with train/global_step; a resumed run logs the steps after its
    checkpoint again (the later wins, as log_history.jsonl's rewrite keeps them); an evaluation's row and the
    end-of-training summary's lone epoch are not entries; W&B's "NaN" is a float again."""
    rows = [
        {"train/loss": 1.0, "train/epoch": 0.1, "train/global_step": 1, "_step": 0},
        {"train/loss": 2.0, "train/sage/q_mean": 1.2, "train/global_step": 2, "_step": 1},
        {"train/loss": 9.0, "train/global_step": 3, "_step": 2},  # the killed run's step 3 ...
        {
            "train/loss": 3.0,
            "train/reward_std": "NaN",
            "train/global_step": 3,
            "_step": 3,
        },  # ... logged again
        {"train/epoch": 0.4, "train/global_step": 3, "_step": 4},  # train_runtime & co went to the summary
        {"eval/aime/pass@1": 0.5, "train/global_step": 3, "_step": 5},
        {"other": 1.0, "_step": 6},
    ]
    entries = wandb_read.log_history([wandb_read.normalise_row(r) for r in rows])
    assert [e["step"] for e in entries] == [1, 2, 3]
    assert entries[0] == {"loss": 1.0, "epoch": 0.1, "step": 1}
    assert entries[1] == {"loss": 2.0, "sage/q_mean": 1.2, "step": 2}
    assert (
        entries[2]["loss"] == 3.0
        and math.isnan(entries[2]["reward_std"])
        and set(entries[2])
        == {
            "loss",
            "reward_std",
            "step",
        }
    )


def test_a_table_reads_the_same_from_the_log_and_from_the_api():
    flat = {
        "eval/x/pass@k._type": "table-file",
        "eval/x/pass@k.path": "media/t.table.json",
        "eval/x/pass@k.sha256": "a",
    }
    nested = {
        "eval/x/pass@k": {"_type": "table-file", "path": "media/t.table.json", "sha256": "a", "nrows": 2}
    }
    expected = {"eval/x/pass@k": {"_type": "table-file", "path": "media/t.table.json"}}
    assert wandb_read.normalise_row(flat) == expected == wandb_read.normalise_row(nested)
    assert wandb_read.normalise_row({"a": "Infinity", "b": "-Infinity", "c": "text"}) == {
        "a": math.inf,
        "b": -math.inf,
        "c": "text",
    }


def _logged_run(manifest: dict, tables: dict[str, dict]) -> wandb_read.LoggedRun:
    row = {key: {"_type": "table-file", "path": key} for key in tables}
    row["eval/manifest"] = {"_type": "table-file", "path": "manifest"}
    files = {**tables, "manifest": {"columns": ["manifest.json"], "data": [[json.dumps(manifest)]]}}
    return wandb_read.LoggedRun({"id": "r1"}, {}, [row], lambda path: files[path])


def test_an_evaluation_s_names_must_be_folder_names():
    """W&B data is outside input: a logged run name that would leave the results folder is one line."""
    run = _logged_run({"model_short_name": "tiny", "run": "../../etc"}, {})
    with pytest.raises(ValueError, match="W&B run r1: its evaluation's run name") as err:
        wandb_read.evaluations([run])
    assert "\n" not in str(err.value)


def test_pass_at_k_tables_become_passk_csv_rows_in_the_eval_stage_s_order():
    tables = {
        f"eval/{d}/pass@k": {
            "columns": ["k", "pass@k", "n_problems", "n_samples"],
            "data": [[1, 0.25, 2, 8], [4, 0.5, 2, 8]],
        }
        for d in ("math500", "avg_paper", "aime")
    }
    tables["eval/per_problem"] = {
        "columns": ["dataset", "problem_id", "n", "c", "mean_completion_tokens"],
        "data": [["aime24", "007", 4, 1, 3.5]],
    }
    ((key, evaluation),) = wandb_read.evaluations(
        [_logged_run({"model_short_name": "m", "run": "r"}, tables)]
    ).items()
    assert key == ("m", "r")
    assert evaluation.passk["dataset"].tolist() == [
        "aime",
        "aime",
        "math500",
        "math500",
        "avg_paper",
        "avg_paper",
    ]
    assert list(evaluation.passk.columns) == ["dataset", "k", "pass_at_k", "n_problems", "n_samples"]
    assert evaluation.per_problem["problem_id"].tolist() == ["007"]  # an id stays text


def test_an_evaluation_logged_twice_is_read_from_the_later_row():
    """A rerun of stage 3 logs the same results folder again (into the same training run, or a new eval run): the
    later row wins, whichever run holds it."""
    table = lambda value: {"columns": ["k", "pass@k", "n_problems", "n_samples"], "data": [[1, value, 2, 8]]}
    manifest = {"model_short_name": "m", "run": "r"}
    late = _logged_run(manifest, {"eval/math500/pass@k": table(0.75)})
    early = _logged_run(manifest, {"eval/math500/pass@k": table(0.25)})
    late.rows[0]["_timestamp"], early.rows[0]["_timestamp"] = 20.0, 10.0
    for order in ([late, early], [early, late]):
        ((_, evaluation),) = wandb_read.evaluations(order).items()
        assert evaluation.passk["pass_at_k"].tolist() == [0.75]


def test_the_reader_replaces_only_a_folder_it_wrote(tmp_path):
    into = tmp_path / "wandb"
    (into / "m" / "r").mkdir(parents=True)
    (into / "m" / "r" / "passk.csv").write_text("dataset,k,pass_at_k\n")
    with pytest.raises(FileExistsError, match="holds files the W&B reader did not write"):
        wandb_read._claim(into)
    (into / ".from_wandb.json").write_text(json.dumps({"runs": ["m/r"]}))
    (into / "report.md").write_text("# old report\n")
    wandb_read._claim(into)
    assert not (into / "m").exists() and (into / "report.md").is_file()  # the report rewrites its own files


def test_from_wandb_is_a_folder_here_or_entity_project(tmp_path):
    assert wandb_read.source_kind(str(tmp_path)) == "offline"
    assert wandb_read.source_kind("me/sage-unsloth") == "online"
    for bad in ("me", "me/proj/runs", "/no/such/folder"):
        with pytest.raises(FileNotFoundError, match="neither a folder of W&B runs"):
            wandb_read.source_kind(bad)
    with pytest.raises(FileNotFoundError, match="no W&B run files"):
        wandb_read.offline_runs(tmp_path)


def test_runs_vs_paper_holds_each_run_point_and_the_paper_rows_they_map_to():
    """One row per (run, dataset, k) with the paper's value at the same point, then the paper's own points of
    the rows the runs map to (the report's mapping: the model folder and the run name), written out by hand."""
    curves = pd.DataFrame(
        [
            ["qwen2.5-math-7b", "grpo_branch", "aime", 1, 0.30, 0.2, 0.4],
            ["qwen2.5-math-7b", "grpo_branch", "aime", 256, 0.70, 0.6, 0.8],
            ["tiny", "grpo", "math500", 1, 0.10, np.nan, np.nan],
        ],
        columns=["model", "run", "dataset", "k", "value", "ci_low", "ci_high"],
    )
    published = pd.DataFrame(
        [
            ["Qwen2.5-Math-7B", "GRPO + Branch", "aime", 256, 0.75, True],
            ["Qwen2.5-Math-7B", "GRPO + Branch", "amc23", 1, 0.60, False],
            ["Qwen2.5-Math-7B", "GRPO", "aime", 256, 0.71, True],
        ],
        columns=["model", "method", "dataset", "k", "value", "primary"],
    )
    table = runs_vs_paper(curves, published)
    runs, paper = table[table["source"] == "run"], table[table["source"] == "paper"]
    assert runs["series"].tolist() == ["qwen2.5-math-7b/grpo_branch"] * 2 + ["tiny/grpo"]
    assert runs["method"].tolist() == ["GRPO + Branch", "GRPO + Branch", "GRPO"]  # by run name
    assert runs["paper_model"].tolist()[:2] == ["Qwen2.5-Math-7B"] * 2 and pd.isna(
        runs["paper_model"].iloc[2]
    )
    assert runs["paper"].iloc[1] == 0.75 and runs["diff"].iloc[1] == pytest.approx(0.70 - 0.75)
    assert pd.isna(runs["paper"].iloc[0]) and runs["ci_low"].tolist()[:2] == [0.2, 0.6]
    assert (
        paper["series"].tolist() == ["paper: Qwen2.5-Math-7B / GRPO + Branch"] * 2
    )  # GRPO: no run maps to it
    assert paper[["dataset", "k", "pass_at_k"]].values.tolist() == [["aime", 256, 0.75], ["amc23", 1, 0.60]]
    assert paper["primary"].tolist() == [True, False]
    mapped = runs_vs_paper(curves, published, {"tiny/grpo": {"model": "Qwen2.5-Math-7B", "method": "GRPO"}})
    assert "paper: Qwen2.5-Math-7B / GRPO" in set(mapped["series"])  # a mapping file's row joins


BLOCK_WANDB = (
    "import sys; sys.modules['wandb'] = None\n"  # `import wandb` raises ImportError, as when uninstalled
)


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_WANDB + code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.slow  # a fresh interpreter
def test_the_kit_runs_without_wandb_and_says_how_to_install_it(tmp_path):
    """With wandb not importable: the report runs (nothing imports wandb unless W&B is asked for), and each W&B
    option is one line naming `pip install wandb`."""
    import shutil

    shutil.copytree(FIXTURE, tmp_path / "results")
    code = f"""
import importlib.util
from sage_unsloth.report.run import main
from sage_unsloth import cli
from sage_unsloth.runtime import wandb_runs
from sage_unsloth.eval import run as eval_run, wandb_log
from sage_unsloth.sft import run as sft_run
from sage_unsloth.rlvr import run as rlvr_run
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "wandb" else real(name, *a)
assert main(["--results", {str(tmp_path / "results")!r}, "--resamples", "100"]) == 0
assert "wandb" not in sys.modules or sys.modules["wandb"] is None
from sage_unsloth.config.input_checks import check_wandb
for call in (lambda: check_wandb("wandb"), lambda: wandb_runs.import_wandb("report_to=wandb")):
    try:
        call()
    except ValueError as exc:
        print("LINE", exc)
print("REPORT", main(["--results", {str(tmp_path / "results")!r}, "--from_wandb", "me/proj"]))
"""
    done = _python(code, REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("LINE")]
    assert len(lines) == 2 and all("pip install wandb" in line for line in lines), lines
    assert "REPORT 2" in done.stdout
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "--from_wandb: the wandb package is not installed" in error and "pip install wandb" in error
    assert (tmp_path / "results" / "report.md").is_file() and not (tmp_path / "results" / "wandb").exists()
