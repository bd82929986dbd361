"""Stage 3's progress, from what this run measures: a tqdm bar on a terminal, and in a log (SLURM, the demo's
step logs, ``> file``), where a bar draws nothing, one line per written chunk (at most one every ``every_s``
seconds, and the last) with the problems done, the time so far and what is left at the measured rate. The rate
counts only what this run sampled, from when the sampler was ready (:meth:`SamplingProgress.ready`): chunks
reused from disk are neither time nor work, and the model's loading is said apart.

At the end one line says what sampling took, beside what the backend rule estimated before it started (its
figures are a cost model's, measured on the tiny model on an idle machine: the run's own time is this one).
"""

from __future__ import annotations

import time
from collections.abc import Callable

LINE_EVERY_S = 10.0


class SamplingProgress:
    """``update(problems)`` after each chunk written; ``close()`` at the end (see the module docstring)."""

    def __init__(
        self,
        total: int,
        done: int,
        name: str,
        *,
        estimate_s: float | None = None,
        lines: bool | None = None,
        every_s: float = LINE_EVERY_S,
        clock: Callable[[], float] = time.perf_counter,
        echo: Callable[[str], None] | None = None,
    ):
        from tqdm.auto import tqdm

        self.total, self.done, self.name = total, done, name
        self.bar = tqdm(
            total=total, initial=done, desc=name, unit="problem", dynamic_ncols=True, disable=None
        )
        self.lines = self.bar.disable if lines is None else lines  # no bar to draw: lines instead
        self.estimate_s, self.every_s, self.clock = estimate_s, every_s, clock
        self.echo = echo or (
            lambda line: print(line, flush=True)
        )  # stdout, as the backend line: stderr is errors
        self.started = self.ready_at = clock()
        self.sampled = 0  # problems sampled by this run
        self.last_line = None

    def ready(self) -> None:
        """The sampler is loaded: the rate is measured from now."""
        self.ready_at = self.clock()

    def update(self, problems: int) -> None:
        self.bar.update(problems)
        self.done += problems
        self.sampled += problems
        now = self.clock()
        if self.lines and (
            self.last_line is None or now - self.last_line >= self.every_s or self.done >= self.total
        ):
            self.last_line = now
            self.echo(self.line(now - self.started))

    def line(self, elapsed: float) -> str:
        left = self.total - self.done
        head = f"stage 3 {self.name}: {self.done}/{self.total} problems, {elapsed:.0f} s"
        if left <= 0 or self.sampled == 0:
            return head
        rate = (self.started + elapsed - self.ready_at) / self.sampled
        return f"{head}, {rate:.2f} s a problem: about {rate * left:.0f} s left"

    def close(self) -> None:
        self.bar.close()
        if self.sampled == 0:
            return
        now = self.clock()
        said = f"; the backend rule had estimated {self.estimate_s:.0f} s" if self.estimate_s else ""
        self.echo(
            f"stage 3 {self.name}: sampled {self.sampled} problems in {now - self.started:.0f} s (loading "
            f"{self.ready_at - self.started:.0f} s){said}"
        )
