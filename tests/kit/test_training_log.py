"""log_history.jsonl (format: sage_unsloth/runtime/training_log.py, writer: sage_unsloth/runtime/log_writer.py) and the
report's training section read from it.

The writer is driven here through the TrainerCallback hooks with a real transformers TrainerState; a real
tiny RLVR run feeding the report is in test_rlvr_pipeline.py, exact resume of the log in test_rlvr_resume.py.
"""

import json
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from transformers import TrainerControl, TrainerState, TrainingArguments

from sage_unsloth.report import plots, training
from sage_unsloth.runtime.log_writer import LogHistoryWriter
from sage_unsloth.runtime.manifest import write_manifest
from sage_unsloth.runtime.training_log import LOG_HISTORY_FILE, read_log_history


def _log(writer, state, entry):
    """What Trainer.log does: append to state.log_history, then call on_log."""
    state.log_history.append(entry)
    writer.on_log(None, state, TrainerControl(), logs=entry)


def _entry(step):
    return {
        "reward": 0.1 * step,
        "kl": 1e-3 * step,
        "sage/q_mean": 1 + step / 7,
        "step": step,
        "epoch": step / 4,
    }


def test_lines_are_written_as_logged_and_a_resume_keeps_exactly_the_checkpoints_steps(tmp_path):
    writer = LogHistoryWriter(tmp_path)
    state = TrainerState()
    writer.on_train_begin(None, state, TrainerControl())
    for step in (1, 2, 3):
        _log(writer, state, _entry(step))
        # on disk as soon as it is logged: a kill now keeps it
        assert [e["step"] for e in read_log_history(tmp_path)] == list(range(1, step + 1))
    checkpoint = TrainerState(log_history=[dict(e) for e in state.log_history[:2]], global_step=2)
    checkpoint.save_to_json(str(tmp_path / "trainer_state.json"))
    written_before = (tmp_path / LOG_HISTORY_FILE).read_text().splitlines()

    # killed after logging step 3; resumed from checkpoint-2 (transformers loads its state before train begin)
    resumed = TrainerState.load_from_json(str(tmp_path / "trainer_state.json"))
    writer = LogHistoryWriter(tmp_path)
    writer.on_train_begin(None, resumed, TrainerControl())
    assert (tmp_path / LOG_HISTORY_FILE).read_text().splitlines() == written_before[
        :2
    ]  # same bytes, step 3 gone
    _log(writer, resumed, _entry(3))
    _log(writer, resumed, _entry(4))
    assert read_log_history(tmp_path) == [_entry(s) for s in (1, 2, 3, 4)]


def test_a_fresh_run_starts_an_empty_log_and_other_processes_write_nothing(tmp_path):
    (tmp_path / LOG_HISTORY_FILE).write_text(
        json.dumps(_entry(9)) + "\n"
    )  # a killed run before any checkpoint
    writer = LogHistoryWriter(tmp_path)
    writer.on_train_begin(None, TrainerState(), TrainerControl())
    assert read_log_history(tmp_path) == []
    other = TrainerState(is_world_process_zero=False)
    _log(writer, other, _entry(1))
    assert read_log_history(tmp_path) == []


def test_a_torn_last_line_is_dropped_and_a_damaged_one_is_an_error(tmp_path):
    path = tmp_path / LOG_HISTORY_FILE
    path.write_text(json.dumps(_entry(1)) + "\n" + json.dumps(_entry(2))[:-7])
    assert read_log_history(path) == [_entry(1)]
    path.write_text("{oops\n" + json.dumps(_entry(1)) + "\n")
    with pytest.raises(ValueError, match=r"log_history.jsonl:1: not a JSON object"):
        read_log_history(path)
    with pytest.raises(FileNotFoundError, match="wrote no training log"):
        read_log_history(tmp_path / "nowhere")


def test_the_writer_is_a_trainer_callback_the_trainer_calls(tmp_path):
    """Contact point: transformers calls on_train_begin and on_log of a callback passed as callbacks=[...]."""
    from transformers.trainer_callback import CallbackHandler

    handler = CallbackHandler([LogHistoryWriter(tmp_path)], None, None, None, None)
    state = TrainerState()
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    handler.on_train_begin(args, state, TrainerControl())
    state.log_history.append(_entry(1))
    handler.on_log(args, state, TrainerControl(), _entry(1))
    assert read_log_history(tmp_path) == [_entry(1)]


# ---------------------------------------------------------------------------------------------- report side
def _rlvr_folder(root, variant, entries, *, named=True):
    folder = root / "outputs" / "tiny" / variant
    folder.mkdir(parents=True)
    (folder / LOG_HISTORY_FILE).write_text("".join(json.dumps(e) + "\n" for e in entries))
    write_manifest(
        folder,
        stage="rlvr",
        config={},
        variant=variant,
        model_short_name="tiny",
        **({"log_history": LOG_HISTORY_FILE} if named else {}),
    )
    return folder


def _Run(checkpoint):  # an evaluated run whose eval manifest names ``checkpoint`` (no CSV is read here)
    from sage_unsloth.report.loading import RunResults

    manifest = {"stage": "eval", "checkpoint": str(checkpoint)}
    return RunResults(
        "tiny", Path(checkpoint).name, Path(checkpoint).parent / "results", None, None, manifest
    )


@pytest.mark.slow
def test_report_finds_rlvr_logs_through_eval_manifests_and_a_glob(tmp_path):
    summary_line = {"train_runtime": 3.0, "train_loss": 0.1, "step": 3, "epoch": 1.0}
    grpo = _rlvr_folder(tmp_path, "grpo", [_entry(1), _entry(2), _entry(3), summary_line])
    _rlvr_folder(tmp_path, "grpo_branch", [_entry(2), {**_entry(4), "sage/seq_log_q": 0.2}])
    _rlvr_folder(tmp_path, "old", [_entry(1)], named=False)
    sft = tmp_path / "outputs" / "tiny" / "sft"
    write_manifest(sft, stage="sft", config={})
    runs = [_Run(grpo), _Run(grpo), _Run(sft), _Run(tmp_path / "missing")]

    folders = training.training_folders(runs, str(tmp_path / "outputs" / "*" / "*"))
    assert sorted(folders) == [
        "tiny/grpo",
        "tiny/grpo_branch",
        "tiny/old",
    ]  # once each; the SFT run is not RLVR
    notes = []
    histories = training.load_histories(folders, notes)
    assert notes == ["tiny/old: the RLVR manifest names no log_history (written before the kit logged one)"]
    assert histories["tiny/grpo"]["step"].tolist() == [1, 2, 3]  # the end-of-training summary is no point
    assert training.metric_keys(histories) == ["reward", "kl", "sage/q_mean", "sage/seq_log_q"]

    summary = training.summary_table(histories).set_index(["run", "metric"])
    assert summary.loc[("tiny/grpo", "reward")].to_dict() == {
        "points": 3,
        "first_step": 1,
        "last_step": 3,
        "first": 0.1,
        "last": pytest.approx(0.3),
        "min": 0.1,
        "max": pytest.approx(0.3),
    }
    assert summary.loc[("tiny/grpo_branch", "sage/seq_log_q"), "points"] == 1
    assert ("tiny/grpo", "sage/seq_log_q") not in summary.index

    text = training.markdown_section(
        summary.reset_index(), "report/training_curves.png", "report/training.csv", notes
    )
    assert "| tiny/grpo | 3 | 0.100 → 0.300 | 0.001 → 0.003 | 1.143 → 1.429 |" in text
    assert "| tiny/grpo_branch | 4 | 0.200 → 0.400 |" in text
    assert "- tiny/old: the RLVR manifest names no log_history" in text

    png = plots.training_curves(
        histories, training.metric_keys(histories), tmp_path / "t.png", size=(640, 480)
    )
    with Image.open(png) as img:
        assert img.size == (640, 480)  # 4 panels: 2 rows fit the size asked
    many = {"run": pd.DataFrame({"step": [1, 2], **{f"sage/m{i}": [0.0, 1.0] for i in range(7)}})}
    png = plots.training_curves(many, training.metric_keys(many), tmp_path / "many.png", size=(640, 480))
    with Image.open(png) as img:
        assert img.size == (640, 4 * plots.TRAINING_ROW_HEIGHT)  # 7 panels: 4 rows, each 220 px high


def test_no_training_log_is_said_not_hidden(tmp_path):
    assert training.load_histories({}, []) == {}
    text = training.markdown_section(training.summary_table({}), None, "report/training.csv", [])
    assert "No RLVR training log found" in text and "--training_runs" in text
    assert plots.training_curves({}, [], tmp_path / "t.png") is None
    assert isinstance(training.summary_table({}), pd.DataFrame)


@pytest.mark.slow
def test_the_report_does_not_import_the_training_stack():
    """Reading logs must not pull in transformers/torch: that import alone tripled the report's CPU time."""
    import subprocess
    import sys

    code = (
        "import sys, sage_unsloth.report.stage; print(sorted({'transformers', 'torch'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
