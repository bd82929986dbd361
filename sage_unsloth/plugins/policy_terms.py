"""Per-token policy terms, registered by name: the entropy advantage, Clip-Cov and KL-Cov.

A term sees one loss call's tokens (:class:`TokenBatch`: the current policy's log-probs with their gradient,
the rollout policy's, the entropies, the advantages broadcast to (B, T), the loss mask) and returns
replacement per-token advantages and/or an added per-token loss term (:class:`TermOutput`). The trainer
(rlvr/exploration.py) feeds the advantages to TRL's own loss, which accepts (B, T) advantages, and aggregates
the added term exactly as TRL aggregates its loss; nothing else of TRL's loss changes. TRL backend only:
Unsloth's compiled loss has no slot for either, so every term declares ``backends=("trl",)``. Terms are entries
of :data:`POLICY_TERMS` (a :class:`sage_unsloth.plugins.registry.Registry`, resolved like the guides: a name,
``package.module:function`` or ``path/to/file.py:function`` with the signature ``fn(batch, **arguments) ->
TermOutput``); a built-in's knobs are keyword arguments set in the node (``policy_term: {name: clip_cov, ratio:
...}``), their defaults the papers'.

- ``entropy_adv`` (Cheng et al., arXiv 2506.14758): A_t + min(alpha * H_t.detach(), |A_t| / kappa). The
  bonus is detached (it shapes the advantage, it is not an entropy gradient) and clipped by |A|/kappa, so it
  never flips the sign of A and is 0 where the group gives no signal.
- ``clip_cov`` (Cui et al., arXiv 2505.22617): Cov_t = (A_t - mean A) (log pi_t - mean log pi) over the loss
  call's valid tokens; of the tokens with lb < Cov_t < ub that PPO's clip has not clipped already, ``ratio`` x N
  (at least 1) drawn at random get no gradient (advantage 0 there).
- ``kl_cov`` (same paper): the ``ratio`` x N (at least 1) tokens of largest Cov_t get
  coef * |log pi_t - log pi_old,t| added to their loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sage_unsloth.config.field_rules import Limit
from sage_unsloth.plugins.registry import Registry

# An import-path term may declare ``fn.backends``; the default is TRL only (see above). ``needs_reuse``: what the
# term reads of pi_old that is 0, with zero gradient, when every batch is used once (pi_old == pi), or None.
POLICY_TERMS = Registry(
    "policy term",
    field="policy_term",
    meta={"backends": ("trl",), "needs_reuse": None},
    inputs="batch",
    retired=("args",),
    example="clip_cov",
)
_POSITIVE = Limit(gt=0, finite=False)


@dataclass(frozen=True)
class TokenBatch:
    """One loss call's completion tokens, TRL's (B, T) layout."""

    logps: torch.Tensor  # current policy, with gradient
    old_logps: torch.Tensor  # policy that sampled (pi_old), no gradient
    entropies: torch.Tensor  # current policy, no gradient
    advantages: torch.Tensor  # (B, T)
    mask: torch.Tensor  # 1 on tokens the loss counts
    epsilon_low: float
    epsilon_high: float
    generator: torch.Generator  # seeded per (seed, step, call): a resumed run draws the same tokens


@dataclass
class TermOutput:
    advantages: torch.Tensor | None = None  # replacement per-token advantages (B, T)
    loss: torch.Tensor | None = None  # added per-token loss (B, T), aggregated as TRL aggregates
    metrics: dict[str, float] = field(default_factory=dict)


def covariance(batch: TokenBatch) -> torch.Tensor:
    """(A_t - mean A)(log pi_t - mean log pi), both means over the batch's valid tokens; no gradient."""
    valid = batch.mask.bool()
    adv, logp = batch.advantages.detach().float(), batch.logps.detach().float()
    return (adv - adv[valid].mean()) * (logp - logp[valid].mean())


@POLICY_TERMS.register(
    "entropy_adv",
    limits={
        "alpha": _POSITIVE,
        "kappa": Limit(gt=1, finite=False, note="the bonus must not flip sign(A); e.g. 2"),
    },
)
def entropy_advantage(batch: TokenBatch, *, alpha: float = 0.4, kappa: float = 2.0) -> TermOutput:
    adv = batch.advantages
    bonus = torch.minimum(alpha * batch.entropies.detach(), adv.abs() / kappa)
    valid = batch.mask.bool()
    return TermOutput(
        advantages=adv + bonus,
        metrics={"entropy_adv/bonus_mean": bonus[valid].float().mean().item() if valid.any() else 0.0},
    )


def _bounds_order(args: dict) -> str | None:
    return None if args["lb"] < args["ub"] else f"lb={args['lb']} must be < ub={args['ub']}"


@POLICY_TERMS.register("clip_cov", limits={"ratio": _POSITIVE}, check=_bounds_order)
def clip_cov(batch: TokenBatch, *, ratio: float = 2e-4, lb: float = 1.0, ub: float = 5.0) -> TermOutput:
    valid = batch.mask.bool()
    adv = batch.advantages
    importance = torch.exp(batch.logps.detach() - batch.old_logps)
    clipped_importance = importance.clamp(1 - batch.epsilon_low, 1 + batch.epsilon_high)
    clipped_by_ppo = (-adv * clipped_importance) > (-adv * importance)  # PPO's clip already stops these
    cov = covariance(batch)
    candidates = valid & ~clipped_by_ppo & (cov > lb) & (cov < ub)
    where = candidates.nonzero()
    count = min(max(int(ratio * int(valid.sum())), 1), len(where))
    keep = torch.ones_like(adv)
    if count:
        chosen = where[torch.randperm(len(where), generator=batch.generator)[:count].to(where.device)]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    return TermOutput(
        advantages=adv * keep,
        metrics={"clip_cov/frac_detached": count / max(int(valid.sum()), 1)},
    )


@POLICY_TERMS.register(
    "kl_cov",
    needs_reuse="penalises |log pi - log pi_old|",
    limits={"ratio": _POSITIVE, "coef": _POSITIVE},
)
def kl_cov(batch: TokenBatch, *, ratio: float = 2e-3, coef: float = 1.0) -> TermOutput:
    valid = batch.mask.bool()
    cov = covariance(batch).masked_fill(~valid, float("-inf"))
    n_valid = int(valid.sum())
    count = min(max(int(ratio * n_valid), 1), n_valid)
    selected = torch.zeros_like(valid)
    if count:
        top = cov.view(-1).topk(count).indices
        selected.view(-1)[top] = True
    penalty = coef * (batch.logps - batch.old_logps).abs() * selected
    return TermOutput(
        loss=penalty,
        metrics={
            "kl_cov/frac_penalised": count / max(n_valid, 1),
            "kl_cov/penalty_mean": (penalty.detach()[selected].float().mean().item() if count else 0.0),
        },
    )
