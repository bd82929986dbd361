"""SAGE-branch vs plain GRPO: training-step time and model forward passes per step, side by side in one run.

Tiny random Qwen2 + LoRA on CPU (TRL's trainer, transformers generation). The variants take one step
each in turn, so that drift in machine load hits all alike; the first step (warm-up) is dropped and the median of the rest is reported, as wall time and as this process's CPU time (steadier
when other jobs share the machine). Forward passes are counted with a forward hook on the
decoder, split into generation calls (KV cache in use) and scoring calls (full sequences, use_cache=False).

    python benchmarks/bench_rlvr_step.py [--steps 7] [--completion-length 32] [--generation-batch-size 16]

Target: branch / plain step-time ratio <= 1.10.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# label, sage_guide, sage_q_source. "branch" is what TRL's trainer runs (q from the loss forward's entropies);
# "branch-rollout" is the hook Unsloth's patched loss needs (one extra no-grad pass per generation batch).
VARIANTS = (("plain", "none", "auto"), ("branch", "branch", "auto"), ("branch-rollout", "branch", "rollout"))


def _reward(completions, **kwargs):
    return [float(len(str(c)) % 5) for c in completions]


class ForwardCounter:
    """Counts decoder forwards; TRL's scorer passes use_cache=False, generation runs with a KV cache."""

    def __init__(self, module):
        self.generation = self.scoring = 0
        module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if kwargs.get("use_cache") is False:
            self.scoring += 1
        else:
            self.generation += 1


def build(model_dir: Path, out_dir: Path, guide: str, q_source: str, args):
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from sage_unsloth.rlvr.config import SageGRPOConfig
    from sage_unsloth.rlvr.trainer import SageGRPOTrainer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompts = [f"Compute {i} * {i + 3} and explain the steps." for i in range(32)]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = SageGRPOConfig(
            output_dir=str(out_dir / f"{guide}-{q_source}"), backend="trl", sage_guide=guide, sage_q_source=q_source,
            beta=0.05, use_cpu=True,
            per_device_train_batch_size=8, num_generations=8, generation_batch_size=args.generation_batch_size,
            max_completion_length=args.completion_length, max_steps=10_000, report_to="none", logging_steps=1_000_000,
            save_strategy="no", disable_tqdm=True, seed=0,
        )
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
    trainer = SageGRPOTrainer(model=model, reward_funcs=_reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, peft_config=lora)
    counter = ForwardCounter(trainer.model.get_base_model().model)
    times: list[tuple[float, float]] = []
    forwards: list[tuple[int, int]] = []

    class StepClock(TrainerCallback):
        """Time and forwards of one train() call (one generation cycle), per optimizer step."""

        start = None

        def on_step_begin(self, *_, **__):
            if self.start is None:
                self.start, self.cpu = time.perf_counter(), time.process_time()
                self.counts, self.steps = (counter.generation, counter.scoring), 0

        def on_step_end(self, *_, **__):
            self.steps += 1
            self.end, self.cpu_end = time.perf_counter(), time.process_time()

        def on_train_end(self, *_, **__):
            n = self.steps
            times.append(((self.end - self.start) / n, (self.cpu_end - self.cpu) / n))
            forwards.append(((counter.generation - self.counts[0]) / n, (counter.scoring - self.counts[1]) / n))
            self.start = None

    trainer.add_callback(StepClock())
    for quiet in (PrinterCallback, ProgressCallback):  # one summary line per train() call is noise here
        trainer.remove_callback(quiet)
    return trainer, times, forwards


def run_round(trainer, steps: int) -> None:
    # A fresh train() call of `steps` steps on the same model; only the steps themselves are timed.
    trainer.args.max_steps = steps
    trainer.train()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=7,
                        help="measured generation cycles per variant (after 1 warm-up); a cycle is 1 step at GA = "
                             "steps_per_generation = 1")
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--generation-batch-size", type=int, default=None,
                        help="16 reproduces the official config (steps_per_generation 2 > GA 1)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch
    from transformers.utils import logging as hf_logging

    from sage_unsloth.testing import build_tiny_model

    hf_logging.set_verbosity_error()
    # One intra-op thread: the tiny model gains nothing from more, and OpenMP spin-waits on a busy machine
    # would inflate both the wall and the CPU time of every variant.
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", seed=0)
        variants = {label: build(model_dir, Path(tmp), guide, source, args) for label, guide, source in VARIANTS}
        # One generation cycle (steps_per_generation optimizer steps) of each variant in turn, so that load
        # changes on a shared machine hit all variants alike.
        for step in range(args.steps + 1):
            for trainer, times, forwards in variants.values():
                run_round(trainer, trainer.args.steps_per_generation)
                if step == 0:  # warm-up
                    times.clear()
                    forwards.clear()

    rows = {}
    for label, (trainer, times, forwards) in variants.items():
        gen = statistics.median(f[0] for f in forwards)
        score = statistics.median(f[1] for f in forwards)  # per optimizer step, averaged over a cycle
        wall, cpu = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
        rows[label] = (wall, cpu)
        print(f"{label:>14}: median step {wall * 1000:8.1f} ms wall, {cpu * 1000:8.1f} ms CPU over {len(times)} steps; "
              f"forwards/step: "
              f"{gen:.1f} generation + {score:.1f} scoring (SAGE extra no-grad passes so far: "
              f"{trainer.sage_forward_passes})")
    # CPU time of this process is the steadier measure on a shared machine; wall time is printed beside it.
    for label in ("branch", "branch-rollout"):
        wall_ratio, cpu_ratio = (rows[label][i] / rows["plain"][i] for i in (0, 1))
        print(f"{label} / plain GRPO step-time ratio: {wall_ratio:.3f} wall, {cpu_ratio:.3f} CPU (target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
