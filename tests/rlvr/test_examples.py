"""The method plug-ins of examples/ (docs/extending.md: one out-of-tree example for each kind), each against its
formula written out here, and examples/my_methods.yaml (all three with the branch guide) trained through the RLVR
CLI on the tiny model, with each plug-in seen to run.

Checked by breaking on purpose: dropping the scale of centred_advantage, the floor of damped_advantage or the
clamp of clipped_k3 fails the formula tests."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from sage_unsloth.plugins.registry import import_object

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _example(spec: str):
    return import_object(str(EXAMPLES / spec), "test")


def test_centred_advantage_is_the_scaled_group_centred_reward():
    fn = _example("centred_advantage.py:centred_advantage")
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, float("nan"), 1.0])
    from sage_unsloth.plugins.advantages import GroupRewards

    got = fn(GroupRewards(rewards, 3), scale=2.0)
    # groups (1, 0, 0) and (0, nan->0, 1): means 1/3 and 1/3
    want = [2 * (1 - 1 / 3), -2 / 3, -2 / 3, -2 / 3, -2 / 3, 2 * (1 - 1 / 3)]
    assert got.tolist() == pytest.approx(want)


def test_damped_advantage_keeps_the_floor_on_certain_tokens():
    from sage_unsloth.plugins.policy_terms import TokenBatch

    fn = _example("damped_advantage_term.py:damped_advantage")
    entropies = torch.tensor([[0.0, 0.5, 2.0]])
    advantages = torch.tensor([[1.0, 1.0, -1.0]])
    batch = TokenBatch(
        logps=torch.zeros(1, 3),
        old_logps=torch.zeros(1, 3),
        entropies=entropies,
        advantages=advantages,
        mask=torch.tensor([[1.0, 1.0, 0.0]]),
        epsilon_low=0.2,
        epsilon_high=0.2,
        generator=torch.Generator(),
    )
    out = fn(batch, floor=0.25, entropy_scale=1.0)
    weights = [0.25, 0.25 + 0.75 * 0.5, 1.0]  # H / scale capped at 1
    assert out.advantages.tolist() == [pytest.approx([a * w for a, w in zip([1.0, 1.0, -1.0], weights)])]
    assert out.loss is None and out.metrics["damped/weight_mean"] == pytest.approx((0.25 + 0.625) / 2)


def test_clipped_k3_is_k3_inside_the_clip_and_flat_outside():
    from sage_unsloth.plugins.kl_terms import KLTokens

    fn = _example("clipped_k3.py:clipped_k3")
    logps = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.2, -9.0]])  # d = -0.5, 0.8, -8.0
    out = fn(KLTokens(logps=logps, ref_logps=ref, old_logps=None, ratio=False), clip=2.0)
    d = [-0.5, 0.8, -2.0]  # the last clipped to -clip
    assert out.term.detach()[0].tolist() == pytest.approx([math.exp(x) - x - 1 for x in d])
    (grad,) = torch.autograd.grad(out.term.sum(), logps)
    # d(exp(d) - d - 1)/dlogp = -(exp(d) - 1) inside the clip, 0 where clipped
    assert grad[0].tolist() == pytest.approx([-(math.exp(-0.5) - 1), -(math.exp(0.8) - 1), 0.0])
    assert fn.backends == ("trl",) and fn.gradient is None
    # use_bias_correction_kl: weighted by pi / pi_old (value unchanged), as TRL weighs k3
    old = torch.tensor([[-1.2, -0.8, -1.0]])
    weighted = fn(KLTokens(logps=logps, ref_logps=ref, old_logps=old, ratio=True), clip=2.0)
    ratio = [math.exp(-1.0 + 1.2), math.exp(-1.0 + 0.8), 1.0]
    assert weighted.term.detach()[0].tolist() == pytest.approx(
        [(math.exp(x) - x - 1) * r for x, r in zip(d, ratio)]
    )
    assert weighted.value[0].tolist() == pytest.approx([math.exp(x) - x - 1 for x in d])


def test_my_methods_trains_all_three_plug_ins_through_the_cli(
    tmp_path, sft_dir, dapo_sample, varied_reward, monkeypatch
):
    from sage_unsloth.rlvr import taps
    from sage_unsloth.rlvr.run import main

    ran = {"estimate": 0, "term": 0, "kl": 0}
    steps = {"estimate": "estimate_advantages", "term": "policy_term", "kl": "kl_term"}

    def counted(step, name):
        def run(record):
            ran[name] += 1
            return step(record)

        return run

    # The plan chooses its steps from taps.py when the config is built: a step the method needs runs, counted.
    for name, attribute in steps.items():
        monkeypatch.setattr(taps, attribute, counted(getattr(taps, attribute), name))
    monkeypatch.chdir(REPO)  # the plug-ins' paths are relative to the working directory, as the file says
    argv = [
        "examples/my_methods.yaml",
        "--sft_dir",
        str(sft_dir),
        "--output_root",
        str(tmp_path / "out"),
        "--dataset_path",
        str(dapo_sample),
        "--max_steps",
        "1",
        "--save_strategy",
        "no",
    ]
    assert main(argv) == 0
    assert all(count > 0 for count in ran.values()), ran
