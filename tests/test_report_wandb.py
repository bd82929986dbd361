"""W&B contact points: our offline-run reader against a run written by the installed wandb, and report logging."""

import os
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest
from PIL import Image

from sage_unsloth.report import plots, wandb_io

LOGGER = textwrap.dedent("""
    import sys, wandb
    run = wandb.init(project="sage-test", dir=sys.argv[1], name="fake-grpo", mode="offline")
    for step in range(6):
        run.log({"train/reward": 0.1 * step, "train/kl": 0.01 * step, "train/entropy": 1.0 - 0.05 * step,
                 "train/sage/q_mean": 1.0 + 0.02 * step, "train/loss": float("nan")}, step=step)
    run.log({"eval/pass_at_1": 0.5}, step=6)
    run.finish()
""")


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
    subprocess.run([sys.executable, "-c", LOGGER, str(root)], check=True, env=env, timeout=120)
    folders = sorted((root / "wandb").glob("offline-run-*"))
    assert len(folders) == 1
    _wait_until_flushed(folders[0])
    return folders[0]


def _wait_until_flushed(folder, timeout=30.0):
    """wandb-core writes the transaction log asynchronously; wait for the run's exit record."""
    deadline = time.monotonic() + timeout
    while not (list(folder.glob("run-*.wandb")) and wandb_io.run_finished(folder)):
        assert time.monotonic() < deadline, f"{folder}: no exit record after {timeout}s"
        time.sleep(0.1)


def test_offline_reader_reads_back_logged_values(offline_run):
    history = wandb_io.read_offline_history(offline_run)
    train = history.dropna(subset=["train/reward"])
    assert list(train["_step"]) == [0, 1, 2, 3, 4, 5]
    assert train["train/reward"].tolist() == pytest.approx([0.1 * s for s in range(6)])
    assert train["train/sage/q_mean"].tolist() == pytest.approx([1.0 + 0.02 * s for s in range(6)])
    assert history.loc[history["_step"] == 6, "eval/pass_at_1"].item() == 0.5
    assert history["train/loss"].isna().all()  # NaN stays NaN, never 0


def test_training_curves_plot(offline_run, tmp_path):
    histories = wandb_io.load_histories(offline=str(offline_run.parent / "offline-run-*"))
    ((name, hist),) = histories.items()
    assert name.startswith("fake-grpo (")
    assert list(hist.columns) == ["_step", *wandb_io.TRAINING_KEYS]
    png = plots.training_curves(histories, list(wandb_io.TRAINING_KEYS), tmp_path / "t.png", size=(800, 500))
    with Image.open(png) as img:
        assert img.size == (800, 500)


def test_key_resolution_accepts_unprefixed_and_suffixed_names():
    assert wandb_io.resolve_key(["_step", "reward"], "train/reward") == "reward"
    assert (
        wandb_io.resolve_key(["train/rewards/accuracy", "train/sage/q_mean"], "train/sage/q_mean")
        == "train/sage/q_mean"
    )
    assert wandb_io.resolve_key(["foo/kl"], "train/kl") == "foo/kl"
    assert wandb_io.resolve_key(["x"], "train/entropy") is None


def test_torn_tail_of_a_live_run_is_dropped(offline_run, tmp_path):
    data = next(offline_run.glob("run-*.wandb")).read_bytes()
    torn = tmp_path / "run-torn.wandb"
    torn.write_bytes(data[: len(data) - 5])
    history = wandb_io.read_offline_history(torn)
    assert len(history) >= 6
    (tmp_path / "run-bad.wandb").write_bytes(b"not a wandb file")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        wandb_io.read_offline_history(tmp_path / "run-bad.wandb")


def test_log_report_to_an_offline_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    png = tmp_path / "p.png"
    Image.new("RGB", (32, 32)).save(png)
    frame = pd.DataFrame({"run": ["a"], "value": [0.5], "ci_low": [float("nan")]})
    run_dir = wandb_io.log_report(
        "sage-test", tables={"comparison": frame}, images={"avg_paper": png}, markdown="# report <b>"
    )
    folder = next((tmp_path / "wandb").glob("offline-run-*"))
    assert str(folder) in run_dir
    _wait_until_flushed(folder)
    assert {"report/comparison", "plots/avg_paper", "report/markdown"} <= _logged_media(folder)
    assert set(wandb_io.read_offline_history(folder).columns) == {"_step", "_runtime", "_timestamp"}


def _logged_media(folder):
    """Names of media history items (tables, images), which read_offline_history skips."""
    keys = set()
    for record in wandb_io._parsed_records(next(folder.glob("run-*.wandb"))):
        if record.WhichOneof("record_type") == "history":
            keys |= {i.nested_key[0] for i in record.history.item if list(i.nested_key[1:]) == ["_type"]}
    return keys
