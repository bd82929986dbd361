"""SAGE trainer: contact points with TRL 1.15 / unsloth_zoo 2026.10.9, an independent oracle of the paper's
loss, parity with Unsloth's zoo loss, the Unsloth layout mapping, config validation, and a 2-step smoke run
per guide. Tiny random Qwen2 + LoRA on CPU; generation by transformers inside TRL."""

from __future__ import annotations

import math

import pytest
import torch
from unsloth_cpu import FORCED_TRAINER_PREAMBLE, run_forced_unsloth

from sage_unsloth import compat
from sage_unsloth.rlvr import taps

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TEMPERATURE = 0.8
LOGIT_SCALE = 8.0
# With the output head scaled by LOGIT_SCALE the tiny model's token entropies spread over ~0.05-4 nats, so the
# paper's branch guide (gamma 0.3, tau 1.2) leaves some tokens at q = 1, raises others and clips a few at 1.4.
BRANCH = {"name": "branch", "gamma": 0.3, "tau": 1.2}
PROMPTS = ["What is 2+3?", "Compute the sum of the first ten odd positive integers, then double it."]


def _config(tmp_path, **overrides):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    base = {
        "output_dir": str(tmp_path / "out"),
        "backend": "trl",
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 12,
        "temperature": TEMPERATURE,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "use_cpu": True,
        "max_steps": 2,
        "learning_rate": 1e-2,
        "guide": BRANCH,
        # Many stop tokens so that completions end at different lengths and the masks are non-trivial.
        "generation_kwargs": {"eos_token_id": list(range(300, 420))},
    }
    base.update(overrides)
    return SageGRPOConfig(**base)


def _reward(completions, **kwargs):
    return [float(len(str(c)) % 5) for c in completions]


def _build(tiny_model_dir, args, logit_scale: float = LOGIT_SCALE, reward=_reward):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sage_unsloth.rlvr.trainer import SageGRPOTrainer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():  # sharper logits: the random model is near-uniform, with entropies all ~6.5 nats
        model.get_output_embeddings().weight.mul_(logit_scale)
    # A new adapter (TRL wraps the model; the reference is the adapter-disabled base), with a random
    # non-zero LoRA B so that the policy differs from the reference from the first step.
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, init_lora_weights=False)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS] * 4)
    return SageGRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
    )


def _rollout(trainer):
    """One generation batch through the hooked _generate_and_score_completions, as the train loop does."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS for _ in range(4)]
    torch.manual_seed(1)
    return trainer._generate_and_score_completions(rows)


@pytest.fixture(scope="module")
def branch_trainer(tiny_model_dir, tmp_path_factory):
    """The rollout hook (the path Unsloth's patched loss needs): q shifts ref_per_token_logps in the batch."""
    return _build(tiny_model_dir, _config(tmp_path_factory.mktemp("branch"), sage_q_source="rollout"))


@pytest.fixture(scope="module")
def branch_batch(branch_trainer):
    return _rollout(branch_trainer)


# --------------------------------------------------------------------- independent reference implementation


def _policy_forward(model, batch, disable_adapter=False):
    """log pi(y_t) and the full log-softmax at the completion positions, at the sampling temperature."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    length = batch["completion_ids"].size(1)
    if disable_adapter:
        with torch.no_grad(), model.disable_adapter():
            logits = model(input_ids=ids, attention_mask=attention).logits
    else:
        logits = model(input_ids=ids, attention_mask=attention).logits
    log_probs = torch.log_softmax(logits[:, -length - 1 : -1].float() / TEMPERATURE, -1)
    return log_probs.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1), log_probs


def oracle_loss(model, batch, raw_ref, *, loss_type, beta, estimator="k3", guide=True):
    """The paper's per-token objective written straight from the formula, q computed in the loss as the
    official code does: q = clip(1 + gamma relu(H - tau)), anchor ref + log q, k3, clipped surrogate."""
    gamma, tau, q_min, q_max = 0.3, 1.2, 0.6, 1.4  # the paper's branch guide and the kit's default clip
    eps, max_completion_length = 0.2, 12  # TRL's clip range; _config's completion budget
    mask = batch["completion_mask"].float()
    logp, log_probs = _policy_forward(model, batch)
    entropy = -(log_probs.exp() * log_probs).sum(-1).detach()
    q = (1 + gamma * torch.relu(entropy - tau)).clamp(q_min, q_max) if guide else torch.ones_like(entropy)
    q = torch.where(mask.bool(), q, torch.ones_like(q))
    anchor_logp = raw_ref + torch.log(q)
    d = anchor_logp - logp
    if estimator == "k3":
        kl = torch.exp(d) - d - 1
    elif estimator == "k2":
        kl = 0.5 * d**2
    ratio = torch.exp(logp - logp.detach())
    if (
        estimator == "forward"
    ):  # KL(pi_ref || pi): u log u - u + 1 with u = pi_ref / pi, times the ratio pi / sg(pi)
        u = torch.exp(raw_ref - logp)
        kl = (u * torch.log(u) - u + 1) * ratio
    adv = batch["advantages"].unsqueeze(1)
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv) + beta * kl
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    elif loss_type == "bnpo" or loss_type == "dapo":
        loss = (per_token * mask).sum() / mask.sum()
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (mask.size(0) * max_completion_length)
    kl_mean = ((kl * mask).sum() / mask.sum()).item()
    return loss, kl_mean, q


def _lora_params(model):
    params = [p for n, p in model.named_parameters() if "lora_" in n and p.requires_grad]
    assert len(params) == 2 * 2 * len(TARGETS)  # A and B, 2 layers
    return params


# --------------------------------------------------------------------- contact points (trl 1.15.0; the static
# checks of each are in test_compat.py)


def test_rollout_batch_keys_and_shapes(branch_trainer, branch_batch):
    b, c = branch_batch["completion_ids"].shape
    for key in (
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "advantages",
        "ref_per_token_logps",
        "num_items_in_batch",
    ):
        assert key in branch_batch, key
    assert branch_batch["ref_per_token_logps"].shape == (b, c)
    assert "old_per_token_logps" not in branch_batch  # on-policy: TRL skips the old-logp forward
    assert not compat.trl_scores_old_logps(branch_trainer)
    lengths = branch_batch["completion_mask"].sum(1)
    assert lengths.min() < lengths.max(), "stop tokens should give completions of different lengths"
    assert (branch_batch["prompt_mask"] == 0).any(), "prompts of different lengths should be left-padded"


def test_scorer_returns_logps_entropies_aux(branch_trainer, branch_batch):
    from trl import GRPOTrainer

    ids = torch.cat([branch_batch["prompt_ids"], branch_batch["completion_ids"]], 1)
    attention = torch.cat([branch_batch["prompt_mask"], branch_batch["completion_mask"]], 1)
    with torch.no_grad():
        result = GRPOTrainer._get_per_token_logps_and_entropies(
            branch_trainer,
            branch_trainer.model,
            ids,
            attention,
            branch_batch["completion_ids"].size(1),
            compute_entropy=True,
        )
        logp, log_probs = _policy_forward(branch_trainer.model, branch_batch)
    assert len(result) == 3 and result[2] is None
    mask = branch_batch["completion_mask"].bool()  # TRL leaves 0 at masked positions
    torch.testing.assert_close(result[0][mask], logp[mask], atol=1e-5, rtol=1e-5)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    torch.testing.assert_close(result[1][mask], entropy[mask], atol=1e-5, rtol=1e-5)


def test_old_logp_pass_reused_for_entropies(tiny_model_dir, tmp_path):
    """steps_per_generation > GA: TRL scores old logps; the branch guide takes its entropies, no extra pass."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = _config(
            tmp_path, per_device_train_batch_size=4, steps_per_generation=2, sage_q_source="rollout"
        )
    trainer = _build(tiny_model_dir, args)
    assert compat.trl_scores_old_logps(trainer)
    batch = _rollout(trainer)
    assert "old_per_token_logps" in batch and trainer.sage_forward_passes == 0
    with torch.no_grad():
        raw_ref, _ = _policy_forward(trainer.model, batch, disable_adapter=True)
        _, _, q = oracle_loss(trainer.model, batch, raw_ref, loss_type="grpo", beta=0.05)
    mask = batch["completion_mask"].bool()
    torch.testing.assert_close(
        batch["ref_per_token_logps"][mask], (raw_ref + torch.log(q))[mask], atol=2e-5, rtol=1e-5
    )


# --------------------------------------------------------------------- the hook puts q into TRL's KL


@pytest.mark.parametrize("guide", ["branch", "token", "random"])
def test_trl_kl_equals_k3_on_shifted_reference(tiny_model_dir, tmp_path, branch_trainer, branch_batch, guide):
    if guide == "branch":
        trainer, batch = branch_trainer, branch_batch
    else:
        knobs = {"eps_upper": 0.5, "eps_lower": 0.5} if guide == "random" else {}
        trainer = _build(
            tiny_model_dir, _config(tmp_path, guide={"name": guide, **knobs}, sage_q_source="rollout")
        )
        batch = _rollout(trainer)
    mask = batch["completion_mask"].bool()
    with torch.no_grad():
        raw_ref, _ = _policy_forward(trainer.model, batch, disable_adapter=True)
        logp, _ = _policy_forward(trainer.model, batch)
        trainer._compute_loss(trainer.model, batch)
    assert torch.all(batch["ref_per_token_logps"][~mask] == 0), (
        "q must be 1 off the completion (TRL scores 0)"
    )
    log_q = torch.where(mask, batch["ref_per_token_logps"] - raw_ref, torch.zeros_like(raw_ref))
    q = log_q.exp()
    assert torch.all((q[mask] > 0.6 - 1e-5) & (q[mask] < 1.4 + 1e-5))
    assert (q[mask] - 1).abs().max() > 0.01, "the guide should move the anchor somewhere"
    d = raw_ref + log_q - logp
    k3 = ((torch.exp(d) - d - 1) * mask).sum() / mask.sum()
    assert trainer._metrics["train"]["kl"][-1] == pytest.approx(k3.item(), rel=1e-5, abs=1e-7)
    metrics = trainer._metrics["train"]
    assert metrics["sage/q_mean"][-1] == pytest.approx(q[mask].mean().item(), rel=1e-5)
    assert metrics["sage/q_max"][-1] == pytest.approx(q[mask].max().item(), rel=1e-5)
    assert metrics["sage/q_min"][-1] == pytest.approx(q[mask].min().item(), rel=1e-5)
    assert metrics["sage/frac_boosted"][-1] == pytest.approx(
        (q[mask] > 1 + 1e-6).float().mean().item(), abs=0.02
    )


# --------------------------------------------------------------------- oracle


@pytest.mark.parametrize(
    "q_source,loss_type,estimator",
    [
        ("rollout", "grpo", "k3"),
        ("rollout", "bnpo", "k3"),
        ("rollout", "dapo", "k3"),
        ("rollout", "dr_grpo", "k3"),
        ("loss", "grpo", "k3"),
        ("loss", "bnpo", "k3"),
        ("loss", "dapo", "k3"),
        ("loss", "dr_grpo", "k3"),
        ("rollout", "grpo", "k2"),
        ("rollout", "bnpo", "k2"),
        ("loss", "dapo", "k2"),
        ("loss", "dr_grpo", "k2"),
        ("rollout", "grpo", "forward"),
        ("rollout", "dapo", "forward"),
    ],
)
def test_loss_and_gradients_match_oracle(
    branch_trainer, branch_batch, monkeypatch, q_source, loss_type, estimator
):
    """rollout: q from the hook's shifted batch reference; loss: TRL's loss gets the plain reference and q is
    computed from its own forward's entropies (the official code's place for it)."""
    trainer, model = branch_trainer, branch_trainer.model
    monkeypatch.setattr(trainer, "loss_type", loss_type)
    monkeypatch.setattr(trainer.args, "kl_term", estimator)
    monkeypatch.setattr(trainer.args, "sage_q_source", q_source)
    with torch.no_grad():
        raw_ref, _ = _policy_forward(model, branch_batch, disable_adapter=True)
    batch = dict(branch_batch)
    guide = estimator != "forward"
    plain_ref = torch.where(batch["completion_mask"].bool(), raw_ref, torch.zeros_like(raw_ref))
    if not guide:  # the forward-KL baseline runs without a guide: feed TRL the plain reference
        monkeypatch.setattr(trainer.args, "guide", "none")
        batch["ref_per_token_logps"] = plain_ref
    elif q_source == "loss":
        batch["ref_per_token_logps"] = plain_ref
        kept = batch["ref_per_token_logps"]
    assert batch["num_items_in_batch"].item() == batch["completion_mask"].sum().item()
    params = _lora_params(model)

    loss = trainer.compute_loss(model, batch)
    grads = torch.autograd.grad(loss, params)
    logged_kl = trainer._metrics["train"]["kl"][-1]
    expected, expected_kl, q = oracle_loss(
        model, batch, raw_ref, loss_type=loss_type, beta=trainer.beta, estimator=estimator, guide=guide
    )
    on = q[batch["completion_mask"].bool()]
    if guide:  # a meaningful check: some tokens keep q = 1, some are raised, some hit the clip
        assert (on == 1).any() and ((on > 1) & (on < 1.4)).any() and (on == 1.4).any()
    expected_grads = torch.autograd.grad(expected, params)

    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    if guide and q_source == "loss":
        assert batch["ref_per_token_logps"] is kept, "the in-loss shift must not touch the buffered batch"
        assert trainer._metrics["train"]["sage/q_max"][-1] == pytest.approx(on.max().item())
    assert logged_kl == pytest.approx(expected_kl, rel=1e-5, abs=1e-7)
    worst = max((g - e).abs().max().item() for g, e in zip(grads, expected_grads))
    assert worst < 1e-6
    assert max(g.abs().max().item() for g in grads) > 1e-4  # the comparison is not between zeros


def test_k2_and_forward_terms_use_anchor_functions(branch_trainer, branch_batch, monkeypatch):
    """The loss-level correction is beta * agg(kl_loss_term - k3), built from sage_unsloth.plugins.anchor."""
    from sage_unsloth.compat import aggregate_like_trl
    from sage_unsloth.plugins import anchor

    trainer = branch_trainer
    mask = branch_batch["completion_mask"].float()
    ref = branch_batch["ref_per_token_logps"]
    logp = (ref - 0.3 * torch.randn_like(ref)).requires_grad_(True)
    for estimator, fn in (
        ("k2", lambda: anchor.kl_loss_term(logp, ref, estimator="k2")),
        ("forward", lambda: anchor.kl_loss_term(logp, ref, estimator="forward")),
    ):
        monkeypatch.setattr(trainer.args, "kl_term", estimator)
        got, _ = taps.kl_correction(trainer.sage_step_context(), branch_batch, logp)
        want = (
            trainer.beta
            * ((fn() - anchor.shaped_kl(logp, ref, estimator="k3")) * mask).sum(1).div(mask.sum(1)).mean()
        )
        assert got.item() == pytest.approx(want.item(), abs=1e-7)
        (g_got,) = torch.autograd.grad(got, logp)
        (g_want,) = torch.autograd.grad(want, logp)
        torch.testing.assert_close(g_got, g_want, atol=1e-7, rtol=1e-6)
    with pytest.raises(ValueError, match="loss_type"):
        aggregate_like_trl(
            mask,
            mask,
            loss_type="cispo",
            max_completion_length=12,
            num_items_in_batch=None,
            num_processes=1,
            accumulation_steps=1,
            steps_per_generation=1,
            training=True,
        )


# --------------------------------------------------------------------- factory + config


def test_factory_looks_up_the_base_class_at_call_time(monkeypatch):
    import trl

    from sage_unsloth.compat import is_unsloth_patched
    from sage_unsloth.rlvr.resume import ExactResumeMixin
    from sage_unsloth.rlvr.trainer import SageTrainerMixin, make_sage_trainer_class
    from sage_unsloth.runtime.checkpoints import CheckpointMixin

    class UnslothGRPOTrainer(trl.GRPOTrainer):  # stands in for the class `import unsloth` installs on a GPU
        pass

    UnslothGRPOTrainer.__module__ = "unsloth_compiled_cache.UnslothGRPOTrainer"
    monkeypatch.setattr(trl, "GRPOTrainer", UnslothGRPOTrainer)

    cls = make_sage_trainer_class()
    # The same kit classes over Unsloth's class as over TRL's: the Unsloth tap is part of the one trainer class.
    kit = (SageTrainerMixin, ExactResumeMixin, CheckpointMixin)
    assert cls.__mro__[1:4] == kit and cls.__bases__[-1] is UnslothGRPOTrainer
    plain = make_sage_trainer_class(trl.trainer.GRPOTrainer)
    assert plain.__mro__[1:4] == kit and plain.__bases__[-1] is trl.trainer.GRPOTrainer
    assert is_unsloth_patched(cls) and not is_unsloth_patched(plain)


def test_trainer_mro_holds_four_kit_classes_none_overriding_what_another_does():
    """One trainer class of the kit over TRL's GRPOTrainer (the generated class, the SAGE trainer, the two
    checkpoint mixins): at most 4 classes of the kit, and no method defined by two of them (a call-flow trace
    can tell which one runs)."""
    import inspect

    import trl

    from sage_unsloth.rlvr.trainer import make_sage_trainer_class

    cls = make_sage_trainer_class(trl.trainer.GRPOTrainer)
    kit = [k for k in cls.__mro__ if k.__module__.startswith("sage_unsloth")]
    assert len(kit) <= 4, [k.__name__ for k in kit]
    owners: dict[str, str] = {}
    for klass in kit:
        for name, value in vars(klass).items():
            if name.startswith("__") or not (inspect.isfunction(value) or isinstance(value, property)):
                continue
            assert name not in owners, f"{name} is defined by {owners[name]} and {klass.__name__}"
            owners[name] = klass.__name__
    # the TRL methods the kit overrides, each once
    for name in ("_generate_and_score_completions", "_compute_loss", "_save_checkpoint", "_run_epoch"):
        assert name in owners, name


def test_config_pins_paper_defaults(tmp_path):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    args = SageGRPOConfig(output_dir=str(tmp_path), report_to="none")
    assert (args.loss_type, args.beta, args.learning_rate, args.gradient_accumulation_steps) == (
        "grpo",
        0.05,
        5e-6,
        1,
    )
    assert (args.num_generations, args.temperature, args.min_p, args.top_p, args.epsilon) == (
        8,
        1.0,
        0.01,
        1.0,
        0.2,
    )
    assert (args.weight_decay, args.seed, args.use_bias_correction_kl) == (0.01, 3407, False)
    assert args.lr_scheduler_type == "constant" and "adamw_torch" in str(args.optim).lower()
    assert (args.guide, args.kl_term) == ({"name": "none", "q_min": 0.6, "q_max": 1.4}, {"name": "k3"})


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"guide": "branch", "beta": 0.0}, "beta"),
        ({"guide": {"name": "branch", "q_min": 1.5}}, "q_min"),
        ({"guide": {"name": "none", "q_min": 0.0}}, "guide.q_min"),
        ({"guide": "entropy"}, "guide"),
        ({"loss_type": "ppo"}, "loss_type"),
        ({"kl_term": "k4"}, "kl_term"),
        ({"guide": {"name": "token", "norm": "max"}}, "guide.norm"),
        ({"sage_q_source": "generation"}, "sage_q_source"),
        ({"kl_term": "forward", "guide": "branch"}, "guide: none"),
        ({"kl_term": "k2", "loss_type": "cispo", "backend": "trl"}, "loss_type"),
    ],
)
def test_config_rejects_bad_values_in_one_line(tmp_path, overrides, field):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with pytest.raises(ValueError) as error:
        SageGRPOConfig(output_dir=str(tmp_path), report_to="none", **overrides)
    message = str(error.value)
    assert field in message and "\n" not in message


def test_config_warns_when_q_comes_from_the_rollout_policy(tmp_path):
    import warnings

    from sage_unsloth.rlvr.config import SageGRPOConfig

    common = {"output_dir": str(tmp_path), "report_to": "none", "guide": "branch"}
    with pytest.warns(UserWarning, match="rollout policy"):
        SageGRPOConfig(**common, sage_q_source="rollout", num_iterations=2)
    with pytest.warns(UserWarning, match="rollout policy"):
        SageGRPOConfig(
            **common, sage_q_source="rollout", per_device_train_batch_size=8, generation_batch_size=16
        )
    with (
        warnings.catch_warnings()
    ):  # q in TRL's loss (auto on TRL's trainer) is the official order: no warning
        warnings.simplefilter("error")
        config = SageGRPOConfig(**common, backend="trl", num_iterations=2)
    assert config.expected_q_source == "loss"


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"kl_term": "k2", "guide": "branch"}, "kl_term"),
        ({"dynamic_sampling": True}, "dynamic_sampling"),
        ({"sage_q_source": "loss", "guide": "token"}, "sage_q_source"),
    ],
)
def test_unsloth_conflicts_are_refused_by_the_config_on_any_machine_and_by_the_trainer_for_its_class(
    tmp_path, overrides, field
):
    """One definition (rlvr/config.py unsloth_conflict): the config refuses it with backend unsloth before any
    model loads, on CPU too (where Unsloth would leave TRL's trainer in place); the trainer makes the same check
    only for a patched class it subclasses without such a config (a patched base built by hand)."""
    from types import SimpleNamespace

    from unsloth_cpu import unsloth_config_fields

    from sage_unsloth.rlvr import config as rlvr_config

    common = unsloth_config_fields(tmp_path, **overrides)
    with pytest.raises(ValueError) as error:
        rlvr_config.SageGRPOConfig(**common)
    message = str(error.value)
    assert message.startswith(field) and "\n" not in message
    on_trl = rlvr_config.SageGRPOConfig(**{**common, "backend": "trl"})
    plan = on_trl.method_plan
    assert rlvr_config.unsloth_conflict(plan, on_trl, unsloth_patched=False) is None
    assert rlvr_config.unsloth_conflict(plan, on_trl, unsloth_patched=True) == message
    plain = SimpleNamespace(dynamic_sampling=False, sage_q_source="auto")  # what it reads beside the plan
    token = rlvr_config.SageGRPOConfig(
        **{**unsloth_config_fields(tmp_path), "backend": "trl", "guide": "token"}
    )
    assert rlvr_config.unsloth_conflict(token.method_plan, plain, unsloth_patched=True) is None


def test_the_rollout_policy_warning_comes_once(tiny_model_dir, tmp_path):
    """The config warns when it expects q at rollout; the trainer built from it does not warn again."""
    import warnings

    with pytest.warns(UserWarning, match="rollout policy"):
        args = _config(tmp_path, sage_q_source="rollout", num_iterations=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _build(tiny_model_dir, args)
    assert not [w for w in caught if "rollout policy" in str(w.message)]


def test_plain_entropy_pass_matches_a_direct_forward(branch_trainer, branch_batch):
    """The extra no-grad pass used under Unsloth (whose scorer returns no entropies)."""
    from sage_unsloth.compat import policy_logps_and_entropies

    b = branch_batch
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    attention = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
    logps, entropies = policy_logps_and_entropies(
        branch_trainer.model,
        ids,
        attention,
        ids.size(1) - b["prompt_ids"].size(1),
        TEMPERATURE,
        rows_per_chunk=3,
    )
    with torch.no_grad():
        want_logps, log_probs = _policy_forward(branch_trainer.model, b)
    mask = b["completion_mask"].bool()
    torch.testing.assert_close(logps[mask], want_logps[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        entropies[mask], -(log_probs.exp() * log_probs).sum(-1)[mask], atol=1e-5, rtol=1e-5
    )


# --------------------------------------------------------------------- training smoke


@pytest.mark.parametrize(
    "guide,q_source",
    [("none", "auto"), ("branch", "auto"), ("branch", "rollout"), ("token", "auto"), ("random", "auto")],
)
def test_two_steps_train_lora_per_guide(tiny_model_dir, tmp_path, guide, q_source):
    trainer = _build(
        tiny_model_dir,
        _config(
            tmp_path,
            guide=guide,
            sage_q_source=q_source,
            max_steps=2,
            per_device_train_batch_size=4,
            max_completion_length=8,
        ),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert before and all("lora_" in n for n in before)
    trainer.train()
    assert trainer.state.global_step == 2
    changed = [
        n for n, p in trainer.model.named_parameters() if n in before and not torch.equal(p, before[n])
    ]
    assert len(changed) == len(before)
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(steps) == 2 and all(math.isfinite(e["loss"]) for e in steps)
    if guide == "none":  # q = 1 by definition: nothing of q is computed or logged
        assert not any(key.startswith("sage/") for e in steps for key in e)
    else:
        assert all("sage/q_mean" in e for e in steps) and any(e["sage/q_max"] > 1.0 for e in steps)
    # the extra no-grad policy pass runs only where no forward of TRL's provides the statistics
    assert trainer.sage_forward_passes == (2 if (guide, q_source) == ("branch", "rollout") else 0)


# --------------------------------------------------------------------- Unsloth: layout + zoo loss parity
# (last in the file: importing unsloth patches transformers in this process)


def test_unsloth_layout_mapping_on_hand_built_batch():
    from sage_unsloth.compat import prompt_pad_counts, to_unsloth_layout

    pad = 0
    prompt_ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10], [0, 11, 12, 13]])
    completion_ids = torch.tensor([[21, 22, 0], [23, 24, 25], [26, 0, 0]])  # row 0 and 2 end with pad-eos
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    assert prompt_pad_counts(prompt_ids, pad).tolist() == [2, 0, 1]
    mapped = to_unsloth_layout(values, prompt_ids, completion_ids, pad)
    # M = 2, so (B, C + M) = (3, 5); row i's completion starts at column M - k_i = 0, 2, 1.
    expected = torch.tensor(
        [
            [1.0, 2.0, 0.0, 0.0, 3.0],  # 21 22 | pads: 2 prompt pads, then the completion's own pad-eos
            [0.0, 0.0, 4.0, 5.0, 6.0],  # no left pad: the completion fills the last C columns
            [0.0, 7.0, 0.0, 8.0, 9.0],  # 1 left pad; trailing pads keep their order (prompt pad, then 8, 9)
        ]
    )
    torch.testing.assert_close(mapped, expected)


@pytest.mark.slow
@pytest.mark.unsloth_in_process
def test_unsloth_layout_matches_zoo_packing():
    """Same permutation as unsloth_zoo's left_pack_padding + calculate_pad_tokens_in_prompt."""
    from sage_unsloth.runtime.backend import import_unsloth

    import_unsloth()
    from unsloth_zoo.rl_replacements import calculate_pad_tokens_in_prompt, left_pack_padding

    from sage_unsloth.compat import to_unsloth_layout

    gen = torch.Generator().manual_seed(0)
    pad = 0
    prompt_ids = torch.randint(1, 50, (6, 7), generator=gen)
    for row, k in enumerate([0, 3, 1, 6, 2, 0]):
        prompt_ids[row, :k] = pad
    completion_ids = torch.randint(1, 50, (6, 5), generator=gen)
    for row, n in enumerate([5, 2, 4, 1, 3, 0]):
        completion_ids[row, n:] = pad
    c = completion_ids.size(1)
    pads = calculate_pad_tokens_in_prompt(torch.cat([prompt_ids, completion_ids], 1), c, pad)
    m = int(pads.max())
    window = left_pack_padding(torch.cat([prompt_ids, completion_ids], 1), pad)[:, -(c + m) :]
    mapped_ids = to_unsloth_layout(completion_ids.float(), prompt_ids, completion_ids, pad, fill=-1.0)
    assert mapped_ids.shape == window.shape == (6, c + m)
    placed = mapped_ids >= 1
    assert torch.equal(mapped_ids[placed].long(), window[placed])
    for row in range(6):  # the completion starts at column M - k_i
        n = int((completion_ids[row] != pad).sum())
        if n:
            start = m - int(pads[row])
            assert torch.equal(mapped_ids[row, start : start + n].long(), completion_ids[row, :n])


@pytest.mark.unsloth_in_process
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_zoo_loss_on_shifted_reference_matches_trl(branch_trainer, branch_batch, monkeypatch, loss_type):
    """unsloth_zoo's grpo_compute_loss, fed the shifted reference in TRL's and in Unsloth's layout, equals
    TRL's loss. The zoo clamps ref - new to [-20, 20] and k3 to [-10, 10] (TRL does not), so the test
    reference is kept within a few nats of the policy: the guide's log q from the hook on top of it."""
    from sage_unsloth.runtime.backend import import_unsloth

    import_unsloth()
    from trl import GRPOTrainer
    from unsloth_zoo.rl_replacements import grpo_compute_loss

    from sage_unsloth.compat import to_unsloth_layout

    trainer, model = branch_trainer, branch_trainer.model
    monkeypatch.setattr(trainer, "loss_type", loss_type)
    batch = dict(branch_batch)
    mask = batch["completion_mask"].bool()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    new, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        trainer, model, ids, attention, batch["completion_ids"].size(1)
    )
    with torch.no_grad():
        raw_ref, _ = _policy_forward(model, batch, disable_adapter=True)
        log_q = torch.where(mask, batch["ref_per_token_logps"] - raw_ref, torch.zeros_like(raw_ref))
        near_ref = new.detach() + 0.5 * torch.randn(new.shape, generator=torch.Generator().manual_seed(0))
        batch["ref_per_token_logps"] = torch.where(mask, near_ref + log_q, torch.zeros_like(near_ref))
    assert (log_q.exp()[mask] > 1.01).any()
    params = _lora_params(model)
    trl_loss = trainer.compute_loss(model, batch)
    trl_grads = torch.autograd.grad(trl_loss, params)

    pad = trainer.processing_class.pad_token_id
    for layout in ("trl", "unsloth"):

        def place(x, _layout=layout):
            return (
                x
                if _layout == "trl"
                else to_unsloth_layout(x, batch["prompt_ids"], batch["completion_ids"], pad)
            )

        zoo_loss = grpo_compute_loss(
            place(batch["ref_per_token_logps"]),
            place(new),
            None,
            None,
            place(batch["completion_ids"].float()).long(),
            place(batch["completion_mask"].float()),
            trainer.beta,
            batch["advantages"],
            loss_type=loss_type,
            epsilon_low=trainer.epsilon_low,
            epsilon_high=trainer.epsilon_high,
            max_completion_length=12,
            num_items_in_batch=batch["num_items_in_batch"],
            current_gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_processes=1,
            use_bias_correction_kl=False,
        )[0]
        zoo_grads = torch.autograd.grad(zoo_loss, params, retain_graph=True)
        assert zoo_loss.item() == pytest.approx(trl_loss.item(), abs=1e-6), layout
        assert max((a - b).abs().max().item() for a, b in zip(zoo_grads, trl_grads)) < 1e-6, layout


@pytest.mark.unsloth_in_process
def test_zoo_dapo_normaliser_with_the_kits_num_items_rescale(branch_trainer, branch_batch):
    """dapo_normalizer=generation multiplies num_items_in_batch by steps_per_generation / accumulation; unsloth_zoo
    divides it back like TRL 1.15, which leaves TRL 0.23's (the official code's) normaliser under Unsloth too."""
    from sage_unsloth.runtime.backend import import_unsloth

    import_unsloth()
    from unsloth_zoo.rl_replacements import grpo_compute_loss

    trainer, batch = branch_trainer, branch_batch
    new, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model,
        torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
        torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
        batch["completion_ids"].size(1),
    )
    n = batch["num_items_in_batch"]

    def zoo(num_items, steps_per_generation):
        return grpo_compute_loss(
            batch["ref_per_token_logps"],
            new.detach(),
            None,
            None,
            batch["completion_ids"],
            batch["completion_mask"].float(),
            trainer.beta,
            batch["advantages"],
            loss_type="dapo",
            epsilon_low=0.2,
            epsilon_high=0.2,
            max_completion_length=12,
            num_items_in_batch=num_items,
            current_gradient_accumulation_steps=1,
            steps_per_generation=steps_per_generation,
            num_processes=1,
            use_bias_correction_kl=False,
        )[0].item()

    official = zoo(n, None)  # no rescale at all: TRL 0.23's num_items_in_batch / num_processes
    assert zoo(n * 2.0, 2) == pytest.approx(official, rel=1e-6)
    assert zoo(n, 2) == pytest.approx(2 * official, rel=1e-6)


# --------------------------------------------------------------------- canary: Unsloth's patched trainer

CANARY = (
    FORCED_TRAINER_PREAMBLE
    + r"""
from sage_unsloth.compat import to_unsloth_layout
from sage_unsloth.rlvr import taps
model._unsloth_user_float32 = True  # else Unsloth's loss autocasts this float32 model to fp16
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
# tau = 0: every completion token gets q = q_max = 1.4, so the KL is known in closed form. q at rollout (the
# path the token and random guides take under Unsloth), shifting the reference in Unsloth's layout.
args = SageGRPOConfig(output_dir="out", backend="trl", guide={"name": "branch", "tau": 0.0}, max_steps=1,
                      sage_q_source="rollout",
                      per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
                      report_to="none", logging_steps=1, save_strategy="no", use_cpu=True)
trainer = SageGRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions],
                          args=args, train_dataset=dataset, processing_class=tokenizer)
assert type(trainer).__bases__[-1].__name__ == "UnslothGRPOTrainer", type(trainer).__mro__
seen, before_shift = {}, {}
patched_compute_loss = trainer.compute_loss
def spy(model, inputs, *a, **k):
    seen.update({key: value.clone() if torch.is_tensor(value) else value for key, value in inputs.items()})
    return patched_compute_loss(model, inputs, *a, **k)
trainer.compute_loss = spy
shift = taps.shift_reference
def spy_shift(output, q, **kwargs):
    before_shift.update(ref=output["ref_per_token_logps"].clone(), ids=output["completion_ids"].clone())
    shift(output, q, **kwargs)
    before_shift["shifted"] = output["ref_per_token_logps"].clone()
taps.shift_reference = spy_shift
trainer.train()

b = seen
c = b["completion_ids"].size(1)
m = int(b["max_left_pad"][0])
assert m > 0 and b["ref_per_token_logps"].shape == (8, c + m), (b["ref_per_token_logps"].shape, c, m)
# The patched loss reads exactly the reference the mixin shifted (rows are shuffled into the buffer).
order = [next(j for j in range(8) if torch.equal(before_shift["ids"][j], row)) for row in b["completion_ids"]]
torch.testing.assert_close(b["ref_per_token_logps"], before_shift["shifted"][order], atol=0, rtol=0)
pad = tokenizer.pad_token_id
log_q = to_unsloth_layout(torch.full((8, c), math.log(1.4)) * b["completion_mask"], b["prompt_ids"],
                          b["completion_ids"], pad)
torch.testing.assert_close(b["ref_per_token_logps"] - before_shift["ref"][order], log_q, atol=1e-6, rtol=0)
# ... and log q sits where Unsloth's own scorer put the completion tokens' logps (non-zero columns).
placed = before_shift["ref"][order] != 0
assert torch.equal(placed, log_q != 0), (placed.int(), log_q)
kl = [e["kl"] for e in trainer.state.log_history if "kl" in e][0]
k3 = 1.4 - math.log(1.4) - 1
# The fresh LoRA (B = 0) makes policy == reference, so Unsloth's own scoring in its loss must give exactly k3
# of log 1.4 per token; a mis-scored completion (its PrefixGrouper on a plain HF model: 0.4 nats) breaks this.
assert abs(kl - k3) < 1e-4, (kl, k3)
print("CANARY-OK", kl, k3)
"""
)


def test_canary_unsloth_patched_trainer_reads_the_shifted_reference(tiny_model_dir, tmp_path):
    """Unsloth's rewritten GRPOTrainer forced on CPU (private API): the mixin over it puts log q, in its
    left-packed (B, C + max_left_pad) layout, on exactly the columns where Unsloth's own scorer placed the
    completion tokens, that shifted tensor is what its compute_loss (the zoo loss) receives, and the KL it logs
    is k3 of log 1.4 to 1e-4 (with the PrefixGrouper on, 0.106 instead of 0.0635). The in-loss branch q is
    tested in tests/rlvr/test_unsloth_path.py."""
    run_forced_unsloth(CANARY, "canary.py", tiny_model_dir, tmp_path, timeout=600)


def test_q_metrics_split_the_first_completion_token_from_the_later_ones():
    """sage/q_first_mean, first_boosted and later_boosted (the demo's branch point is the first completion
    token) on a hand-built q and mask, against values worked out by hand; no model needed."""
    from collections import defaultdict
    from types import SimpleNamespace

    from sage_unsloth.rlvr.trainer import log_q_metrics

    class OneProcess:
        def reduce(self, tensor, reduction):
            return tensor

        def gather(self, tensor):
            return tensor

    metrics = {"train": defaultdict(list)}
    fake = SimpleNamespace(model=SimpleNamespace(training=True), accelerator=OneProcess(), _metrics=metrics)
    q = torch.tensor([[1.4, 1.0, 1.2, 1.0], [1.0, 1.3, 1.0, 9.9], [9.9, 9.9, 9.9, 9.9], [1.2, 1.0, 1.0, 1.0]])
    # the third completion is all padding (its q must not count), the second's last token too
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    log_q_metrics(fake, q, mask)
    log = metrics["train"]
    assert log["sage/q_first_mean"] == [pytest.approx((1.4 + 1.0 + 1.2) / 3)]
    assert log["sage/first_boosted"] == [pytest.approx(2 / 3)]  # 1.4 and 1.2 of the three first tokens
    assert log["sage/later_boosted"] == [pytest.approx(2 / 6)]  # 1.2 and 1.3 of the six later tokens
    assert log["sage/frac_boosted"] == [pytest.approx(4 / 9)]
