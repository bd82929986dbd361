"""One stage run of the acceptance check, in its own process, with the faults the check injects:

    python -m sage_unsloth.acceptance.stage [--forced-cpu] [--kill-at-save N] [--poison-step N] [--record FILE] \
        {sft,rlvr} CONFIG [--key value ...]

- ``--forced-cpu``: Unsloth's GPU-only trainer rewrites forced onto this CPU first (sage_unsloth/acceptance/forced.py);
- ``--kill-at-save N``: the process SIGKILLs itself right after checkpoint-N is written (nothing else of the run
  reaches the disk: a crash, not an exit);
- ``--poison-step N``: the loss of step N is NaN (what a fault in the forward or the batch gives); the kit's step
  guard must refuse that step (sage_unsloth/runtime/finite_steps.py);
- ``--varied-reward``: a reward that differs between completions (a random model never answers right, so the real
  reward is 0 everywhere and every advantage 0): the policy term is trained too;
- ``--record FILE``: after the stage returns, its exit code, seconds, the peak GPU memory of this process and what
  sage_unsloth/acceptance/evidence.py recorded about the code paths it ran.

Otherwise this is the stage's own command line (sage_unsloth/sft/run.py, sage_unsloth/rlvr/run.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def kill_at_save(step: int) -> None:
    """SIGKILL this process as soon as the Trainer has written checkpoint-``step`` (its on_save)."""
    from transformers.trainer_callback import CallbackHandler

    on_save = CallbackHandler.on_save

    def then_die(self, args, state, control):
        control = on_save(self, args, state, control)
        if state.global_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return control

    CallbackHandler.on_save = then_die


def poison_step(stage: str, step: int) -> None:
    """Make the loss of optimizer step ``step`` NaN, in the trainer class the stage will build on (trl's SFTTrainer
    or GRPOTrainer as looked up now: Unsloth's where it has patched them)."""
    from sage_unsloth import compat

    base = compat.current_sft_trainer_class() if stage == "sft" else compat.current_grpo_trainer_class()
    compute_loss = base.compute_loss

    def poisoned(self, model, inputs, *args, **kwargs):
        loss = compute_loss(self, model, inputs, *args, **kwargs)
        if self.state.global_step + 1 == step:
            loss = loss * float("nan")
        return loss

    base.compute_loss = poisoned


def varied_reward(prompts, completions, answer=None, **kwargs):
    """Deterministic, different between completions: (sum of the completion's character codes mod 3) / 2."""
    from sage_unsloth.rlvr import reward

    return [float(sum(map(ord, reward.completion_text(c))) % 3) / 2.0 for c in completions]


varied_reward.__name__ = "correctness"


def peak_memory() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"peak_allocated_gib": None, "peak_reserved_gib": None}
    return {
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sage_unsloth.acceptance.stage", allow_abbrev=False)
    parser.add_argument("--forced-cpu", action="store_true")
    parser.add_argument("--kill-at-save", type=int)
    parser.add_argument("--poison-step", type=int)
    parser.add_argument("--varied-reward", action="store_true")
    parser.add_argument("--record", type=Path)
    parser.add_argument("stage", choices=("sft", "rlvr"))
    args, stage_argv = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    started = time.time()
    if args.forced_cpu:
        from sage_unsloth.acceptance.forced import force_on_cpu

        force_on_cpu()
    else:
        from sage_unsloth.runtime.backend import cuda_available, import_unsloth

        if cuda_available():
            import_unsloth()  # before TRL, as the stages do on a GPU: the poisoned class is Unsloth's
    if args.kill_at_save is not None:
        kill_at_save(args.kill_at_save)
    if args.poison_step is not None:
        poison_step(args.stage, args.poison_step)
    if args.varied_reward:
        from sage_unsloth.rlvr import reward

        reward.correctness_reward = varied_reward  # looked up when the stage builds its trainer
    from sage_unsloth.acceptance import evidence

    seen: dict = {}
    evidence.record_training(seen)
    if args.stage == "sft":
        from sage_unsloth.sft.run import main as stage_main
    else:
        from sage_unsloth.rlvr.run import main as stage_main
    code = stage_main(stage_argv)
    if args.record is not None:
        record = {"exit": code, "seconds": round(time.time() - started, 1), **peak_memory()}
        record.update(evidence.summary(seen, args.stage))
        args.record.write_text(json.dumps(record, default=str) + "\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
