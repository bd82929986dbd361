"""Branch q inside Unsloth's patched GRPO loss, from the forward that loss already runs.

Unsloth's patched ``compute_loss`` never calls TRL's ``_compute_loss`` and its scorer returns no entropies,
so before this module the branch guide under Unsloth cost one extra no-grad policy forward at rollout, and
q came from the rollout policy rather than the in-loss policy the official code uses.

The one contact point (row ``unsloth_entropy_tap`` of sage_unsloth/compat.py: pinned to unsloth / unsloth_zoo
2026.10.9, tested in tests/test_compat.py, tests/test_unsloth_path.py and by ``sage-unsloth doctor``): unsloth_zoo's ``grpo_accumulated_loss`` (inlined into the generated
UnslothGRPOTrainer) reads ``trainer.args.top_entropy_quantile``; below 1 it computes the full-vocabulary
token entropies of its own policy forward, at the sampling temperature and without gradient, and hands
them with its loss mask, both in its left-packed (B, C + max_left_pad) layout, to
``trainer.get_high_entropy_mask(entropies, mask, threshold)``. That call comes after the forward and
*before* ``UnslothEfficientGRPO`` reads ``ref_per_token_logps``, which is used only in the KL term.

:class:`InUnslothLossBranchQ` uses it: for the duration of one ``compute_loss`` call it

1. gives the loss its own copy of ``ref_per_token_logps`` (the buffered rollout batch is reused across
   num_iterations and must never change),
2. sets ``args.top_entropy_quantile`` below 1 (restored afterwards) so the loss computes the entropies,
3. in ``get_high_entropy_mask`` computes q = branch_guide(H) in Unsloth's layout, adds log q in place to
   that copy, and returns None, which Unsloth stores as "no entropy mask": the policy term is unchanged.

So q is computed when the official code computes it (from the current policy, per micro-batch, for any
steps_per_generation / num_iterations) and forward passes per step equal plain GRPO's. A loss that never
called the hook raises, so a change in Unsloth cannot silently turn SAGE into plain GRPO. Side effects of
the entropy path in Unsloth 2026.10.9: its PrefixGrouper is skipped (it is off under vLLM anyway) and the
log-probs go through its logit-recomputing kernel. A user's own top_entropy_quantile < 1 keeps working:
then TRL's mask is returned as well.

Any guide that reads only the entropies (sage_unsloth/guides.py, ``needs``) runs here the same way. A guide that
needs the in-loss log-probs (the token guide) or a logit signal does not: this call receives neither, so its q
is computed at rollout from one extra no-grad pass (guides.q_source).
"""

from __future__ import annotations

import torch

from sage_unsloth import anchor, compat

# Any value below 1 switches Unsloth's in-loss entropies on; the hook ignores the threshold it implies.
ENTROPY_TAP_QUANTILE = 0.5


class SageHookNotCalled(RuntimeError):
    """Unsloth's loss ran without handing the entropies to the SAGE hook (an unpinned Unsloth?)."""


class InUnslothLossBranchQ:
    """Mixin for a trainer over Unsloth's patched GRPOTrainer: q of an entropy-only guide (the branch guide) from
    the loss's own entropies.

    Needs the SageTrainerMixin interface (``sage_q_in_loss``, ``_sage_guide_step``, ``_sage_log_q_metrics``)
    and sits between SageTrainerMixin and the patched base in the MRO (see make_sage_trainer_class)."""

    _sage_tap: dict | None = None

    def _sage_tap_wanted(self) -> bool:
        # sage_q_in_loss under Unsloth means: the guide reads the entropies and nothing else the loss lacks
        # (guides.q_source), so the tap has all it needs.
        return getattr(self, "_sage_patched", False) and self.sage_q_in_loss and self.beta != 0.0

    def compute_loss(self, model, inputs, *args, **kwargs):
        if not self._sage_tap_wanted() or inputs.get("ref_per_token_logps") is None:
            return super().compute_loss(model, inputs, *args, **kwargs)
        inputs = dict(inputs)
        inputs["ref_per_token_logps"] = inputs["ref_per_token_logps"].clone()
        user_quantile = getattr(self.args, compat.ENTROPY_QUANTILE_FIELD, 1.0)
        self._sage_tap = {
            "ref": inputs["ref_per_token_logps"],
            "user_quantile": user_quantile,
            "called": False,
        }
        if user_quantile is None or user_quantile >= 1.0:
            setattr(self.args, compat.ENTROPY_QUANTILE_FIELD, ENTROPY_TAP_QUANTILE)
        try:
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            called = self._sage_tap["called"]
        finally:
            setattr(self.args, compat.ENTROPY_QUANTILE_FIELD, user_quantile)
            self._sage_tap = None
        if not called:
            raise SageHookNotCalled(
                "Unsloth's GRPO loss ran without calling get_high_entropy_mask, so SAGE's branch q never reached "
                "its KL; the kit is pinned to unsloth/unsloth_zoo 2026.10.9: reinstall those or set "
                "sage_q_source=rollout"
            )
        return loss

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float):
        tap = self._sage_tap
        if tap is None:
            return super().get_high_entropy_mask(entropies, mask, threshold)
        ref = tap["ref"]
        if tap["called"] or entropies.shape != ref.shape or mask.shape != ref.shape:
            raise SageHookNotCalled(
                f"Unsloth handed SAGE entropies {tuple(entropies.shape)} / mask {tuple(mask.shape)} for a reference "
                f"of shape {tuple(ref.shape)} (call {2 if tap['called'] else 1}); the kit is pinned to "
                "unsloth/unsloth_zoo 2026.10.9"
            )
        tap["called"] = True
        q = self.sage_branch_q(entropies, mask)
        self._sage_log_q_metrics(q, mask)
        ref.add_(anchor.log_q(q).to(device=ref.device, dtype=ref.dtype))
        tap["q"] = q
        user_quantile = tap["user_quantile"]
        if user_quantile is not None and user_quantile < 1.0:
            return super().get_high_entropy_mask(entropies, mask, threshold)
        return None  # Unsloth: no entropy mask, the policy term is left as plain GRPO's

    def sage_branch_q(self, entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The configured guide's q (the branch guide's, or any guide that reads only the entropies) in Unsloth's
        layout: its Signals carry ``entropies`` and ``mask`` in that layout (``layout='unsloth'``)."""
        entry, _, guide = self.sage_guide()
        step = self._sage_guide_step()
        return self._sage_run_guide(entry, guide, mask, step, layout="unsloth", entropies=entropies.detach())
