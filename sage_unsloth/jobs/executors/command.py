"""The function every non-local executor runs on its worker: start the task's stage command with its log,
wait, return the exit status. It runs in submitit's job process or a Ray worker, so a killed worker must
not leave the stage running: the stage gets SIGKILL when its parent dies (Linux ``PR_SET_PDEATHSIG``), and
SIGTERM / SIGINT / SIGUSR2 (SLURM's pre-emption and time-limit signals) are passed on to its process group.
Credentials reach the stage from the driver's credentials file (``SAGE_CREDENTIALS_FILE``), read here, on the
worker: never from the task's serialised arguments.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

from sage_unsloth.jobs.executors.base import Task

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass


def run_command(task: Task, argv: list[str] | None = None, log: Path | None = None, extra_env=None) -> int:
    argv = list(task.argv if argv is None else argv)
    log = Path(task.log if log is None else log)
    from sage_unsloth.runtime.credentials import CREDENTIALS_FILE_ENV, read_credentials_file

    env = {**os.environ, **task.env, **(extra_env or {})}
    env.update(read_credentials_file(env.get(CREDENTIALS_FILE_ENV)))  # never in the task's own arguments
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=task.cwd,
            env=env,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - setsid + prctl only, no locks taken
        )

    def forward(signum, _frame):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        try:
            previous[signum] = signal.signal(signum, forward)
        except ValueError:  # not the main thread (a Ray worker may call us from another thread)
            pass
    try:
        return proc.wait()
    finally:  # a Ray worker runs other tasks after this one, and must still stop on its own SIGTERM
        for signum, handler in previous.items():
            signal.signal(signum, handler)
