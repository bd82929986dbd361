r"""A policy term of your own: shrink the advantage of the tokens the policy is already sure of.

    policy_term: {name: examples/damped_advantage_term.py:damped_advantage, floor: 0.5, entropy_scale: 1.0}

Per token: A_t <- A_t * (floor + (1 - floor) * min(1, H_t / entropy_scale)), with H_t the current policy's token
entropy (no gradient): a token near-deterministic under the policy keeps ``floor`` of its advantage, an
uncertain one all of it. Per sequence nothing else changes (TRL's clipped surrogate and aggregation).

The contract (docs/extending.md): ``fn(batch, **arguments) -> TermOutput``, the one call shape of every
plug-in kind. ``batch`` is a
sage_unsloth.plugins.policy_terms.TokenBatch of the loss call (logps with gradient, old_logps, entropies,
per-token advantages, mask, the clip range, a per-step seeded generator); return replacement ``advantages``
(B, T), an added per-token ``loss`` (aggregated as TRL aggregates its own), ``metrics`` to log, or any of them.
TRL backend only (Unsloth's compiled loss has no slot for it); the kit refuses the rest in one line.
"""

from sage_unsloth.plugins.policy_terms import TermOutput


def damped_advantage(batch, *, floor: float = 0.5, entropy_scale: float = 1.0):
    certainty = (batch.entropies / entropy_scale).clamp(max=1.0)
    weight = floor + (1.0 - floor) * certainty
    kept = (weight * batch.mask).sum() / batch.mask.sum().clamp(min=1)
    return TermOutput(advantages=batch.advantages * weight, metrics={"damped/weight_mean": kept.item()})
