"""The recipe driver: build a stage's command, skip a stage whose manifest matches this run's inputs, run it
in a child process with its log streamed (to a notebook cell) or written (to a log file).

Used by the offline demo (sage_unsloth/demo), the notebooks (sage_unsloth/notebook.py) and the sweep
(sage_unsloth/sweep.py); each stage always runs as its own process (``python -m sage_unsloth.<stage>``), since
importing Unsloth patches TRL process-wide and evaluation must never share a process with it.

A finished stage is recognised by its folder's ``manifest.json`` (written last by every stage) together with a
*record*: a small JSON file the driver writes before it starts the stage, holding the stage's command without
the interpreter. Same manifest, same command: the stage is skipped. A folder that holds output of another
command is never silently reused or overwritten (:func:`finished` raises).
"""

from __future__ import annotations

import codecs
import json
import os
import shlex
import subprocess
import sys
from collections import deque
from pathlib import Path

from sage_unsloth.folder_lock import LOCK_NAME
from sage_unsloth.manifest import MANIFEST_NAME, atomic_write_text, read_manifest

STAGE_MODULES = {
    "sft": "sage_unsloth.sft",
    "rlvr": "sage_unsloth.rlvr",
    "eval": "sage_unsloth.eval",
    "report": "sage_unsloth.report",
}


class StageFailed(RuntimeError):
    """A stage's child process exited with a non-zero status (the message holds the last lines of its log)."""


def stage_command(stage: str, config: str | Path, *args: str, python: str | None = None) -> list[str]:
    """``[python, -m, sage_unsloth.<stage>, CONFIG, *args]``."""
    if stage not in STAGE_MODULES:
        raise ValueError(f"stage {stage!r} is unknown: choose one of {', '.join(STAGE_MODULES)}")
    return [python or sys.executable, "-m", STAGE_MODULES[stage], str(config), *map(str, args)]


def finished(manifest_dir: Path, stage: str, command: list[str], record: Path | None) -> bool:
    """Skip the stage? True when ``manifest_dir`` holds the ``stage`` manifest and ``record`` says this same
    ``command`` (without the interpreter) wrote it. A folder with output of another (or an unknown) command
    raises ValueError: its contents are never silently reused or overwritten. ``record=None``: the manifest
    alone decides (a folder filled by hand, e.g. a notebook rerun after the record was lost)."""
    from sage_unsloth.credentials import redact_argv

    manifest = Path(manifest_dir) / MANIFEST_NAME
    command = redact_argv(command)  # records hold commands without credentials (write_record)
    if record is not None:
        recorded = read_record(record) if record.is_file() else None
        has_output = Path(manifest_dir).is_dir() and any(  # a killed stage's lock file is no output
            p.name != LOCK_NAME for p in Path(manifest_dir).iterdir()
        )
        if has_output and recorded != command:
            how = (
                "by another driver or by hand"
                if recorded is None
                else f"with {shlex.join(redact_argv(recorded))}"
            )
            raise ValueError(
                f"{manifest_dir} was written {how}, not by {shlex.join(command)}: delete it or "
                "choose another output folder"
            )
    if not manifest.is_file():
        return False
    read_manifest(manifest_dir, expect_stage=stage)
    return True


def read_record(record: Path) -> list[str]:
    """The command a record names; a damaged record is one line naming the file and the fix."""
    try:
        command = json.loads(record.read_text(encoding="utf-8"))["command"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        where = f" line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise ValueError(
            f"{record}{where} is damaged ({type(exc).__name__}): delete it and the stage folder it names, then rerun"
        ) from None
    if not isinstance(command, list):
        raise ValueError(  # noqa: TRY004 - a damaged file, reported on the stages' one-line ValueError path
            f"{record} is damaged (no command list): delete it and the stage folder it names, then rerun"
        )
    return command


def write_record(record: Path, command: list[str]) -> None:
    """Say which command fills a stage folder (before it starts: a killed stage is recognised on rerun). A
    credential flag's value is never recorded (credentials.redact_argv)."""
    from sage_unsloth.credentials import redact_argv

    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(record, json.dumps({"command": redact_argv(command)}, indent=1) + "\n")


def start(
    argv: list[str],
    log: Path,
    *,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    new_session: bool = False,
) -> subprocess.Popen:
    """Start a stage with its stdout + stderr written to ``log`` (parallel drivers poll it). The stage dies with
    this driver (the sweep's local executor, the demo), kill -9 included: sage_unsloth/lifeline.py."""
    from sage_unsloth.lifeline import guard_descendants

    guard_descendants()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        return subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=None if cwd is None else str(cwd),
            env=env,
            start_new_session=new_session,
        )


def stream(
    argv: list[str], *, cwd: str | Path, env: dict[str, str] | None = None, tail_lines: int = 40, out=None
) -> tuple[int, list[str]]:
    """Run ``argv`` copying its stdout + stderr to ``out`` as it comes; returns (exit status, last lines).

    The raw bytes are written, so progress bars (\\r) redraw in place; an interrupt (a notebook's stop button)
    kills the child."""
    out = out or sys.stdout
    tail: deque[str] = deque(maxlen=tail_lines)
    partial = ""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    proc = subprocess.Popen(argv, cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        while chunk := os.read(proc.stdout.fileno(), 65536):
            text = decoder.decode(chunk)
            out.write(text)
            out.flush()
            *lines, partial = (partial + text).replace("\r", "\n").split("\n")
            tail.extend(line for line in lines if line.strip())
        code = proc.wait()
    except BaseException:  # KeyboardInterrupt included
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
    if partial.strip():
        tail.append(partial)
    return code, list(tail)


def run_stage(
    command: list[str],
    *,
    cwd: str | Path,
    env: dict[str, str] | None = None,
    done: Path | None = None,
    stage: str | None = None,
    record: Path | None = None,
    tail_lines: int = 40,
    out=None,
    recorded: list[str] | None = None,
) -> bool:
    """Run one stage in a child process with its log streamed to ``out``; False when it was skipped.

    ``done``: the stage's output folder; when it holds a finished run of this command (:func:`finished`, the
    manifest of ``stage`` and ``record``) the stage is skipped, so rerunning a recipe continues where it
    stopped. ``recorded``: the command the record holds when it is not ``command`` (a run continued with
    ``--resume`` is the same run). Raises :class:`StageFailed` with the last ``tail_lines`` lines when the child
    fails."""
    out = out or sys.stdout
    recorded = recorded or command[1:]  # the interpreter is not part of a stage's inputs
    if done is not None and (
        finished(Path(done), stage, recorded, record) if stage else (Path(done) / MANIFEST_NAME).is_file()
    ):
        print(f"[skip] {done} is finished ({MANIFEST_NAME} present)", file=out, flush=True)
        return False
    if record is not None:
        write_record(record, recorded)
    from sage_unsloth.credentials import redact_argv

    print("$ " + shlex.join(["python", *redact_argv(command[1:])]), file=out, flush=True)
    code, tail = stream(command, cwd=cwd, env=env, tail_lines=tail_lines, out=out)
    if code != 0:
        name = command[2] if len(command) > 2 else command[0]
        raise StageFailed(f"{name} exited with status {code}; last lines:\n" + "\n".join(tail))
    return True
