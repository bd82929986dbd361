"""P1 against TRL: the kit's plain GRPO (beta 0.05, no guide) against ``trl.GRPOTrainer`` driven directly with the
same GRPOConfig, LoRA, prompts and reward, interleaved, CPU time per step side by side.

Both arms train the same tiny random Qwen2 (sage_unsloth/model/tiny.py) with the same LoRA (TRL wraps it from
``peft_config``), prompts, reward, seed and GRPOConfig fields: the kit's arm is ``SageGRPOTrainer`` over a
``SageGRPOConfig``, TRL's arm ``trl.GRPOTrainer`` over a plain ``trl.GRPOConfig`` built from the same keyword
arguments (the script checks that every GRPOConfig field agrees). TRL 1.15 cannot score on a CPU without Triton
(its fused LM head is None there), so both arms use the kit's CPU fallback (compat.install_cpu_logprob_fallback:
the same chunked log-softmax in both). The arms must agree step for step: the same losses, bit for bit, or the
script says so and exits 1 (a timing of two different computations means nothing).

Runs alternate (kit, TRL, TRL, kit, ...), each ``--steps`` optimizer steps after ``--warmup`` steps it drops, in one
process and one torch thread, so load on a shared machine hits both arms alike; per run the median step's CPU time
(this process's user + system) and the median loss side (``compute_loss``: the forward, the loss, the kit's steps
in the loss). Printed: each arm's median, the kit / TRL ratio of each adjacent pair with its median and its
min / max over the pairs, for the whole step and the loss side; and, since step i of the two arms of a pair is the
same computation, the median over a pair's steps of the step-by-step ratio (less exposed to a load that changes
within a run), again with its median, min and max over the pairs.

The kit's own work, timed directly on one more kit run: every method the kit's trainer classes define
(rlvr/trainer.py, rlvr/resume.py, runtime/checkpoints.py) is wrapped, and so is the library method each one overrides (and
the guard's clip, which is accelerate's clip op for op, with the guard's check inside it counted as the kit's); a
kit method's exclusive time (its own time less that of the wrapped calls inside it) is the kit's work, the rest is
TRL's and the model's. The
wrappers cost a few microseconds a call, counted as the kit's: the share printed is an upper bound.

    python benchmarks/bench_trl_anchor.py [--runs 6] [--steps 20] [--warmup 2] [--json out.json]

Targets (issue 51): kit / TRL CPU time per step <= 1.01 (median of the pairs) and the kit's own work <= 1% of a
plain step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARMS = ("kit", "trl")


def _reward(completions, **kwargs):
    """Deterministic and varied across completions, so the group advantages are not all 0."""
    return [float(sum(map(ord, str(c))) % 5) / 4.0 for c in completions]


def grpo_fields(args, out: Path) -> dict:
    """The GRPOConfig keyword arguments both arms get (every value the kit pins differently from TRL is set)."""
    return {
        "output_dir": str(out),
        "beta": 0.05,
        "loss_type": "grpo",
        "scale_rewards": "group",
        "use_bias_correction_kl": False,
        "num_generations": 8,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "num_iterations": 1,
        "max_completion_length": args.completion_length,
        "temperature": 1.0,
        "top_p": 1.0,
        "min_p": 0.01,
        "epsilon": 0.2,
        "learning_rate": 1e-4,
        "lr_scheduler_type": "constant",
        "weight_decay": 0.01,
        "optim": "adamw_torch",
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_max": 2.0,
        "max_steps": args.warmup + args.steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "seed": 0,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def configs(args, out: Path):
    """(the kit's SageGRPOConfig, TRL's GRPOConfig) from the same fields; every GRPOConfig field must agree."""
    from trl.trainer.grpo_config import GRPOConfig

    from sage_unsloth.rlvr.config import SageGRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kit = SageGRPOConfig(**grpo_fields(args, out / "kit"), backend="trl")
        trl = GRPOConfig(**grpo_fields(args, out / "trl"))
    differ = {
        f.name
        for f in dataclasses.fields(GRPOConfig)
        if f.name not in ("output_dir", "logging_dir") and getattr(kit, f.name) != getattr(trl, f.name)
    }
    if differ:
        raise SystemExit(f"the two GRPOConfigs differ in {sorted(differ)}: set them in grpo_fields")
    assert not kit.method_plan.guided and kit.method_plan.steps(unsloth_patched=False) == ((), (), ())
    return kit, trl


class StepClock:
    """CPU and wall time of each optimizer step, and of the loss side (compute_loss) within it."""

    def __init__(self, trainer):
        from transformers import TrainerCallback

        self.steps: list[tuple[float, float, float]] = []
        self.loss_cpu = 0.0
        clock = self

        class Callback(TrainerCallback):
            def on_step_begin(self, *_, **__):
                clock.start, clock.cpu, clock.loss_cpu = time.perf_counter(), time.process_time(), 0.0

            def on_step_end(self, *_, **__):
                wall, cpu = time.perf_counter() - clock.start, time.process_time() - clock.cpu
                clock.steps.append((cpu, wall, clock.loss_cpu))

        compute_loss = trainer.compute_loss

        def timed_loss(*a, **k):
            start = time.process_time()
            try:
                return compute_loss(*a, **k)
            finally:
                clock.loss_cpu += time.process_time() - start

        trainer.compute_loss = timed_loss
        trainer.add_callback(Callback())


def build(arm: str, model_dir: Path, config, prompts):
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOTrainer

    from sage_unsloth.compat import install_cpu_logprob_fallback
    from sage_unsloth.rlvr.trainer import SageGRPOTrainer

    install_cpu_logprob_fallback()  # both arms: TRL's fused LM head is None without Triton
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
    rows = [{"prompt": [{"role": "user", "content": p}]} for p in prompts]
    same = {
        "reward_funcs": _reward,
        "train_dataset": Dataset.from_list(rows),
        "peft_config": lora,
    }  # both arms'
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make = SageGRPOTrainer if arm == "kit" else GRPOTrainer
        trainer = make(model=model, args=config, processing_class=tokenizer, **same)
    for quiet in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(quiet)
    return trainer


def run(arm: str, model_dir: Path, config, prompts, warmup: int) -> dict:
    trainer = build(arm, model_dir, config, prompts)
    clock = StepClock(trainer)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    kept = clock.steps[warmup:]
    return {
        "steps_cpu": [s[0] for s in kept],
        "step_cpu": statistics.median(s[0] for s in kept),
        "step_wall": statistics.median(s[1] for s in kept),
        "loss_cpu": statistics.median(s[2] for s in kept),
        "losses": losses,
        "steps": len(kept),
    }


# ---------------------------------------------------------------------------------------------- the kit's own work
class ExclusiveClock:
    """Exclusive CPU time of wrapped functions: each call's time less that of the wrapped calls inside it."""

    def __init__(self):
        self.kit = 0.0
        self.other = 0.0
        self.by_name: dict[str, float] = {}  # a kit method's exclusive CPU time over the run
        self._stack: list[float] = []  # time of wrapped calls inside the current one

    def wrap(self, fn, kit: bool):
        clock = self
        name = getattr(fn, "__qualname__", repr(fn))

        def timed(*a, **k):
            start = time.process_time()
            clock._stack.append(0.0)
            try:
                return fn(*a, **k)
            finally:
                inside = clock._stack.pop()
                elapsed = time.process_time() - start
                if kit:
                    clock.kit += elapsed - inside
                    clock.by_name[name] = clock.by_name.get(name, 0.0) + elapsed - inside
                else:
                    clock.other += elapsed - inside
                if clock._stack:
                    clock._stack[-1] += elapsed

        timed.__wrapped__ = fn
        return timed


def kit_own_work(model_dir: Path, config, prompts, warmup: int) -> dict:
    """One kit run with every kit method and the method it overrides wrapped: the kit's exclusive CPU time per
    step against the step's CPU time."""
    from sage_unsloth import compat
    from sage_unsloth.rlvr.resume import ExactResumeMixin
    from sage_unsloth.rlvr.trainer import SageTrainerMixin
    from sage_unsloth.runtime import checkpoints
    from sage_unsloth.runtime.checkpoints import CheckpointMixin

    clock = ExclusiveClock()
    trainer = build("kit", model_dir, config, prompts)
    kit_classes = (SageTrainerMixin, ExactResumeMixin, CheckpointMixin)
    library = [c for c in type(trainer).__mro__ if c not in kit_classes and c is not type(trainer)]
    restore = []

    def patch(owner, name, kit):
        original = vars(owner)[name]
        setattr(owner, name, clock.wrap(original, kit))
        restore.append((owner, name, original))

    for cls in kit_classes:
        for name, value in list(vars(cls).items()):
            if (
                not callable(value)
                or isinstance(value, (type, staticmethod, classmethod))
                or name.startswith("__")
            ):
                continue
            patch(cls, name, kit=True)
            owner = next((c for c in library if name in vars(c)), None)
            if owner is not None and callable(vars(owner)[name]):
                patch(owner, name, kit=False)
    # The guard's clip is accelerate's clip_grad_norm_ op for op (compat.clip_with_norm, tested bit for bit):
    # TRL's arm does the same work inside accelerate, so it counts as the library's; the guard's check of the
    # norm inside it is the kit's.
    for owner, name, kit in ((compat, "clip_with_norm", False), (checkpoints, "check_gradient_norm", True)):
        patch(owner, name, kit=kit)
    steps: list[tuple[float, float]] = []
    from transformers import TrainerCallback

    class Callback(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.cpu, self.kit = time.process_time(), clock.kit

        def on_step_end(self, *_, **__):
            steps.append((time.process_time() - self.cpu, clock.kit - self.kit))

    trainer.add_callback(Callback())
    try:
        trainer.train()
    finally:
        for owner, name, original in reversed(restore):
            setattr(owner, name, original)
    kept = steps[warmup:]
    shares = [kit / step for step, kit in kept]
    top = sorted(clock.by_name.items(), key=lambda item: -item[1])[:5]
    return {
        "top": [(name, seconds * 1000 / len(steps)) for name, seconds in top],
        "kit_ms": statistics.median(k for _, k in kept) * 1000,
        "step_ms": statistics.median(s for s, _ in kept) * 1000,
        "share_median": statistics.median(shares),
        "share_min": min(shares),
        "share_max": max(shares),
    }


def _spread(values) -> str:
    return (
        f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f}, {len(values)} pairs)"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="runs per arm (interleaved)")
    parser.add_argument("--steps", type=int, default=20, help="measured optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of each run")
    parser.add_argument("--completion-length", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args(argv)

    import torch
    from transformers.utils import logging as hf_logging

    from sage_unsloth.model.tiny import build_tiny_model

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    prompts = [f"Compute {i} * {i + 3} and explain the steps." for i in range(64)]
    load = os.getloadavg()
    results: dict[str, list] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", seed=0)
        kit_config, trl_config = configs(args, Path(tmp))
        config = {"kit": kit_config, "trl": trl_config}
        for i in range(args.runs):
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                results[arm].append(run(arm, model_dir, config[arm], prompts, args.warmup))
                print(
                    f"run {i} {arm}: median step {results[arm][-1]['step_cpu'] * 1000:.1f} ms CPU", flush=True
                )
        own = kit_own_work(model_dir, kit_config, prompts, args.warmup)
    load_after = os.getloadavg()
    same = all(k["losses"] == t["losses"] for k, t in zip(results["kit"], results["trl"]))
    step_ratio = [k["step_cpu"] / t["step_cpu"] for k, t in zip(results["kit"], results["trl"])]
    loss_ratio = [k["loss_cpu"] / t["loss_cpu"] for k, t in zip(results["kit"], results["trl"])]
    # The arms' step i is the same computation (same completions, same losses): its ratio, step by step, within a pair
    matched = [
        statistics.median(a / b for a, b in zip(k["steps_cpu"], t["steps_cpu"]))
        for k, t in zip(results["kit"], results["trl"])
    ]
    lines = [
        (
            f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} at the start, {load_after[0]:.1f} at the "
            f"end; torch threads {args.threads}; {args.runs} runs per arm of {args.steps} steps (+{args.warmup} dropped)"
        ),
        "both arms score with the kit's CPU fallback (TRL 1.15's fused LM head needs Triton)",
        f"losses identical step for step in every pair: {'yes' if same else 'NO'}",
        *(
            f"{arm:>3}: median step {statistics.median(r['step_cpu'] for r in results[arm]) * 1000:7.1f} ms CPU, "
            f"{statistics.median(r['step_wall'] for r in results[arm]) * 1000:7.1f} ms wall; loss side "
            f"{statistics.median(r['loss_cpu'] for r in results[arm]) * 1000:6.1f} ms CPU"
            for arm in ARMS
        ),
        f"kit / TRL CPU time per step: {_spread(step_ratio)} (target <= 1.01)",
        f"kit / TRL CPU time per step, step i against step i of its pair: {_spread(matched)}",
        f"kit / TRL CPU time of the loss side: {_spread(loss_ratio)}",
        (
            f"the kit's own work, timed directly: {own['kit_ms']:.2f} ms of a {own['step_ms']:.1f} ms step, "
            f"{own['share_median']:.2%} (min {own['share_min']:.2%}, max {own['share_max']:.2%} over the steps; "
            "target <= 1%)"
        ),
        "  of which: "
        + ", ".join(f"{name} {ms:.2f} ms" for name, ms in own["top"])
        + " (per step, over the run)",
    ]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"runs": results, "step_ratio": step_ratio, "loss_ratio": loss_ratio, "own": own}, indent=1
            )
        )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
