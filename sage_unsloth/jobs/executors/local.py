"""``executor: local`` (the default): each task is a child process of the driver, in a session of its own, on
one of the driver's own slots (a GPU group or a CPU slot, sage_unsloth/jobs/sweep.py ``make_slots``; the demo's
``--jobs``). Its CPU time (user + system, its waited-for children included) is measured when it ends."""

from __future__ import annotations

import os
import signal
import subprocess

from sage_unsloth.jobs.executors.base import Executor, Task, register
from sage_unsloth.jobs.recipe import start


class LocalHandle:
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.cpu_s = 0.0  # set when the process has ended

    def poll(self) -> int | None:
        if self.proc.returncode is not None:
            return self.proc.returncode
        pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
        if pid == 0:
            return None
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_s = round(usage.ru_utime + usage.ru_stime, 1)
        return self.proc.returncode

    def cancel(self) -> None:
        """Stop the task's whole process group (a stage's own children too)."""
        if self.proc.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired, ChildProcessError):
            pass


@register("local")
class LocalExecutor(Executor):
    uses_local_slots = True

    def submit(self, tasks: list[Task]) -> list[LocalHandle]:
        return [
            LocalHandle(start(t.argv, t.log, cwd=t.cwd, env={**os.environ, **t.env}, new_session=True))
            for t in tasks
        ]
