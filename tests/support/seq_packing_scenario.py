"""Run by tests/rlvr/test_seq_packing.py in a fresh interpreter (Unsloth's GPU-only rewrites forced onto the CPU stay
for the process): Unsloth's GRPO sequence packing on and off under the SAGE trainer, on one rollout batch.

Two guides: branch (q from the entropies Unsloth's loss hands to the kit's hook, in its (B, C + M) layout) and random
(q drawn at rollout and placed into that layout by compat.to_unsloth_layout). The policy differs from the reference and
the branch q varies between 1 and 1.4, so a layout drift moves the loss, the KL and q. The tokenizer's pad is made
distinct from its EOS by Unsloth's own repair (compat.as_unsloth_tokenizer, what FastLanguageModel's loader does).
Per guide, with packing on and off: the reference scores, the loss, its gradients, the KL logged, q per token, what
Unsloth's loss function received (reference, policy log-probs, mask); the decoder forwards that got
``packed_seq_lengths`` (packing really ran); and, from the equations (an unpadded forward of each row with and without
the adapter, q placed on each row's own completion tokens), the loss and the KL Unsloth's loss defines. Writes
OUT/result.json.

SAGE_SCENARIO_DRIFT=1 (a deliberate break): the packed reference one column off. SAGE_SCENARIO_PAD_IS_EOS=1: the
tokenizer as the tiny model ships it (pad == EOS), without Unsloth's repair.

Usage: seq_packing_scenario.py MODEL_DIR OUT"""

import json
import os
import sys
import warnings
from pathlib import Path

warnings.simplefilter("ignore")
from sage_unsloth.acceptance.forced import force_on_cpu

force_on_cpu()

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from sage_unsloth import compat
from sage_unsloth.acceptance import forced
from sage_unsloth.rlvr.config import SageGRPOConfig
from sage_unsloth.rlvr.trainer import SageGRPOTrainer

TEMPERATURE = 0.8
# The tiny model with its output embedding doubled has token entropies within ~6.2-6.4 nats: q from 1 to 1.4.
GUIDES = {"branch": {"name": "branch", "tau": 6.37, "gamma": 20.0}, "random": "random"}  # guide nodes
PROMPTS = ["What is 2+3?", "Compute the sum of the first ten odd positive integers, then double it."]


def build(model_dir: str, guide: str):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(2.0)
    compat.as_unsloth_model(model)
    if os.environ.get("SAGE_SCENARIO_PAD_IS_EOS") != "1":
        compat.as_unsloth_tokenizer(model, tokenizer)
    # Completions of unequal lengths: stop tokens the model samples often, in its generation config, where TRL reads
    # the ids that end a completion (its completion_mask), as it does for Qwen's several stop ids.
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *range(300, 420)]
    torch.manual_seed(0)
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )  # the reference is the adapter-disabled base: policy != reference
    args = SageGRPOConfig(
        output_dir="out",
        backend="unsloth",
        guide=GUIDES[guide],
        max_steps=1,
        temperature=TEMPERATURE,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS] * 4)
    return SageGRPOTrainer(
        model=model, reward_funcs=varied, args=args, train_dataset=dataset, processing_class=tokenizer
    )


def varied(completions, **kwargs):
    return [float(sum(map(ord, str(c))) % 3) for c in completions]


def count_packed(trainer):
    """Forwards of the decoder that got packed_seq_lengths (Unsloth's packed call), counted into the returned list."""
    calls = []
    base = trainer.accelerator.unwrap_model(trainer.model).get_base_model()
    base.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(1) if "packed_seq_lengths" in kwargs else None,
        with_kwargs=True,
    )
    return calls


def reference(trainer, batch):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad(), compat.use_adapter(trainer.accelerator.unwrap_model(trainer.model), None):
        return trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, batch["completion_ids"].size(1), batch_size=ids.size(0)
        )[0]


def loss_step(trainer, batch) -> dict:
    """One compute_loss with its gradients, the KL it logged and the q it computed (branch: in the loss)."""
    captured, log_q = [], trainer.sage_log_q
    trainer.sage_log_q = lambda q, mask: (captured.append(q.detach().clone()), log_q(q, mask))[1]
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    try:
        loss = trainer.compute_loss(trainer.model, dict(batch))
        grads = torch.autograd.grad(loss, params)
    finally:
        trainer.sage_log_q = log_q
    return {
        "loss": float(loss),
        "grads": grads,
        "kl": trainer._metrics["train"]["kl"][-1],
        "q": captured[-1] if captured else None,
    }


def spy_loss_inputs(trainer) -> list[dict]:
    """What Unsloth's loss function receives (UnslothEfficientGRPO of the generated trainer's module, called once
    the branch hook has put log q into its copy of the reference): reference, policy log-probs and mask, per call."""
    module = next(
        sys.modules[k.__module__] for k in type(trainer).__mro__ if k.__name__ == "UnslothGRPOTrainer"
    )
    loss_function, calls = module.UnslothEfficientGRPO, []
    apply = loss_function.apply

    def spied(new, old, ref, sampling, lm_head, completion_ids, mask, *rest):
        calls.append(
            {"ref": ref.detach().clone(), "policy": new.detach().clone(), "mask": mask.detach().clone()}
        )
        return apply(new, old, ref, sampling, lm_head, completion_ids, mask, *rest)

    loss_function.apply = spied
    return calls


def stand_in_pad(model_dir: str) -> dict:
    """The pad and EOS ids the stages' stand-in for FastLanguageModel's loader returns (acceptance/forced.py)."""
    from trl import ModelConfig

    model, tokenizer = forced._load_stand_in(
        ModelConfig(model_name_or_path=model_dir, dtype="float32"), 0, None, False, False
    )
    return {
        "pad": tokenizer.pad_token_id,
        "eos": tokenizer.eos_token_id,
        "config_pad": model.config.pad_token_id,
        "generation_pad": model.generation_config.pad_token_id,
    }


def rows_from_the_equations(trainer, batch) -> list[dict]:
    """Per row, from the equations and Unsloth's definition of the sequence it scores (the row without its
    pad-valued tokens: unsloth_zoo's left_pack_padding drops them from the context, create_completion_attention_mask
    from the loss): TRL's completion tokens (``kept``), which of them are loss tokens (not the pad token), and at
    each loss token log pi_theta, log pi_ref and the policy's entropy (sampling temperature), from an unpadded
    forward of the prompt and the loss tokens with and without the policy adapter: nothing of the kit's or Unsloth's
    layout code."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    pad = trainer.processing_class.pad_token_id
    rows = []
    with torch.no_grad():
        for r in range(batch["prompt_ids"].size(0)):
            prompt = batch["prompt_ids"][r][batch["prompt_mask"][r].bool()]
            kept = batch["completion_mask"][r].bool()
            loss_token = batch["completion_ids"][r][kept] != pad
            tokens = batch["completion_ids"][r][kept][loss_token]
            row = torch.cat([prompt, tokens])[None]
            policy, entropy = _completion_logps(model, row, tokens)
            with model.disable_adapter():
                ref, _ = _completion_logps(model, row, tokens)
            rows.append(
                {
                    "kept": kept,
                    "loss_token": loss_token,
                    "prompt": prompt,
                    "policy": policy,
                    "ref": ref,
                    "entropy": entropy,
                }
            )
    return rows


def _completion_logps(model, row, completion):
    """log pi of the last ``len(completion)`` tokens of ``row`` (1, L) and the entropy of pi before each, at the
    sampling temperature."""
    n = completion.numel()
    log_probs = torch.log_softmax(model(input_ids=row).logits[0, -n - 1 : -1].float() / TEMPERATURE, -1)
    return log_probs.gather(-1, completion[:, None])[:, 0], -(log_probs.exp() * log_probs).sum(-1)


def rollout_log_q(rows, rollout_q):
    """The random guide: log q drawn at rollout (B, C), each row's values at its loss tokens."""
    return [torch.log(rollout_q[r][row["kept"]][row["loss_token"]]) for r, row in enumerate(rows)]


def branch_log_q(rows, gamma, tau, q_min, q_max):
    """The branch guide (arXiv 2605.18864): q_t = 1 + gamma * relu(H_t - tau), clipped to [q_min, q_max], from the
    current policy's entropies."""
    return [torch.log((1 + gamma * torch.relu(row["entropy"] - tau)).clamp(q_min, q_max)) for row in rows]


def zoo_loss_and_kl(rows, log_q, advantages, beta) -> dict:
    """What Unsloth's GRPO loss (loss_type grpo, one iteration: the ratio exp(log pi - old) is 1 in value, no vLLM
    correction) and the KL it logs are, from the equations: per loss token t of completion i,
    d = clamp(log pi_ref + log q - log pi_theta, -20, 20), k3 = min(exp(d) - d - 1, 10);
    kl = mean over completions with loss tokens of (mean of k3 over them);
    loss = mean over completions of (sum over loss tokens of (beta k3 - A_i)) / max(1, loss tokens)."""
    kls, losses = [], []
    for row, lq, advantage in zip(rows, log_q, advantages.tolist()):
        d = (row["ref"] + lq - row["policy"]).clamp(-20, 20)
        k3 = (torch.exp(d) - d - 1).clamp(max=10)
        if k3.numel():
            kls.append(float(k3.mean()))
        losses.append(float((beta * k3 - advantage).sum()) / max(1, k3.numel()))
    return {"kl": sum(kls) / len(kls), "loss": sum(losses) / len(losses)}


def kit_kl(trainer, batch, guide) -> float:
    """The logged KL as the kit's GPU self-test recomputes it (sage-unsloth doctor, check q_source), from the
    batch as the loss sees it: the kit's understanding of Unsloth's metric, tested against the equations."""
    from sage_unsloth.doctor import selftest
    from sage_unsloth.plugins import anchor

    stats = selftest.independent_policy_stats(trainer, batch)
    log_q = torch.zeros_like(stats["logp"])  # random: log q is in the batch's reference already
    if guide == "branch":
        node = trainer.args.guide  # resolved by the plan: every argument, defaults filled
        q = anchor.branch_guide(
            stats["entropy"],
            stats["mask"],
            gamma=node["gamma"],
            tau=node["tau"],
            q_min=node["q_min"],
            q_max=node["q_max"],
        )
        log_q = torch.log(q)
    ref = batch["ref_per_token_logps"].float()
    return selftest.k3_kl_metric(ref, log_q, stats["logp"], stats["mask"], per_sequence=True)


def loss_columns(batch, rows) -> list[torch.Tensor]:
    """Per row, the column of each of its loss tokens in Unsloth's layout: the row's non-pad tokens moved left
    (prompt, then the completion's loss tokens), the last C + M of its L columns scored."""
    width = batch["ref_per_token_logps"].size(1)
    length = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
    return [row["prompt"].numel() + torch.arange(row["policy"].numel()) - (length - width) for row in rows]


def loss_input_gaps(call, batch, rows, log_q) -> dict:
    """What Unsloth's loss function received against the equations, token for token: its mask is exactly the loss
    tokens' columns; there its reference is log pi_ref + log q and its policy log pi_theta."""
    columns = loss_columns(batch, rows)
    wanted = torch.zeros_like(call["mask"], dtype=torch.bool)
    ref_gap, policy_gap = 0.0, 0.0
    for r, (row, lq, cols) in enumerate(zip(rows, log_q, columns)):
        wanted[r, cols] = True
        ref_gap = max(ref_gap, _largest(call["ref"][r, cols] - (row["ref"] + lq)))
        policy_gap = max(policy_gap, _largest(call["policy"][r, cols] - row["policy"]))
    return {
        "mask_is_loss_tokens": bool(torch.equal(call["mask"].bool(), wanted)),
        "ref": ref_gap,
        "policy": policy_gap,
    }


def _largest(gaps) -> float:
    return float(gaps.abs().max()) if gaps.numel() else 0.0


def shifted_reference_gap(batch, rows, log_q) -> float:
    """The largest gap between the batch's reference (random guide: ref + log q placed at rollout) and
    log pi_ref + log q from the equations, at each row's loss tokens in Unsloth's layout."""
    return max(
        _largest(batch["ref_per_token_logps"][r, cols] - (row["ref"] + lq))
        for r, (row, lq, cols) in enumerate(zip(rows, log_q, loss_columns(batch, rows)))
    )


def drift(trainer) -> None:
    """SAGE_SCENARIO_DRIFT=1 (a deliberate break): the scorer's packed output one column off, what a changed
    scatter in Unsloth's packing would give."""
    score = trainer._get_per_token_logps_and_entropies

    def drifted(*args, **kwargs):
        out = score(*args, **kwargs)
        if os.environ.get(compat.UNSLOTH_SEQ_PACKING_ENV) == "1" and torch.is_tensor(out[0]):
            return (torch.roll(out[0], 1, dims=1), *out[1:])
        return out

    trainer._get_per_token_logps_and_entropies = drifted


def guide_case(model_dir: str, guide: str) -> dict:
    trainer = build(model_dir, guide)
    trainer.model.train()
    packed, rollout_q, log_q = count_packed(trainer), [], trainer.sage_log_q
    trainer.sage_log_q = lambda q, mask: (rollout_q.append(q.detach().clone()), log_q(q, mask))[1]
    if os.environ.get("SAGE_SCENARIO_DRIFT") == "1":
        drift(trainer)
    compat.set_unsloth_seq_packing(type(trainer), True)
    torch.manual_seed(1)
    batch = trainer._generate_and_score_completions(
        [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS * 4]
    )
    trainer.sage_log_q = log_q
    loss_inputs, runs = spy_loss_inputs(trainer), {}
    for on in (True, False):
        compat.set_unsloth_seq_packing(type(trainer), on)
        before = len(packed)
        runs[on] = {
            "ref": reference(trainer, batch),
            **loss_step(trainer, batch),
            "packed": len(packed) - before,
            "loss_inputs": loss_inputs[-1],
        }
    on, off = runs[True], runs[False]
    pad = trainer.processing_class.pad_token_id
    mask = batch["completion_mask"].bool()
    rows = rows_from_the_equations(trainer, batch)
    scored = torch.zeros_like(on["ref"], dtype=torch.bool)  # the loss tokens in Unsloth's layout
    for r, cols in enumerate(loss_columns(batch, rows)):
        scored[r, cols] = True
    if guide == "branch":
        node = trainer.args.guide  # the guide node as the plan resolved it: every argument, defaults filled
        log_q = branch_log_q(rows, node["gamma"], node["tau"], node["q_min"], node["q_max"])
    else:
        log_q = rollout_log_q(rows, rollout_q[0])
    result = {
        "pad_is_eos": pad == trainer.processing_class.eos_token_id,
        "pad_in_completions": int(
            ((batch["completion_ids"] == pad) & mask).sum()
        ),  # sampled: not loss tokens
        "trl_tokens_not_in_the_loss": int(mask.sum() - scored.sum()),
        "ref_max_diff": float((on["ref"] - off["ref"])[scored].abs().max()),
        # branch adds log q inside the loss: the batch holds the rollout's own (packed) reference scores
        "ref_on_vs_rollout": float((on["ref"] - batch["ref_per_token_logps"])[scored].abs().max()),
        "loss": [on["loss"], off["loss"]],
        "kl": [on["kl"], off["kl"]],
        "grad_max_diff": max(float((a - b).abs().max()) for a, b in zip(on["grads"], off["grads"])),
        "grad_scale": max(float(g.abs().max()) for g in off["grads"]),
        "packed_forwards": [on["packed"], off["packed"]],
        "verified": getattr(
            trainer.accelerator.unwrap_model(trainer.model), compat.UNSLOTH_SEQ_PACKING_VERIFIED, None
        ),
        "unequal_lengths": int(mask.sum(1).unique().numel()),
        "equations": zoo_loss_and_kl(rows, log_q, batch["advantages"], trainer.beta),
        "kit_kl": kit_kl(trainer, batch, guide),
        "loss_inputs": [loss_input_gaps(run["loss_inputs"], batch, rows, log_q) for run in (on, off)],
    }
    if guide == "branch":
        q_on, q_off = on["q"], off["q"]
        result["q_max_diff"] = float((q_on - q_off).abs().max())
        scored = q_on[q_on != 1.0]
        result["q_between"] = float(
            ((q_on > 1.0) & (q_on < 1.4)).float().sum() / max(1, int((q_on != 1).sum()))
        )
        result["q_range"] = [float(scored.min()), float(scored.max())] if scored.numel() else None
    else:
        result["shifted_reference_gap"] = shifted_reference_gap(batch, rows, log_q)
        result["rollout_q_calls"] = [list(q.shape) for q in rollout_q]
    return result


if __name__ == "__main__":
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    found = {guide: guide_case(model_dir, guide) for guide in GUIDES}
    found["stand_in"] = stand_in_pad(model_dir)
    (out / "result.json").write_text(json.dumps(found, indent=1))
