"""The acceptance check of the GPU path (scripts/gpu_acceptance.sh runs it; docs/verification.md says what each check
means): ``python -m sage_unsloth.acceptance WORKDIR [--cpu-rehearsal]``.

On a GPU: a random-weight model of the Qwen2.5-1.5B architecture made on the card (sage_unsloth/acceptance/model.py);
stage 1 on Unsloth, 4 steps with checkpoints at 2 and 4, then the same run SIGKILLed after checkpoint-2, resumed with
step 3 poisoned (the step guard must refuse it), resumed again (it must end where the uninterrupted run did); stage 2
with the Branch guide on Unsloth the same way, and step 1 again with Unsloth's GRPO sequence packing off (the same
loss, KL, gradient norm and q); each uninterrupted run's peak GPU memory against the doctor's estimate; stage 2 with
Unsloth's vLLM where vLLM is importable. With ``--cpu-rehearsal`` the same steps run on this CPU with the tiny model,
Unsloth's GPU-only trainer rewrites forced onto it (sage_unsloth/acceptance/forced.py). Every stage is its own process
(sage_unsloth/acceptance/stage.py), as a user runs them. Writes WORKDIR/verdict.json and prints a one-screen summary;
exit 0 when every check that applies passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sage_unsloth.acceptance import checks

REPO = Path(__file__).resolve().parents[2]
STEPS, SAVE_AT, POISONED = 4, 2, 3  # 4 optimizer steps, checkpoints at 2 and 4, step 3 poisoned on the resume
SFT_SAMPLE = REPO / "sage_unsloth" / "data" / "sft" / "sample.jsonl"
RLVR_SAMPLE = REPO / "sage_unsloth" / "data" / "rlvr" / "dapo_math_sample.jsonl"


@dataclass
class Mode:
    """What differs between the GPU run and the CPU rehearsal: the configs and their overrides, the runner's flags."""

    gpu: bool
    sft_config: Path
    rlvr_config: Path
    sft_flags: dict
    rlvr_flags: dict
    runner_flags: list[str] = field(default_factory=list)
    micro_steps: int = 1  # optimizer steps' micro-batches in stage 2 (gradient accumulation)
    packing_rtol: float = 1e-4
    timeout: int = 600


def gpu_mode() -> Mode:
    import torch

    bf16 = torch.cuda.get_device_capability(0) >= (8, 0)
    precision = {
        "dtype": "bfloat16" if bf16 else "float16",
        "bf16": str(bf16).lower(),
        "optim": "adamw_torch",
    }
    return Mode(
        gpu=True,
        sft_config=REPO / "configs" / "sft" / "qwen2.5-1.5b.yaml",
        rlvr_config=REPO / "configs" / "rlvr" / "qwen2.5-1.5b" / "grpo_branch.yaml",
        sft_flags={**precision, "max_seq_length": 1024, "dataset_path": SFT_SAMPLE},
        rlvr_flags={
            **precision,
            "use_vllm": "false",
            "max_completion_length": 64,
            "max_prompt_length": 256,
            "max_train_rows": 40,
            "dataset_path": RLVR_SAMPLE,
            "generation_kwargs": "{}",  # the preset's stop strings are vLLM's; this run samples with transformers
        },
        micro_steps=2,  # the preset: per_device_train_batch_size 4, gradient_accumulation_steps 2
        packing_rtol=5e-2,  # 16-bit kernels: the packed and padded forwards round differently
        timeout=240,
    )


def cpu_mode() -> Mode:
    cpu = {"backend": "unsloth", "unsloth_without_gpu": "true"}
    return Mode(
        gpu=False,
        sft_config=REPO / "configs" / "sft" / "tiny-cpu.yaml",
        rlvr_config=REPO / "configs" / "rlvr" / "tiny-cpu" / "grpo_branch.yaml",
        sft_flags={**cpu, "dataset_path": SFT_SAMPLE},
        rlvr_flags={**cpu, "dataset_path": RLVR_SAMPLE},
        runner_flags=["--forced-cpu"],
    )


def flags(values: dict) -> list[str]:
    return [item for key, value in values.items() for item in (f"--{key}", str(value))]


@dataclass
class Runner:
    """Runs stage processes in WORKDIR, keeping each one's record and log."""

    work: Path
    mode: Mode
    runs: dict = field(default_factory=dict)

    def stage(self, name: str, stage: str, argv: list[str], *extra: str, env: dict | None = None) -> dict:
        record = self.work / "records" / f"{name}.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "sage_unsloth.acceptance.stage", *self.mode.runner_flags, *extra]
        command += ["--record", str(record), stage, *argv]
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        environment.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
        started = time.time()
        try:
            done = subprocess.run(
                command,
                check=False,
                cwd=self.work,
                env=environment,
                capture_output=True,
                text=True,
                timeout=self.mode.timeout,
            )
            code, stdout, stderr = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            code, stdout, stderr = "timeout", str(exc.stdout or ""), str(exc.stderr or "")
        (self.work / "logs").mkdir(exist_ok=True)
        (self.work / "logs" / f"{name}.log").write_text(f"$ {' '.join(command)}\n{stdout}\n{stderr}")
        run = json.loads(record.read_text()) if record.is_file() else {}
        run.update(exit=code, stderr=stderr[-4000:], seconds=round(time.time() - started, 1))
        self.runs[name] = run
        return run


def sft_argv(mode: Mode, model: Path, out: Path, *extra: str) -> list[str]:
    chosen = {"model_name_or_path": model, "output_dir": out, "max_steps": STEPS, "save_strategy": "steps"}
    return [str(mode.sft_config), *flags({**mode.sft_flags, **chosen, "save_steps": SAVE_AT}), *extra]


def rlvr_argv(mode: Mode, sft: Path, out: Path, *extra: str) -> list[str]:
    chosen = {"sft_dir": sft, "output_dir": out, "max_steps": STEPS, "save_steps": SAVE_AT}
    return [str(mode.rlvr_config), *flags({**mode.rlvr_flags, **chosen}), *extra]


def doctor_estimate_gib(config: dict, config_path: Path, card_gib: float | None) -> float | None:
    """The doctor's memory estimate for this run's config (sage_unsloth/doctor/memory.py, its public ``estimate``) in
    GiB of the card, None when it has none: the one place the acceptance check reads the doctor's model."""
    from sage_unsloth.doctor import memory

    found = memory.estimate(config, str(config_path))
    if found is None:
        return None
    total = getattr(found, "total_gib", None)
    value = total(card_gib) if callable(total) else found
    return None if value is None else float(value)


def run_config(config_path: Path, overrides: dict) -> dict:
    """A stage config as the stage reads it: the YAML (with its base chain), then the run's overrides."""
    from sage_unsloth.config.args import load_config

    values = {key: (str(v) if isinstance(v, Path) else v) for key, v in overrides.items()}
    for key, value in values.items():  # the command line's strings, typed as the YAML would be
        if isinstance(value, str) and value.lower() in ("true", "false"):
            values[key] = value.lower() == "true"
    return {**load_config(config_path), **values}


def card_gib() -> float | None:
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None


def chain(runner: Runner, name: str, stage: str, argv, out: Path, *extra: str) -> dict:
    """The kill / poison / resume chain of one stage into ``out``: checks keyed by ``name``."""
    resume = [*argv(out), "--resume", "true"]
    runner.stage(f"{name}_killed", stage, argv(out), *extra, "--kill-at-save", str(SAVE_AT))
    found = {f"{name}_sigkill": checks.killed(runner.runs[f"{name}_killed"], out, SAVE_AT)}
    runner.stage(f"{name}_poisoned", stage, resume, *extra, "--poison-step", str(POISONED))
    found[f"{name}_step_guard"] = checks.guarded(runner.runs[f"{name}_poisoned"], out, POISONED, SAVE_AT)
    runner.stage(f"{name}_resumed", stage, resume, *extra)
    return found


def sft_checks(runner: Runner, model: Path) -> dict:
    mode, work = runner.mode, runner.work
    full = runner.stage("sft", "sft", sft_argv(mode, model, work / "sft"))
    found = {
        "sft_rewrites": checks.rewrites(full, "UnslothSFTTrainer", STEPS, 1),
        "sft_assistant_only": checks.assistant_only(full),
    }
    found.update(chain(runner, "sft", "sft", lambda out: sft_argv(mode, model, out), work / "sft-killed"))
    found["sft_resume_exact"] = checks.resumed_exactly(
        runner.runs["sft_resumed"], work / "sft-killed", work / "sft", work / "sft-killed", SAVE_AT
    )
    config = run_config(mode.sft_config, {**mode.sft_flags, "model_name_or_path": model})
    found["sft_memory"] = checks.memory(
        full, doctor_estimate_gib(config, mode.sft_config, card_gib()), card_gib()
    )
    return found


def rlvr_checks(runner: Runner) -> dict:
    from sage_unsloth.runtime.training_log import read_log_history

    mode, work, sft = runner.mode, runner.work, runner.work / "sft"
    reward = "--varied-reward"
    full = runner.stage("rlvr", "rlvr", rlvr_argv(mode, sft, work / "rlvr"), reward)
    found = {"rlvr_rewrites": checks.rewrites(full, "UnslothGRPOTrainer", STEPS, mode.micro_steps)}
    found.update(
        chain(runner, "rlvr", "rlvr", lambda out: rlvr_argv(mode, sft, out), work / "rlvr-killed", reward)
    )
    found["rlvr_resume_exact"] = checks.resumed_exactly(
        runner.runs["rlvr_resumed"], work / "rlvr-killed", work / "rlvr", work / "rlvr-killed", SAVE_AT
    )
    off = work / "rlvr-unpacked"
    unpacked = runner.stage(
        "rlvr_unpacked", "rlvr", rlvr_argv(mode, sft, off, "--max_steps", "1"), reward, env={_packing(): "0"}
    )
    found["rlvr_packing_used"] = checks.packing_used(full, unpacked)
    logs = [read_log_history(f) if (f / "log_history.jsonl").is_file() else [] for f in (work / "rlvr", off)]
    found["rlvr_packing_on_off"] = checks.packing_equal(*logs, rtol=mode.packing_rtol)
    config = run_config(mode.rlvr_config, {**mode.rlvr_flags, "sft_dir": sft})
    found["rlvr_memory"] = checks.memory(
        full, doctor_estimate_gib(config, mode.rlvr_config, card_gib()), card_gib()
    )
    return found


def _packing() -> str:
    from sage_unsloth.compat import UNSLOTH_SEQ_PACKING_ENV

    return UNSLOTH_SEQ_PACKING_ENV


def vllm_check(runner: Runner) -> tuple[bool | None, dict]:
    """Stage 2 with Unsloth's vLLM (fast_inference) for 2 steps, where vLLM is importable; skipped in one line else."""
    import importlib.util

    if not runner.mode.gpu or importlib.util.find_spec("vllm") is None:
        where = "on a CPU rehearsal" if not runner.mode.gpu else "here"
        return None, {"line": f"skipped: vLLM is not importable {where}"}
    argv = rlvr_argv(runner.mode, runner.work / "sft", runner.work / "rlvr-vllm", "--max_steps", "2")
    argv += ["--use_vllm", "true", "--vllm_gpu_memory_utilization", "0.3", "--save_strategy", "no"]
    run = runner.stage("rlvr_vllm", "rlvr", argv, "--varied-reward")
    from sage_unsloth.runtime.training_log import read_log_history

    log = runner.work / "rlvr-vllm"
    losses = (
        [e["loss"] for e in read_log_history(log) if "loss" in e]
        if (log / "log_history.jsonl").is_file()
        else []
    )
    ok = run["exit"] == 0 and len(losses) == 2 and all(abs(x) < float("inf") for x in losses)
    return ok, {"exit": run["exit"], "losses": losses, "line": f"exit {run['exit']}, losses {losses}"}


def environment(gpu: bool) -> tuple[bool, dict]:
    """The stack this ran on (the versions a report needs), and whether the kit's pins are the installed ones."""
    import importlib.metadata as md

    import torch

    from sage_unsloth import compat
    from sage_unsloth.runtime.manifest import TRACKED_PACKAGES

    # the packages every manifest records
    versions = {name: compat.installed_version(name) for name in TRACKED_PACKAGES}
    device = (
        torch.cuda.get_device_name(0) if gpu else "none (Unsloth's GPU-only rewrites forced onto the CPU)"
    )
    off = compat.unpinned_versions()
    detail = {"versions": versions, "device": device, "cuda": torch.version.cuda, "unpinned": off}
    detail["python"] = sys.version.split()[0]
    detail["kit"] = md.version("sage-unsloth") if _installed("sage-unsloth") else "from the checkout"
    line = f"torch {versions['torch']}, unsloth {versions['unsloth']}, trl {versions['trl']}, GPU: {device}"
    return not off, {**detail, "line": line}


def _installed(name: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


def acceptance(work: Path, cpu_rehearsal: bool) -> dict:
    """Every check, in order; the verdict as written to WORKDIR/verdict.json."""
    from sage_unsloth.acceptance.model import build_model

    started = time.time()
    work.mkdir(parents=True, exist_ok=True)
    mode = cpu_mode() if cpu_rehearsal else gpu_mode()
    found = {"environment": environment(mode.gpu)}
    model = build_model(work / "model", gpu=mode.gpu)
    found["model"] = (True, {"path": str(model), "line": json.dumps(_model_note(model))})
    runner = Runner(work, mode)
    found.update(sft_checks(runner, model))
    found.update(rlvr_checks(runner))
    found["vllm"] = vllm_check(runner)
    results = {name: {"ok": ok, **detail} for name, (ok, detail) in found.items()}
    seconds = round(time.time() - started, 1)
    verdict = {
        "ok": all(r["ok"] is not False for r in results.values()),
        "mode": "cpu-rehearsal" if cpu_rehearsal else "gpu",
        "seconds": seconds,
        "stage_seconds": {name: run.get("seconds") for name, run in runner.runs.items()},
        "checks": results,
    }
    if mode.gpu:
        verdict["checks"]["time_budget"] = {
            "ok": seconds <= 600,
            "line": f"{seconds:.0f} s of the 600 s budget",
        }
        verdict["ok"] = verdict["ok"] and seconds <= 600
    return verdict


def _model_note(model: Path) -> dict:
    from sage_unsloth.acceptance.model import MODEL_NOTE

    for name in (MODEL_NOTE, "TINY_MODEL.json"):
        if (model / name).is_file():
            return json.loads((model / name).read_text())
    return {}


def summary(verdict: dict, path: Path) -> str:
    """One screen: the verdict, then one line per check."""
    mark = {True: "PASS", False: "FAIL", None: "SKIP"}
    head = f"GPU ACCEPTANCE {'PASS' if verdict['ok'] else 'FAIL'} ({verdict['mode']}, {verdict['seconds']:.0f} s): {path}"
    lines = [head]
    for name, result in verdict["checks"].items():
        lines.append(f"  {mark[result['ok']]} {name:<20} {str(result.get('line', ''))[:96]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sage_unsloth.acceptance", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("workdir", type=Path, help="where the model, the stage folders and verdict.json go")
    parser.add_argument("--cpu-rehearsal", action="store_true", help="the same steps on this CPU, tiny model")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.cpu_rehearsal:
        import torch

        if not torch.cuda.is_available():
            print(
                "error: no GPU is visible to torch: run on the GPU machine, or pass --cpu-rehearsal",
                file=sys.stderr,
            )
            return 2
    verdict = acceptance(args.workdir.resolve(), args.cpu_rehearsal)
    path = args.workdir.resolve() / "verdict.json"
    path.write_text(json.dumps(verdict, indent=1, default=str) + "\n")
    print(summary(verdict, path), flush=True)
    return 0 if verdict["ok"] else 1
