"""The recipe driver (sage_unsloth/jobs/recipe.py): stage commands, streaming a child's log, and failures with the last
lines of the log; a stage run in the foreground under the job graph's done rule (sage_unsloth/jobs, as the
notebooks run theirs)."""

from __future__ import annotations

import json
import sys

import pytest

from sage_unsloth.jobs import recipe
from sage_unsloth.runtime.manifest import write_manifest


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


def test_run_stage_streams_output_and_reports_failures(tmp_path, capsys):
    ok = [sys.executable, "-c", "import sys; print('step 1'); print('warn', file=sys.stderr)"]
    recipe.run_stage(ok, cwd=tmp_path)
    out = capsys.readouterr().out
    assert "step 1" in out and "warn" in out and out.startswith("$ python -c")

    fail = [sys.executable, "-c", "import sys; [print(f'line {i}') for i in range(100)]; sys.exit(3)"]
    with pytest.raises(recipe.StageFailed, match="exited with status 3") as info:
        recipe.run_stage(fail, cwd=tmp_path, tail_lines=5)
    assert str(info.value).splitlines()[1:] == [f"line {i}" for i in range(95, 100)]


def _stage(out_dir, extra=""):
    from sage_unsloth.jobs import Step

    write = (
        f"from sage_unsloth.runtime.manifest import write_manifest; "
        f"write_manifest({str(out_dir)!r}, stage='sft', config={{}}){extra}"
    )
    argv = [sys.executable, "-c", write]
    return Step("sft", argv, (out_dir,), code=None, done_file="manifest.json", keep=True)


def test_a_stage_run_here_is_skipped_only_when_the_job_graph_says_it_is_done(tmp_path, capsys):
    from sage_unsloth.jobs import fingerprint
    from sage_unsloth.jobs.graph import run_here

    out_dir, stamps = tmp_path / "sft", tmp_path / "stages"
    step = _stage(out_dir)
    start = lambda: recipe.run_stage(step.argv, cwd=tmp_path)
    assert run_here(step, fingerprint(step, {}), stamps, start)  # ran
    assert (
        json.loads((stamps / "sft.json").read_text())["command"] == step.argv[1:]
    )  # without the interpreter
    assert not run_here(step, fingerprint(step, {}), stamps, start)  # same inputs: skipped
    assert "[skip] sft: finished before with the same inputs" in capsys.readouterr().out
    other = _stage(out_dir, "  # --max_steps 5")
    with pytest.raises(ValueError, match="was written with .* not by"):
        run_here(other, fingerprint(other, {}), stamps, start)
    (out_dir / "manifest.json").unlink()  # stopped before its manifest: runs again, in its folder
    assert run_here(step, fingerprint(step, {}), stamps, start)


def test_a_folder_filled_without_a_stamp_is_refused(tmp_path):
    from sage_unsloth.jobs import fingerprint
    from sage_unsloth.jobs.graph import run_here

    folder = tmp_path / "run"
    write_manifest(folder, stage="sft", config={})
    step = _stage(folder)
    with pytest.raises(ValueError, match="by another driver or by hand"):
        run_here(step, fingerprint(step, {}), tmp_path / "stages", lambda: None)
