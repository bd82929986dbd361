"""Run by tests/rlvr/test_seq_packing.py in a fresh interpreter (Unsloth's GPU-only rewrites forced onto the CPU stay
for the process): Unsloth's GRPO sequence packing on and off under the SAGE trainer, on one rollout batch.

Two guides: branch (q from the entropies Unsloth's loss hands to the kit's hook, in its (B, C + M) layout) and random
(q drawn at rollout and placed into that layout by compat.to_unsloth_layout). The policy differs from the reference and
the branch q varies between 1 and 1.4, so a layout drift moves the loss, the KL and q. Per guide, with packing on and
off: the reference scores, the loss, its gradients, the KL logged, q per token; the decoder forwards that got
``packed_seq_lengths`` (packing really ran); and the KL from the equations (random guide: an unpadded forward per row,
q placed at each row's completion columns). Writes OUT/result.json.

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
        generation_kwargs={"eos_token_id": list(range(300, 420))},  # completions of unequal lengths
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


def kl_from_the_equations(trainer, batch, rollout_q) -> dict:
    """The KL Unsloth logs (the mean over rows of each row's mean k3 over its completion tokens) against q * pi_ref,
    from an unpadded forward of each row with and without the policy adapter and the rollout's q (B, C) put on the
    row's own completion tokens: nothing of the kit's or Unsloth's layout code. Also the largest gap between that
    shifted reference and the batch's, at each row's completion tokens (Unsloth's layout: the row with its pads
    moved to the right, the last C + M columns)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    pad = trainer.processing_class.pad_token_id
    width = batch["ref_per_token_logps"].size(1)
    length = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
    per_row, tokens, gaps = [], [], []
    with torch.no_grad():
        for r in range(batch["prompt_ids"].size(0)):
            prompt = batch["prompt_ids"][r][batch["prompt_mask"][r].bool()]
            kept = batch["completion_mask"][r].bool()
            completion = batch["completion_ids"][r][kept]
            row = torch.cat([prompt, completion])[None]
            policy = _completion_logps(model, row, completion)
            with model.disable_adapter():
                ref = _completion_logps(model, row, completion)
            shifted = ref + torch.log(rollout_q[r][kept])
            d = shifted - policy
            per_row.append(float((torch.exp(d) - d - 1).mean()))
            tokens.append(torch.exp(d) - d - 1)
            real = int((torch.cat([batch["prompt_ids"][r], batch["completion_ids"][r]]) != pad).sum())
            first = prompt.numel() - (length - width)  # column of the first completion token
            columns = torch.arange(first, first + completion.numel())
            if real == prompt.numel() + completion.numel():  # no pad-valued token inside the completion
                gaps.append(float((batch["ref_per_token_logps"][r, columns] - shifted).abs().max()))
    return {
        "kl": sum(per_row) / len(per_row),
        "kl_tokens": float(torch.cat(tokens).mean()),
        "shifted_reference_gap": max(gaps) if gaps else None,
    }


def _completion_logps(model, row, completion):
    """log pi of the last ``len(completion)`` tokens of ``row`` (1, L) at the sampling temperature."""
    n = completion.numel()
    logits = model(input_ids=row).logits[0, -n - 1 : -1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, completion[:, None])[:, 0]


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
    runs = {}
    for on in (True, False):
        compat.set_unsloth_seq_packing(type(trainer), on)
        before = len(packed)
        runs[on] = {
            "ref": reference(trainer, batch),
            **loss_step(trainer, batch),
            "packed": len(packed) - before,
        }
    on, off = runs[True], runs[False]
    mask = batch["completion_mask"].bool()
    scored = compat.to_unsloth_layout(
        batch["completion_mask"].float(),
        batch["prompt_ids"],
        batch["completion_ids"],
        trainer.processing_class.pad_token_id,
    ).bool()  # the completion tokens in Unsloth's layout
    result = {
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
        result["oracle"] = kl_from_the_equations(trainer, batch, rollout_q[0])
        result["rollout_q_calls"] = [list(q.shape) for q in rollout_q]
    return result


if __name__ == "__main__":
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    found = {guide: guide_case(model_dir, guide) for guide in GUIDES}
    (out / "result.json").write_text(json.dumps(found, indent=1))
