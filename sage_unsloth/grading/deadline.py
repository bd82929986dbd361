"""A per-pair deadline for grading: CPU time of the grading thread, with a wall-clock limit beside it.

Why this clock: a verdict must not depend on machine load or on what else the process runs. Wall time
grows with load; process CPU time (``ITIMER_PROF``) also counts a vLLM engine's threads running beside the
grader. ``time.thread_time()`` counts only the work of the grading itself. Python cannot arm a timer on
that clock, so two periodic timers (process CPU and wall time) only *wake* the handler, which raises once
the thread's CPU time is over budget. The wall limit (``WALL_FACTOR`` x the budget + ``WALL_SLACK_S`` by
default, or a caller's own, e.g. what is left of the RLVR reward's batch budget) ends a grading that stopped
consuming CPU; the default is far above what load can stretch a real budget to.

Cost: arming means two ``signal.signal`` and two ``setitimer`` calls, and as many to disarm. A batch of pairs
(a pool worker's chunk, a reward batch) arms once with ``armed(budget)``; each pair's ``cpu_deadline`` inside
it only notes its start and limits (two clock reads). Outside ``armed`` each ``cpu_deadline`` arms on its own.

The deadline raises :class:`GradingTimeout`, a ``BaseException`` so that math-verify's and sympy's
``except Exception`` blocks let it through. Signals reach only the main thread; elsewhere grading runs in a
helper process (see ``sage_unsloth.grading.verify``). math-verify's own ``signal.alarm`` timeouts are
switched off (whole seconds, and they reset each other's timer). A signal is handled between bytecodes: C
code that never returns to the interpreter (a backtracking regular expression, a huge integer power) is out
of its reach, which is why every regular expression over an answer is linear or bounded, and why shapes
that explode in sympy are refused before parsing (``verify._explosive``).
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


def wall_limit_s(budget_s: float) -> float:
    """The default wall-clock limit of a pair with CPU budget ``budget_s``."""
    return budget_s * WALL_FACTOR + WALL_SLACK_S


class _Window:
    """The limits of the pair being graded: thread-CPU and monotonic-clock instants."""

    __slots__ = ("cpu_end", "wall_end")

    def __init__(self, cpu_end: float, wall_end: float):
        self.cpu_end, self.wall_end = cpu_end, wall_end


_window: _Window | None = None  # the innermost open deadline (main thread only)
_armed_tick: float | None = None  # the tick of the timers ``armed`` holds, None when not armed


def _check(signum, frame):
    window = _window
    if window is not None and (time.thread_time() > window.cpu_end or time.monotonic() > window.wall_end):
        raise GradingTimeout()


def _arm(tick: float):
    previous = {sig: signal.signal(sig, _check) for sig in (signal.SIGPROF, signal.SIGALRM)}
    timers = {
        timer: signal.setitimer(timer, tick, tick) for timer in (signal.ITIMER_PROF, signal.ITIMER_REAL)
    }
    return previous, timers


def _disarm(previous, timers) -> None:
    for timer in timers:
        signal.setitimer(timer, 0)
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    for timer, (remaining, interval) in timers.items():
        if remaining > 0:  # give the caller's own timers back (approximately)
            signal.setitimer(timer, remaining, interval)


def _settle(action) -> None:
    """Run ``action`` to the end: a tick landing inside a clean-up must not leave it half done."""
    while True:
        try:
            action()
            return
        except GradingTimeout:
            continue


@contextlib.contextmanager
def armed(budget_s: float):
    """Hold the timers for a batch of pairs graded with ``budget_s`` each (no-op off the main thread)."""
    global _armed_tick
    if not can_interrupt() or _armed_tick is not None:
        yield
        return
    tick = max(budget_s / TICKS_PER_BUDGET, 0.001)
    state = _arm(tick)
    _armed_tick = tick
    try:
        yield
    finally:

        def release():
            global _armed_tick
            _armed_tick = None
            _disarm(*state)

        _settle(release)


@contextlib.contextmanager
def cpu_deadline(budget_s: float, wall_s: float | None = None):
    """Run the block with at most ``budget_s`` CPU seconds of this (main) thread and at most ``wall_s``
    (default ``wall_limit_s(budget_s)``) seconds of wall time; else GradingTimeout."""
    global _window
    wall = wall_limit_s(budget_s) if wall_s is None else max(wall_s, 0.0)
    window = _Window(time.thread_time() + budget_s, time.monotonic() + wall)
    tick = max(min(budget_s, wall) / TICKS_PER_BUDGET, 0.001)
    # The held timers serve when they tick at least twice as often as this window needs (what is left of a
    # pair's budget after extraction still qualifies); else this window arms its own.
    state = None if _armed_tick is not None and _armed_tick <= 2 * tick else _arm(tick)
    outer, _window = _window, window
    try:
        yield
    finally:

        def close():
            global _window
            _window = outer
            if state is not None:
                _disarm(*state)

        _settle(close)
