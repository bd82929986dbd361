"""``executor: local`` (the default): each task is a child process of the driver on one of the driver's own
slots (a GPU group or a CPU slot, sage_unsloth/sweep.py ``make_slots``)."""

from __future__ import annotations

import os
import subprocess

from sage_unsloth.executors.base import Executor, Task, register
from sage_unsloth.recipe import start


class LocalHandle:
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def poll(self) -> int | None:
        return self.proc.poll()

    def cancel(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()


@register("local")
class LocalExecutor(Executor):
    uses_local_slots = True

    def submit(self, tasks: list[Task]) -> list[LocalHandle]:
        return [LocalHandle(start(t.argv, t.log, cwd=t.cwd, env={**os.environ, **t.env})) for t in tasks]
