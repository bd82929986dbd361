"""The SAGE self-test of ``sage-unsloth doctor``: 2 steps of the tiny model through the real RLVR stage
(``build_stage``) on the chosen backend, each property checked PASS/FAIL. Runs in its own process, because
importing Unsloth patches TRL for the rest of the process:

    python -m sage_unsloth.doctor.selftest WORKDIR --backend unsloth|trl [--json OUT] [--quick]

Checks (``--quick``: the first four, 1 step):

  patched     backend unsloth: the trainer subclasses Unsloth's generated UnslothGRPOTrainer (on a CPU
              machine Unsloth's patching is forced, as on a GPU); backend trl: TRL's own GRPOTrainer
  trains      the optimizer steps finish with finite losses; only the "default" adapter trains and it moved
  q_in_loss   with the branch guide at tau 0 every completion token gets q = q_max = 1.4, so on the first batch (policy ==
              reference, both the SFT adapter) KL(with q) - KL(without q) = 1.4 - ln 1.4 - 1 = 0.0635 and the
              loss difference is beta times that; no extra policy pass was run for q
  q_source    the entropies q is computed from are those of the current policy (an independent unpadded
              forward of each row), and the logged KL equals k3 against ref + log q recomputed from it
  anchor_sft  the scored reference is the frozen "ref" adapter (== the SFT adapter), not the disabled base
  lora_sync   only the policy adapter reaches vLLM: Unsloth's load_lora with hide_adapter_from_vllm_sync
              (backend unsloth; vLLM's LoRARequest class when vLLM imports, else a stand-in on CPU)
  anchor_base with anchor base there is no "ref" adapter and the scored reference is the disabled base

On a CPU the model is the tiny float32 Qwen2 loaded by transformers + peft (Unsloth's FastLanguageModel
needs a GPU), Unsloth's PrefixGrouper is off (a plain transformers model ignores its prefix_seg_info) and
the tolerances are fp32-tight; on a GPU FastLanguageModel loads it in 16 bits and the tolerances widen.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
import traceback
import types
from pathlib import Path

from sage_unsloth.doctor.report import Check
from sage_unsloth.runtime import layout

DKL_Q_MAX = 1.4 - math.log(1.4) - 1.0  # k3 of log q at d = 0, q = 1.4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROBLEMS = [
    "What is 2+3?",
    "Compute 7*6.",
    "Add the first ten odd positive integers, then double it.",
    "If x + 4 = 9, what is x?",
    "What is 12 divided by 4, plus 1?",
    "Find 3 squared minus 2.",
    "How many sides does a hexagon have, times two?",
    "Subtract 5 from 20.",
]
# (cpu fp32, gpu 16-bit): |KL(q) - KL(no q) - 0.0635|, relative KL / entropy agreement, |KL without q|
TOLERANCE = {
    "cpu": {"dkl": 1e-4, "rel": 1e-4, "h": 1e-4, "kl0": 1e-4},
    "gpu": {"dkl": 5e-3, "rel": 5e-2, "h": 5e-2, "kl0": 5e-3},
}


class SelfTest:
    def __init__(self, work: Path, backend: str):
        self.work, self.backend = work, backend
        self.checks: list[Check] = []

    def add(self, name: str, ok: bool, detail: str, fix: str = "") -> None:
        self.checks.append(Check(name, "PASS" if ok else "FAIL", detail, "" if ok else fix))
        print(self.checks[-1].line(), flush=True)

    def guarded(self, name: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - one failure must not hide the other checks
            self.add(
                name,
                False,
                f"{type(exc).__name__}: {str(exc)[:400]}",
                "see the traceback above; the kit is pinned to the versions in pyproject.toml",
            )
            traceback.print_exc()
            return None


# ----------------------------------------------------------------------------------------------- set-up
def prepare_backend(backend: str, cpu: bool) -> None:
    """Before TRL is imported: Unsloth's patching (forced onto the CPU when there is no GPU)."""
    os.environ.setdefault("UNSLOTH_SKIP_TORCHVISION_CHECK", "1")
    os.environ.setdefault("UNSLOTH_VLLM_MERGED_ROLLOUT", "0")  # what build_stage sets for anchor sft + vLLM
    if backend != "unsloth":
        return
    if cpu:
        os.environ.update(UNSLOTH_ALLOW_CPU="1", UNSLOTH_COMPILE_DISABLE="1", UNSLOTH_GRPO_PREFIX_GROUPER="0")
    from sage_unsloth.runtime.backend import import_unsloth

    import_unsloth()
    if cpu:
        import unsloth.models.rl as unsloth_rl

        unsloth_rl._patch_trl_rl_trainers("grpo_trainer")  # private: what `import unsloth` does on a GPU


def cpu_stand_in_loader() -> None:
    """CPU only: FastLanguageModel needs a GPU, so the stage loads the tiny model with transformers + peft and
    it gets the two mode switches and the float32 stamp a FastLanguageModel model carries."""
    from sage_unsloth.model import loading as models

    load = models.load_for_training

    def load_on_cpu(model_args, **kwargs):
        kwargs["backend"] = "trl"
        model, tokenizer = load(model_args, **kwargs)
        model.for_training = model.for_inference = lambda *a, **k: None
        model._unsloth_user_float32 = True  # else Unsloth's loss autocasts a float32 model to fp16
        return model, tokenizer

    models.load_for_training = load_on_cpu


def make_sft_run(work: Path) -> tuple[Path, Path]:
    """The tiny model and an SFT output folder whose adapter is random and non-zero (SFT model != base)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sage_unsloth.model.tiny import build_tiny_model
    from sage_unsloth.runtime.manifest import write_manifest

    tiny = build_tiny_model(work / "tiny-qwen2", seed=0)
    sft = layout.sft_dir(work / layout.OUTPUTS, "tiny-qwen2")
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny),
        LoraConfig(
            r=8, lora_alpha=16, target_modules=TARGETS, task_type="CAUSAL_LM", init_lora_weights=False
        ),
    )
    model.save_pretrained(sft)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(sft)
    write_manifest(sft, stage="sft", config={}, seed=0, base_model=str(tiny), adapter=True)
    data = work / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": p, "answer": str(i)}) + "\n" for i, p in enumerate(PROBLEMS * 4))
    )
    return sft, data


def text_reward(prompts, completions, answer=None, **kwargs):
    """Deterministic and different between completions (the random tiny model never answers right)."""
    from sage_unsloth.rlvr import reward

    return [float(sum(map(ord, reward.completion_text(c))) % 3) / 2.0 for c in completions]


def build(
    work: Path,
    backend: str,
    sft: Path,
    data: Path,
    *,
    anchor: str,
    steps: int,
    cpu: bool,
    checkpointing: bool = False,
):
    from trl import ModelConfig

    from sage_unsloth.rlvr import reward
    from sage_unsloth.rlvr.config import SageGRPOConfig
    from sage_unsloth.rlvr.run import RLVRStageArgs, build_stage

    reward.correctness_reward = functools.update_wrapper(text_reward, reward.correctness_reward)
    bf16 = not cpu and _bf16()
    grpo = SageGRPOConfig(
        output_dir=str(work / "unused"),
        backend=backend,
        use_vllm=False,
        guide={"name": "branch", "tau": 0.0},
        beta=0.05,
        loss_type="grpo",
        num_generations=4,  # 2 prompts x 4 completions a step
        generation_batch_size=8,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        max_completion_length=12,
        temperature=1.0,
        learning_rate=1e-2,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=cpu,
        bf16=bf16,
        fp16=False,
        optim="adamw_torch",
        gradient_checkpointing=checkpointing,
        seed=3407,
        generation_kwargs={"eos_token_id": list(range(300, 420))},  # many stop tokens: uneven lengths
    )
    stage = RLVRStageArgs(
        sft_dir=str(sft),
        anchor=anchor,
        variant=f"selftest-{anchor}",
        output_root=str(work / f"out-{anchor}"),
        dataset_path=str(data),
        max_prompt_length=200,
    )
    dtype = "float32" if cpu else ("bfloat16" if bf16 else "float16")
    model_args = ModelConfig(model_name_or_path=None, dtype=dtype, load_in_4bit=False)
    return build_stage(grpo, stage, model_args)


def _bf16() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


# ----------------------------------------------------------------------------------------------- recording
class Recorder:
    """Spies on one trainer: the rollout batches (raw reference), the first loss call run once more with the
    guide off (loss and KL without q), and the entropies the loss hands to q."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.rollouts, self.losses, self.entropies = [], [], []
        generate = trainer._generate_and_score_completions
        compute_loss = trainer.compute_loss

        def spy_generate(inputs):
            output = generate(inputs)
            self.rollouts.append({k: v.clone() for k, v in output.items() if hasattr(v, "clone")})
            return output

        def spy_loss(model, inputs, *args, **kwargs):
            record = {k: v.clone() for k, v in inputs.items() if hasattr(v, "clone")}
            record["independent"] = independent_policy_stats(trainer, inputs)
            if not self.losses:
                record["loss_noq"], record["kl_noq"] = self._without_q(
                    compute_loss, model, inputs, args, kwargs
                )
            loss = compute_loss(model, inputs, *args, **kwargs)
            record["loss"] = float(loss.detach().float())
            record["kl"] = trainer._metrics["train"]["kl"][-1]
            self.losses.append(record)
            return loss

        trainer._generate_and_score_completions = spy_generate
        trainer.compute_loss = spy_loss
        if hasattr(trainer, "get_high_entropy_mask"):  # Unsloth's loss hands its entropies over here
            mask_fn = trainer.get_high_entropy_mask

            def spy_mask(entropies, mask, threshold):
                self.entropies.append(entropies.detach().clone())
                return mask_fn(entropies, mask, threshold)

            trainer.get_high_entropy_mask = spy_mask

    def _without_q(self, compute_loss, model, inputs, args, kwargs):
        """The same batch through the same loss with the guide none, leaving no trace in the metrics."""
        import torch

        trainer = self.trainer
        metrics = trainer._metrics["train"]
        sizes = {name: len(values) for name, values in metrics.items()}
        guide = trainer.args.guide
        trainer.args.guide = "none"
        try:
            with torch.no_grad():
                loss = float(compute_loss(model, dict(inputs), *args, **kwargs).float())
            kl = metrics["kl"][-1]
        finally:
            trainer.args.guide = guide
            for name, values in list(metrics.items()):
                del values[sizes.get(name, 0) :]
        return loss, kl


def independent_policy_stats(trainer, batch) -> dict:
    """log pi and entropy of every completion token under the current policy, one unpadded row at a time,
    placed in the layout the reference has: TRL's (B, C) or Unsloth's left-packed (B, C + max_left_pad)."""
    import torch

    pad = trainer.processing_class.pad_token_id
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    ref = batch["ref_per_token_logps"]
    rows, length, width = ids.size(0), ids.size(1), ref.size(1)
    logp, entropy, mask = (torch.zeros(rows, width) for _ in range(3))
    unsloth_layout = width != batch["completion_ids"].size(1)
    model = trainer.model
    with torch.no_grad():
        for r in range(rows):
            if unsloth_layout:  # pads (prompt and completion) moved right, the last `width` columns scored
                keep = ids[r] != pad
                n_prompt = int((batch["prompt_ids"][r] != pad).sum())
            else:  # TRL: the padded row as it is, completion tokens by completion_mask
                keep = torch.cat([batch["prompt_mask"][r], batch["completion_mask"][r]]).bool()
                n_prompt = int(batch["prompt_mask"][r].sum())
            row = ids[r][keep]
            logits = model(input_ids=row[None].to(model.device)).logits[0].float().cpu() / trainer.temperature
            log_probs = torch.log_softmax(logits, -1)
            for j in range(n_prompt, row.numel()):
                if unsloth_layout:
                    col = j - (length - width)
                else:
                    col = j - n_prompt
                    if not batch["completion_mask"][r, col]:
                        continue
                logp[r, col] = log_probs[j - 1, row[j]]
                entropy[r, col] = -(log_probs[j - 1].exp() * log_probs[j - 1]).sum()
                mask[r, col] = 1.0
    return {"logp": logp, "entropy": entropy, "mask": mask}


def k3_kl_metric(ref, log_q, logp, mask, *, per_sequence: bool) -> float:
    """The KL metric the loss logs: k3 of (ref + log q - log pi) averaged over the completion tokens (TRL), or
    per completion and then over the completions that have tokens (Unsloth). The zoo clamps the log-ratio
    to [-20, 20] and k3 to 10; TRL does not (neither binds here)."""
    import torch

    d = (ref + log_q - logp).clamp(-20, 20)
    k3 = (torch.exp(d) - d - 1).clamp(max=10) * mask
    if not per_sequence:
        return float(k3.sum() / mask.sum().clamp(min=1))
    tokens = mask.sum(1)
    return float((k3.sum(1)[tokens > 0] / tokens[tokens > 0]).mean())


# ----------------------------------------------------------------------------------------------- checks
def check_patched(t: SelfTest, trainer) -> None:
    from sage_unsloth.compat import is_unsloth_patched

    mro = [f"{k.__module__}.{k.__name__}" for k in type(trainer).__mro__[:5]]
    patched = is_unsloth_patched(type(trainer)) and any(
        k.__name__ == "UnslothGRPOTrainer" for k in type(trainer).__mro__
    )
    if t.backend == "unsloth":
        t.add(
            "patched",
            patched,
            f"trainer {' < '.join(mro)}",
            "import unsloth before trl (sage_unsloth.runtime.backend.import_unsloth) with unsloth==2026.10.9",
        )
    else:
        t.add("patched", not patched, f"backend trl: trainer {' < '.join(mro)}")


def check_trains(t: SelfTest, built, sft_tensors: dict, rec: Recorder, steps: int) -> None:
    import torch

    model, trainer = built.model, built.trainer
    losses = [r["loss"] for r in rec.losses]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    moved = any(
        not torch.equal(p.detach().cpu().float(), sft_tensors[_sft_key(n)].float())
        for n, p in model.named_parameters()
        if ".default." in n and _sft_key(n) in sft_tensors
    )
    ok = (
        trainer.state.global_step == steps
        and losses
        and all(math.isfinite(x) for x in losses)
        and trainable
        and all(".default." in n for n in trainable)
        and moved
    )
    t.add(
        "trains",
        ok,
        f"{trainer.state.global_step} steps, losses {[round(x, 5) for x in losses]}, "
        f"{len(trainable)} trainable tensors all in 'default': {all('.default.' in n for n in trainable)}, "
        f"policy moved: {moved}",
    )


def _sft_key(name: str) -> str:
    return name.replace(".default.", ".").replace(".ref.", ".")


def check_q_in_loss(t: SelfTest, built, rec: Recorder, tol: dict) -> None:
    trainer = built.trainer
    first = rec.losses[0]
    dkl, dloss = first["kl"] - first["kl_noq"], first["loss"] - first["loss_noq"]
    expected = trainer.beta * dkl / max(1, trainer.args.gradient_accumulation_steps)
    extra = trainer.sage_forward_passes
    ok = (
        abs(dkl - DKL_Q_MAX) < tol["dkl"]
        and abs(first["kl_noq"]) < tol["kl0"]
        and abs(dloss - expected) < max(tol["dkl"] * trainer.beta, 1e-7)
        and extra == 0
    )
    t.add(
        "q_in_loss",
        ok,
        f"KL with q {first['kl']:.6f} - without {first['kl_noq']:.6f} = {dkl:.6f} "
        f"(q = 1.4 everywhere: 1.4 - ln 1.4 - 1 = {DKL_Q_MAX:.6f}); loss {first['loss']:.7f} - "
        f"{first['loss_noq']:.7f} = {dloss:.7f}, beta * dKL = {expected:.7f}; extra policy passes for q: {extra}",
        "q does not reach the KL of the loss: check the pinned trl / unsloth versions "
        "(sage_unsloth/rlvr/unsloth_hooks.py, trainer.py)",
    )


def check_q_source(t: SelfTest, built, rec: Recorder, tol: dict) -> None:
    """The entropies behind q are the current policy's, and the logged KL is k3 against ref + log q(H)."""
    import torch

    from sage_unsloth.plugins import anchor

    knobs = built.trainer.args.method_plan.guide_args  # the resolved plan's: what training used
    worst_h, worst_kl, rows = 0.0, 0.0, []
    for index, record in enumerate(rec.losses):
        ind = record["independent"]
        mask = ind["mask"].bool()
        if rec.entropies:  # Unsloth: what its loss handed to the hook, in its layout
            worst_h = max(
                worst_h, float((rec.entropies[index].float().cpu() - ind["entropy"]).abs()[mask].max())
            )
        q = anchor.branch_guide(
            ind["entropy"],
            ind["mask"],
            gamma=knobs["gamma"],
            tau=knobs["tau"],
            q_min=knobs["q_min"],
            q_max=knobs["q_max"],
        )
        want = k3_kl_metric(
            record["ref_per_token_logps"].float().cpu(),
            torch.log(q),
            ind["logp"],
            ind["mask"],
            per_sequence=t.backend == "unsloth",
        )
        worst_kl = max(worst_kl, abs(record["kl"] - want) / max(abs(want), 1e-8))
        rows.append(f"{record['kl']:.6f} vs {want:.6f}")
    handed = bool(rec.entropies) or t.backend == "trl"
    ok = handed and worst_h < tol["h"] and worst_kl < tol["rel"]
    t.add(
        "q_source",
        ok,
        f"logged KL vs k3 recomputed from an independent forward of the current policy: "
        f"{'; '.join(rows)} (max rel. diff {worst_kl:.2e})"
        + (f"; in-loss entropies vs independent: max |dH| {worst_h:.2e}" if rec.entropies else ""),
        "q is computed from something other than the current policy's entropies",
    )


def scored_reference(trainer, batch, adapter):
    """The trainer's own scorer on a recorded batch with adapter 'ref', None (all disabled) or 'default'."""
    import torch
    from trl.trainer.utils import use_adapter

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width = batch["completion_ids"].size(1)
    with torch.no_grad(), use_adapter(trainer.accelerator.unwrap_model(trainer.model), adapter_name=adapter):
        return trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, width, batch_size=ids.size(0)
        )[0]


def _max_diff(a, b, mask) -> float:
    return float((a.float().cpu() - b.float().cpu()).abs()[mask.cpu()].max())


def check_anchor_sft(t: SelfTest, built, sft_tensors: dict, rec: Recorder, tol: dict) -> None:
    import torch

    model, trainer = built.model, built.trainer
    ref = {n: p for n, p in model.named_parameters() if ".ref." in n}
    same = (
        bool(ref)
        and len(ref) == len(sft_tensors)
        and all(
            torch.equal(p.detach().cpu().float(), sft_tensors[_sft_key(n)].float()) for n, p in ref.items()
        )
    )
    frozen = all(not p.requires_grad for p in ref.values())
    batch = rec.rollouts[-1]
    raw = batch["ref_per_token_logps"]
    scored = raw != 0
    err_ref = _max_diff(scored_reference(trainer, batch, "ref"), raw, scored)
    err_base = _max_diff(scored_reference(trainer, batch, None), raw, scored)
    ok = same and frozen and err_ref < tol["h"] and err_base > 100 * tol["h"]
    t.add(
        "anchor_sft",
        ok,
        f"'ref' adapter == SFT adapter: {same}, frozen: {frozen}; rollout reference vs the scorer "
        f"with 'ref': max |d| {err_ref:.2e}, vs the disabled base: {err_base:.2e}",
        "the reference is not the SFT model: see apply_anchor in sage_unsloth/rlvr/run.py",
    )


def check_anchor_base(t: SelfTest, work: Path, sft: Path, data: Path, cpu: bool, tol: dict) -> None:
    built = build(work, t.backend, sft, data, anchor="base", steps=1, cpu=cpu, checkpointing=not cpu)
    rec = Recorder(built.trainer)
    built.trainer.train()
    batch = rec.rollouts[0]
    raw = batch["ref_per_token_logps"]
    scored = raw != 0
    err_base = _max_diff(scored_reference(built.trainer, batch, None), raw, scored)
    err_policy = _max_diff(scored_reference(built.trainer, batch, "default"), raw, scored)
    adapters = list(built.model.peft_config)
    ok = "ref" not in adapters and err_base < tol["h"] and err_policy > 100 * tol["h"]
    t.add(
        "anchor_base",
        ok,
        f"adapters {adapters}; rollout reference vs the disabled base: max |d| {err_base:.2e}, "
        f"vs the policy: {err_policy:.2e}" + ("; Unsloth gradient checkpointing on" if not cpu else ""),
        "anchor base must score the adapter-disabled base: see apply_anchor in sage_unsloth/rlvr/run.py",
    )


def check_lora_sync(t: SelfTest, built) -> None:
    """Unsloth's own load_lora(load_tensors=True), as its vLLM sync calls it, before and after the kit hides
    the 'ref' adapter: the tensors it would hand vLLM."""
    import importlib.util

    import torch
    from unsloth_zoo import vllm_utils  # probes find_spec("vllm") on import: before any stand-in

    from sage_unsloth.rlvr.run import hide_adapter_from_vllm_sync

    model = built.model
    real_vllm = "vllm" not in sys.modules or sys.modules["vllm"] is not None
    real_vllm = real_vllm and importlib.util.find_spec("vllm") is not None
    saved = {name: sys.modules.get(name, "absent") for name in ("vllm", "vllm.lora", "vllm.lora.request")}
    if (
        not real_vllm
    ):  # a CPU training process hides vLLM (runtime/backend.py): stand in for vLLM's LoRARequest

        class LoRARequest:
            def __init__(self, name, id, path=None, lora_tensors=None, lora_config=None):
                self.lora_tensors, self.lora_config = lora_tensors, lora_config

        request = types.ModuleType("vllm.lora.request")
        request.LoRARequest = LoRARequest
        sys.modules.update(
            {
                "vllm": types.ModuleType("vllm"),
                "vllm.lora": types.ModuleType("vllm.lora"),
                "vllm.lora.request": request,
            }
        )
    try:
        if getattr(vllm_utils, "LORA_REQUEST_ID", None) is None:
            vllm_utils.LORA_REQUEST_ID = None
        model.load_lora = functools.partial(
            vllm_utils.load_lora, model
        )  # what patch_peft_fast_inference installs
        try:
            leaked = sum(
                ".ref." in k
                for k in model.load_lora(str(t.work / "lora_raw"), load_tensors=True).lora_tensors
            )
        except Exception as exc:  # noqa: BLE001 - vLLM-side validation may refuse the foreign tensors
            leaked = f"refused ({type(exc).__name__})"
        hide_adapter_from_vllm_sync(model)
        sent = model.load_lora(str(t.work / "lora_hidden"), load_tensors=True).lora_tensors
        policy = {
            k.replace(".default", ""): v
            for k, v in model.state_dict().items()
            if ".default." in k and (".lora_A." in k or ".lora_B." in k)
        }
        equal = set(sent) == set(policy) and all(torch.equal(sent[k], policy[k]) for k in sent)
        restored = any(".ref." in k for k in model.state_dict())
    finally:
        for name, module in saved.items():
            if module == "absent":
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    ok = equal and restored and leaked != 0
    t.add(
        "lora_sync",
        ok,
        f"{'vLLM' if real_vllm else 'stand-in'} LoRARequest: without hiding 'ref' tensors "
        f"sent: {leaked}; with hide_adapter_from_vllm_sync {len(sent)} tensors == the policy adapter: {equal}; "
        f"'ref' restored afterwards: {restored}",
        "vLLM would receive the frozen 'ref' adapter: see hide_adapter_from_vllm_sync in sage_unsloth/rlvr/run.py",
    )


# ----------------------------------------------------------------------------------------------- main
def run(work: Path, backend: str, quick: bool = False) -> list[Check]:
    import torch

    cpu = not torch.cuda.is_available()
    prepare_backend(backend, cpu)
    from safetensors.torch import load_file

    t = SelfTest(work, backend)
    tol = TOLERANCE["cpu" if cpu else "gpu"]
    if cpu and backend == "unsloth":
        cpu_stand_in_loader()
    sft, data = make_sft_run(work)
    sft_tensors = load_file(str(sft / "adapter_model.safetensors"))
    steps = 1 if quick else 2
    built = t.guarded("build", build, work, backend, sft, data, anchor="sft", steps=steps, cpu=cpu)
    if built is None:
        return t.checks
    t.guarded("patched", check_patched, t, built.trainer)
    rec = Recorder(built.trainer)
    if t.guarded("trains", built.trainer.train) is None and not rec.losses:
        return t.checks
    t.guarded("trains", check_trains, t, built, sft_tensors, rec, steps)
    t.guarded("q_in_loss", check_q_in_loss, t, built, rec, tol)
    t.guarded("q_source", check_q_source, t, built, rec, tol)
    if quick:
        return t.checks
    t.guarded("anchor_sft", check_anchor_sft, t, built, sft_tensors, rec, tol)
    if backend == "unsloth":
        t.guarded("lora_sync", check_lora_sync, t, built)
    del built
    t.guarded("anchor_base", check_anchor_base, t, work, sft, data, cpu, tol)
    return t.checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--backend", choices=("unsloth", "trl"), default="unsloth")
    parser.add_argument("--json", help="write the checks here")
    parser.add_argument(
        "--quick", action="store_true", help="1 step; patched, trains, q_in_loss, q_source only"
    )
    args = parser.parse_args(argv)
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # Unsloth writes its unsloth_compiled_cache/ into the working directory
    start = time.time()
    checks = run(work, args.backend, args.quick)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"seconds": round(time.time() - start, 1), "checks": [c.to_dict() for c in checks]}, indent=1
            )
        )
    return 0 if checks and all(c.status != "FAIL" for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
