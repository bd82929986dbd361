"""The ref_branch guide (an extension beyond the paper): q_t = clamp(1 + gamma * relu(H_ref_t - tau), q_min, q_max)
with H_ref_t the reference (SFT anchor) model's token entropy, taken from the reference pass the KL already runs.

Checked against an independent forward of the reference (the adapter-disabled tiny model, entropy written here
from its logits) on TRL's trainer, with and without TRL's old-logp pass before the reference pass and in the
reward placement (the kit's own reference pass); forward passes counted against the same run without a guide;
Unsloth's refusal is one line before any model loads."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_rlvr_trainer import TEMPERATURE, _config, _rollout
from test_rlvr_trainer import _build as _build_trainer

from sage_unsloth.config.args import ConfigError

GAMMA, TAU = 0.8, 1.5
# The tiny random model's head scaled so that the reference's own entropies spread around TAU (near-uniform at
# 1, near-deterministic at test_rlvr_trainer's 8).
LOGIT_SCALE = 3.0


def _build(tiny_model_dir, args):
    return _build_trainer(tiny_model_dir, args, logit_scale=LOGIT_SCALE)


def _independent_q(model, batch, q_min=0.6, q_max=1.4):
    """(log pi_ref(y_t), q_t) from a plain forward of the reference: the base model with the LoRA disabled."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    c = batch["completion_ids"].size(1)
    with torch.no_grad(), model.disable_adapter():
        logits = model(input_ids=ids, attention_mask=attention).logits
    log_probs = torch.log_softmax(logits[:, -c - 1 : -1].float() / TEMPERATURE, -1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    logp = log_probs.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    mask = batch["completion_mask"].bool()
    q = torch.where(
        mask, (1 + GAMMA * torch.relu(entropy - TAU)).clamp(q_min, q_max), torch.ones_like(entropy)
    )
    return logp, q, entropy


def _policy_entropy(model, batch):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    c = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits
    log_probs = torch.log_softmax(logits[:, -c - 1 : -1].float() / TEMPERATURE, -1)
    return -(log_probs.exp() * log_probs).sum(-1)


class ScoringForwards:
    """Decoder forwards without a KV cache: scoring passes (reference, old-logp, any of the kit's)."""

    def __init__(self, trainer):
        self.count = 0
        trainer.model.get_base_model().model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if kwargs.get("past_key_values") is None:
            self.count += 1


def _trainer(tiny_model_dir, tmp_path, guide, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        node = "none" if guide == "none" else {"name": guide, "gamma": GAMMA, "tau": TAU}
        args = _config(tmp_path / guide, guide=node, **kw)
    trainer = _build(tiny_model_dir, args)
    return trainer, ScoringForwards(trainer)


@pytest.mark.parametrize(
    "setting",
    [{}, {"per_device_train_batch_size": 4, "steps_per_generation": 2}],
    ids=["reference-pass-first", "after-the-old-logp-pass"],
)
def test_ref_branch_q_is_the_reference_entropy_guide_with_no_extra_pass(tiny_model_dir, tmp_path, setting):
    trainer, forwards = _trainer(tiny_model_dir, tmp_path, "ref_branch", **setting)
    plain, plain_forwards = _trainer(tiny_model_dir, tmp_path, "none", **setting)
    assert not trainer.sage_q_in_loss  # the reference's entropies exist at rollout
    batch = _rollout(trainer)
    _rollout(plain)
    assert forwards.count == plain_forwards.count > 0 and trainer.sage_forward_passes == 0
    assert ("old_per_token_logps" in batch) == bool(setting)
    raw_ref, want_q, _ = _independent_q(trainer.model, batch)
    mask = batch["completion_mask"].bool()
    assert (want_q[mask] > 1.0).any() and (want_q[mask] == 1.0).any()  # the threshold splits the tokens
    torch.testing.assert_close(
        batch["ref_per_token_logps"][mask], (raw_ref + torch.log(want_q))[mask], atol=2e-5, rtol=1e-5
    )
    # The policy's entropies (LoRA B is random, so pi != pi_ref) would give another q: the test can tell them apart.
    policy_q = (1 + GAMMA * torch.relu(_policy_entropy(trainer.model, batch) - TAU)).clamp(0.6, 1.4)
    assert not torch.allclose(policy_q[mask], want_q[mask], atol=1e-3)


def test_ref_branch_in_the_reward_placement_uses_the_kits_reference_pass(
    tiny_model_dir, tmp_path, monkeypatch
):
    from sage_unsloth.rlvr.trainer import SageTrainerMixin

    seen = []
    original = SageTrainerMixin.sage_q

    def spy(self, *args, **kwargs):
        q = original(self, *args, **kwargs)
        if self.sage_plan.guided:  # the guide's q (the plain trainer's q = 1 goes through here too)
            seen.append(q)
        return q

    monkeypatch.setattr(SageTrainerMixin, "sage_q", spy)
    trainer, forwards = _trainer(tiny_model_dir, tmp_path, "ref_branch", sage_kl_placement="reward")
    plain, plain_forwards = _trainer(tiny_model_dir, tmp_path, "none", sage_kl_placement="reward")
    batch = _rollout(trainer)
    _rollout(plain)
    # the same passes as the placement without a guide (its policy pass for the pseudo-KL, its reference pass)
    assert forwards.count == plain_forwards.count > 0
    assert trainer.sage_forward_passes == plain.sage_forward_passes
    _, want_q, _ = _independent_q(trainer.model, batch)
    assert len(seen) == 1
    mask = batch["completion_mask"].bool()
    torch.testing.assert_close(seen[0][mask], want_q[mask], atol=1e-5, rtol=1e-5)


def test_unsloth_refuses_ref_branch_in_one_line_before_loading(tmp_path):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with pytest.raises(ConfigError, match=r"needs ref_entropies, .*: set backend=trl") as caught:
        SageGRPOConfig(output_dir=str(tmp_path), report_to="none", backend="unsloth", guide="ref_branch")
    assert "\n" not in str(caught.value)


def test_ref_branch_guide_effect_is_the_branch_rule():
    """q is the same for every candidate token at a position (it reads no sampled-token signal): under the paper's
    k3 without the ratio it changes the expected gradient exactly as branch does."""
    from sage_unsloth.plugins import anchor, guides

    entry = guides.GUIDES.resolve("ref_branch")
    assert not guides.token_dependent(entry.meta["needs"])
    for estimator in ("k3", "k2", "forward"):
        for ratio in (False, True):
            kw = {"ratio": ratio, "placement": "loss", "q_min": 0.6, "q_max": 1.4}
            assert guides.guide_effect(entry, estimator, **kw) == anchor.guide_effect(
                "branch", estimator, **kw
            )
