"""The acceptance check's verdicts, from what its stage runs left on disk and recorded (pure functions: the driver in
sage_unsloth/acceptance/run.py runs the stages, tests/kit/test_gpu_acceptance.py feeds these made-up runs too).

Each check returns ``(ok, detail)``: ``ok`` True, False, or None for a check that does not apply here (skipped);
``detail`` a small JSON-able dict, its ``line`` what the one-screen summary prints."""

from __future__ import annotations

import math
from pathlib import Path

from sage_unsloth.data.prompts import REASONING_START, SOLUTION_END
from sage_unsloth.model.tiny import EOS_TOKEN

SIGKILL_EXIT = -9  # subprocess's returncode of a process killed by SIGKILL
TIMING_KEYS = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
# Step-1 metrics of the packing on/off runs (the same rollout: the same seed and weights before step 1).
PACKING_METRICS = ("loss", "kl", "grad_norm", "sage/q_mean", "sage/q_min", "sage/q_max", "sage/frac_boosted")
# A resumed run whose adapter differs from the uninterrupted one by at most this many times the difference between
# two from-scratch runs of the same steps (GPU kernels that are not deterministic) is as exact as the GPU allows.
NOISE_FACTOR = 10.0


def rewrites(record: dict, trainer_class: str, steps: int, micro_steps_per_step: int) -> tuple[bool, dict]:
    """The run trained through Unsloth's rewritten training_step and inner loop and its generated trainer class."""
    functions, calls = record.get("functions", {}), record.get("calls", {})
    want_functions = {
        "training_step": "_unsloth_training_step",
        "_inner_training_loop": "_fast_inner_training_loop",
    }
    want_calls = {"training_step": steps * micro_steps_per_step, "_inner_training_loop": 1}
    ok = functions == want_functions and calls == want_calls and trainer_class in record.get("classes", [])
    line = f"{trainer_class} over {functions.get('training_step')} x{calls.get('training_step')}"
    return ok, {"functions": functions, "calls": calls, "classes": record.get("classes"), "line": line}


def assistant_only(record: dict) -> tuple[bool, dict]:
    """SFT's loss is on the assistant turn only: one span per row, after the prompt's ``<start_working_out>``, ending
    with the solution and the end-of-text token, which is the row's last real token."""
    spans = record.get("labelled") or []
    ok = bool(spans) and all(
        span["one_span"]
        and span["ends_at_last_token"]
        and span["labels_are_ids"]
        and span["before"].endswith(REASONING_START)
        and span["trained"].endswith(SOLUTION_END + EOS_TOKEN)
        and REASONING_START not in span["trained"]
        for span in spans
    )
    return ok, {"spans": spans, "line": f"{len(spans)} rows: loss on the assistant turn only" if ok else "no"}


def killed(run: dict, folder: Path, step: int) -> tuple[bool, dict]:
    """The run died of SIGKILL right after writing checkpoint-``step``: that checkpoint complete, nothing after it."""
    from sage_unsloth.runtime.checkpoints import checkpoint_problem

    names = sorted(p.name for p in folder.glob("checkpoint-*"))
    problem = checkpoint_problem(folder / f"checkpoint-{step}") if names else "no checkpoint"
    ok = run["exit"] == SIGKILL_EXIT and names == [f"checkpoint-{step}"] and problem is None
    ok = ok and not (folder / "manifest.json").exists()
    return ok, {
        "exit": run["exit"],
        "checkpoints": names,
        "problem": problem,
        "line": f"exit {run['exit']}, {names}",
    }


def guarded(run: dict, folder: Path, step: int, kept: int) -> tuple[bool, dict]:
    """The step guard refused the poisoned step ``step``: exit 1, one line naming it, checkpoint-``kept`` still the
    newest and complete, no checkpoint of the poisoned step or after, no final outputs."""
    from sage_unsloth.runtime.checkpoints import checkpoint_problem

    last = (run.get("stderr") or "").strip().splitlines()[-1:] or [""]
    names = sorted(p.name for p in folder.glob("checkpoint-*"))
    ok = (
        run["exit"] == 1
        and last[0].startswith(f"error: step {step}: the loss is nan")
        and names == [f"checkpoint-{kept}"]
        and checkpoint_problem(folder / f"checkpoint-{kept}") is None
        and not (folder / "manifest.json").exists()
    )
    return ok, {"exit": run["exit"], "last_line": last[0][:300], "checkpoints": names, "line": last[0][:100]}


def adapter_difference(a: Path, b: Path) -> float:
    """Largest |a - b| over the tensors of two adapter folders (inf when their tensor names differ)."""
    from safetensors.torch import load_file

    first, second = (
        load_file(str(a / "adapter_model.safetensors")),
        load_file(str(b / "adapter_model.safetensors")),
    )
    if first.keys() != second.keys():
        return math.inf
    return max(((first[k].double() - second[k].double()).abs().max().item() for k in first), default=0.0)


def resumed_exactly(
    run: dict, resumed: Path, uninterrupted: Path, killed_dir: Path, step: int
) -> tuple[bool, dict]:
    """The resumed run ends where the uninterrupted one did: the same final adapter (bit for bit; or, where two
    from-scratch runs of the first ``step`` steps already differ, the GPU's kernels are not deterministic, within
    :data:`NOISE_FACTOR` times that difference) and the same logged steps."""
    import json

    from sage_unsloth.runtime.training_log import read_log_history

    final = adapter_difference(resumed, uninterrupted)
    noise = adapter_difference(killed_dir / f"checkpoint-{step}", uninterrupted / f"checkpoint-{step}")
    manifest = (
        json.loads((resumed / "manifest.json").read_text()) if (resumed / "manifest.json").is_file() else {}
    )

    def steps(folder):
        return [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in read_log_history(folder)]

    same_log = steps(resumed) == steps(uninterrupted) if (resumed / "log_history.jsonl").is_file() else False
    within = final == 0.0 or (noise > 0.0 and final <= NOISE_FACTOR * noise)
    ok = run["exit"] == 0 and manifest.get("resumed_from") == f"checkpoint-{step}" and within
    ok = ok and (same_log or noise > 0.0)  # logged floats match only where the kernels are deterministic
    line = f"max |resumed - uninterrupted| {final:.3g} (two fresh runs at step {step}: {noise:.3g})"
    return ok, {"final_difference": final, "noise_at_step": noise, "same_log": same_log, "line": line}


def packing_equal(on: list[dict], off: list[dict], rtol: float) -> tuple[bool, dict]:
    """Step 1 of Unsloth's GRPO with sequence packing on and off: the same loss, KL, gradient norm and q."""
    first_on = next((e for e in on if e.get("step") == 1 and "loss" in e), {})
    first_off = next((e for e in off if e.get("step") == 1 and "loss" in e), {})
    differences = {}
    for key in PACKING_METRICS:
        a, b = first_on.get(key), first_off.get(key)
        differences[key] = None if a is None or b is None else abs(a - b) / max(abs(a), abs(b), 1e-12)
    ok = bool(first_on) and all(d is not None and d <= rtol for d in differences.values())
    worst = max((d for d in differences.values() if d is not None), default=math.inf)
    return ok, {
        "relative_differences": differences,
        "rtol": rtol,
        "line": f"largest relative difference {worst:.2g}",
    }


def packing_used(record_on: dict, record_off: dict) -> tuple[bool, dict]:
    """Unsloth verified and used its packed forward with packing on, and never tried it with packing off."""
    on, off = record_on.get("seq_packing"), record_off.get("seq_packing")
    return on is True and off is None, {"on": on, "off": off, "line": f"packed forward on: {on}, off: {off}"}


def memory(record: dict, estimate_gib: float | None, card_gib: float | None) -> tuple[bool | None, dict]:
    """Peak GPU memory of the run (what the CUDA caching allocator reserved) against the doctor's estimate for that
    shape: the estimate must not be below it (the doctor would approve a run that runs out of memory)."""
    peak = record.get("peak_reserved_gib")
    if peak is None:
        return None, {
            "estimate_gib": estimate_gib,
            "line": f"no GPU here; the doctor's estimate is {_gib(estimate_gib)}",
        }
    if estimate_gib is None:
        return False, {
            "peak_gib": peak,
            "line": f"peak {peak:.2f} GiB; the doctor gave no estimate for this shape",
        }
    ok = peak <= estimate_gib
    line = (
        f"peak {peak:.2f} GiB, doctor {estimate_gib:.2f} GiB ({estimate_gib / peak:.2f}x) of {_gib(card_gib)}"
    )
    return ok, {"peak_gib": peak, "estimate_gib": estimate_gib, "card_gib": card_gib, "line": line}


def _gib(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f} GiB"
