"""How many torch threads a step of a job graph gets: the cores idle when the graph starts, shared among the heavy
steps running at once (at least 1 each); a light step (writing files, a table) takes one thread and no share.

"Idle" is read from /proc/stat over half a second, not from the load average: on a small VM the 1-minute load
average sits near 1 with nothing running (kernel threads in I/O wait count towards it), which left the demo's
pre-training on one of two idle cores (190 s instead of about 90 s). On a loaded machine it is one thread per
step: torch's OpenMP threads spin while they wait, and two threads on a busy core cost about five times the CPU
of one (measured for the demo's pre-training step: 85 s against 16 s of CPU for the same 60 steps). The results
do not depend on the thread count (tests/demo/test_demo_steps.py checks the pre-training; torch's CPU kernels for
these shapes reduce in a fixed order).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies over all CPUs from /proc/stat; idle counts I/O wait (the CPU is free then)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields[:8])  # user nice system idle iowait irq softirq steal


def idle_fraction(interval: float = 0.5) -> float | None:
    """The share of CPU time spent idle over ``interval`` seconds now, or None where /proc/stat is missing."""
    try:
        idle0, total0 = _cpu_times()
        time.sleep(interval)
        idle1, total1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    return (idle1 - idle0) / (total1 - total0) if total1 > total0 else None


def idle_cores(interval: float = 0.5) -> int:
    """Usable cores not busy with other work now (at least 1): the idle share of all CPUs over ``interval``
    seconds, times their number, capped at the usable ones; off Linux, usable cores minus the load average."""
    fraction = idle_fraction(interval)
    if fraction is not None:
        return max(1, min(usable_cores(), int(fraction * (os.cpu_count() or 1) + 0.5)))
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(1, int(usable_cores() - load + 0.5))


def threads_for(step, *, free: int, heavy_waiting: int, heavy_running: int, jobs: int) -> int:
    """Torch threads for a step starting now: one for a light step; else the idle cores shared among the
    heavy steps that will run at once (this one, those running, and those ready to start beside it)."""
    if step.light:
        return 1
    at_once = min(jobs, heavy_running + 1 + heavy_waiting)
    return max(1, free // max(1, at_once))
