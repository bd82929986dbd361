"""Tiny RLVR runs shared by the pytest process and the processes that ``accelerate launch`` starts.

Importable helpers (conftest.py, tests/test_rlvr_resume.py, tests/test_rlvr_multiprocess.py): the stage-1
folder, the reward that gives GRPO a signal on a random model, the run / compare helpers. As a script it
is one rank of a multi-process run: ``accelerate launch --num_processes 2 tests/rlvr_scenario.py MODE ...``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIGS = REPO / "configs" / "rlvr" / "tiny-cpu"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Logged values that measure time, not training (never equal between two runs).
TIMING_KEYS = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def build_sft_dir(tiny_model_dir, out: Path) -> Path:
    """A stage-1 folder: a non-zero LoRA on the tiny model (so SFT model != base), tokenizer, manifest."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sage_unsloth.manifest import write_manifest

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM",
                        init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    write_manifest(out, stage="sft", config={}, seed=0, base_model=str(tiny_model_dir), adapter=True)
    return out


def text_reward(prompts, completions, answer=None, **kwargs):
    """The random tiny model never answers correctly, so the real reward is 0 everywhere and every
    advantage vanishes; a deterministic reward that differs between completions gives GRPO a signal."""
    from sage_unsloth.rlvr import reward

    texts = [reward.completion_text(c) for c in completions]
    return [float(sum(map(ord, t)) % 3) / 2.0 for t in texts]


text_reward.__name__ = "correctness"


def use_text_reward() -> None:
    from sage_unsloth.rlvr import reward

    reward.correctness_reward = text_reward


def rlvr_argv(variant: str, sft_dir, out_root, dataset, *extra) -> list[str]:
    return [str(TINY_CONFIGS / f"{variant}.yaml"), "--sft_dir", str(sft_dir), "--output_root", str(out_root),
            "--dataset_path", str(dataset), *extra]


class Interrupted(Exception):
    """Stands for a kill: raised from a callback at a chosen step."""


def stop_callback(step: int, when: str):
    """A callback raising Interrupted at ``step``: ``when='step_end'`` after the optimizer step but before
    that step's checkpoint is written (a kill between checkpoints), ``'save'`` right after it is written."""
    from transformers import TrainerCallback

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if when == "step_end" and state.global_step == step:
                raise Interrupted(step)

        def on_save(self, args, state, control, **kwargs):
            if when == "save" and state.global_step == step:
                raise Interrupted(step)

    return StopAt()


def train(argv: list[str], stop: tuple[int, str] | None = None):
    """Build stage 2 from ``argv`` and train it; with ``stop``, interrupt it there. Returns the built stage."""
    from sage_unsloth.rlvr.run import build_stage, parse_args

    built = build_stage(*parse_args(argv))
    if stop is not None:
        built.trainer.add_callback(stop_callback(*stop))
        try:
            built.train_and_save()
        except Interrupted:
            return built
        raise AssertionError(f"the run was not interrupted at {stop}")
    built.train_and_save()
    return built


def logged_steps(folder: Path) -> list[dict]:
    """Per-step log entries of a checkpoint's trainer_state.json, without the wall-clock ones."""
    history = json.loads((Path(folder) / "trainer_state.json").read_text())["log_history"]
    return [{k: v for k, v in entry.items() if k not in TIMING_KEYS} for entry in history]


def max_abs_difference(a: dict, b: dict) -> float:
    """Largest |a - b| over same-named tensors (inf if the names differ)."""
    if a.keys() != b.keys():
        return float("inf")
    return max(((a[k].double() - b[k].double()).abs().max().item() for k in a), default=0.0)


def optimizer_tensors(folder: Path) -> dict:
    import torch

    saved = torch.load(Path(folder) / "optimizer.pt", weights_only=True)
    return {f"{i}.{name}": value for i, state in saved["state"].items() for name, value in state.items()
            if isinstance(value, torch.Tensor)}


def adapter_tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "adapter_model.safetensors"))


# ------------------------------------------------------------------------------------------ one rank
def _rank_main(mode: str, argv: list[str]) -> None:
    """One process of ``accelerate launch``: ``train`` (optionally ``--stop STEP:WHEN``) or ``resume``."""
    os.environ.setdefault("UNSLOTH_SKIP_TORCHVISION_CHECK", "1")
    use_text_reward()
    stop = None
    if "--stop" in argv:
        i = argv.index("--stop")
        step, when = argv[i + 1].split(":")
        stop, argv = (int(step), when), argv[:i] + argv[i + 2:]
    if mode == "resume":
        argv = [*argv, "--resume"]
    train(argv, stop)


if __name__ == "__main__":
    _rank_main(sys.argv[1], sys.argv[2:])
