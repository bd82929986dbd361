"""The recipe driver: build a stage's command, run it in a child process with its log streamed (to a notebook
cell) or written (to a log file).

Used by the offline demo (sage_unsloth/demo), the notebooks (sage_unsloth/jobs/notebook.py) and the sweep
(sage_unsloth/jobs/sweep.py); each stage always runs as its own process (``python -m sage_unsloth.<stage>``), since
importing Unsloth patches TRL process-wide and evaluation must never share a process with it. Which stages are
finished, and which run, is the kit's one job graph's to decide (sage_unsloth/jobs).
"""

from __future__ import annotations

import codecs
import os
import shlex
import subprocess
import sys
from collections import deque
from pathlib import Path

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


def start(
    argv: list[str],
    log: Path,
    *,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    new_session: bool = False,
) -> subprocess.Popen:
    """Start a stage with its stdout + stderr written to ``log`` (parallel drivers poll it). The stage dies with
    this driver (the sweep's local executor, the demo), kill -9 included: sage_unsloth/runtime/lifeline.py."""
    from sage_unsloth.runtime.lifeline import guard_descendants

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
    tail_lines: int = 40,
    out=None,
) -> None:
    """Run one stage in a child process with its log streamed to ``out``. Whether it needs to run is the job
    graph's to say (sage_unsloth/jobs: the notebooks' recipe asks it first). Raises :class:`StageFailed` with
    the last ``tail_lines`` lines when the child fails."""
    out = out or sys.stdout
    from sage_unsloth.runtime.credentials import redact_argv

    print("$ " + shlex.join(["python", *redact_argv(command[1:])]), file=out, flush=True)
    code, tail = stream(command, cwd=cwd, env=env, tail_lines=tail_lines, out=out)
    if code != 0:
        name = command[2] if len(command) > 2 else command[0]
        raise StageFailed(f"{name} exited with status {code}; last lines:\n" + "\n".join(tail))
