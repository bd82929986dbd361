"""SAGE-branch vs plain GRPO on both trainer stacks: model forward passes and step time per optimizer step,
measured side by side in one run per backend.

Tiny random Qwen2 + LoRA on CPU, transformers generation inside the trainer. Backends:

- ``trl``: TRL 1.15's GRPOTrainer (this process);
- ``unsloth``: Unsloth 2026.10.9's generated UnslothGRPOTrainer, its patching forced onto the CPU in a child
  process as tests/rlvr/test_rlvr_trainer.py's canary does (PrefixGrouper off: a plain transformers model ignores
  its prefix_seg_info; sequence packing off: its re-verification adds forwards that depend on the rollout
  lengths, for every variant alike; float32 loss).

Variants per backend (``--variants sage``, the default): ``plain`` (guide none), ``branch`` (the default q
source: in the loss, from the entropies of the loss's own forward, on both backends), ``branch-rollout``
(sage_q_source rollout: q from the rollout policy, one extra no-grad pass; what the Unsloth backend did before q
went into its loss), ``ref_branch`` (the branch formula on the reference's entropy, an extension beyond the paper:
its entropies come from the reference pass the KL runs anyway, so 0 extra passes; TRL only, Unsloth refuses it).

``--variants exploration`` (TRL backend; docs/methods.md): ``plain`` against the exploration baselines,
``entropy_adv``, ``high_entropy`` (top_entropy_quantile 0.2), ``clip_cov``, ``kl_cov``, ``passk`` (k 4 of 8),
``ref_reset`` (every step: the worst case). KL-Cov needs pi_old != pi, so this set runs 16 rollouts per
generation (steps_per_generation 2) for every variant unless --generation-batch-size says otherwise.

The variants take one generation cycle each in turn, so load changes on a shared machine hit all alike; the
warm-up cycle is dropped and medians are reported, as wall time and as this process's CPU time (steadier on
a shared machine). Forward passes are counted by a pre-hook on the decoder: with a KV cache
(``past_key_values``) it is generation, without it scoring (reference, old-logp, loss and any SAGE pass).

    python benchmarks/bench_rlvr_step.py [--backend both|trl|unsloth] [--steps 7] [--completion-length 32]

Target: branch / plain step-time ratio <= 1.02 and 0 extra scoring passes per step, on both backends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("UNSLOTH_SKIP_TORCHVISION_CHECK", "1")

# label -> SageGRPOConfig fields of the variant, per --variants set
VARIANT_SETS = {
    "sage": {
        "plain": {},
        "branch": {"guide": "branch"},
        "branch-rollout": {"guide": "branch", "sage_q_source": "rollout"},
        "ref_branch": {"guide": "ref_branch"},
    },
    "exploration": {
        "plain": {},
        "entropy_adv": {"policy_term": "entropy_adv"},
        "high_entropy": {"top_entropy_quantile": 0.2},
        "clip_cov": {"policy_term": "clip_cov"},
        "kl_cov": {"policy_term": "kl_cov"},
        "passk": {"advantage_estimator": {"name": "passk", "k": 4}},
        "ref_reset": {"ref_reset_steps": 1},
    },
}
RATIO_TARGETS = {"branch": " (target <= 1.02 for branch)"}
# Variants a backend refuses before loading (guides.unsloth_cannot): reported as refused, not run.
REFUSED = {"unsloth": {"ref_branch": "its reference scorer returns no entropies"}}
# Sequence packing off too: Unsloth re-verifies its packed forward with one extra forward per row whenever a
# batch is longer than any verified before, so that count follows each variant's rollout lengths, not SAGE.
UNSLOTH_CPU_ENV = {
    "UNSLOTH_ALLOW_CPU": "1",
    "UNSLOTH_COMPILE_DISABLE": "1",
    "UNSLOTH_GRPO_PREFIX_GROUPER": "0",
    "UNSLOTH_GRPO_SEQ_PACKING": "0",
}


def _reward(completions, **kwargs):
    return [float(len(str(c)) % 5) for c in completions]


class ForwardCounter:
    """Decoder forwards: with a KV cache (generation) or without (scoring, any trainer's and the kit's)."""

    def __init__(self, module):
        self.generation = self.scoring = 0
        module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if kwargs.get("past_key_values") is not None:
            self.generation += 1
        else:
            self.scoring += 1


def force_unsloth_patching() -> None:
    for key, value in UNSLOTH_CPU_ENV.items():
        os.environ[key] = value
    from sage_unsloth.runtime.backend import import_unsloth

    import_unsloth()
    import unsloth.models.rl as unsloth_rl

    unsloth_rl._patch_trl_rl_trainers("grpo_trainer")  # private: what `import unsloth` does on a GPU


def build(model_dir: Path, out_dir: Path, label: str, overrides: dict, args, unsloth: bool):
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from sage_unsloth.rlvr.config import SageGRPOConfig
    from sage_unsloth.rlvr.trainer import SageGRPOTrainer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
    if unsloth:  # what a FastLanguageModel model carries: its mode switches and the float32 stamp
        model.for_training = model.for_inference = lambda *a, **k: None
        model._unsloth_user_float32 = True
    if unsloth or overrides.get(
        "ref_reset_steps"
    ):  # a PeftModel: TRL adds the frozen "ref" copy the reset needs
        model, lora = get_peft_model(model, lora), None
    prompts = [f"Compute {i} * {i + 3} and explain the steps." for i in range(32)]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = SageGRPOConfig(
            output_dir=str(out_dir / label),
            backend="trl",
            beta=0.05,
            use_cpu=True,
            optim="adamw_torch",
            per_device_train_batch_size=8,
            num_generations=8,
            generation_batch_size=args.generation_batch_size,
            max_completion_length=args.completion_length,
            max_steps=10_000,
            report_to="none",
            logging_steps=1_000_000,
            save_strategy="no",
            disable_tqdm=True,
            seed=0,
            **overrides,
        )
    trainer = SageGRPOTrainer(
        model=model,
        reward_funcs=_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
    )
    counter = ForwardCounter(trainer.model.get_base_model().model)
    times: list[tuple[float, float]] = []
    forwards: list[tuple[float, float, float]] = []

    class StepClock(TrainerCallback):
        """Time and forwards of one train() call (one generation cycle), per optimizer step."""

        start = None

        def on_step_begin(self, *_, **__):
            if self.start is None:
                self.start, self.cpu = time.perf_counter(), time.process_time()
                self.counts, self.steps = (
                    (counter.generation, counter.scoring, trainer.sage_forward_passes),
                    0,
                )

        def on_step_end(self, *_, **__):
            self.steps += 1
            self.end, self.cpu_end = time.perf_counter(), time.process_time()

        def on_train_end(self, *_, **__):
            n = self.steps
            times.append(((self.end - self.start) / n, (self.cpu_end - self.cpu) / n))
            forwards.append(
                (
                    (counter.generation - self.counts[0]) / n,
                    (counter.scoring - self.counts[1]) / n,
                    (trainer.sage_forward_passes - self.counts[2]) / n,
                )
            )
            self.start = None

    trainer.add_callback(StepClock())
    for quiet in (PrinterCallback, ProgressCallback):  # one summary line per train() call is noise here
        trainer.remove_callback(quiet)
    return trainer, times, forwards


def measure(backend: str, args) -> dict:
    """Run every variant of one backend in this process; per variant the medians."""
    import torch
    from transformers.utils import logging as hf_logging

    from sage_unsloth.model.tiny import build_tiny_model

    unsloth = backend == "unsloth"
    if unsloth:
        force_unsloth_patching()
    hf_logging.set_verbosity_error()
    # One intra-op thread: the tiny model gains nothing from more, and OpenMP spin-waits on a busy machine
    # would inflate both the wall and the CPU time of every variant.
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # Unsloth writes its unsloth_compiled_cache/ into the working directory
        try:
            model_dir = build_tiny_model(Path(tmp) / "model", seed=0)
            variants = {
                label: build(model_dir, Path(tmp), label, overrides, args, unsloth)
                for label, overrides in VARIANT_SETS[args.variants].items()
                if label not in REFUSED.get(backend, {})
            }
            for step in range(args.steps + 1):
                for trainer, times, forwards in variants.values():
                    trainer.args.max_steps = trainer.args.steps_per_generation  # one generation cycle
                    trainer.train()
                    if step == 0:  # warm-up
                        times.clear()
                        forwards.clear()
        finally:
            os.chdir(cwd)
    rows = {}
    for label, (trainer, times, forwards) in variants.items():
        rows[label] = {
            "class": next(
                k.__name__
                for k in type(trainer).__mro__
                if k.__name__ in ("UnslothGRPOTrainer", "GRPOTrainer")
            ),
            "wall_s": statistics.median(t[0] for t in times),
            "cpu_s": statistics.median(t[1] for t in times),
            "generation_forwards": statistics.median(f[0] for f in forwards),
            "scoring_forwards": statistics.median(f[1] for f in forwards),
            "sage_extra_passes_per_step": statistics.median(f[2] for f in forwards),
            "q_in_loss": trainer.sage_q_in_loss,
            "steps": len(times),
        }
    return rows


def report(backend: str, rows: dict) -> list[str]:
    lines = []
    plain = rows["plain"]
    for label, row in rows.items():
        extra = row["scoring_forwards"] - plain["scoring_forwards"]
        lines.append(
            f"{backend:>7} {label:>14} ({row['class']}): median step {row['wall_s'] * 1000:7.1f} ms wall, "
            f"{row['cpu_s'] * 1000:7.1f} ms CPU over {row['steps']} steps; forwards/step "
            f"{row['generation_forwards']:.1f} generation + {row['scoring_forwards']:.1f} scoring "
            f"({extra:+.1f} vs plain; SAGE's own passes/step {row['sage_extra_passes_per_step']:.1f})"
        )
    for label in rows:
        if label == "plain":
            continue
        wall, cpu = (rows[label][key] / plain[key] for key in ("wall_s", "cpu_s"))
        lines.append(
            f"{backend:>7} {label} / plain step-time ratio: {wall:.3f} wall, {cpu:.3f} CPU"
            + RATIO_TARGETS.get(label, "")
        )
    for label, why in REFUSED.get(backend, {}).items():
        if label in VARIANT_SETS["sage"] and label not in rows:
            lines.append(f"{backend:>7} {label}: refused before loading ({why}), not run")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("both", "trl", "unsloth"), default="both")
    parser.add_argument(
        "--steps",
        type=int,
        default=7,
        help="measured generation cycles per variant (after 1 warm-up); a cycle is 1 step at GA = "
        "steps_per_generation = 1",
    )
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument(
        "--generation-batch-size",
        type=int,
        default=None,
        help="16 reproduces the official config (steps_per_generation 2 > GA 1)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--variants",
        choices=tuple(VARIANT_SETS),
        default="sage",
        help="sage: plain / branch / branch-rollout; exploration: plain / the exploration baselines (TRL only)",
    )
    parser.add_argument("--json", help="write the measurements here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.variants == "exploration":
        if args.backend == "unsloth":
            parser.error("--variants exploration runs on the TRL backend (policy terms need TRL's loss)")
        args.backend = "trl"
        args.generation_batch_size = args.generation_batch_size or 16  # KL-Cov needs pi_old != pi
    if args.child:  # one backend, results as JSON on stdout's last line
        print("BENCH-JSON " + json.dumps(measure(args.backend, args)), flush=True)
        return 0
    backends = ("trl", "unsloth") if args.backend == "both" else (args.backend,)
    results = {}
    for backend in backends:
        # Each backend in its own process: Unsloth's patching stays for the rest of a process.
        command = [
            sys.executable,
            __file__,
            "--child",
            "--backend",
            backend,
            "--steps",
            str(args.steps),
            "--completion-length",
            str(args.completion_length),
            "--threads",
            str(args.threads),
            "--variants",
            args.variants,
        ]
        if args.generation_batch_size:
            command += ["--generation-batch-size", str(args.generation_batch_size)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("BENCH-JSON ")), None)
        if done.returncode != 0 or line is None:
            print(done.stdout[-2000:] + done.stderr[-4000:], file=sys.stderr)
            return 1
        results[backend] = json.loads(line[len("BENCH-JSON ") :])
        print("\n".join(report(backend, results[backend])), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
