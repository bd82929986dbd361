"""A CPU-time deadline for grading, measured on the grading thread's own clock.

Why this clock: a verdict must not depend on machine load or on what else the process runs. Wall time
grows with load; process CPU time (``ITIMER_PROF``) also counts a vLLM engine's threads running beside the
grader. ``time.thread_time()`` counts only the work of the grading itself. Python cannot arm a timer on
that clock, so two periodic timers (process CPU and wall time) only *wake* the handler, which raises once
the thread's CPU time is over budget. A wall-clock backstop (``WALL_FACTOR`` x the budget + ``WALL_SLACK_S``)
ends a grading that stopped consuming CPU; it is far above what load can stretch a real budget to.

The deadline raises :class:`GradingTimeout`, a ``BaseException`` so that math-verify's and sympy's
``except Exception`` blocks let it through. Signals reach only the main thread; elsewhere grading runs in a
helper process (see ``sage_unsloth.grading.verify``). math-verify's own ``signal.alarm`` timeouts are
switched off (whole seconds, and they reset each other's timer).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

WALL_FACTOR = 10.0
WALL_SLACK_S = 5.0
TICKS_PER_BUDGET = 20  # the deadline fires within 1/20 of the budget of the thread's CPU time passing it


class GradingTimeout(BaseException):
    """Raised by the deadline; BaseException so that library ``except Exception`` blocks let it through."""


def can_interrupt() -> bool:
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")


@contextlib.contextmanager
def cpu_deadline(budget_s: float):
    """Run the block with at most ``budget_s`` CPU seconds of this (main) thread; else GradingTimeout."""
    started_cpu = time.thread_time()
    wall_deadline = time.monotonic() + budget_s * WALL_FACTOR + WALL_SLACK_S
    tick = max(budget_s / TICKS_PER_BUDGET, 0.001)

    armed = [True]

    def check(signum, frame):
        if armed[0] and (time.thread_time() - started_cpu > budget_s or time.monotonic() > wall_deadline):
            raise GradingTimeout()

    previous = {sig: signal.signal(sig, check) for sig in (signal.SIGPROF, signal.SIGALRM)}
    previous_timers = {
        timer: signal.setitimer(timer, tick, tick) for timer in (signal.ITIMER_PROF, signal.ITIMER_REAL)
    }

    def disarm():
        armed[0] = False
        for timer in previous_timers:
            signal.setitimer(timer, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for timer, (remaining, interval) in previous_timers.items():
            if remaining > 0:  # give the caller's own timers back (approximately)
                signal.setitimer(timer, remaining, interval)

    try:
        yield
    finally:
        while True:  # a tick landing inside the clean-up must not leave the timers armed
            try:
                disarm()
                break
            except GradingTimeout:
                continue
