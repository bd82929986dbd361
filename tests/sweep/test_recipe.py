"""The recipe driver (sage_unsloth/recipe.py): stage commands, skipping a stage whose manifest matches this run's
command, streaming a child's log, and failures with the last lines of the log."""

from __future__ import annotations

import json
import sys

import pytest

from sage_unsloth import recipe
from sage_unsloth.manifest import write_manifest


def test_stage_command_runs_the_stage_package():
    assert recipe.stage_command("sft", "c.yaml", "--max_steps", 3, python="py") == [
        "py",
        "-m",
        "sage_unsloth.sft",
        "c.yaml",
        "--max_steps",
        "3",
    ]
    assert recipe.stage_command("report", "r.yaml")[0] == sys.executable
    with pytest.raises(ValueError, match="stage 'tune' is unknown"):
        recipe.stage_command("tune", "c.yaml")


def test_run_stage_streams_output_skips_finished_stages_and_reports_failures(tmp_path, capsys):
    ok = [sys.executable, "-c", "import sys; print('step 1'); print('warn', file=sys.stderr)"]
    assert recipe.run_stage(ok, cwd=tmp_path)
    out = capsys.readouterr().out
    assert "step 1" in out and "warn" in out and out.startswith("$ python -c")

    fail = [sys.executable, "-c", "import sys; [print(f'line {i}') for i in range(100)]; sys.exit(3)"]
    with pytest.raises(recipe.StageFailed, match="exited with status 3") as info:
        recipe.run_stage(fail, cwd=tmp_path, tail_lines=5)
    assert str(info.value).splitlines()[1:] == [f"line {i}" for i in range(95, 100)]

    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "manifest.json").write_text("{}")
    assert not recipe.run_stage(fail, cwd=tmp_path, done=tmp_path / "done")  # finished earlier: not run
    assert "[skip]" in capsys.readouterr().out


def test_a_stage_is_skipped_only_when_its_manifest_matches_this_command(tmp_path, capsys):
    out_dir, record = tmp_path / "sft", tmp_path / "stages" / "sft.json"
    write = (
        f"from sage_unsloth.manifest import write_manifest; "
        f"write_manifest({str(out_dir)!r}, stage='sft', config={{}})"
    )
    command = [sys.executable, "-c", write]
    assert recipe.run_stage(command, cwd=tmp_path, done=out_dir, stage="sft", record=record)  # ran
    assert json.loads(record.read_text())["command"] == command[1:]  # without the interpreter
    assert not recipe.run_stage(
        command, cwd=tmp_path, done=out_dir, stage="sft", record=record
    )  # same: skipped
    assert "[skip]" in capsys.readouterr().out
    other = [sys.executable, "-c", write + "  # --max_steps 5"]
    with pytest.raises(ValueError, match="was written with .* not by"):
        recipe.run_stage(other, cwd=tmp_path, done=out_dir, stage="sft", record=record)
    with pytest.raises(ValueError, match="manifest"):  # the manifest of another stage is not a finished sft
        recipe.finished(out_dir, "rlvr", command[1:], record)


def test_finished_refuses_a_folder_filled_without_a_record(tmp_path):
    folder = tmp_path / "run"
    assert not recipe.finished(folder, "eval", ["a"], tmp_path / "r.json")  # nothing there: run it
    write_manifest(folder, stage="eval", config={})
    with pytest.raises(ValueError, match="by another driver or by hand"):
        recipe.finished(folder, "eval", ["a"], tmp_path / "r.json")
    assert recipe.finished(folder, "eval", ["a"], None)  # no record kept: the manifest alone decides
