"""Branch q inside Unsloth's patched GRPO loss, from the forward that loss already runs.

Unsloth's patched ``compute_loss`` never calls TRL's ``_compute_loss`` and its scorer returns no entropies,
so before this module the branch guide under Unsloth cost one extra no-grad policy forward at rollout, and
q came from the rollout policy rather than the in-loss policy the official code uses.

The one contact point (row ``unsloth_entropy_tap`` of sage_unsloth/compat.py: pinned to unsloth / unsloth_zoo
2026.10.9, tested in tests/kit/test_compat.py, tests/rlvr/test_unsloth_path.py and by ``sage-unsloth doctor``): unsloth_zoo's ``grpo_accumulated_loss`` (inlined into the generated
UnslothGRPOTrainer) reads ``trainer.args.top_entropy_quantile``; below 1 it computes the full-vocabulary
token entropies of its own policy forward, at the sampling temperature and without gradient, and hands
them with its loss mask, both in its left-packed (B, C + max_left_pad) layout, to
``trainer.get_high_entropy_mask(entropies, mask, threshold)``. That call comes after the forward and
*before* ``UnslothEfficientGRPO`` reads ``ref_per_token_logps``, which is used only in the KL term.

The trainer's ``compute_loss`` and ``get_high_entropy_mask`` (rlvr/trainer.py) hand over to the two functions
here: for the duration of one ``compute_loss`` call :func:`compute_loss_with_q`

1. gives the loss its own copy of ``ref_per_token_logps`` (the buffered rollout batch is reused across
   num_iterations and must never change),
2. sets ``args.top_entropy_quantile`` below 1 (restored afterwards) so the loss computes the entropies,
3. in ``get_high_entropy_mask`` (:func:`entropies_handed_over`) runs the in-loss steps (rlvr/taps.py): q =
   branch_guide(H) in Unsloth's layout, log q added in place to that copy; and returns None, which Unsloth
   stores as "no entropy mask": the policy term is unchanged.

So q is computed when the official code computes it (from the current policy, per micro-batch, for any
steps_per_generation / num_iterations) and forward passes per step equal plain GRPO's. A loss that never
called the hook raises, so a change in Unsloth cannot silently turn SAGE into plain GRPO. Side effects of
the entropy path in Unsloth 2026.10.9: its PrefixGrouper is skipped (it is off under vLLM anyway) and the
log-probs go through its logit-recomputing kernel. A user's own top_entropy_quantile < 1 keeps working:
then TRL's mask is returned as well.

Any guide that reads only the entropies (sage_unsloth/plugins/guides.py, ``needs``) runs here the same way. A guide that
needs the in-loss log-probs (the token guide) or a logit signal does not: this call receives neither, so its q
is computed at rollout from one extra no-grad pass (guides.q_source).
"""

from __future__ import annotations

from sage_unsloth import compat
from sage_unsloth.rlvr import taps

# Any value below 1 switches Unsloth's in-loss entropies on; the hook ignores the threshold it implies.
ENTROPY_TAP_QUANTILE = 0.5


class SageHookNotCalled(RuntimeError):
    """Unsloth's loss ran without handing the entropies to the SAGE hook (an unpinned Unsloth?)."""


def compute_loss_with_q(trainer, compute_loss, model, inputs, args: tuple, kwargs: dict):
    """Unsloth's patched ``compute_loss`` with the SAGE trainer's in-loss steps (rlvr/taps.py, layout "unsloth")
    run from its own entropies; raises if the loss never handed them over."""
    if inputs.get("ref_per_token_logps") is None:
        return compute_loss(model, inputs, *args, **kwargs)
    batch = dict(inputs)
    batch["ref_per_token_logps"] = batch["ref_per_token_logps"].clone()
    user_quantile = getattr(trainer.args, compat.ENTROPY_QUANTILE_FIELD, 1.0)
    loss = taps.LossBatch(
        batch=batch, layout="unsloth", context=trainer.sage_step_context(), user_quantile=user_quantile
    )
    if user_quantile is None or user_quantile >= 1.0:
        setattr(trainer.args, compat.ENTROPY_QUANTILE_FIELD, ENTROPY_TAP_QUANTILE)
    trainer._sage_open_loss = loss
    try:
        value = compute_loss(model, batch, *args, **kwargs)
    finally:
        setattr(trainer.args, compat.ENTROPY_QUANTILE_FIELD, user_quantile)
        trainer._sage_open_loss = None
    if loss.entropies is None:
        raise SageHookNotCalled(
            "Unsloth's GRPO loss ran without calling get_high_entropy_mask, so SAGE's branch q never reached "
            "its KL; the kit is pinned to unsloth/unsloth_zoo 2026.10.9: reinstall those or set "
            "sage_q_source=rollout"
        )
    return value


def entropies_handed_over(trainer, loss, get_high_entropy_mask, entropies, mask, threshold):
    """Unsloth's loss handing its entropies and mask (its layout) to ``get_high_entropy_mask``: run the in-loss
    steps on them (q, and log q added in place to the loss's reference), then answer as Unsloth expects."""
    ref = loss.batch["ref_per_token_logps"]
    if loss.entropies is not None or entropies.shape != ref.shape or mask.shape != ref.shape:
        raise SageHookNotCalled(
            f"Unsloth handed SAGE entropies {tuple(entropies.shape)} / mask {tuple(mask.shape)} for a reference "
            f"of shape {tuple(ref.shape)} (call {2 if loss.entropies is not None else 1}); the kit is pinned to "
            "unsloth/unsloth_zoo 2026.10.9"
        )
    loss.entropies, loss.mask = entropies, mask
    for step in trainer.loss_steps:
        step(loss)
    user_quantile = loss.user_quantile
    if user_quantile is not None and user_quantile < 1.0:
        return get_high_entropy_mask(entropies, mask, threshold)
    return None  # Unsloth: no entropy mask, the policy term is left as plain GRPO's
