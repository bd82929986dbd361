"""Sequence-level advantage estimators, registered by name: GRPO's group advantage (the default) and Pass@k
Training's analytic advantage (Chen et al., arXiv 2508.10751).

An estimator maps the rollout's summed rewards (N,) -- ordered group by group, every process's rows -- to
one advantage per completion. ``advantage_estimator: grpo`` leaves TRL's own advantage in place (TRL computed
exactly :func:`sage_unsloth.compat.group_advantages`); any other name, or ``package.module:function`` /
``path/to/file.py:function`` with the signature ``fn(inputs, **arguments) -> advantages`` (``inputs`` a
:class:`GroupRewards`), replaces it after TRL's rollout. Estimators are entries of :data:`ADVANTAGE_ESTIMATORS`,
a :class:`sage_unsloth.plugins.registry.Registry` like the guides; a built-in's knobs are keyword arguments set in the
node (``advantage_estimator: {name: passk, k: 4}``); grpo's ``scale_rewards`` is TRL's own field.

Pass@k Training rewards a group's k-subsets by their best member and credits each response with the mean
normalised reward of the subsets that contain it. Enumerating the C(N, k) subsets is not needed: sorted
ascending, the j-th reward is the maximum of C(j-1, k-1) subsets, and of the C(N-1, k-1) subsets holding the
response at sorted place p, C(p-1, k-1) have it as their maximum and C(j-2, k-2) have the j-th (j > p).
For 0/1 rewards this is the paper's closed form (Eqs. for the positive / negative response advantage):
mean R = 1 - C(N_neg, k)/C(N, k), sigma = sqrt(R(1-R)), A_pos = (1-R)/sigma,
A_neg = (1 - R - C(N_neg-1, k-1)/C(N-1, k-1))/sigma; this form also covers graded rewards (subset reward =
its maximum), which the kit's tiny tests use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from sage_unsloth.plugins.registry import Registry

# A group whose k-subset rewards all agree has no signal: advantage 0 (as GRPO's for a flat group).
_FLAT = 1e-8


def passk_group_advantages(rewards: torch.Tensor, num_generations: int, k: int) -> torch.Tensor:
    """Pass@k Training's analytic advantage of every completion (N,), groups of ``num_generations`` in order.

    NaN rewards (unscorable completions) count as 0."""
    if not 1 <= k <= num_generations:
        raise ValueError(f"passk_k={k} must be in [1, num_generations={num_generations}]")
    grouped = torch.nan_to_num(rewards.double(), nan=0.0).view(-1, num_generations)
    n = num_generations
    order = grouped.argsort(dim=1, stable=True)
    ranked = grouped.gather(1, order)  # ascending
    place = torch.arange(1, n + 1, dtype=torch.float64)  # sorted place j (1-based)
    # P(max of a random k-subset is the j-th) = C(j-1, k-1) / C(n, k)
    as_max = torch.tensor([math.comb(j - 1, k - 1) for j in range(1, n + 1)], dtype=torch.float64)
    p_max = as_max / math.comb(n, k)
    mean = (ranked * p_max).sum(1, keepdim=True)
    sigma = ((ranked**2 * p_max).sum(1, keepdim=True) - mean**2).clamp(min=0.0).sqrt()
    # Of the C(n-1, k-1) subsets holding the response at place p: it is the max of C(p-1, k-1); the j-th
    # (j > p) is the max of C(j-2, k-2).
    self_max = torch.tensor([math.comb(p - 1, k - 1) for p in range(1, n + 1)], dtype=torch.float64)
    other_max = torch.tensor(
        [math.comb(j - 2, k - 2) if j >= 2 and k >= 2 else 0 for j in range(1, n + 1)], dtype=torch.float64
    )
    later = place[None, :] > place[:, None]  # [p, j]: j after p
    weights = later.double() * other_max[None, :]
    holding = math.comb(n - 1, k - 1)
    subset_mean = (ranked * self_max[None, :] + ranked @ weights.T) / holding
    advantage_sorted = torch.where(sigma > _FLAT, (subset_mean - mean) / sigma.clamp(min=_FLAT), 0.0)
    advantages = torch.empty_like(advantage_sorted).scatter_(1, order, advantage_sorted)
    return advantages.view(-1).to(rewards.dtype)


@dataclass(frozen=True)
class GroupRewards:
    """An estimator's inputs: the rollout's summed rewards (N,), group by group, every process's rows."""

    rewards: torch.Tensor
    num_generations: int


# ``recomputed``: False for the estimator TRL already computed (the trainer leaves TRL's advantage alone);
# an import-path estimator says so with ``fn.recomputed = False`` (default True: it replaces TRL's).
# ``group_subset_arg``: the keyword holding the size k of the subsets of a group the estimator scores (checked
# 1 <= k <= num_generations), or None.
ADVANTAGE_ESTIMATORS = Registry(
    "advantage estimator",
    field="advantage_estimator",
    meta={"backends": ("trl", "unsloth"), "recomputed": True, "group_subset_arg": None},
    inputs="inputs",
    retired=("num_generations", "args"),
    example="passk",
)


# TRL reads scale_rewards itself (its own advantage): the grpo estimator is bound from TRL's field, one value.
@ADVANTAGE_ESTIMATORS.register("grpo", recomputed=False, trl_fields={"scale_rewards": "scale_rewards"})
def _grpo(inputs: GroupRewards, *, scale_rewards: Literal["group", "batch", "none"]):
    from sage_unsloth.compat import group_advantages

    return group_advantages(inputs.rewards, inputs.num_generations, scale_rewards)


@ADVANTAGE_ESTIMATORS.register("passk", group_subset_arg="k")
def _passk(inputs: GroupRewards, *, k: int = 4):
    return passk_group_advantages(inputs.rewards, inputs.num_generations, k)
