"""The report's optional W&B upload (sage_unsloth/report/wandb_log.py), against the installed wandb, offline.

This checks what it writes: the run (project, group, job type "report", read with wandb's own reader) and the
media files the wandb SDK puts in the offline run folder: the report's tables, the paper's, plots, markdown. What
the report reads back from W&B: tests/kit/test_wandb_stages.py.
"""

import json

import pandas as pd
import pytest
from PIL import Image

from sage_unsloth import compat
from sage_unsloth.report import wandb_log


@pytest.mark.slow
def test_log_report_to_an_offline_run(tmp_path, monkeypatch):
    import wandb

    wandb.teardown()  # an earlier in-process run (tests/kit/test_checkpoints.py's) leaves wandb's settings, WANDB_DIR too
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    png = tmp_path / "p.png"
    Image.new("RGB", (32, 32), color=(200, 10, 10)).save(png)
    frame = pd.DataFrame({"run": ["a"], "value": [0.5], "ci_low": [float("nan")]})
    paper = pd.DataFrame({"model": ["Qwen2.5-Math-7B"], "method": ["GRPO"], "k": [256], "value": [0.8]})
    run_dir = wandb_log.log_report(
        "sage-test",
        tables={"comparison": frame, "empty": frame.iloc[:0]},
        images={"avg_paper": png},
        markdown="# report <b>",
        group="qwen",
        paper={"passk": paper},
    )
    folder = next((tmp_path / "wandb").glob("offline-run-*"))
    assert str(folder) in run_dir
    (log_file,) = folder.glob("run-*.wandb")
    (head,) = [r["run"] for r in compat.wandb_transaction_log(log_file) if r["type"] == "run"]
    assert (head["project"], head["run_group"], head["job_type"]) == ("sage-test", "qwen", "report")
    media = folder / "files" / "media"
    (reference,) = (media / "table" / "paper").glob("passk_*.table.json")  # the paper's table beside the runs
    assert json.loads(reference.read_text()) == {
        "columns": ["model", "method", "k", "value"],
        "data": [["Qwen2.5-Math-7B", "GRPO", 256, 0.8]],
    }
    (table,) = (media / "table" / "report").glob("comparison_*.table.json")
    assert json.loads(table.read_text()) == {
        "columns": ["run", "value", "ci_low"],
        "data": [["a", 0.5, None]],
    }
    assert not list((media / "table" / "report").glob("empty_*"))  # an empty table is not logged
    (image,) = (media / "images" / "plots").glob("avg_paper_*.png")
    with Image.open(image) as img:
        assert img.size == (32, 32) and img.getpixel((0, 0))[:3] == (200, 10, 10)
    (page,) = (media / "html" / "report").glob("markdown_*.html")
    assert "<pre># report &lt;b&gt;</pre>" in page.read_text()  # the markdown is escaped, not rendered
