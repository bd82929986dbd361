"""The steps of rlvr/taps.py read only their record and its context: each runs here on a hand-made record and a
StepContext built by hand, without a trainer, and is checked against its formula written from the definitions
(the reward placement's r - beta * sum_t (log pi - log pi_ref - log q_t), TRL's grpo aggregation of a KL term's
difference to k3, GRPO's group advantage of the shaped reward)."""

from __future__ import annotations

import inspect
import math
import warnings
from collections import defaultdict

import pytest
import torch

from sage_unsloth.rlvr import taps
from sage_unsloth.rlvr.taps import LossBatch, Rollout, StepContext, TrlSettings

G, ROWS, T = 2, 4, 5
BETA = 0.125


class OneProcess:
    """The accelerator a step reads: gather / reduce over one process, process index 0."""

    process_index = 0

    @staticmethod
    def gather(x):
        return x

    @staticmethod
    def reduce(x, reduction="sum"):
        return x


def _plan(**fields):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = SageGRPOConfig(output_dir="/tmp/unused", report_to="none", backend="trl", beta=BETA, **fields)
    return cfg.method_plan


def _context(plan, **kw) -> StepContext:
    aggregation = {
        "loss_type": "grpo",
        "max_completion_length": T,
        "num_processes": 1,
        "accumulation_steps": 1,
        "steps_per_generation": 1,
        "training": True,
    }
    return StepContext(
        plan=plan,
        mode="train",
        log=defaultdict(list),
        kl_coef=BETA,
        accelerator=OneProcess(),
        q=lambda batch, mask, **_: torch.where(
            mask.bool(), torch.full_like(mask, 1.25), torch.ones_like(mask)
        ),
        noise=lambda stream: torch.Generator().manual_seed(0),
        step=3,
        reward_weights=torch.ones(1),
        num_generations=G,
        trl=TrlSettings(aggregation=aggregation),
        **kw,
    )


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(ROWS, T)
    mask[1, 3:] = 0.0
    mask[3, 1:] = 0.0
    logps = -torch.rand(ROWS, T, generator=g) * 3
    ref = logps - 0.4 * torch.rand(ROWS, T, generator=g)
    rewards = torch.tensor([[1.0], [0.0], [0.5], [1.0]])
    return mask, logps, ref, rewards


def test_no_step_takes_the_trainer():
    """Every step the plan can choose is ``step(record)``: one parameter, its record."""
    steps = [getattr(taps, name) for name in taps.__dict__ if callable(getattr(taps, name))]
    chosen = {s for s in steps if inspect.isfunction(s) and s.__module__ == taps.__name__}
    step_names = {
        "summed_rewards", "q_at_rollout", "reward_placement", "estimate_advantages", "shift_reference_at_rollout",
        "log_importance_sampling", "dapo_normaliser", "q_in_the_loss", "q_in_the_unsloth_loss", "policy_term",
        "kl_term",
    }  # fmt: skip
    assert step_names <= {s.__name__ for s in chosen}
    for step in (s for s in chosen if s.__name__ in step_names):
        params = list(inspect.signature(step).parameters)
        assert params in (["rollout"], ["loss"]), (step.__name__, params)
        assert "trainer" not in step.__code__.co_varnames and "trainer" not in step.__code__.co_names


def test_the_reward_placement_and_its_estimator_on_a_hand_made_rollout():
    """r~ = r - beta * sum_t [log pi - log pi_ref - log q_t] over the completion, then GRPO's group advantage of
    r~ (the unbiased std + 1e-4, TRL's), written here from the definitions."""
    plan = _plan(guide="branch", sage_kl_placement="reward")
    mask, logps, ref, rewards = _tensors()
    output = {
        "completion_mask": mask,
        "completion_ids": torch.zeros(ROWS, T),
        "advantages": torch.zeros(ROWS),
    }
    rollout = Rollout(output=output, rewards_per_func=rewards, context=_context(plan))
    rollout.policy, rollout.reference = {"logps": logps}, {"ref_logps": ref}
    for step in plan.steps(unsloth_patched=False).after_each_rollout:
        step(rollout)
    kls = [
        sum((logps[i, t] - ref[i, t] - math.log(1.25)).item() for t in range(T) if mask[i, t] > 0)
        for i in range(ROWS)
    ]
    want = [rewards[i, 0].item() - BETA * kls[i] for i in range(ROWS)]
    torch.testing.assert_close(rollout.rewards, torch.tensor(want))
    advantages = []
    for group in (want[:G], want[G:]):
        mean = sum(group) / G
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (G - 1))
        advantages += [(r - mean) / (std + 1e-4) for r in group]
    torch.testing.assert_close(output["advantages"], torch.tensor(advantages))
    assert rollout.context.log["sage/kl_in_reward"] == [pytest.approx(BETA * sum(kls) / ROWS)]


def test_the_kl_term_step_on_a_hand_made_loss_batch():
    """k2 in place of TRL's k3: the step adds beta * mean_rows(sum_t (k2 - k3) * mask / sum_t mask) (TRL's grpo
    aggregation) and logs k2's mean over the tokens."""
    plan = _plan(guide="branch", kl_term="k2")
    mask, logps, ref, _ = _tensors(seed=1)
    logps = logps.clone().requires_grad_(True)
    batch = {"completion_mask": mask, "ref_per_token_logps": ref, "num_items_in_batch": mask.sum()}
    loss = LossBatch(batch=batch, context=_context(plan), logps=logps)
    taps.kl_term(loss)
    d = ref - logps.detach()
    k2, k3 = 0.5 * d**2, torch.exp(d) - d - 1
    rows = [((k2[i] - k3[i]) * mask[i]).sum() / mask[i].sum() for i in range(ROWS)]
    want = BETA * torch.stack(rows).mean()
    assert len(loss.added) == 1 and loss.added[0].item() == pytest.approx(want.item(), abs=1e-7)
    assert loss.logged_kl == pytest.approx(((k2 * mask).sum() / mask.sum()).item(), rel=1e-6)
    (grad,) = torch.autograd.grad(loss.added[0], logps)
    assert grad.abs().sum() > 0  # the term carries its gradient
