"""Pass@k Training composes with the reward placement: the shaped reward r~_i = r_i - beta * sum_t [log pi -
log pi_ref - log q_t]_i feeds Pass@k's estimator instead of the raw reward. Checked through the kit's code path
(the trainer's steps after the rollout, rlvr/taps.py) on the hand-made batch of tests/rlvr/test_placement_group_constant_q.py against
Pass@k by enumerating every k-subset (tests/rlvr/test_exploration.py's brute force) of the shaped rewards computed here
from the definition."""

from __future__ import annotations

import pytest
import torch
from test_exploration import _passk_by_enumeration
from test_placement_group_constant_q import GENERATIONS, GROUPS, _batch, run_rollout_steps
from test_rlvr_trainer import _build, _config

BETA, K = 0.125, 2


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    cfg = _config(
        tmp_path_factory.mktemp("passk_reward"),
        sage_kl_placement="reward",
        beta=BETA,
        guide="none",
        num_generations=GENERATIONS,
        advantage_estimator={"name": "passk", "k": K},
    )
    trainer = _build(tiny_model_dir, cfg)
    trainer.model.train()
    return trainer


def test_passk_with_the_reward_placement_is_passk_of_the_shaped_reward(trainer):
    output, logps, ref, rewards = _batch()
    trainer.sage_policy_stats = lambda output, captured: (logps, None, {})
    trainer.sage_reference_scores = lambda output, entropies=False: (ref, None)
    run_rollout_steps(trainer, output, rewards)
    mask = output["completion_mask"].float()
    shaped = rewards[:, 0] - BETA * ((logps - ref) * mask).sum(-1)  # q = 1 (no guide): log q = 0
    want = [
        a
        for g in range(GROUPS)
        for a in _passk_by_enumeration(shaped[g * GENERATIONS : (g + 1) * GENERATIONS].tolist(), K)
    ]
    torch.testing.assert_close(output["advantages"], torch.tensor(want), atol=1e-5, rtol=1e-5)
    # and it is not GRPO's advantage of the shaped reward (the estimator really ran)
    grouped = shaped.view(GROUPS, GENERATIONS)
    grpo = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    assert (output["advantages"] - grpo).abs().max() > 1e-2
