"""The reward placement (sage_kl_placement: reward) and a q that is equal across a group at a position.

r~_i = r_i - beta * sum_t [log pi - log pi_ref - log q_t]_i, then the group advantage (r~_i - mean) / (std +
1e-4). If q at position t is the same for every completion i of a group, beta * log q_t shifts every r~_i of
that group by the same amount: the mean moves by it, the deviations and the std do not, so the advantages are
those of q = 1 at that position. In the demo lab the branch point is completion position 0, whose entropy
(and so the branch guide's q there) depends only on the prompt, shared by the group: the branch-point part of
grpo_branch_reward is a no-op there (docs/theory.md, "The reward placement and group-constant q").

Checked through the kit's code path (the trainer's steps after the rollout, rlvr/taps.py: the guide, finalise_q,
the sequence pseudo-KL, the shaped reward and GRPO's group advantage) on a hand-made batch whose log-probs,
rewards and beta are dyadic and whose log q values are exactly +-0.25 in float32, so that every sum is exact
and the claim is exact equality (torch.equal), not closeness; then a control whose q differs inside a group
(the advantages must move) and the same cancellation at a later position.
"""

from __future__ import annotations

import pytest
import torch
from test_rlvr_trainer import _build, _config

# float32 values whose torch.log is exactly +0.25 / -0.25 (found by scanning the neighbours of exp(+-0.25))
Q_UP, Q_DOWN = 1.2840254306793213, 0.7788007855415344
GENERATIONS, GROUPS, PROMPT, COMPLETION = 4, 2, 3, 5
HERE = __name__  # the plug-in guides below are named by import path: "<this module>:<function>"


def prompt_constant_q(signals, *, position: int = 0):
    """q at ``position`` from the prompt alone (as the branch point's entropy is), 1 elsewhere."""
    q = torch.ones(signals.mask.shape)
    by_prompt = torch.where(signals.prompt_ids[:, 0] % 2 == 0, Q_UP, Q_DOWN)
    q[:, position] = by_prompt
    return q


prompt_constant_q.needs = ("prompt_ids",)


def token_dependent_q(signals, *, position: int = 0):
    """Control: q at ``position`` from the sampled token, which differs inside a group."""
    q = torch.ones(signals.mask.shape)
    q[:, position] = torch.where(signals.completion_ids[:, position] % 2 == 0, Q_UP, Q_DOWN)
    return q


token_dependent_q.needs = ("completion_ids",)


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    cfg = _config(
        tmp_path_factory.mktemp("group_q"),
        sage_kl_placement="reward",
        beta=0.125,  # a power of two: beta * (dyadic pseudo-KL) is exact
        guide="none",
        num_generations=GENERATIONS,
    )
    trainer = _build(tiny_model_dir, cfg)
    trainer.model.train()
    return trainer


def _batch():
    """Two groups of four completions: identical prompts within a group (tokens 2 and 3), distinct sampled
    tokens, two completions shorter than the others (position 0 is always a completion token)."""
    prompt_ids = torch.tensor([[2, 7, 9]] * GENERATIONS + [[3, 7, 9]] * GENERATIONS)
    completion_ids = torch.arange(GENERATIONS * GROUPS * COMPLETION).view(-1, COMPLETION) + 100
    mask = torch.ones(GENERATIONS * GROUPS, COMPLETION, dtype=torch.long)
    mask[1, 3:] = 0
    mask[6, 2:] = 0
    output = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": mask,
        "advantages": torch.zeros(GENERATIONS * GROUPS),
    }
    # multiples of 1/8 and 1/16: every sum below is exact in float32
    generator = torch.Generator().manual_seed(0)
    logps = -torch.randint(1, 24, (GENERATIONS * GROUPS, COMPLETION), generator=generator).float() / 8
    ref = -torch.randint(1, 24, (GENERATIONS * GROUPS, COMPLETION), generator=generator).float() / 16
    rewards = torch.tensor([[1.0], [0.0], [1.0], [1.0], [0.0], [0.0], [1.0], [0.0]])
    return output, logps, ref, rewards


def run_rollout_steps(trainer, output: dict, rewards: torch.Tensor) -> None:
    """The trainer's steps after a rollout (rlvr/taps.py) on a hand-made TRL batch with these rewards."""
    from sage_unsloth.rlvr.taps import Rollout

    rollout = Rollout(output=output, rewards_per_func=rewards)
    trainer._sage_rollout_signals(rollout)  # what the trainer gathers after TRL's rollout
    rollout.context = trainer.sage_step_context()
    for step in trainer.rollout_steps:
        step(rollout)


def _advantages(trainer, guide: str, position: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, q) from the kit's reward placement for the hand-made batch, with ``guide``."""
    output, logps, ref, rewards = _batch()
    trainer.args.guide = guide if guide == "none" else {"name": guide, "position": position}
    trainer.sage_policy_stats = lambda output, captured: (logps, None, {})
    trainer.sage_reference_scores = lambda output, entropies=False: (ref, None)
    seen = {}
    compute_q = type(trainer).sage_q

    def spy(*args, **kwargs):
        seen["q"] = compute_q(trainer, *args, **kwargs)
        return seen["q"]

    trainer.sage_q = spy
    run_rollout_steps(trainer, output, rewards)
    return output["advantages"].clone(), seen["q"]


def test_a_q_equal_across_each_group_at_a_position_leaves_the_group_advantages_exactly_unchanged(trainer):
    plain, q_plain = _advantages(trainer, "none")
    assert torch.equal(q_plain, torch.ones_like(q_plain)) and plain.abs().max() > 0.5  # the rewards move them
    for position in (0, 1):  # the branch point (position 0) and a later position every completion reaches
        shaped, q = _advantages(trainer, f"{HERE}:prompt_constant_q", position)
        on = q[:, position]
        assert torch.equal(torch.log(on), torch.tensor([0.25] * GENERATIONS + [-0.25] * GENERATIONS))
        assert torch.equal(shaped, plain), (position, shaped - plain)


def test_a_q_that_differs_inside_a_group_moves_the_advantages(trainer):
    plain, _ = _advantages(trainer, "none")
    shaped, q = _advantages(trainer, f"{HERE}:token_dependent_q")
    assert len(set(q[:GENERATIONS, 0].tolist())) == 2  # both values inside the first group
    # r~ gains beta * log q_0 = +-0.03125 per completion: the group deviations change by that, over the std
    assert (shaped - plain).abs().max() > 1e-2
