"""The DAPO paper's pieces the kit adds or wires (dynamic sampling, soft overlong punishment through TRL's own
reward function), the vLLM importance-sampling pin and its clipped-fraction metric (TRL's vLLM code path driven by
faked sampling log-probs), and the config-time checks and warnings that come with them."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from test_rlvr_trainer import PROMPTS, _build, _config, _policy_forward

from sage_unsloth.rlvr.trainer import concat_rollouts, importance_sampling_clipped_fraction

FLAT_PROMPT = PROMPTS[0]  # its completions all get reward 0: a degenerate group


def _reward(prompts, completions, **kwargs):
    return [0.0 if FLAT_PROMPT in str(p) else float(len(str(c)) % 5) for p, c in zip(prompts, completions)]


def _rows(prompts):
    return [{"prompt": [{"role": "user", "content": p}]} for p in prompts for _ in range(4)]


@pytest.fixture(scope="module")
def dapo_trainer(tiny_model_dir, tmp_path_factory):
    args = _config(
        tmp_path_factory.mktemp("dapo"),
        guide="none",
        beta=0.0,
        loss_type="dapo",
        epsilon_high=0.28,
        dynamic_sampling=True,
        dynamic_sampling_max_rounds=12,
        soft_overlong_punish_cache=4,
        dapo_normalizer="window",
    )
    return _build(tiny_model_dir, args, reward=_reward)  # this file's reward: one flat group


def _generate(trainer, prompts, seed=1):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(_rows(prompts))


def test_soft_overlong_punishment_is_trls_reward_after_the_task_reward(dapo_trainer):
    from trl.rewards import get_soft_overlong_punishment

    trainer = dapo_trainer
    assert (
        len(trainer.reward_funcs) == 2 and trainer.reward_func_names[1] == "soft_overlong_punishment_reward"
    )
    assert type(trainer.reward_funcs[1]) is type(get_soft_overlong_punishment(12, 4))
    trainer.args.dynamic_sampling = False
    try:
        batch = _generate(trainer, PROMPTS)
    finally:
        trainer.args.dynamic_sampling = True
    lengths = batch["completion_mask"].sum(1).tolist()
    # DAPO eq. 13 with L_max = max_completion_length = 12, L_cache = 4
    want = [0.0 if n <= 8 else (8 - n) / 4 if n <= 12 else -1.0 for n in lengths]
    assert any(w < 0 for w in want), "some completions should reach the punished zone"
    assert trainer.last_rollout.rewards_per_func[:, 1].tolist() == pytest.approx(want)


def test_dynamic_sampling_drops_and_refills_degenerate_groups(dapo_trainer):
    trainer = dapo_trainer
    metrics = trainer._metrics["train"]
    batch = _generate(trainer, [FLAT_PROMPT, PROMPTS[1]])
    assert batch["completion_ids"].size(0) == 8 and batch["advantages"].shape == (8,)
    groups = batch["advantages"].view(2, 4)
    assert (groups.abs().max(1).values > 0).all(), "every kept group has a learning signal"
    assert metrics["dynamic_sampling/kept_frac_first_round"][-1] == 0.5
    assert (
        metrics["dynamic_sampling/rounds"][-1] >= 2 and metrics["dynamic_sampling/degenerate_frac"][-1] == 0
    )
    assert batch["num_items_in_batch"].item() == batch["completion_mask"].sum().item()
    # the kept rows are the whole groups of the non-flat prompt: decode the prompts
    texts = trainer.processing_class.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    assert not any(FLAT_PROMPT in t for t in texts)
    # the merged batch is what the loss consumes
    loss = trainer.compute_loss(trainer.model, batch)
    assert math.isfinite(loss.item())


def test_dynamic_sampling_fills_with_degenerate_groups_past_the_round_limit(dapo_trainer, monkeypatch):
    trainer = dapo_trainer
    monkeypatch.setattr(trainer.args, "dynamic_sampling_max_rounds", 1)
    batch = _generate(trainer, [FLAT_PROMPT, PROMPTS[1]])
    assert batch["completion_ids"].size(0) == 8
    assert trainer._metrics["train"]["dynamic_sampling/degenerate_frac"][-1] == 0.5
    texts = trainer.processing_class.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    assert sum(FLAT_PROMPT in t for t in texts) == 4  # the flat group completes the batch
    # (its advantages need not be 0: the filter reads the task reward, the length punishment still varies)


def test_concat_rollouts_pads_prompts_left_and_completions_right():
    a = {
        "prompt_ids": torch.tensor([[0, 5], [6, 7]]),
        "prompt_mask": torch.tensor([[0, 1], [1, 1]]),
        "completion_ids": torch.tensor([[8], [9]]),
        "completion_mask": torch.tensor([[1], [1]]),
        "ref_per_token_logps": torch.tensor([[-1.0], [-2.0]]),
        "advantages": torch.tensor([0.5, -0.5]),
        "num_items_in_batch": torch.tensor(2),
    }
    b = {
        "prompt_ids": torch.tensor([[1, 2, 3]]),
        "prompt_mask": torch.tensor([[1, 1, 1]]),
        "completion_ids": torch.tensor([[4, 4, 0]]),
        "completion_mask": torch.tensor([[1, 1, 0]]),
        "ref_per_token_logps": torch.tensor([[-3.0, -4.0, 0.0]]),
        "advantages": torch.tensor([1.0]),
        "num_items_in_batch": torch.tensor(2),
    }
    merged = concat_rollouts([(a, torch.tensor([1])), (b, torch.tensor([0]))], pad_token_id=0)
    assert merged["prompt_ids"].tolist() == [[0, 6, 7], [1, 2, 3]]
    assert merged["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert merged["completion_ids"].tolist() == [[9, 0, 0], [4, 4, 0]]
    assert merged["completion_mask"].tolist() == [[1, 0, 0], [1, 1, 0]]
    assert merged["ref_per_token_logps"].tolist() == [[-2.0, 0.0, 0.0], [-3.0, -4.0, 0.0]]
    assert merged["advantages"].tolist() == [-0.5, 1.0] and merged["num_items_in_batch"].item() == 3
    with pytest.raises(ValueError, match="pixel_values"):
        concat_rollouts([({**a, "pixel_values": torch.zeros(2, 3)}, torch.tensor([0]))], pad_token_id=0)


# ----------------------------------------------------------------------------- vLLM importance sampling


def test_importance_sampling_pin_reaches_trls_vllm_path_and_clipped_fraction_is_logged(
    tiny_model_dir, tmp_path
):
    """TRL's vLLM branch, driven on CPU: generation stays transformers', the sampling log-probs are faked. The
    kit's defaults (token_truncate, cap 2.0, as the paper's TRL 0.23) are what TRL applies."""
    trainer = _build(tiny_model_dir, _config(tmp_path, guide="branch", sage_q_source="rollout"))
    assert (trainer.vllm_importance_sampling_mode, trainer.vllm_importance_sampling_clip_max) == (
        "token_truncate",
        2.0,
    )
    assert trainer.vllm_importance_sampling_correction
    generate = trainer._generate

    def generate_as_vllm(prompts):
        trainer.use_vllm = False
        try:
            out = list(generate(prompts))
        finally:
            trainer.use_vllm = True
        # A sampling engine whose log-probs differ from the trainer's by -0.9 .. +0.9 nats per token.
        out[4] = [[-1.0 - 0.9 * math.sin(1.7 * i + len(ids)) for i in range(len(ids))] for ids in out[1]]
        return tuple(out)

    trainer._generate = generate_as_vllm
    # the config too: the plan chooses the importance-sampling metric's step from it
    trainer.use_vllm = trainer.args.use_vllm = True
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(1)
    batch = trainer._generate_and_score_completions(_rows(PROMPTS))
    mask = batch["completion_mask"].bool()
    raw = torch.exp(batch["old_per_token_logps"] - batch["sampling_per_token_logps"])
    torch.testing.assert_close(batch["importance_sampling_ratio"][mask], raw.clamp(max=2.0)[mask])
    clipped = (raw[mask] > 2.0).float().mean().item()
    assert 0 < clipped < 1
    metrics = trainer._metrics["train"]
    assert metrics["sampling/importance_sampling_ratio/clipped_frac"][-1] == pytest.approx(clipped)
    assert metrics["sampling/importance_sampling_ratio/max"][-1] == pytest.approx(
        2.0
    )  # TRL's own, after the cap
    assert metrics["sampling/importance_sampling_ratio/min"][-1] == pytest.approx(
        raw[mask].min().item(), rel=1e-5
    )
    # The ratio weighs the policy term only, never beta * KL (the point about the anchor's strength).
    loss = trainer.compute_loss(trainer.model, dict(batch))
    logp, _ = _policy_forward(trainer.model, batch)
    adv = batch["advantages"].unsqueeze(1)
    rho = torch.exp(logp - batch["old_per_token_logps"])
    policy = -torch.min(rho * adv, rho.clamp(0.8, 1.2) * adv) * batch["importance_sampling_ratio"]
    d = batch["ref_per_token_logps"] - logp
    per_token = (policy + 0.05 * (torch.exp(d) - d - 1)) * mask
    want = (per_token.sum(1) / mask.sum(1)).mean()
    assert loss.item() == pytest.approx(want.item(), abs=1e-6)


@pytest.mark.parametrize(
    "mode,clip_min,clip_max,want",
    [
        ("token_truncate", None, 2.0, 2 / 5),
        ("token_mask", 0.5, 2.0, 3 / 5),
        ("sequence_mask", None, 3.0, 1 / 2),
    ],
)
def test_clipped_fraction_by_hand(mode, clip_min, clip_max, want):
    diff = torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.5, 0.0]])  # log(old / sampling)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    got = importance_sampling_clipped_fraction(
        diff, torch.zeros(2, 3), mask, mode=mode, clip_min=clip_min, clip_max=clip_max
    )
    # tokens: e^1 = 2.72 > 2 and e^2 > 2 of 5; with min 0.5 also e^-1 = 0.37; sequences: e^0 = 1, e^2.5 > 3
    assert got == pytest.approx(want)


# ----------------------------------------------------------------------------- config


def test_config_pins_the_papers_importance_sampling(tmp_path):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    args = SageGRPOConfig(output_dir=str(tmp_path), report_to="none")
    assert args.vllm_importance_sampling_correction is True
    assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_max) == (
        "token_truncate",
        2.0,
    )
    assert (args.sage_kl_placement, args.dapo_normalizer, args.dynamic_sampling) == (
        "loss",
        "generation",
        False,
    )


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"dapo_normalizer": "batch"}, "dapo_normalizer"),
        ({"dynamic_sampling_max_rounds": 0}, "dynamic_sampling_max_rounds"),
        ({"soft_overlong_punish_cache": 5000, "max_completion_length": 256}, "soft_overlong_punish_cache"),
        ({"soft_overlong_punish_cache": -1}, "soft_overlong_punish_cache"),
    ],
)
def test_dapo_config_errors_are_one_line(tmp_path, overrides, field):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with pytest.raises(ValueError) as error:
        SageGRPOConfig(output_dir=str(tmp_path), report_to="none", **overrides)
    assert field in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "overrides,warns",
    [
        ({"guide": "branch"}, False),  # k3: q scales the forward-KL pull
        ({"guide": "branch", "kl_term": "k2", "backend": "trl"}, True),
        ({"guide": "branch", "use_bias_correction_kl": True}, True),  # k3 x ratio: reverse-KL gradient
        ({"guide": "random"}, True),  # E[q] = 1 with [0.6, 1.4]
        ({"guide": {"name": "random", "q_max": 2.0}}, False),
        ({"guide": "token", "kl_term": "k2", "backend": "trl"}, False),
        (
            {"guide": "branch", "kl_term": "k2", "backend": "trl", "sage_kl_placement": "reward"},
            None,
        ),
        ({"guide": "random", "sage_kl_placement": "reward"}, False),  # sum log q enters the reward
    ],
)
def test_warning_when_a_guide_has_no_effect_in_expectation(tmp_path, overrides, warns):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    if warns is None:  # k2 with the reward placement is a config error, not a warning
        with pytest.raises(ValueError, match="kl_term"):
            SageGRPOConfig(output_dir=str(tmp_path), report_to="none", **overrides)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SageGRPOConfig(output_dir=str(tmp_path), report_to="none", sage_q_source="loss", **overrides)
    messages = [str(w.message) for w in caught if "no effect on the expected gradient" in str(w.message)]
    assert bool(messages) == warns, messages
    assert all("\n" not in m for m in messages)
