"""Exact resume of a GRPO run: the state transformers' checkpoint does not hold, saved and restored.

A run stopped and resumed from ``checkpoint-N`` must continue exactly like the uninterrupted run
(adapter, optimizer state and logged metrics bit for bit on CPU). transformers' checkpoint restores the
optimizer, LR scheduler, ``TrainerState``, the RNG states (one file per process) and the position inside
the current epoch (it skips the batches already seen). Three things were lost:

0. The policy adapter itself. With the SFT anchor the model holds two adapters, ``default`` (the policy)
   and the frozen ``ref``; PEFT saves ``default`` at the checkpoint root and ``ref`` in ``ref/``, and
   transformers 5.17's ``_load_from_checkpoint``, seeing an adapter sub-folder, loads only the sub-folders
   (huggingface/transformers#30505 assumed every adapter is named). The resumed policy restarted from the
   SFT adapter with the optimizer moments of step N. :meth:`ExactResumeMixin._load_from_checkpoint` loads
   the root adapter into the active one.
1. The prompt order of later epochs. TRL's ``RepeatSampler`` shuffles with its own ``torch.Generator``,
   seeded once when the sampler is built and advanced by one permutation per epoch. A resumed run builds
   a fresh sampler, so epoch ``e > 0`` replays epoch 0's order. :class:`EpochSeededSampler` puts the
   generator where the uninterrupted run has it (the seed, advanced by ``e`` permutations) whenever the
   Trainer calls ``set_epoch(e)``, which it does before every epoch.
2. The micro-step counter ``_step`` and the buffered generation batch ``_buffered_inputs``. With
   ``steps_per_generation * num_iterations > 1`` one generation batch feeds several optimizer steps; a
   checkpoint inside that window would resume with ``_step = 0`` and no buffer, i.e. generate a new
   batch from the current policy instead of using the remaining slices. Both are written to
   ``sage_resume_state_<process>.pt`` in the checkpoint (the buffer only when the checkpoint falls inside
   a window) and read back with the optimizer.

Not lost, checked: the SAGE guide generator is re-seeded from (seed, step, call, process) at every
draw; the token/random schedule is a pure function of the step; the LR schedule is in the checkpoint.
Logged metrics are exact when ``save_steps`` is a multiple of ``logging_steps`` (the Trainer's running
loss and TRL's metric buffers are empty at such a save); :func:`logging_alignment_warning` says so.

Contact points (row ``resume_internals`` of sage_unsloth/compat.py: trl 1.15.0 / transformers 5.17.0, tested in
tests/kit/test_compat.py and tests/rlvr/test_rlvr_resume.py): the sampler's
``generator``/``num_samples``/``shuffle``/``seed`` attributes; the trainer's ``_step``, ``_buffered_inputs``,
``_load_from_checkpoint`` (the PEFT checkpoint layout), ``_get_train_sampler``, ``_save_checkpoint``,
``_load_optimizer_and_scheduler`` (TRL overrides the last two
for its own adaptive-entropy state the same way).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.utils.data import Sampler

logger = logging.getLogger(__name__)

RESUME_STATE_FILE = "sage_resume_state_{process}.pt"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


class EpochSeededSampler(Sampler):
    """Wraps TRL's RepeatSampler so that the permutation of epoch ``e`` does not depend on the process history."""

    def __init__(self, sampler):
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        if not getattr(self.sampler, "shuffle", False) or self.sampler.seed is None:
            return
        generator = torch.Generator()
        generator.manual_seed(self.sampler.seed)
        for _ in range(epoch):  # RepeatSampler draws one randperm(num_samples) per epoch
            torch.randperm(self.sampler.num_samples, generator=generator)
        self.sampler.generator.set_state(generator.get_state())

    @property
    def generator(self):  # accelerate synchronises a sampler's generator across processes
        return getattr(self.sampler, "generator", None)

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class ExactResumeMixin:
    """Saves and restores the GRPOTrainer state a transformers checkpoint lacks (see the module docstring)."""

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        model = self.model if model is None else model
        root = Path(resume_from_checkpoint)
        subfolders = [p for p in root.iterdir() if p.is_dir() and (p / ADAPTER_WEIGHTS_FILE).is_file()]
        if subfolders and (root / ADAPTER_WEIGHTS_FILE).is_file() and hasattr(model, "load_adapter"):
            # transformers loaded only the sub-folders (``ref/``); the policy adapter is the root one.
            active = model.active_adapters[0]
            model.load_adapter(str(root), active, is_trainable=True)
            model.set_adapter(active)

    def _get_train_sampler(self, dataset=None):
        return EpochSeededSampler(super()._get_train_sampler(dataset))

    def _sage_generate_every(self) -> int:
        return self.args.steps_per_generation * self.num_iterations

    def write_resume_state(self, folder: Path) -> None:
        """TRL's generation-window state into the checkpoint being written (CheckpointMixin calls it first)."""
        if self.args.save_only_model:
            return
        folder.mkdir(parents=True, exist_ok=True)
        inside_window = self._step % self._sage_generate_every() != 0
        state = {"step": self._step, "buffered_inputs": self._buffered_inputs if inside_window else None}
        torch.save(state, folder / RESUME_STATE_FILE.format(process=self.args.process_index))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = Path(checkpoint) / RESUME_STATE_FILE.format(process=self.args.process_index)
        if not path.is_file():
            logger.warning(
                "%s has no %s: resuming without TRL's generation buffer, not bit-exact", checkpoint, path.name
            )
            return
        device = self.accelerator.device
        # torch.load knows "cuda:1" but not "cpu:0", the device name of a rank in multi-process CPU runs.
        state = torch.load(path, map_location="cpu" if device.type == "cpu" else device, weights_only=True)
        self._step, self._buffered_inputs = state["step"], state["buffered_inputs"]


def logging_alignment_warning(args) -> str | None:
    """Why a resumed run's logged metrics could differ from an uninterrupted one's, or None."""
    if args.save_strategy != "steps" or args.logging_strategy != "steps":
        return None
    save, log = int(args.save_steps), int(args.logging_steps)
    if save >= 1 and log >= 1 and save % log:
        return (
            f"save_steps={save} is not a multiple of logging_steps={log}: after a resume the first logged "
            "values average fewer steps than in an uninterrupted run (training itself resumes exactly)"
        )
    return None
