"""Run by tests/rlvr/test_unsloth_path.py in a fresh interpreter (Unsloth's patching is forced onto the CPU and stays
for the process): the branch guide's q inside Unsloth's patched GRPO loss. Writes OUT/result.json.

Usage: unsloth_path_scenario.py MODEL_DIR OUT"""

import json
import os
import sys
import warnings
from pathlib import Path

os.environ.update(
    UNSLOTH_ALLOW_CPU="1",
    UNSLOTH_COMPILE_DISABLE="1",
    UNSLOTH_GRPO_PREFIX_GROUPER="0",
    UNSLOTH_SKIP_TORCHVISION_CHECK="1",
    HF_HUB_OFFLINE="1",
)
warnings.simplefilter("ignore")

from sage_unsloth.runtime.backend import import_unsloth

import_unsloth()
import unsloth.models.rl as unsloth_rl

unsloth_rl._patch_trl_rl_trainers("grpo_trainer")  # private: rewrites TRL's GRPOTrainer as on a GPU

import inspect

import torch
import unsloth_zoo.rl_replacements as zoo
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from sage_unsloth.rlvr.config import SageGRPOConfig
from sage_unsloth.rlvr.trainer import SageGRPOTrainer

TEMPERATURE = 0.8
# The scaled tiny model's token entropies lie within ~6.2-6.4 nats: tau at their middle and a steep gamma give
# tokens at q = 1, tokens in between and tokens clipped at 1.4.
GUIDE = {"name": "branch", "tau": 6.37, "gamma": 20.0}
BRANCH = {"guide": GUIDE}
PROMPTS = ["What is 2+3?", "Compute the sum of the first ten odd positive integers, then double it."]


def build(model_dir, **overrides):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():  # sharper than the near-uniform random model, still sampling varied completions
        model.get_output_embeddings().weight.mul_(2.0)
    model.for_training = model.for_inference = lambda *a, **k: None  # FastLanguageModel's mode switches
    model._unsloth_user_float32 = True  # else Unsloth's loss autocasts this float32 model to fp16
    torch.manual_seed(0)
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )  # policy != reference from the start
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS] * 8)
    args = {
        "output_dir": "out",
        "backend": "trl",
        "guide": "branch",
        "max_steps": 2,
        "temperature": TEMPERATURE,
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 8,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "use_cpu": True,
        "learning_rate": 1e-2,
        "seed": 0,
        "generation_kwargs": {"eos_token_id": list(range(300, 420))},
    }
    args.update(overrides)
    return SageGRPOTrainer(
        model=model,
        reward_funcs=text_reward,
        args=SageGRPOConfig(**args),
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def text_reward(completions, **kwargs):
    return [float(sum(map(ord, str(c))) % 3) for c in completions]


def policy_in_unsloth_layout(trainer, batch):
    """log pi and entropy of each completion token under the current policy, from the equations: each row with
    its pad tokens removed, one plain forward, values placed where Unsloth's left-packed window has them
    (the last C + max_left_pad columns of the row with all pads moved to the right)."""
    pad = trainer.processing_class.pad_token_id
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    length, width = ids.size(1), batch["ref_per_token_logps"].size(1)
    logp, entropy, mask = (torch.zeros(ids.size(0), width) for _ in range(3))
    with torch.no_grad():
        for r in range(ids.size(0)):
            row = ids[r][ids[r] != pad]
            n_prompt = int((batch["prompt_ids"][r] != pad).sum())
            log_probs = torch.log_softmax(
                trainer.model(input_ids=row[None]).logits[0].float() / TEMPERATURE, -1
            )
            for j in range(n_prompt, row.numel()):
                col = j - (length - width)
                logp[r, col] = log_probs[j - 1, row[j]]
                entropy[r, col] = -(log_probs[j - 1].exp() * log_probs[j - 1]).sum()
                mask[r, col] = 1.0
    return logp, entropy, mask


def branch_q(entropy, mask, gamma=GUIDE["gamma"], tau=GUIDE["tau"]):
    q = (1 + gamma * torch.relu(entropy - tau)).clamp(0.6, 1.4)
    return torch.where(mask.bool(), q, torch.ones_like(q))


def k3_per_sequence(ref, q, logp, mask):
    d = ref + torch.log(q) - logp
    k3 = (torch.exp(d) - d - 1) * mask
    return float((k3.sum(1) / mask.sum(1).clamp(min=1)).mean())


def count_decoder_calls(trainer, fn):
    """(fn(), number of decoder forwards it ran)."""
    calls = []
    handle = trainer.model.get_base_model().model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        return fn(), len(calls)
    finally:
        handle.remove()


def same_rows_as_rollout(inputs, rollouts):
    """Each row's reference equals the raw reference its rollout produced (rows matched by completion)."""
    for i in range(inputs["completion_ids"].size(0)):
        hits = [
            r["ref"][j]
            for r in rollouts
            for j in range(r["ids"].size(0))
            if torch.equal(r["ids"][j], inputs["completion_ids"][i])
        ]
        if not any(torch.equal(inputs["ref_per_token_logps"][i], hit) for hit in hits):
            return False
    return True


def in_loss_training(model_dir):
    """num_iterations 2: the second step reuses the first rollout after an optimizer step, so its q must come
    from the updated policy (the official code's order) and the buffered reference must stay untouched."""
    trainer = build(model_dir, num_iterations=2, **BRANCH)
    rollouts, calls = [], []
    generate, compute_loss = trainer._generate_and_score_completions, trainer.compute_loss

    def spy_generate(inputs):
        out = generate(inputs)
        rollouts.append({"ref": out["ref_per_token_logps"].clone(), "ids": out["completion_ids"].clone()})
        return out

    def spy_loss(model, inputs, *a, **k):
        logp, entropy, mask = policy_in_unsloth_layout(trainer, inputs)
        ref_before = inputs["ref_per_token_logps"].clone()
        loss = compute_loss(model, inputs, *a, **k)
        q = branch_q(entropy, mask)
        metrics = trainer._metrics["train"]
        calls.append(
            {
                "kl": metrics["kl"][-1],
                "want_kl": k3_per_sequence(ref_before, q, logp, mask),
                "q_mean": metrics["sage/q_mean"][-1],
                "want_q_mean": float(q[mask.bool()].mean()),
                "q_max": metrics["sage/q_max"][-1],
                "want_q_max": float(q[mask.bool()].max()),
                "frac_boosted": float((q[mask.bool()] > 1).float().mean()),
                "frac_clipped": float((q[mask.bool()] >= 1.4).float().mean()),
                "ref_untouched": bool(torch.equal(inputs["ref_per_token_logps"], ref_before)),
                "quantile_restored": trainer.args.top_entropy_quantile == 1.0,
                "ref_is_the_rollouts": same_rows_as_rollout(inputs, rollouts),
            }
        )
        return loss

    trainer._generate_and_score_completions, trainer.compute_loss = spy_generate, spy_loss
    trainer.train()
    return {
        "calls": calls,
        "rollouts": len(rollouts),
        "extra_passes": trainer.sage_forward_passes,
        "q_in_loss": trainer.sage_q_in_loss,
        "mro": [k.__name__ for k in type(trainer).__mro__],
    }


def loss_and_grads(trainer, batch, *, guide, quantile):
    """Loss, LoRA gradients and decoder forwards of one compute_loss call with these two settings."""
    old = trainer.args.guide, trainer.args.top_entropy_quantile
    trainer.args.guide, trainer.args.top_entropy_quantile = guide, quantile
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    try:
        loss, forwards = count_decoder_calls(trainer, lambda: trainer.compute_loss(trainer.model, batch))
        return float(loss), torch.autograd.grad(loss, params), forwards
    finally:
        trainer.args.guide, trainer.args.top_entropy_quantile = old


def compare(on, off):
    return {
        "loss_on": on[0],
        "loss_off": off[0],
        "forwards_on": on[2],
        "forwards_off": off[2],
        "max_grad_diff": max(float((a - b).abs().max()) for a, b in zip(on[1], off[1])),
        "grad_scale": max(float(g.abs().max()) for g in off[1]),
    }


def neutral_hook(model_dir):
    """q == 1 (gamma 0): the loss with the hook (entropy path on, mask None) equals plain GRPO's, gradients and
    forward count too; with a user's own top_entropy_quantile the hook still returns TRL's mask."""
    neutral = {**GUIDE, "gamma": 0.0}
    trainer = build(model_dir, guide=neutral, max_steps=1)
    trainer.model.train()
    rows = [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS for _ in range(4)]
    torch.manual_seed(1)
    batch = trainer._generate_and_score_completions(rows)
    for guide in (neutral, "none"):  # warm-up: Unsloth verifies its sequence packing on a first batch shape
        loss_and_grads(trainer, batch, guide=guide, quantile=1.0)
    plain = compare(
        loss_and_grads(trainer, batch, guide=neutral, quantile=1.0),
        loss_and_grads(trainer, batch, guide="none", quantile=1.0),
    )
    user = compare(
        loss_and_grads(trainer, batch, guide=neutral, quantile=0.5),
        loss_and_grads(trainer, batch, guide="none", quantile=0.5),
    )
    return {
        "plain": plain,
        "user_quantile": user,
        "batch": batch,
        "trainer": trainer,
        "user_mask_changes_loss": abs(user["loss_off"] - plain["loss_off"]),
        "advantages_nonzero": bool((batch["advantages"] != 0).any()),
    }


def loud_when_not_called(trainer, batch):
    """An Unsloth whose loss never hands the entropies over must raise, not train plain GRPO in silence."""
    from sage_unsloth.rlvr.unsloth_hooks import SageHookNotCalled

    original = zoo.grpo_high_entropy_mask
    zoo.grpo_high_entropy_mask = lambda trainer, entropies, mask, threshold, sample_weight=None: None
    try:
        trainer.args.guide = GUIDE
        trainer.compute_loss(trainer.model, batch)
        return {"raised": False}
    except SageHookNotCalled as exc:
        return {"raised": True, "message": str(exc)}
    finally:
        zoo.grpo_high_entropy_mask = original


def contact_point_source():
    """The pinned contact point in unsloth_zoo 2026.10.9: the quantile read, then the entropies handed to
    trainer.get_high_entropy_mask, then the reference read by UnslothEfficientGRPO."""
    source = inspect.getsource(zoo.grpo_accumulated_loss)
    read = source.find('getattr(trainer.args, "top_entropy_quantile"')
    handed = source.find("_grpo_high_entropy_mask(")
    used = source.find("UnslothEfficientGRPO.apply(")
    helper = inspect.getsource(zoo.grpo_high_entropy_mask)
    return {"order": 0 <= read < handed < used, "calls_trainer": "trainer.get_high_entropy_mask(" in helper}


LATE_NAN_ESTIMATOR = """
CALLS = []

def late_nan(inputs):
    CALLS.append(1)  # call 1: the trial call before loading; call 2: step 1
    out = inputs.rewards - inputs.rewards.mean()
    return out * float("nan") if len(CALLS) > 1 else out
"""


def trainable(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def stopped(trainer, fault: type) -> dict:
    """Train; the line of the ``fault`` that stopped it (None if none did) and whether the weights are as before."""
    before = trainable(trainer)
    try:
        trainer.train()
        raised = None
    except fault as exc:
        raised = str(exc)
    return {
        "raised": raised,
        "unchanged": all(torch.equal(p, before[n]) for n, p in trainable(trainer).items()),
    }


def guards(model_dir):
    """Under Unsloth's patched trainer and loss: a NaN batch from no plug-in (a rollout step poisoning the
    advantages) and a plug-in estimator turning NaN in training each stop the run before the optimizer step, the
    weights untouched (sage_unsloth/runtime/finite_steps.py, plugins/calls.py)."""
    from sage_unsloth.plugins.calls import PluginFault
    from sage_unsloth.runtime.finite_steps import NonFiniteStep

    trainer = build(model_dir, max_steps=1, **BRANCH)

    def poison(rollout):
        rollout.output["advantages"] = rollout.output["advantages"] * float("nan")

    trainer.rollout_steps = (*trainer.rollout_steps, poison)
    result = {"poisoned": stopped(trainer, NonFiniteStep)}
    Path("late_estimator.py").write_text(LATE_NAN_ESTIMATOR)
    trainer = build(model_dir, max_steps=1, advantage_estimator="late_estimator.py:late_nan", **BRANCH)
    result["plugin"] = stopped(trainer, PluginFault)
    result["patched"] = type(trainer).__mro__[4].__name__
    return result


def loss_contact(_plain):
    """What check_unsloth_loss (run when every trainer above was built) read: the generated trainer's module file
    and the zoo helper it checks, so the test can break each path in a copy and see the check name it."""
    import trl

    from sage_unsloth import compat

    cls = trl.GRPOTrainer
    source = compat.generated_trainer_source(cls)
    helper = inspect.getsource(getattr(zoo, compat.UNSLOTH_ENTROPY_HELPER[0]))
    module = next(k for k in cls.__mro__ if k.__name__.startswith("_UnslothGRPO")).__module__
    return {
        "file": sys.modules[module].__file__,
        "helper": helper,
        "problem": compat.unsloth_loss_problem(source, helper),
    }


if __name__ == "__main__":
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    result = {"in_loss": in_loss_training(model_dir), "guards": guards(model_dir)}
    neutral = neutral_hook(model_dir)
    result["loud"] = loud_when_not_called(neutral.pop("trainer"), neutral.pop("batch"))
    result["neutral"] = neutral
    result["contact"] = contact_point_source()
    result["loss_contact"] = loss_contact(neutral["plain"])
    (out / "result.json").write_text(json.dumps(result, indent=1))
