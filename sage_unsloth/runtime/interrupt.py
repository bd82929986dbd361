"""Ctrl-C or SIGTERM during a stage: one line saying what was kept and how to continue, exit 130 (128 + SIGINT)
or 143 (128 + SIGTERM: what SLURM's pre-emption, ``timeout`` and ``kill`` send).

Each stage's ``main`` catches ``KeyboardInterrupt`` around its run and returns :func:`interrupted`'s code
instead of letting Python print a traceback through the Trainer or the engine. :func:`handle_sigterm` (called by
``sage-unsloth`` and by each stage) makes SIGTERM raise :class:`Terminated`, a ``KeyboardInterrupt``, in the main
thread, so a terminated stage takes the same path as one stopped with Ctrl-C. The line names the command
that continues the run: for training, the same command with the stage's resume flag when a complete
checkpoint exists (else the same command, which starts over); for evaluation, the same command (it reuses
the saved completion chunks).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

EXIT_INTERRUPTED = 130  # the shell's code for a process ended by SIGINT
EXIT_TERMINATED = 143  # and by SIGTERM
QUIET_ENV = "SAGE_UNSLOTH_QUIET_INTERRUPT"  # set for a child stage process: its parent prints the line


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C's KeyboardInterrupt would be."""


def _raise_terminated(signum, frame):
    raise Terminated


def handle_sigterm():
    """From now on SIGTERM raises :class:`Terminated` in this process's main thread; returns the handler it
    replaced, for :func:`restore_sigterm` (a caller in-process, a test, gets its own back). None off the main
    thread, where a handler cannot be set."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _how(exc: BaseException | None) -> tuple[str, int]:
    """(how the stage was stopped, its exit code)."""
    return ("SIGTERM", EXIT_TERMINATED) if isinstance(exc, Terminated) else ("Ctrl-C", EXIT_INTERRUPTED)


def exit_code_of(exc: BaseException | None) -> int:
    """The exit code of a process stopped by ``exc`` (a KeyboardInterrupt: 130; a Terminated: 143)."""
    return _how(exc)[1]


def exit_code_stopped(code: int) -> BaseException | None:
    """The interruption a child stage's exit ``code`` stands for (to re-raise in its parent), or None."""
    return {EXIT_INTERRUPTED: KeyboardInterrupt(), EXIT_TERMINATED: Terminated()}.get(code)


def _command(stage: str, argv: list[str], extra: tuple[str, ...] = ()) -> str:
    """The command line to show: a credential flag's value (``--hub_token VALUE``) is redacted (the stage's
    ``argv`` is its own copy of the command line, which the parser's redaction of ``sys.argv`` does not reach)."""
    from sage_unsloth.runtime.credentials import redact_argv

    return shlex.join(["sage-unsloth", stage, *redact_argv([*argv, *extra])])


def _without(argv: list[str], flag: str, takes_value: bool) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = takes_value
            continue
        if not arg.startswith(flag + "="):
            out.append(arg)
    return out


def close_progress_bars() -> None:
    """Close the live tqdm bars (the Trainer's, the datasets'): else each redraws itself at exit, below the line."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


def interrupted_training(
    stage: str,
    argv: list[str],
    output_dir: str | Path | None,
    resume_flag: tuple[str, ...],
    last_checkpoint: Callable[[str | Path], Path | None],
    stopped_by: BaseException | None = None,
) -> int:
    """Print the one line for a training stage stopped by Ctrl-C (or SIGTERM: ``stopped_by`` a
    :class:`Terminated`); returns the exit code. ``last_checkpoint`` finds the newest complete checkpoint in
    ``output_dir`` (the caller's: this module sits below the stages)."""
    how, code = _how(stopped_by)
    last = last_checkpoint(output_dir) if output_dir else None
    if last is None:
        where = f" in {output_dir}" if output_dir else ""
        what = f"no checkpoint yet{where}: run the same command to start over: {_command(stage, argv)}"
    else:
        plain = _without(argv, resume_flag[0], takes_value=len(resume_flag) > 1)
        what = f"{last} is kept: continue with {_command(stage, plain, resume_flag)}"
    close_progress_bars()
    print(f"sage-unsloth {stage}: interrupted ({how}); {what}", file=sys.stderr, flush=True)
    return code


def interrupted_stage(stage: str, argv: list[str], stopped_by: BaseException | None = None) -> int:
    """The one line for a command without a line of its own (report, sample, export, ...) stopped by Ctrl-C or
    SIGTERM; returns the exit code."""
    how, code = _how(stopped_by)
    close_progress_bars()
    print(
        f"sage-unsloth {stage}: interrupted ({how}); run the same command again: {_command(stage, argv)}",
        file=sys.stderr,
        flush=True,
    )
    return code


def interrupted_eval(argv: list[str], stopped_by: BaseException | None = None) -> int:
    """Print the one line for stage 3 stopped by Ctrl-C or SIGTERM; returns the exit code."""
    how, code = _how(stopped_by)
    if os.environ.get(QUIET_ENV):
        return code
    close_progress_bars()
    print(
        f"sage-unsloth eval: interrupted ({how}); the completion chunks already written are kept: run the "
        f"same command to continue: {_command('eval', argv)}",
        file=sys.stderr,
        flush=True,
    )
    return code
