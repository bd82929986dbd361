"""Training checkpoints that are complete or skipped, for SFT and RLVR alike.

Complete means every file a resume reads is there and parses: ``trainer_state.json`` loads as JSON, each
safetensors file's header reads and its tensors fit in the file, and the optimizer, scheduler and RNG files
(torch's zip format) end in an intact zip directory. Only the existence of trainer_state.json used to be
checked, so a checkpoint cut short by a full disk was resumed from and crashed (SFT), or trapped the run
(RLVR: ``--resume`` said start without it, without it the kit said pass it). And its contents are sane
(sage_unsloth/runtime/checkpoint_contents.py: every tensor finite, the LoRA adapter not degenerate, the optimizer state
that of these weights): a checkpoint of NaN weights with an intact header used to be resumed from.

Saves are atomic (:class:`CheckpointMixin`, the one contact with the Trainer's save): a checkpoint is
written under ``.saving-checkpoint-N/`` and renamed to ``checkpoint-N`` when whole, so a crash mid-save leaves
no ``checkpoint-N`` at all, and a staged checkpoint whose contents are not sane is removed instead of renamed
(:class:`UnsaneCheckpoint` stops the run). Folders written before that (or copied by hand) are still checked file
by file.

:func:`choose_checkpoint` is the resume rule of both stages: the newest complete checkpoint, with a notice for
each newer one skipped and why; a folder whose checkpoints are all incomplete is restarted only with
``--restart true`` (which deletes them). This module imports no heavy library (it runs before a model loads).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import struct
import zipfile
from pathlib import Path

from sage_unsloth.runtime.finite_steps import TrainingFault, check_gradient_norm, check_micro_step

logger = logging.getLogger(__name__)

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
STAGING_PREFIX = ".saving-"  # .saving-checkpoint-N/checkpoint-N while a save is under way
TRAINER_STATE_FILE = "trainer_state.json"
# Written by the Trainer unless save_only_model; a resume loads each of them.
RESUME_FILES = ("optimizer.pt", "scheduler.pt")
RNG_GLOB = "rng_state*.pth"
TORCH_ZIP_SUFFIXES = (".pt", ".pth", ".bin")
WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors")
# The training loss summed up to the checkpoint's step (the Trainer keeps it only in memory): train_loss after a
# resume is the whole run's mean.
LOSS_TOTAL_FILE = "sage_loss_total.json"
RESTART_FLAG = "--restart true"
# A save that fails for lack of room: one line naming the folder and the free space (see save_failure).
NO_ROOM = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


class CheckpointSaveError(OSError):
    """A save ran out of room (disk full, quota, file-size limit); the message is one line."""


class UnsaneCheckpoint(TrainingFault):
    """A checkpoint whose contents are not sane (a non-finite tensor, a degenerate adapter) was about to be saved:
    it is removed unwritten and the run stops; the message is one line."""


# ---------------------------------------------------------------------------------------------- file checks
def safetensors_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a whole safetensors file, or None. Reads the header only (8-byte length + JSON) and
    checks that every tensor's byte range lies inside the file, so a truncated file is caught without loading."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{path} is truncated ({size} bytes, no safetensors header)"
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                return f"{path} is truncated ({size} bytes, its header alone says {length + 8})"
            header = json.loads(fh.read(length))
    except FileNotFoundError:
        return f"{path} is missing"
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return f"{path} has an unreadable safetensors header ({type(exc).__name__})"
    if not isinstance(header, dict):
        return f"{path} has an unreadable safetensors header"
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(entry["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            return f"{path} has an unreadable safetensors header (tensor {name!r})"
    if 8 + length + end > size:
        return f"{path} is truncated ({size} bytes, its tensors need {8 + length + end})"
    return None


def _torch_file_problem(path: Path) -> str | None:
    # torch.save writes a zip archive whose directory is at the end: a cut-short file has none.
    if not path.is_file():
        return f"{path.name} is missing"
    if not zipfile.is_zipfile(path):
        return f"{path.name} is truncated or unreadable"
    return None


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` (a checkpoint-N) cannot be resumed from, or None when it is complete."""
    folder = Path(folder)
    state_path = folder / TRAINER_STATE_FILE
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{TRAINER_STATE_FILE} is missing (interrupted while saving)"
    except (OSError, ValueError, UnicodeDecodeError):
        return f"{TRAINER_STATE_FILE} is truncated or not JSON"
    if not isinstance(state, dict) or "global_step" not in state:
        return f"{TRAINER_STATE_FILE} has no global_step"
    weights = [folder / name for name in WEIGHT_FILES if (folder / name).exists()]
    weights += sorted(folder.glob("*/adapter_model.safetensors"))  # a second adapter (RLVR's ref/)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError):
            return f"{index.name} is truncated or not JSON"
        weights += [folder / shard for shard in sorted(shards)]
    if not weights:
        return "it holds no model or adapter weights"
    for path in weights:
        if (problem := safetensors_problem(path)) is not None:
            return problem.replace(str(folder) + os.sep, "")
    if any(folder.glob(RNG_GLOB)) or any((folder / name).exists() for name in RESUME_FILES):
        # (else save_only_model: weights only; transformers resumes the weights)
        for name in RESUME_FILES:
            if (problem := _torch_file_problem(folder / name)) is not None:
                return problem
        rng = sorted(folder.glob(RNG_GLOB))
        if not rng:
            return "no rng_state file"
        for path in rng + sorted(p for p in folder.glob("sage_resume_state_*.pt")):
            if (problem := _torch_file_problem(path)) is not None:
                return problem
    # The files are whole; their contents must be sane too (finite, not degenerate, consistent).
    from sage_unsloth.runtime.checkpoint_contents import contents_problem

    return contents_problem(folder, int(state["global_step"]))


# ---------------------------------------------------------------------------------------------- the resume rule
def checkpoints_newest_first(output_dir: str | os.PathLike) -> list[Path]:
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def newest_complete_checkpoint(output_dir: str | os.PathLike) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest complete checkpoint or None, [(newer or all incomplete checkpoint, why)...])."""
    skipped = []
    for path in checkpoints_newest_first(output_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint; each newer incomplete one is logged as skipped, with the reason."""
    newest, skipped = newest_complete_checkpoint(output_dir)
    for path, why in skipped:
        logger.warning("%s is incomplete (%s): skipped", path, why)
    return newest


def _listing(skipped: list[tuple[Path, str]]) -> str:
    return "; ".join(f"{path.name}: {why}" for path, why in skipped)


def choose_checkpoint(
    output_dir: str | os.PathLike, *, resume: bool, restart: bool, resume_flag: str
) -> Path | None:
    """The checkpoint a run continues from, or None to start fresh. Raises FileExistsError (one line) when the
    folder holds checkpoints and neither flag says what to do with them; never resumes an incomplete one.

    - complete checkpoints: ``resume`` continues from the newest (skipping newer incomplete ones with a notice);
      without it, an error naming ``resume_flag``;
    - checkpoints, none complete: ``restart`` deletes them and starts over; otherwise an error naming
      ``--restart true`` (``resume`` cannot help, so it is never the advice);
    - none: None (the caller decides whether ``resume`` without a checkpoint is an error).
    """
    out = Path(output_dir)
    newest, skipped = newest_complete_checkpoint(out)
    if newest is not None:
        if not resume:
            raise FileExistsError(
                f"{out} has checkpoints (newest complete: {newest.name}): pass {resume_flag} to continue, "
                "or choose another output_dir"
            )
        for path, why in skipped:
            logger.warning("%s is incomplete (%s): skipped, resuming from %s", path, why, newest.name)
        return newest
    if not skipped:
        return None
    if not restart:
        raise FileExistsError(
            f"{out} has only incomplete checkpoints ({_listing(skipped)}): nothing can be resumed; pass "
            f"{RESTART_FLAG} to delete them and start over, or choose another output_dir"
        )
    for path, why in skipped:
        logger.warning("%s: deleting incomplete %s (%s), starting over", RESTART_FLAG, path, why)
        shutil.rmtree(path)
    return None


# ---------------------------------------------------------------------------------------------- atomic saves
def free_space(folder: Path) -> str:
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return "unknown free space"
    return f"{free / 2**20:.1f} MiB free"


def _no_room(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in NO_ROOM:
        return True
    text = str(exc)
    # safetensors' writer: SafetensorError("... I/O error: File too large (os error 27)")
    if any(f"(os error {code})" in text for code in NO_ROOM):
        return True
    # torch's zip writer reports a short write as RuntimeError("... unexpected pos N vs M")
    return isinstance(exc, RuntimeError) and ("unexpected pos" in text or "file write failed" in text)


def save_failure(what: str, folder: Path, exc: BaseException) -> CheckpointSaveError:
    reason = str(exc).splitlines()[0] if str(exc) else "no room"
    return CheckpointSaveError(
        f"saving {what}into {folder} failed ({type(exc).__name__}: {reason}); {free_space(folder)} there "
        "(or a file-size limit, ulimit -f): make room, then continue with the stage's resume flag"
    )


def out_of_room_line(exc: BaseException, folder: str | os.PathLike | None) -> str | None:
    """The one line for a training stage whose save failed for lack of room, or None for any other error."""
    if isinstance(exc, CheckpointSaveError):
        return str(exc)
    if folder is not None and _no_room(exc):
        return str(save_failure("", Path(folder), exc))
    return None


# ---------------------------------------------------------------------------------------------- train_loss
def write_loss_total(folder: Path, trainer) -> None:
    """The training loss summed over every step so far (logged and not yet logged) into the checkpoint being written:
    what a resumed session adds its own steps to."""
    total = trainer._total_loss_scalar + float(trainer._tr_loss.item())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOSS_TOTAL_FILE).write_text(json.dumps({"loss_total": total}), encoding="utf-8")


def resumed_loss_total(checkpoint: str | os.PathLike) -> float:
    """The loss summed over the steps before ``checkpoint``: its :data:`LOSS_TOTAL_FILE`, else (a checkpoint written
    before it existed) each logged mean loss times the steps it averaged, from its ``trainer_state.json``."""
    folder = Path(checkpoint)
    try:
        return float(json.loads((folder / LOSS_TOTAL_FILE).read_text(encoding="utf-8"))["loss_total"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        history = json.loads((folder / TRAINER_STATE_FILE).read_text(encoding="utf-8"))["log_history"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    total, previous = 0.0, 0
    for entry in history:
        if "loss" in entry and "step" in entry:
            total += float(entry["loss"]) * (int(entry["step"]) - previous)
            previous = int(entry["step"])
    return total


class CheckpointMixin:
    """Over any transformers Trainer, what training may apply and write: ``checkpoint-N`` appears only whole and
    sane (written as ``.saving-checkpoint-N/checkpoint-N``, its contents checked, then renamed; an unsane one is
    removed and :class:`UnsaneCheckpoint` stops the run), and a save that runs out of room raises
    :class:`CheckpointSaveError` (one line) after removing what it wrote; a resume from the checkpoint of the
    last step trains nothing more (``compat.every_step_done``) and continues the run's summed loss (train_loss);
    no micro-batch with a non-finite loss, no window with non-finite gradients reaches the optimizer
    (sage_unsloth/runtime/finite_steps.py, row ``step_guard``: the window's gradient norm is the one the clip computes).

    Contact (sage_unsloth/compat.py, row ``resume_internals``): ``_save_checkpoint(model, trial)`` and every save
    inside it (TRL's own, and the stage's extra resume state: a trainer that defines
    ``write_resume_state(folder)`` has it called first, into the staging folder) locate the checkpoint through
    ``_get_output_dir(trial)``; while saving it names the staging folder. After the rename the old checkpoints
    are rotated as the Trainer would have (``save_total_limit``)."""

    _sage_staging: Path | None = None
    _sage_step_batch = None

    def _get_output_dir(self, trial):
        if self._sage_staging is not None:
            return str(self._sage_staging)
        return super()._get_output_dir(trial=trial)

    def _save_checkpoint(self, model, trial):
        run_dir = Path(super()._get_output_dir(trial=trial))
        name = f"checkpoint-{self.state.global_step}"
        staging, final = run_dir / f"{STAGING_PREFIX}{name}", run_dir / name
        main = self.args.should_save
        if main and staging.exists():
            shutil.rmtree(staging)  # left by a save that died
        self.accelerator.wait_for_everyone()
        self._sage_staging = staging
        try:
            write_resume_state = getattr(self, "write_resume_state", None)
            if write_resume_state is not None:
                # Before the Trainer's files, so that trainer_state.json (written last) marks a complete checkpoint.
                write_resume_state(staging / name)
            if main:
                write_loss_total(staging / name, self)
            super()._save_checkpoint(model, trial)
        except Exception as exc:  # OSError, torch's RuntimeError, safetensors' SafetensorError
            if not _no_room(exc):
                raise
            shutil.rmtree(staging, ignore_errors=True)
            raise save_failure(f"{name} ", run_dir, exc) from None
        finally:
            self._sage_staging = None
        self.accelerator.wait_for_everyone()  # every process wrote its RNG state into the staging folder
        if main:
            from sage_unsloth.runtime.checkpoint_contents import contents_problem

            if (problem := contents_problem(staging / name, self.state.global_step)) is not None:
                shutil.rmtree(staging, ignore_errors=True)  # never counted complete, never resumed from
                raise UnsaneCheckpoint(f"{name} was not written: {problem}")
            if final.exists():
                shutil.rmtree(final)  # a checkpoint of the same step from a run that was restarted
            os.replace(staging / name, final)
            shutil.rmtree(staging, ignore_errors=True)
            if self.state.best_model_checkpoint and str(staging) in self.state.best_model_checkpoint:
                self.state.best_model_checkpoint = str(final)
            from transformers.trainer_utils import rotate_checkpoints

            rotate_checkpoints(
                output_dir=str(run_dir),
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=False,
            )
        self.accelerator.wait_for_everyone()

    def _prepare_inputs(self, inputs):
        prepared = super()._prepare_inputs(inputs)
        self._sage_step_batch = (
            prepared  # what this micro-batch's loss reads (named if the loss is not finite)
        )
        return prepared

    def training_step(self, model, inputs, *args, **kwargs):
        loss = super().training_step(model, inputs, *args, **kwargs)
        # before the optimizer step: a non-finite loss or gradient stops the run (runtime/finite_steps.py); the gradients
        # here only where the clip below cannot measure them for the guard
        check_micro_step(
            self, model, loss, self._sage_step_batch, gradients=not self._sage_guard_at_clip(model)
        )
        return loss

    _sage_plain_clip: bool | None = None

    def _sage_guard_at_clip(self, model) -> bool:
        """Does the guard read the norm the clip computes (accelerate's plain clip, compat.plain_gradient_clip)?
        Decided once: the accelerator and the parameters' kind do not change within a run."""
        if self._sage_plain_clip is None:
            from sage_unsloth.compat import plain_gradient_clip

            self._sage_plain_clip = plain_gradient_clip(self, model)
        return self._sage_plain_clip

    def _sage_clip(self, model, max_norm: float):
        from sage_unsloth.compat import clip_with_norm

        return clip_with_norm(self, model, max_norm, lambda norm: check_gradient_norm(self, model, norm))

    def _clip_grad_norm(self, model):
        if not self._sage_guard_at_clip(model):
            return super()._clip_grad_norm(model)
        return self._sage_clip(model, self.args.max_grad_norm)

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None and self._sage_guard_at_clip(model):  # no clipping (max_grad_norm 0): its norm
            grad_norm = self._sage_clip(model, float("inf"))
        return super()._get_grad_norm(model, grad_norm=grad_norm)

    def _run_epoch(self, *args, **kwargs):
        from sage_unsloth.compat import every_step_done

        checkpoint = kwargs.get("resume_from_checkpoint")
        if checkpoint is not None and kwargs.get("epoch") == kwargs.get("epochs_trained"):
            # The first epoch of a resumed session: the loss summed before the checkpoint, so that train_loss is the
            # whole run's mean (the Trainer starts its sum at 0 and divides by the whole run's steps).
            self._total_loss_scalar += resumed_loss_total(checkpoint)
        if every_step_done(self):
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)
