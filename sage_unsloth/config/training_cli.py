"""What the two training stages (``sage-unsloth sft``, ``sage-unsloth rlvr``) share on the command line.

- :class:`StageRunArgs`: the run-control fields ``resume``, ``restart`` and ``unsloth_without_gpu``, one
  declaration that SageSFTConfig (sage_unsloth/sft/config.py) and RLVRStageArgs (sage_unsloth/rlvr/run.py)
  build on;
- :func:`refuse_before_parsing`: a missing CONFIG, and ``backend=unsloth`` on a machine without a GPU unless
  ``unsloth_without_gpu`` is set (read from the command line and the YAML), refused in one line before the
  stage imports Unsloth or parses (which imports TRL and transformers);
- :func:`run_training_stage`: a stage's ``main`` around its planning and training: the output folder is locked
  for the run (one writer per folder, sage_unsloth/runtime/folder_lock.py; rank 0 of a multi-process run holds it) before
  anything in it is read or changed; an input error is one line, exit 2; a save out of room is one line, exit 2;
  a training fault is one line, exit 1; Ctrl-C is the one line of sage_unsloth/runtime/interrupt.py, exit 130.

Importing this module imports neither torch nor TRL.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from sage_unsloth.config.args import DryRunArgs
from sage_unsloth.runtime.finite_steps import TrainingFault

logger = logging.getLogger(__name__)

INPUT_ERRORS = (ValueError, FileNotFoundError, FileExistsError)


@dataclass(kw_only=True)  # keyword-only: the positional order of the stage classes' own fields stays theirs
class StageRunArgs(DryRunArgs):
    """How a training stage treats its output folder, and whether Unsloth may run without a GPU.

    ``unsloth_without_gpu`` is read before the stage parses (:func:`refuse_before_parsing`); it is a field so that
    the parser accepts it and ``--help`` lists it."""

    # config_args lists these fields in a stage's short --help even under an upstream config (SageSFTConfig).
    SHORT_HELP: ClassVar[bool] = True

    resume: bool = field(
        default=False, metadata={"help": "Continue from the newest complete checkpoint in the output folder"}
    )
    unsloth_without_gpu: bool = field(
        default=False,
        metadata={
            "help": "backend=unsloth on a machine without a GPU: run Unsloth's slow CPU fallback anyway"
        },
    )
    restart: bool = field(
        default=False,
        metadata={"help": "Output folder holds only incomplete checkpoints: delete them and start over"},
    )


def refuse_before_parsing(argv: list[str], configs_dir: str) -> int | None:
    """Print one line and return 2 for what must be refused before the stage parses, else None:

    - a ``CONFIG`` file that does not exist (naming ``configs_dir``, where the stage's configs live), or that does
      not read as YAML (file, line and column: before anything is read from it);
    - ``backend=unsloth`` without a GPU and without ``unsloth_without_gpu``. Both fields are read as the parser
      will (flag, else YAML, else the default) but without TRL: stage 1 imports Unsloth before parsing whenever
      ``backend=unsloth`` (Unsloth must come before TRL), and on a CPU that would load it, slowly, only to
      train several times slower. ``--help`` is never refused (the parser prints it)."""
    from sage_unsloth.config.args import (
        HELP_ALL,
        ConfigError,
        load_config,
        requested_backend,
        requested_flag,
        with_config_flag,
    )

    try:
        _, config_path = with_config_flag(argv, configs_dir)
        if config_path is not None:
            load_config(config_path)  # a YAML error is said as one, not read as "backend: the default"
    except (FileNotFoundError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if (
        {"-h", "--help", HELP_ALL} & set(argv)
        or requested_backend(argv) != "unsloth"
        or dry_run_requested(argv)
    ):
        return None  # a dry run loads nothing: it may plan a GPU config on any machine
    from sage_unsloth.config.input_checks import check_unsloth_has_gpu

    try:
        check_unsloth_has_gpu("unsloth", forced=requested_flag(argv, "unsloth_without_gpu"))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return None


def _continue_from(output_dir: Path | None, resume_flag: tuple[str, ...]) -> str:
    """'; checkpoint-4 is kept: fix the cause and continue with --resume' (nothing if there is none)."""
    from sage_unsloth.runtime.checkpoints import last_complete_checkpoint

    kept = last_complete_checkpoint(output_dir) if output_dir is not None else None
    if kept is None:
        return ""
    return f"; {kept.name} is kept: fix the cause and continue with {' '.join(resume_flag)}"


def dry_run_requested(argv: list[str]) -> bool:
    """``--dry-run`` / ``--dry_run`` [true] on the command line or ``dry_run: true`` in the YAML, read without TRL."""
    from sage_unsloth.config.args import requested_flag

    return requested_flag([a.replace("--dry-run", "--dry_run", 1) for a in argv], "dry_run")


def run_training_stage(
    stage: str,
    argv: list[str],
    prepare: Callable[[Callable[[str | Path], None]], Callable[[], object]],
    resume_flag: tuple[str, ...],
) -> int:
    """Run a training stage; returns its exit code.

    ``prepare(settle)`` parses and checks every input and builds what trains, calling ``settle(output_dir)`` as
    soon as the output folder is known and before it reads or changes anything in it (``settle`` takes the
    folder's lock: another writer is one line naming it, exit 2); it returns the call that trains and saves. An input error raised by
    ``prepare`` (ValueError, FileNotFoundError, FileExistsError) is printed as one line, exit 2 (the traceback
    at DEBUG level); a save out of room while training is one line naming the folder, exit 2; a training fault
    (a plug-in's, a non-finite step, an unsane checkpoint: sage_unsloth/runtime/finite_steps.py) is one line naming it and
    the checkpoint kept, exit 1, nothing of the faulty step applied or written; Ctrl-C at any
    point prints how to continue (``resume_flag`` is the stage's way of saying ``resume``), exit 130; SIGTERM
    the same, exit 143."""
    from sage_unsloth.runtime.folder_lock import FolderLock
    from sage_unsloth.runtime.interrupt import handle_sigterm, restore_sigterm

    previous_sigterm = handle_sigterm()
    output_dir: Path | None = None
    lock: FolderLock | None = None

    def settle(path: str | Path) -> None:
        nonlocal output_dir, lock
        output_dir = Path(path)
        if lock is None and writes_outputs():
            lock = FolderLock(output_dir, fix="choose another --output_dir").acquire()

    try:
        try:
            train = prepare(settle)
        except INPUT_ERRORS as exc:
            logger.debug("%s input error", stage, exc_info=True)
            print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
            return 2
        train()
    except (
        TrainingFault
    ) as exc:  # a plug-in fault, a non-finite step or checkpoint: stopped before applying it
        logger.debug("%s stopped", stage, exc_info=True)
        from sage_unsloth.runtime.interrupt import close_progress_bars

        hint = _continue_from(output_dir, resume_flag) if exc.resumable else ""
        close_progress_bars()  # else the line would start after the Trainer's half-drawn bar
        print(f"error: {exc}{hint}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # a save out of room (OSError, torch's RuntimeError, SafetensorError): one line
        from sage_unsloth.runtime.checkpoints import out_of_room_line

        if (line := out_of_room_line(exc, output_dir)) is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line saying how to continue, not a traceback
        from sage_unsloth.runtime.checkpoints import last_complete_checkpoint
        from sage_unsloth.runtime.interrupt import interrupted_training

        return interrupted_training(stage, argv, output_dir, resume_flag, last_complete_checkpoint, exc)
    finally:
        if lock is not None:
            lock.release()
        restore_sigterm(previous_sigterm)
    return 0


def writes_outputs() -> bool:
    """Whether this process is the one that holds the output folder: rank 0 of an ``accelerate launch`` (every
    rank runs the stage; RANK is the global rank over nodes), or a single process."""
    import os

    return os.environ.get("RANK", "0") in ("", "0")
