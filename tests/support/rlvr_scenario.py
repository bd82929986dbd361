"""Tiny RLVR runs shared by the pytest process and the processes that ``accelerate launch`` starts.

Importable helpers (conftest.py, tests/rlvr/test_rlvr_resume.py, tests/rlvr/test_rlvr_multiprocess.py): the stage-1
folder, the reward that gives GRPO a signal on a random model, the run / compare helpers, a fixed global
batch. As a script it is one rank of a multi-process run (see :func:`_rank_main`):
``accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 2 tests/support/rlvr_scenario.py ...``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIGS = REPO / "configs" / "rlvr" / "tiny-cpu"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Logged values that measure time, not training (never equal between two runs).
TIMING_KEYS = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def build_sft_dir(tiny_model_dir, out: Path) -> Path:
    """A stage-1 folder: a non-zero LoRA on the tiny model (so SFT model != base), tokenizer, manifest."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sage_unsloth.runtime.manifest import write_manifest

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM", init_lora_weights=False
    )
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
    return [
        str(TINY_CONFIGS / f"{variant}.yaml"),
        "--sft_dir",
        str(sft_dir),
        "--output_root",
        str(out_root),
        "--dataset_path",
        str(dataset),
        *extra,
    ]


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


def logged_lines(folder: Path) -> list[dict]:
    """The stage folder's log_history.jsonl entries, without the wall-clock keys."""
    from sage_unsloth.runtime.training_log import read_log_history

    return [{k: v for k, v in entry.items() if k not in TIMING_KEYS} for entry in read_log_history(folder)]


def max_abs_difference(a: dict, b: dict) -> float:
    """Largest |a - b| over same-named tensors (inf if the names differ)."""
    if a.keys() != b.keys():
        return float("inf")
    return max(((a[k].double() - b[k].double()).abs().max().item() for k in a), default=0.0)


def optimizer_tensors(folder: Path) -> dict:
    import torch

    saved = torch.load(Path(folder) / "optimizer.pt", weights_only=True)
    return {
        f"{i}.{name}": value
        for i, state in saved["state"].items()
        for name, value in state.items()
        if isinstance(value, torch.Tensor)
    }


def adapter_tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "adapter_model.safetensors"))


# ------------------------------------------------------------------------------------------ a fixed global batch
def fixed_global_batch(
    pad_token_id: int, vocab_size: int, rows: int = 4, prompt_len: int = 6, completion_len: int = 8
) -> dict:
    """A scored GRPO batch (what _generate_and_score_completions returns) that is the same on every rank:
    left-padded prompts, completions of unequal lengths, mixed-sign advantages, a reference away from the
    policy. The dapo normaliser ``num_items_in_batch`` is the global completion-token count, as TRL's."""
    import torch

    generator = torch.Generator().manual_seed(1234)
    prompt_ids = torch.randint(5, vocab_size, (rows, prompt_len), generator=generator)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_ids[1, :2], prompt_mask[1, :2] = pad_token_id, 0
    completion_ids = torch.randint(5, vocab_size, (rows, completion_len), generator=generator)
    lengths = torch.tensor([completion_len, 5, 7, 3][:rows])
    completion_mask = (torch.arange(completion_len)[None, :] < lengths[:, None]).long()
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5][:rows]),
        "num_items_in_batch": completion_mask.sum(),
        "ref_per_token_logps": -6.5 + 0.5 * torch.randn(rows, completion_len, generator=generator),
    }


def rank_slice(batch: dict, rank: int, world: int) -> dict:
    rows = batch["prompt_ids"].shape[0] // world
    return {k: v if v.ndim == 0 else v[rank * rows : (rank + 1) * rows] for k, v in batch.items()}


def fixed_batch_step(argv: list[str]) -> dict:
    """One optimizer step of the real Trainer (DDP under accelerate launch) on this rank's slice of
    :func:`fixed_global_batch` instead of generated completions. Returns the logged loss and q metrics,
    this rank's own q mean, and (on the main process) the synced gradients of the trainable parameters."""
    from transformers import TrainerCallback

    from sage_unsloth.rlvr.run import build_stage, parse_args

    built = build_stage(
        *parse_args([*argv, "--max_steps", "1", "--save_strategy", "no", "--max_grad_norm", "0"])
    )
    trainer, accelerator = built.trainer, built.trainer.accelerator
    tokenizer = built.tokenizer
    batch = fixed_global_batch(tokenizer.pad_token_id, built.model.get_input_embeddings().weight.shape[0])
    batch = {
        k: v.to(accelerator.device)
        for k, v in rank_slice(batch, accelerator.process_index, accelerator.num_processes).items()
    }
    trainer._generate_and_score_completions = lambda inputs: dict(batch)  # instead of sampling
    local = {}
    log_q = trainer.sage_log_q

    def record_local(q, mask):
        local["q_mean"] = q[mask.bool()].float().mean().item()
        return log_q(q, mask)

    trainer.sage_log_q = record_local
    grads = {}

    class Gradients(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            grads.update(
                {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
            )

    trainer.add_callback(Gradients())
    trainer.train()
    logged = next(e for e in trainer.state.log_history if "loss" in e)
    return {
        "loss": logged["loss"],
        "local_q_mean": local["q_mean"],
        **{k: logged[k] for k in ("sage/q_mean", "sage/q_min", "sage/q_max", "sage/frac_boosted", "kl")},
        "grads": grads if accelerator.is_main_process else None,
    }


def guide_noise(trainer, batch: dict) -> dict:
    """q of the token and random guides on the same completions, drawn with ``trainer``'s per-process
    generator at step 0 (the counters and the metric buffers are put back: the run itself is not disturbed)."""
    from sage_unsloth import compat
    from sage_unsloth.plugins import anchor

    noise = trainer._sage_noise["guide"]
    saved = noise.last_step, noise.calls
    metrics = compat.metrics(
        trainer, "train"
    )  # sage_q logs q: this probe's q must not enter step 1's averages
    logged = {name: list(values) for name, values in metrics.items()}
    try:
        logps, entropies, logits = trainer.sage_policy_stats(batch, None)
        policy = {"logps": logps, "entropies": entropies, "logits": logits}
        token = trainer.sage_q(batch, compat.loss_mask(batch), layout="trl", policy=policy)  # the run's guide
        random = anchor.random_guide(
            batch["completion_mask"],
            eps=0.5,
            sigma=0.15,
            generator=trainer.sage_noise("guide", trainer.args.guide_seed),
            q_min=0.6,
            q_max=1.4,
        )
    finally:
        noise.last_step, noise.calls = saved
        metrics.clear()
        metrics.update(logged)
    return {"token": token.cpu(), "random": random.cpu()}


# ------------------------------------------------------------------------------------------ one rank
def _load_storages_tagged_cpu_rank() -> None:
    """Multi-process CPU only (this test machine): transformers 5.17 resumes the optimizer with
    ``torch.load(map_location=args.device)``, which is "cpu:0" on a CPU rank and which torch.load refuses
    ("don't know how to restore data location ... cpu:0"); on GPUs it is "cuda:N" and loads. Teach
    torch.load that "cpu:N" is the CPU."""
    import torch

    def restore(storage, location):
        return storage if location.startswith("cpu:") else None

    torch.serialization.register_package(5, lambda storage: None, restore)


def _rank_main(out: Path, fixed_argvs: list[list[str]], run_argv: list[str]) -> None:
    """One process of ``accelerate launch``: the fixed-batch steps, then the RLVR run (a ``--resume`` in
    ``run_argv`` continues it), with the guide-noise probe before it trains. Writes OUT/rank<i>.pt."""
    import torch
    import torch.distributed as dist

    from sage_unsloth.rlvr.run import build_stage, parse_args

    use_text_reward()
    _load_storages_tagged_cpu_rank()
    result = {"fixed": [fixed_batch_step(argv) for argv in fixed_argvs]}
    built = build_stage(*parse_args(run_argv))
    accelerator = built.trainer.accelerator
    tokenizer = built.tokenizer
    batch = fixed_global_batch(tokenizer.pad_token_id, built.model.get_input_embeddings().weight.shape[0])
    result["noise"] = guide_noise(built.trainer, rank_slice(batch, 0, 2))  # the same rows on every rank
    result["output_dir"] = str(built.train_and_save())
    result["world"] = accelerator.num_processes
    torch.save(result, out / f"rank{accelerator.process_index}.pt")
    if dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ a killed run
KILL = "--kill-in-final-save"


def _killed_main(run_argv: list[str]) -> None:
    """One run SIGKILLed during its final save: after every checkpoint (the last one is its last step) and
    after the final adapter is written, before its manifest (which marks a finished run)."""
    import os
    import signal

    from sage_unsloth.rlvr.run import build_stage, parse_args
    from sage_unsloth.runtime import manifest

    use_text_reward()
    built = build_stage(*parse_args(run_argv))
    manifest.write_manifest = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
    built.train_and_save()
    raise AssertionError("the run was not killed in its final save")


if __name__ == "__main__":
    if sys.argv[1] == KILL:  # rlvr_scenario.py --kill-in-final-save RUN_ARGV_JSON
        _killed_main(json.loads(sys.argv[2]))
    # rlvr_scenario.py OUT FIXED_ARGV_JSON RUN_ARGV_JSON
    _rank_main(Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]))
