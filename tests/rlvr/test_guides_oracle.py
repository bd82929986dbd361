"""Independent oracles for what the first oracle (tests/rlvr/test_rlvr_trainer.py: branch guide, on-policy) leaves out:
the token and random guides with a fixed noise generator, and off-policy batches (steps_per_generation 2 with a
weight update between the micro-batches, num_iterations 2, epsilon_high active) under every token-level loss
type's normaliser, TRL 0.23's "dapo" normaliser included. Every formula here is written from the paper / the
official code (tally0818/SAGE on TRL 0.23), not taken from the kit."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from test_rlvr_trainer import PROMPTS, _build, _config, _lora_params, _policy_forward, _rollout

from sage_unsloth.rlvr import dapo
from sage_unsloth.rlvr.taps import step_seed

SEED = 3407
BETA = 0.05


def _schedule(step, max_steps, upper, lower, sigma_upper, sigma_lower, cycles=8, decay=0.9):
    """The paper's cosine annealing with 8 restarts; the upper bounds shrink by 0.9 at each new cycle."""
    length = max(1, max_steps // cycles)
    cycle = min(step // length, cycles - 1)
    anneal = 0.5 * (1 + math.cos(math.pi * (step % length) / length))
    shrink = decay**cycle
    return (
        lower + (upper * shrink - lower) * anneal,
        sigma_lower + (sigma_upper * shrink - sigma_lower) * anneal,
    )


def _minmax_surprisal(logp, mask):
    """Per completion: surprisal -log p clipped to its 5th-95th percentiles, then min-max scaled to [0, 1]."""
    w = torch.zeros_like(logp)
    for row in range(logp.size(0)):
        on = mask[row].bool()
        s = -logp[row, on]
        lo, hi = torch.quantile(s, 0.05), torch.quantile(s, 0.95)
        w[row, on] = (s.clamp(lo, hi) - lo) / (hi - lo).clamp_min(1e-6)
    return w


def _branch_q(log_probs, mask, gamma=0.3, tau=1.2):
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return torch.where(
        mask.bool(), (1 + gamma * torch.relu(entropy - tau)).clamp(0.6, 1.4), torch.ones_like(entropy)
    )


def _oracle(
    logp,
    old,
    raw_ref,
    q,
    advantages,
    mask,
    *,
    loss_type,
    estimator="k3",
    eps_low=0.2,
    eps_high=0.2,
    normaliser=None,
    max_completion_length=12,
    beta=BETA,
):
    """Clipped surrogate + beta * KL term, per token, aggregated per loss type (official code / TRL 0.23 forms).
    KL terms: k3 against ref + log q (no ratio, as TRL 0.23); forward (u log u - u + 1) times rho = pi / pi_old;
    k2 times sg(rho)."""
    mask = mask.float()
    rho = torch.exp(logp - old)
    adv = advantages.unsqueeze(1)
    policy = -torch.min(rho * adv, rho.clamp(1 - eps_low, 1 + eps_high) * adv)
    d = raw_ref + torch.log(q) - logp
    if estimator == "k3":
        kl = torch.exp(d) - d - 1
    elif estimator == "k2":
        kl = 0.5 * d**2 * rho.detach()
    else:
        u = torch.exp(raw_ref - logp)
        kl = (u * torch.log(u) - u + 1) * rho
    per_token = (policy + beta * kl) * mask
    if loss_type == "grpo":
        return (per_token.sum(1) / mask.sum(1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return per_token.sum() / mask.sum()
    if loss_type == "dr_grpo":
        return per_token.sum() / (mask.size(0) * max_completion_length)
    return per_token.sum() / normaliser  # dapo


def _kit_and_oracle_forwards(trainer, batch):
    """The trainer's loss and LoRA gradients on ``batch``, and the oracle's own forwards at the same weights:
    (params, loss, grads, log pi_ref without gradient, log pi with gradient, the full log-softmax)."""
    params = _lora_params(trainer.model)
    loss = trainer.compute_loss(trainer.model, dict(batch))
    grads = torch.autograd.grad(loss, params)
    with torch.no_grad():
        raw_ref, _ = _policy_forward(trainer.model, batch, disable_adapter=True)
    logp, log_probs = _policy_forward(trainer.model, batch)
    return params, loss, grads, raw_ref, logp, log_probs


def _assert_same_loss_and_gradients(params, loss, grads, want):
    want_grads = torch.autograd.grad(want, params)
    assert loss.item() == pytest.approx(want.item(), abs=1e-6, rel=1e-5)
    assert max((g - e).abs().max().item() for g, e in zip(grads, want_grads)) < 1e-6
    assert max(g.abs().max().item() for g in grads) > 1e-4  # not a comparison between zeros


# ----------------------------------------------------------------------------- token and random guides


def test_token_guide_in_loss_matches_oracle_with_fixed_generator(tiny_model_dir, tmp_path):
    trainer = _build(tiny_model_dir, _config(tmp_path, guide="token", sage_q_source="loss", max_steps=16))
    batch = _rollout(trainer)
    step = 3  # mid-cycle of the second cosine cycle (cycle length 16 // 8 = 2)
    trainer.state.global_step, trainer._sage_noise["guide"].last_step = (
        step,
        -1,
    )  # the first q of this step: call 0
    params, loss, grads, raw_ref, logp, _ = _kit_and_oracle_forwards(trainer, batch)
    mask = batch["completion_mask"]
    alpha, sigma = _schedule(step, 16, 0.3, 0.1, 0.25, 0.1)
    w = _minmax_surprisal(logp.detach(), mask)
    noise = torch.randn(
        w.shape, generator=torch.Generator().manual_seed(step_seed(SEED, step, 0, 0, stream="guide"))
    )
    q = torch.where(mask.bool(), (1 + alpha * w + sigma * w * noise).clamp(0.6, 1.4), torch.ones_like(w))
    on = q[mask.bool()]
    assert ((on > 1.02) & (on < 1.38)).sum() > 5  # q spread over the range, not stuck at a clip
    no_noise = torch.where(mask.bool(), (1 + alpha * w).clamp(0.6, 1.4), torch.ones_like(w))
    assert (q - no_noise).abs().max() > 0.05  # the noise term is exercised
    _assert_same_loss_and_gradients(
        params,
        loss,
        grads,
        _oracle(logp, logp.detach(), raw_ref, q, batch["advantages"], mask, loss_type="grpo"),
    )
    assert trainer._metrics["train"]["sage/q_max"][-1] == pytest.approx(on.max().item(), abs=1e-6)


def test_random_guide_at_rollout_matches_oracle_with_fixed_generator(tiny_model_dir, tmp_path):
    eps_up, eps_low, sig_up, sig_low, step = 0.6, 0.2, 0.3, 0.1, 5
    trainer = _build(
        tiny_model_dir,
        _config(
            tmp_path,
            guide={
                "name": "random",
                "eps_upper": eps_up,
                "eps_lower": eps_low,
                "sigma_upper": sig_up,
                "sigma_lower": sig_low,
            },
            max_steps=16,
        ),
    )
    trainer.state.global_step, trainer._sage_noise["guide"].last_step = step, -1
    batch = _rollout(trainer)
    mask = batch["completion_mask"].bool()
    with torch.no_grad():
        raw_ref, _ = _policy_forward(trainer.model, batch, disable_adapter=True)
    log_q = torch.where(mask, batch["ref_per_token_logps"] - raw_ref, torch.zeros_like(raw_ref))

    eps, sigma = _schedule(step, 16, eps_up, eps_low, sig_up, sig_low)
    generator = torch.Generator().manual_seed(step_seed(SEED, step, 0, 0, stream="guide"))
    chosen = torch.rand(mask.shape, generator=generator) < eps
    noise = torch.randn(mask.shape, generator=generator)
    q = torch.where(chosen & mask, (1 + sigma * noise).clamp(0.6, 1.4), torch.ones(mask.shape))
    assert (q[mask] != 1).float().mean().item() == pytest.approx(eps, abs=0.2)
    torch.testing.assert_close(log_q[mask], torch.log(q)[mask], atol=2e-5, rtol=0)


# ----------------------------------------------------------------------------- off-policy batches


def _policy_gradient_step(trainer, batch, size=0.03):
    """A small step up the batch's policy gradient (what an optimizer step does to this policy): it raises the
    ratio of positive-advantage tokens past 1 + epsilon and lowers the others, so both clips are exercised."""
    params = _lora_params(trainer.model)
    logp, _ = _policy_forward(trainer.model, batch)
    mask = batch["completion_mask"].float()
    objective = -(batch["advantages"].unsqueeze(1) * logp * mask).sum() / mask.sum()
    grads = torch.autograd.grad(objective, params)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(size * p.abs().mean() * g / g.abs().max())


def _generate_update_and_serve(trainer, update_from: int):
    """TRL's own batching: generate at step 0 (``_prepare_inputs``), take a policy-gradient step on buffered
    micro-batch ``update_from``, then return (the micro-batch served at step 0, the one served at step 1)."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS for _ in range(4)]
    torch.manual_seed(1)
    trainer._step, trainer._buffered_inputs = 0, None
    first = trainer._prepare_inputs(rows)
    _policy_gradient_step(trainer, trainer._buffered_inputs[update_from])
    trainer._step = 1
    return first, trainer._prepare_inputs(rows)


@pytest.fixture(scope="module")
def two_step_generation(tiny_model_dir, tmp_path_factory):
    """steps_per_generation 2 (8 rollouts, micro-batches of 4), q in the loss, epsilon_high 0.28: generate at
    step 0, then change the LoRA weights by a policy-gradient step, then take the second micro-batch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = _config(
            tmp_path_factory.mktemp("offpolicy"),
            per_device_train_batch_size=4,
            steps_per_generation=2,
            sage_q_source="loss",
            epsilon_high=0.28,
        )
    trainer = _build(tiny_model_dir, args)
    first, second = _generate_update_and_serve(trainer, update_from=1)
    generation_tokens = sum(b["completion_mask"].sum().item() for b in trainer._buffered_inputs)
    return trainer, first, second, generation_tokens


def test_second_micro_batch_is_off_policy_with_epsilon_high_active(two_step_generation):
    trainer, first, second, _ = two_step_generation
    # TRL scores the rollout policy for the whole generation batch (steps_per_generation > accumulation)
    assert "old_per_token_logps" in first and "old_per_token_logps" in second
    logp, _ = _policy_forward(trainer.model, second)
    mask = second["completion_mask"].bool()
    rho = torch.exp(logp.detach() - second["old_per_token_logps"])[mask]
    assert (rho - 1).abs().max() > 0.3, "the weight update should move the policy"
    adv = second["advantages"].unsqueeze(1).expand_as(mask)[mask]
    between = ((rho > 1.2) & (rho < 1.28) & (adv > 0)).sum().item()
    beyond = ((rho > 1.28) & (adv > 0)).sum().item()
    assert between > 0 and beyond > 0, (between, beyond)  # tokens where epsilon_high = 0.28 vs 0.2 matters


@pytest.mark.parametrize(
    "loss_type,estimator,dapo_normalizer",
    [
        ("grpo", "k3", None),
        ("bnpo", "k3", None),
        ("dr_grpo", "k3", None),
        ("dapo", "k3", "generation"),
        ("dapo", "k3", "window"),
        ("grpo", "forward", None),
        ("dapo", "forward", "generation"),
        ("bnpo", "k2", None),
    ],
)
def test_off_policy_micro_batch_matches_oracle(
    two_step_generation, monkeypatch, loss_type, estimator, dapo_normalizer
):
    trainer, _, second, generation_tokens = two_step_generation
    monkeypatch.setattr(trainer, "loss_type", loss_type)
    monkeypatch.setattr(trainer.args, "kl_term", estimator)
    if estimator == "forward":
        monkeypatch.setattr(trainer.args, "guide", "none")
    inputs = dict(second)
    if dapo_normalizer:  # what the rollout hook does for this loss type (the rollout itself ran as grpo)
        monkeypatch.setattr(trainer.args, "dapo_normalizer", dapo_normalizer)
        if dapo_normalizer == "generation":  # the plan runs the normaliser step for dapo + generation only
            dapo.official_normaliser(trainer, inputs)
    params, loss, grads, raw_ref, logp, log_probs = _kit_and_oracle_forwards(trainer, inputs)
    mask = second["completion_mask"]
    q = _branch_q(log_probs.detach(), mask) if estimator != "forward" else torch.ones_like(logp)
    # TRL 0.23 / the official code: all completion tokens of the generation batch; TRL >= 1.10: one window's.
    normaliser = generation_tokens if dapo_normalizer == "generation" else generation_tokens / 2
    want = _oracle(
        logp,
        second["old_per_token_logps"],
        raw_ref,
        q,
        second["advantages"],
        mask,
        loss_type=loss_type,
        estimator=estimator,
        eps_high=0.28,
        normaliser=normaliser,
    )
    _assert_same_loss_and_gradients(params, loss, grads, want)


def test_official_dapo_normaliser_halves_the_loss_at_two_steps_per_generation(
    two_step_generation, monkeypatch
):
    """TRL 1.15 rescales num_items_in_batch to one accumulation window; TRL 0.23 (the official code) did not, so
    at steps_per_generation 2 / gradient accumulation 1 its dapo loss is half of TRL 1.15's."""
    trainer, _, second, _ = two_step_generation
    monkeypatch.setattr(trainer, "loss_type", "dapo")
    losses = {}
    for name in ("generation", "window"):
        monkeypatch.setattr(trainer.args, "dapo_normalizer", name)
        inputs = dict(second)
        if name == "generation":  # the plan runs the normaliser step for this setting only
            dapo.official_normaliser(trainer, inputs)
        with torch.no_grad():
            losses[name] = trainer.compute_loss(trainer.model, inputs).item()
    assert losses["generation"] / losses["window"] == pytest.approx(0.5, rel=1e-6)
    trainer.model.eval()  # evaluation: neither TRL version rescales, nor does the kit
    try:
        inputs = dict(second)
        monkeypatch.setattr(trainer.args, "dapo_normalizer", "generation")
        dapo.official_normaliser(trainer, inputs)
        assert inputs["num_items_in_batch"] is second["num_items_in_batch"]
    finally:
        trainer.model.train()


def test_num_iterations_two_reuses_the_batch_off_policy(tiny_model_dir, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = _config(tmp_path, num_iterations=2, sage_q_source="loss", guide="branch")
    trainer = _build(tiny_model_dir, args)
    first, again = _generate_update_and_serve(trainer, update_from=0)  # one micro-batch, used twice
    assert torch.equal(again["completion_ids"], first["completion_ids"]) and "old_per_token_logps" in again
    params, loss, grads, raw_ref, logp, log_probs = _kit_and_oracle_forwards(trainer, again)
    mask = again["completion_mask"]
    assert (torch.exp(logp.detach() - again["old_per_token_logps"])[mask.bool()] - 1).abs().max() > 0.2
    _assert_same_loss_and_gradients(
        params,
        loss,
        grads,
        _oracle(
            logp,
            again["old_per_token_logps"],
            raw_ref,
            _branch_q(log_probs.detach(), mask),
            again["advantages"],
            mask,
            loss_type="grpo",
        ),
    )
