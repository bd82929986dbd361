"""What one plug-in call may not do to the process it runs in: run past its time budget, end the process, or pass
its own ``KeyboardInterrupt`` off as the user's Ctrl-C. :func:`guarded` holds a call (sage_unsloth/plugins/calls.py
runs every trial and run-time call of every plug-in kind inside it) and says afterwards what happened.

- **Time budget.** Each call has a wall-clock budget: :data:`TRIAL_TIMEOUT_ENV` (default
  :data:`DEFAULT_TRIAL_TIMEOUT_S`) for the trial call before loading, :data:`TIMEOUT_ENV` (default
  :data:`DEFAULT_TIMEOUT_S`) for a call in training; 0 means none. In the main thread a ``SIGALRM`` timer raises
  :class:`Overtime` inside the call when the budget is spent (a ``sleep``, a lock wait or a Python loop is cut
  there), and again each second after, so a plug-in whose ``except BaseException`` swallows it is cut again; a
  call that swallowed it and returned still counts as over its budget. A call still running
  :data:`HANG_GRACE_S` after its budget (it swallows every stop, it waits in C code that released the
  interpreter, or it runs off the main thread, where no signal reaches) is ended by the watchdog thread: its one
  ``error:`` line on stderr and the process exits (:data:`EXIT_TRIAL` for a trial call, :data:`EXIT_TRAINING` in
  training), skipping clean-up as ``os._exit`` does. Only C code that holds the interpreter and never returns is
  out of reach of both, as for the grader's deadline (sage_unsloth/grading/deadline.py).
- **Ending the process.** ``os._exit`` (which skips every ``finally`` and exit handler: a stage would end with
  exit 0 and no manifest) is replaced during the call by a function that raises :class:`ProcessExit`; a plug-in
  that swallows it is still reported. ``sys.exit`` is a ``SystemExit`` the call wrapper reports itself.
- **Ctrl-C.** The call's SIGINT (and SIGTERM, where a handler is installed) handler is wrapped to note that a
  signal came before it runs, so a ``KeyboardInterrupt`` with no signal behind it is the plug-in's own.

Each guard costs a few ``signal.signal`` and ``setitimer`` system calls and a lock of the one watchdog thread per
call (tens of microseconds); everything is put back as it was when the call ends, an outer timer of someone else's
included (approximately: its remaining time).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The signal module's C functions without its wrappers, which convert each handler to an enum through an exception
# when it is a function (~50 us a guard); the same calls.
try:
    import _signal as _handlers
except ImportError:  # pragma: no cover (an interpreter without it: the wrappers)
    _handlers = signal

TIMEOUT_ENV = "SAGE_PLUGIN_TIMEOUT_S"  # a call in training
TRIAL_TIMEOUT_ENV = "SAGE_PLUGIN_TRIAL_TIMEOUT_S"  # the trial call on the synthetic batch before loading
# A guide, estimator or term on a real batch takes milliseconds to seconds; ten minutes is a hang, not a slow call.
DEFAULT_TIMEOUT_S = 600.0
# The trial batch is 2 groups x 6 tokens: a minute covers a plug-in's first-call imports and compilation.
DEFAULT_TRIAL_TIMEOUT_S = 60.0
REPEAT_S = 1.0  # after the budget, the timer fires again this often until the call gives up
HANG_GRACE_S = 10.0  # then the watchdog ends the process (a stopped call unwinds in well under a second)
EXIT_TRIAL, EXIT_TRAINING = 2, 1  # the stages' codes for a bad input and for a fault in training
_REAL_EXIT = os._exit  # the watchdog's, whatever a guard has put in os._exit meanwhile


class Overtime(BaseException):
    """Raised inside a plug-in call past its budget; a BaseException so that ``except Exception`` lets it through."""


class ProcessExit(BaseException):
    """Raised in place of ``os._exit`` during a plug-in call."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


def budget_env(trial: bool) -> str:
    """The environment variable that sets the budget of a trial call or of a call in training."""
    return TRIAL_TIMEOUT_ENV if trial else TIMEOUT_ENV


def budget_s(trial: bool) -> float:
    """The per-call budget in seconds (0: none) from the environment, or the default; a bad value is one line."""
    name, default = budget_env(trial), DEFAULT_TRIAL_TIMEOUT_S if trial else DEFAULT_TIMEOUT_S
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        from sage_unsloth.config.args import ConfigError

        raise ConfigError(
            f"{name}={text!r} must be a number of seconds >= 0 (0: no limit), e.g. {name}={default:g}"
        )
    return value


@dataclass
class Guard:
    """What happened during one guarded call (read after it)."""

    budget_s: float
    env: str  # the variable that set the budget (named in the fault's line)
    started: float = field(default_factory=time.monotonic)
    active: bool = True  # the timer raises only while the call runs
    overtime: bool = False
    exit_code: object = None
    exited: bool = False
    signals_before: int = field(default_factory=lambda: _signals_seen)

    @property
    def signalled(self) -> bool:
        """Did a real SIGINT / SIGTERM reach the process during the call (an outer guard's handler counts too)?"""
        return _signals_seen != self.signals_before

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def over_budget(self) -> bool:
        return self.overtime or (self.budget_s > 0 and self.elapsed() > self.budget_s)


_depth = 0  # guards open in the main thread: a call inside a call keeps the outer one's timer and handlers
_signals_seen = 0  # SIGINT / SIGTERM deliveries noted by the guards' handlers


@contextlib.contextmanager
def guarded(*, trial: bool, hang_line: Callable[[Guard], str]):
    """Hold one plug-in call, a trial call or one in training (see the module docstring); yields its
    :class:`Guard`. ``hang_line(guard)``: the line the watchdog prints if the call will not stop. A bad budget in
    the environment is one ConfigError line, before the call."""
    global _depth
    guard = Guard(budget_s(trial), budget_env(trial))
    watchdog = _watchdog(guard, hang_line, EXIT_TRIAL if trial else EXIT_TRAINING)
    main = threading.current_thread() is threading.main_thread() and not _depth
    if main:
        _depth += 1
    saved = _install(guard) if main else None
    try:
        with _exit_intercepted(guard):
            yield guard
    finally:
        guard.active = False
        if watchdog is not None:
            _WATCHDOG.disarm(watchdog)
        if main:
            _depth -= 1
            _restore(saved)


class _Watchdog:
    """One daemon thread for every guard (a thread per call would cost more than the call's other guards): it
    sleeps until the earliest armed deadline and, if that guard is still armed then, prints its line and ends the
    process."""

    def __init__(self):
        self._condition = threading.Condition()
        self._armed: dict[int, tuple[float, Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._wakes_at = float("inf")  # when the thread wakes next (inf: waiting for a guard)

    def arm(self, key: int, deadline: float, fire: Callable[[], None]) -> None:
        with self._condition:
            self._armed[key] = (deadline, fire)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="sage-plugin-watchdog", daemon=True)
                self._thread.start()
            if deadline < self._wakes_at:  # else it wakes before this deadline anyway, and looks again
                self._condition.notify()

    def disarm(self, key: int) -> None:
        with self._condition:
            self._armed.pop(key, None)

    def _watch(self) -> None:
        with self._condition:
            while True:
                if not self._armed:
                    self._wakes_at = float("inf")
                    self._condition.wait()
                    continue
                key, (deadline, fire) = min(self._armed.items(), key=lambda item: item[1][0])
                left = deadline - time.monotonic()
                if left > 0:
                    self._wakes_at = deadline
                    self._condition.wait(left)
                    continue
                del self._armed[key]
                fire()


_WATCHDOG = _Watchdog()


def _watchdog(guard: Guard, hang_line: Callable[[Guard], str], code: int) -> int | None:
    """Arm the watchdog to end the process :data:`HANG_GRACE_S` after the budget if the call is still running;
    returns the key that disarms it (None without a budget)."""
    if guard.budget_s <= 0:
        return None

    def stop():
        if guard.active:
            guard.overtime = True
            os.write(2, f"error: {hang_line(guard)}\n".encode(errors="replace"))
            _REAL_EXIT(code)

    _WATCHDOG.arm(id(guard), guard.started + guard.budget_s + HANG_GRACE_S, stop)
    return id(guard)


def _install(guard: Guard) -> dict:
    """The guard's SIGALRM timer and signal-noting handlers; returns what to put back."""
    saved: dict = {"handlers": {}, "timer": None}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = _handlers.getsignal(signum)
        if callable(previous):  # SIG_DFL / SIG_IGN: no exception can come from it
            saved["handlers"][signum] = previous
            _handlers.signal(signum, _noting(previous))
    if guard.budget_s > 0 and hasattr(signal, "setitimer"):

        def expire(signum, frame):
            if guard.active:
                guard.overtime = True
                raise Overtime()

        saved["handlers"][signal.SIGALRM] = _handlers.signal(signal.SIGALRM, expire)
        saved["timer"] = signal.setitimer(signal.ITIMER_REAL, guard.budget_s, REPEAT_S)
    return saved


def _noting(previous):
    def handler(signum, frame):
        global _signals_seen
        _signals_seen += 1
        return previous(signum, frame)

    return handler


def _restore(saved: dict) -> None:
    if saved["timer"] is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
    for signum, handler in saved["handlers"].items():
        _handlers.signal(signum, handler)
    if saved["timer"] is not None and saved["timer"][0] > 0:  # someone else's timer: give it back
        signal.setitimer(signal.ITIMER_REAL, *saved["timer"])


@contextlib.contextmanager
def _exit_intercepted(guard: Guard):
    real = os._exit

    def intercepted(code):
        guard.exited, guard.exit_code = True, code
        raise ProcessExit(code)

    os._exit = intercepted
    try:
        yield
    finally:
        os._exit = real
