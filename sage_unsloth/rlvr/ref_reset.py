"""Periodic reference reset (ProRL, arXiv 2505.24864): every ``ref_reset_steps`` optimizer steps the anchor
pi_ref -- the kit's frozen ``ref`` adapter (rlvr/run.py, ``anchor: sft``) -- becomes a copy of the policy
adapter, and (``ref_reset_optimizer``, ProRL's hard reset) the optimizer's moments start afresh.

TRL's own ``sync_ref_model`` refuses PEFT models, hence this callback. It runs at the end of the optimizer
step, before the Trainer saves that step's checkpoint, and transformers' checkpoints hold the ``ref`` adapter
(``ref/`` beside the policy's) and the optimizer state, so a run resumed from any checkpoint continues with
the reference and moments of the uninterrupted run (tests/rlvr/test_exploration.py resumes across a reset).
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback

from sage_unsloth.compat import POLICY_ADAPTER, REF_ADAPTER

logger = logging.getLogger(__name__)


def copy_policy_into_reference(model) -> None:
    """ref adapter weights <- policy adapter weights (PEFT's per-adapter state dict, so names match)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    model = getattr(model, "module", model)
    if REF_ADAPTER not in getattr(model, "peft_config", {}):
        raise ValueError(
            "ref_reset_steps needs the frozen 'ref' adapter (anchor: sft with beta > 0): set anchor=sft or "
            "ref_reset_steps=0"
        )
    weights = get_peft_model_state_dict(model, adapter_name=POLICY_ADAPTER)
    set_peft_model_state_dict(
        model, {k: v.detach().clone() for k, v in weights.items()}, adapter_name=REF_ADAPTER
    )


def reset_optimizer_state(optimizer) -> None:
    """Drop every parameter's moments and step count; the optimizer re-initialises them on its next step."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps torch's
    inner.state.clear()


class ReferenceReset(TrainerCallback):
    def __init__(self, every: int, reset_optimizer: bool):
        self.every, self.reset_optimizer = every, reset_optimizer

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model = getattr(model, "module", model)
        if model is not None and REF_ADAPTER not in getattr(model, "peft_config", {}):
            raise ValueError(
                "ref_reset_steps needs the frozen 'ref' adapter (anchor: sft with beta > 0): set anchor=sft or "
                "ref_reset_steps=0"
            )

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if state.global_step % self.every:
            return
        copy_policy_into_reference(model)
        if self.reset_optimizer and optimizer is not None:
            reset_optimizer_state(optimizer)
        logger.info("reference reset to the policy at step %d", state.global_step)
