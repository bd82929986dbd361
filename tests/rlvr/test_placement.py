"""sage_kl_placement: reward. The sequence-level pseudo-KL r~ = r - beta * sum_t [log pi - log pi_ref - log q_t]
enters the reward before the group advantage, and the loss has no KL term: checked against an independent
implementation written from the formula (its own forwards, its own branch guide and group advantage), on TRL's
trainer and on Unsloth's patched trainer forced onto the CPU. The fixed point itself is checked analytically in
tests/rlvr/test_estimators.py."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_rlvr_trainer import _build, _config, _lora_params, _policy_forward, _rollout, oracle_loss
from unsloth_cpu import FORCED_TRAINER_PREAMBLE, run_forced_unsloth

BETA = 0.05


@pytest.fixture(scope="module")
def reward_trainer(tiny_model_dir, tmp_path_factory):
    trainer = _build(tiny_model_dir, _config(tmp_path_factory.mktemp("reward"), sage_kl_placement="reward"))
    seen = {}

    def spy(rollout):  # TRL's own advantages, before the placement replaces them
        seen["trl_advantages"] = rollout.output["advantages"].clone()

    trainer.rollout_steps = (spy, *trainer.rollout_steps)
    trainer.seen_by_test = seen
    return trainer


@pytest.fixture(scope="module")
def reward_batch(reward_trainer):
    return _rollout(reward_trainer)


def _oracle_advantages(rewards, num_generations):
    """(r - group mean) / (group std, Bessel-corrected, + 1e-4): GRPO's advantage, written from its definition."""
    grouped = rewards.view(-1, num_generations)
    mean = grouped.mean(1, keepdim=True)
    std = grouped.std(1, unbiased=True, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).reshape(-1)


def test_reward_placement_matches_the_formula(reward_trainer, reward_batch):
    trainer, batch = reward_trainer, reward_batch
    assert trainer.beta == 0.0 and trainer.sage_beta == BETA  # no KL in TRL's loss, beta weighs the reward
    assert "ref_per_token_logps" not in batch  # TRL scored no reference: the placement did
    mask = batch["completion_mask"].float()
    with torch.no_grad():
        logp, log_probs = _policy_forward(trainer.model, batch)
        raw_ref, _ = _policy_forward(trainer.model, batch, disable_adapter=True)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    q = torch.where(
        mask.bool(), (1 + 0.3 * torch.relu(entropy - 1.2)).clamp(0.6, 1.4), torch.ones_like(entropy)
    )
    on = q[mask.bool()]
    assert (on == 1).any() and ((on > 1) & (on < 1.4)).any(), "the guide should move some tokens"
    seq_kl = ((logp - raw_ref - torch.log(q)) * mask).sum(1)
    rewards = trainer.last_rollout.rewards_per_func.sum(1)  # one reward function, weight 1
    want = _oracle_advantages(rewards - BETA * seq_kl, trainer.num_generations)
    torch.testing.assert_close(batch["advantages"], want, atol=2e-4, rtol=1e-4)
    # The pseudo-KL really moves the advantages (it is not lost in the std scaling).
    assert (batch["advantages"] - _oracle_advantages(rewards, trainer.num_generations)).abs().max() > 1e-2
    metrics = trainer._metrics["train"]
    assert metrics["sage/kl_in_reward"][-1] == pytest.approx(
        (BETA * seq_kl).mean().item(), rel=1e-4, abs=1e-6
    )
    assert metrics["sage/seq_log_q"][-1] == pytest.approx(
        (torch.log(q) * mask).sum(1).mean().item(), rel=1e-4
    )


def test_reward_placement_loss_has_no_kl_term(reward_trainer, reward_batch):
    trainer, model = reward_trainer, reward_trainer.model
    params = _lora_params(model)
    loss = trainer.compute_loss(model, dict(reward_batch))
    grads = torch.autograd.grad(loss, params)
    raw_ref = torch.zeros_like(reward_batch["completion_mask"], dtype=torch.float32)  # unused at beta 0
    want, _, _ = oracle_loss(model, reward_batch, raw_ref, loss_type="grpo", beta=0.0, guide=False)
    want_grads = torch.autograd.grad(want, params)
    assert loss.item() == pytest.approx(want.item(), abs=1e-6)
    assert max((g - w).abs().max().item() for g, w in zip(grads, want_grads)) < 1e-6
    assert max(g.abs().max().item() for g in grads) > 1e-4


def test_group_advantage_contact_point(reward_trainer, reward_batch):
    """group_advantages (used for r~) is TRL's own advantage computation: on the task reward alone it gives
    exactly the advantages TRL produced for this rollout."""
    from sage_unsloth.compat import group_advantages

    trainer = reward_trainer
    rewards = trainer.last_rollout.rewards_per_func.sum(1)
    got = group_advantages(rewards, trainer.num_generations, trainer.scale_rewards)
    torch.testing.assert_close(got, trainer.seen_by_test["trl_advantages"], atol=0, rtol=0)
    nan_row = rewards.clone()
    nan_row[0] = float("nan")
    assert group_advantages(nan_row, trainer.num_generations, "group")[0] == 0  # unscorable: no signal
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(rewards, trainer.num_generations, "max")


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"sage_kl_placement": "advantage"}, "sage_kl_placement"),
        ({"sage_kl_placement": "reward", "beta": 0.0, "guide": "none"}, "beta"),
        ({"sage_kl_placement": "reward", "kl_term": "k2", "backend": "trl"}, "kl_term"),
        (
            {"sage_kl_placement": "reward", "multi_objective_aggregation": "normalize_then_sum"},
            "multi_objective_aggregation",
        ),
    ],
)
def test_placement_config_errors_are_one_line(tmp_path, overrides, field):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with pytest.raises(ValueError) as error:
        SageGRPOConfig(output_dir=str(tmp_path), report_to="none", **overrides)
    assert field in str(error.value) and "\n" not in str(error.value)


def test_reward_placement_takes_q_at_rollout_without_the_off_policy_warning(tmp_path):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SageGRPOConfig(
            output_dir=str(tmp_path),
            report_to="none",
            guide="branch",
            sage_kl_placement="reward",
            sage_q_source="rollout",
            per_device_train_batch_size=8,
            generation_batch_size=16,
        )


UNSLOTH_REWARD_CANARY = (
    FORCED_TRAINER_PREAMBLE
    + r"""
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                         init_lora_weights=False))
args = SageGRPOConfig(output_dir="out", backend="trl", guide={"name": "branch", "tau": 0.0}, max_steps=1,
                      sage_kl_placement="reward", per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, report_to="none", logging_steps=1, save_strategy="no", use_cpu=True,
                      learning_rate=1e-2)
trainer = SageGRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c) % 3) for c in completions],
                          args=args, train_dataset=dataset, processing_class=tokenizer)
assert type(trainer).__bases__[-1].__name__ == "UnslothGRPOTrainer", type(trainer).__mro__
assert trainer.beta == 0.0 and trainer.sage_beta == 0.05
checked, seen = {}, {}
def check_rollout(rollout):  # after the placement and the advantages (rlvr/taps.py)
    output = rollout.output
    # Independently, at the rollout weights: plain forwards, q = 1.4 (tau = 0 and entropies > 1.4 / 0.3).
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], 1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], 1)
    c = output["completion_ids"].size(1)
    mask = output["completion_mask"].float()
    def forward(disable):
        with torch.no_grad(), (model.disable_adapter() if disable else torch.enable_grad()):
            logits = model(input_ids=ids, attention_mask=attention).logits.float()
        lp = torch.log_softmax(logits[:, -c - 1:-1], -1)
        return lp.gather(-1, output["completion_ids"].unsqueeze(-1)).squeeze(-1), lp
    (logp, log_probs), (ref, _) = forward(False), forward(True)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    assert (entropy[mask.bool()] > 1.4 / 0.3).all()
    shaped = rollout.rewards_per_func.sum(1) - 0.05 * ((logp - ref - math.log(1.4)) * mask).sum(1)
    grouped = shaped.view(-1, 4)
    want = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).reshape(-1)
    checked["max_diff"] = (output["advantages"] - want).abs().max().item()
    checked["max_adv"] = output["advantages"].abs().max().item()
trainer.rollout_steps = (*trainer.rollout_steps, check_rollout)
patched_compute_loss = trainer.compute_loss
def spy(model, inputs, *a, **k):
    seen.update(inputs)
    return patched_compute_loss(model, inputs, *a, **k)
trainer.compute_loss = spy
before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
trainer.train()
assert seen and seen.get("ref_per_token_logps") is None, "no reference in the loss's batch"
moved = sum(not torch.equal(before[n], p) for n, p in model.named_parameters() if n in before)
print("CHECK", checked["max_diff"], checked["max_adv"], moved, len(before))
print("CANARY-OK")
"""
)


@pytest.mark.slow
def test_unsloth_patched_trainer_reward_placement(tiny_model_dir, tmp_path):
    """Unsloth's rewritten GRPOTrainer forced on CPU (private API): the placement runs there too, the loss it
    trains on gets advantages of r~ (checked against an independent recomputation) and no reference."""
    result = run_forced_unsloth(
        UNSLOTH_REWARD_CANARY, "reward_canary.py", tiny_model_dir, tmp_path, timeout=900
    )
    line = next(line for line in result.stdout.splitlines() if line.startswith("CHECK "))
    max_diff, max_adv, moved, total = (float(x) for x in line.split()[1:])
    assert max_diff < 2e-4 and max_adv > 0.1  # advantages of r~, recomputed independently
    assert moved == total > 0  # the LoRA trained
