"""The checks of ``sage-unsloth doctor CONFIG --gpu NAME``: a card the user does not have yet, judged on any machine
without loading a model, and the same checks for the card a GPU machine has.

One line per check, each from what the pinned libraries do (sage_unsloth/compat.py names the contact points):

  capability  the pinned CUDA 13 wheels (torch 2.13, vLLM 0.31) carry kernels for compute capability 7.5 and newer
  precision   every dtype the config implies: bfloat16 weights or bf16 mixed precision need 8.0 (Ampere)
  sampler     vLLM's FlashInfer sampler refuses compute capability below 8.0 once VLLM_USE_FLASHINFER_SAMPLER is
              set, and Unsloth sets it unless UNSLOTH_VLLM_NO_FLASHINFER: the kit sets that switch there, and on
              newer cards unless nvcc's CUDA is torch's (FlashInfer JIT-compiles with it)
  4-bit       load_in_4bit with Unsloth's vLLM needs vllm-bnb-plugin (vLLM >= 0.28 moved bitsandbytes into it)
  memory      training beside vLLM's share, and what that share must hold (sage_unsloth/doctor/memory.py)
  driver      NVIDIA driver >= 580 for the CUDA 13 runtime (read on a GPU machine; named for a card)
  lora rank   the max_lora_rank vLLM gets for the adapter (a rank vLLM accepts), with ``--sft_dir``
  base        the adapter's recorded base against the config's model, through Unsloth's mapper (``--sft_dir``)
  disk, ram   the model's files in the Hugging Face cache; CPU RAM for the checkpoints Unsloth offloads
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from sage_unsloth import compat
from sage_unsloth.doctor import driver
from sage_unsloth.doctor.memory import Estimate, estimate, model_of_config
from sage_unsloth.doctor.report import Check

# The pinned wheels' kernels start at sm_75 (torch 2.13.0 CUDA 13.0 and vLLM 0.31.0: P100 6.0 and V100 7.0 are out).
MIN_CAPABILITY = (7, 5)
PASS_SHARE = 0.95  # an estimate above this share of the card is a WARN, above the card a FAIL


@dataclass(frozen=True)
class Card:
    name: str
    label: str
    capability: tuple[int, int]
    total_gib: float  # the memory nvidia-smi reports (memory.total), in GiB


# Compute capability: NVIDIA's CUDA GPU list (developer.nvidia.com/cuda-gpus); memory: each card's memory.total
# as nvidia-smi reports it, in MiB / 1024.
CARDS = {
    "t4": Card("t4", "Tesla T4 (16 GB)", (7, 5), 15360 / 1024),
    "l4": Card("l4", "NVIDIA L4 (24 GB)", (8, 9), 23034 / 1024),
    "a10g": Card("a10g", "NVIDIA A10G (24 GB)", (8, 6), 23028 / 1024),
    "a100-40gb": Card("a100-40gb", "NVIDIA A100 40 GB", (8, 0), 40960 / 1024),
    "a100-80gb": Card("a100-80gb", "NVIDIA A100 80 GB", (8, 0), 81920 / 1024),
    "h100": Card("h100", "NVIDIA H100 80 GB", (9, 0), 81559 / 1024),
}


@dataclass
class Host:
    """What the machine that will run the stage has besides the card (None: not known from here)."""

    driver: str | None = None
    free_disk_gib: float | None = None  # in the Hugging Face cache's file system
    available_ram_gib: float | None = None
    on_target: bool = False  # this is the machine the stage runs on (a GPU machine): short disk or RAM fails


def this_host(on_target: bool, driver: str | None = None) -> Host:
    """Free disk where the Hugging Face cache lives and available RAM, of this machine."""
    from huggingface_hub import constants

    cache = Path(constants.HF_HUB_CACHE)
    probe = cache
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    ram = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                ram = int(line.split()[1]) / 2**20
    except OSError:
        pass
    return Host(driver, shutil.disk_usage(probe).free / 2**30, ram, on_target)


# ----------------------------------------------------------------------------------------------- the config
def _stage(config: dict) -> str:
    return "eval" if "checkpoints" in config else "rlvr" if "max_completion_length" in config else "sft"


def _uses_unsloth_vllm(config: dict) -> bool:
    return (
        _stage(config) == "rlvr"
        and bool(config.get("use_vllm"))
        and config.get("backend", "unsloth") == "unsloth"
    )


def _uses_vllm(config: dict) -> bool:
    return _uses_unsloth_vllm(config) or (
        _stage(config) == "eval" and config.get("backend", "auto") in ("vllm", "auto")
    )


def _cc(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


# ----------------------------------------------------------------------------------------------- checks
def capability_check(card: Card) -> Check:
    if card.capability >= MIN_CAPABILITY:
        return Check(
            "capability",
            "PASS",
            f"{card.label}: compute capability {_cc(card.capability)} (the pinned wheels: 7.5+)",
        )
    return Check(
        "capability",
        "FAIL",
        f"{card.label}: compute capability {_cc(card.capability)}; torch 2.13 / vLLM 0.31 (CUDA 13) need 7.5",
        "use a T4, L4, A10G, A100 or H100",
    )


def precision_check(config: dict, card: Card) -> Check:
    from sage_unsloth.model.loading import precision_problem

    dtype, bf16 = config.get("dtype"), bool(config.get("bf16"))
    problem = precision_problem(dtype, bf16, card.capability)
    if problem is not None:
        return Check(
            "precision", "FAIL", f"{card.label}: {problem.split(': pass')[0]}", problem.split(": ", 2)[-1]
        )
    used = [f"dtype {dtype or 'auto'}"] + [name for name in ("bf16", "fp16") if config.get(name)]
    if config.get("load_in_4bit"):
        used.append("4-bit (NF4)")
    return Check("precision", "PASS", f"{', '.join(used)} on compute capability {_cc(card.capability)}")


UNKNOWN = "unknown"  # the toolchain of a machine the doctor is not on


def sampler_check(config: dict, card: Card, environ, toolchain: str | None = UNKNOWN) -> Check:
    """``toolchain``: why FlashInfer's JIT cannot build against torch here (compat.flashinfer_toolchain_problem),
    None when it can, :data:`UNKNOWN` for a card judged from another machine."""
    if not _uses_vllm(config):
        return Check("sampler", "SKIP", "the config starts no vLLM engine")
    if card.capability >= compat.FLASHINFER_MIN_CAPABILITY:
        return _toolchain_check(config, environ, toolchain)
    forced = environ.get(compat.VLLM_FLASHINFER_SAMPLER_ENV, "0") not in ("", "0")
    switch = environ.get(compat.UNSLOTH_NO_FLASHINFER_ENV)
    if forced or (_uses_unsloth_vllm(config) and switch is not None and switch in ("", "0")):
        what = (
            f"{compat.VLLM_FLASHINFER_SAMPLER_ENV}={environ[compat.VLLM_FLASHINFER_SAMPLER_ENV]}"
            if forced
            else f"{compat.UNSLOTH_NO_FLASHINFER_ENV}={switch} (Unsloth then sets {compat.VLLM_FLASHINFER_SAMPLER_ENV}=1)"
        )
        return Check(
            "sampler",
            "FAIL",
            f"{what}: vLLM refuses its FlashInfer sampler on compute capability {_cc(card.capability)} and the engine "
            "does not start",
            f"unset it (the kit sets {compat.UNSLOTH_NO_FLASHINFER_ENV}=1 below 8.0)",
        )
    how = (
        f"the kit sets {compat.UNSLOTH_NO_FLASHINFER_ENV}=1 before Unsloth starts vLLM"
        if _uses_unsloth_vllm(config)
        else f"vLLM falls back to its own sampler ({compat.VLLM_FLASHINFER_SAMPLER_ENV} unset)"
    )
    return Check("sampler", "PASS", f"compute capability {_cc(card.capability)} < 8.0: {how}")


def _toolchain_check(config: dict, environ, toolchain: str | None) -> Check:
    forced = environ.get(compat.VLLM_FLASHINFER_SAMPLER_ENV, "0") not in ("", "0")
    if toolchain not in (None, UNKNOWN) and forced:
        return Check(
            "sampler",
            "FAIL",
            f"{compat.VLLM_FLASHINFER_SAMPLER_ENV}=1 with {toolchain}: vLLM raises when FlashInfer's JIT fails",
            f"unset {compat.VLLM_FLASHINFER_SAMPLER_ENV}, or install the CUDA toolkit of torch's CUDA",
        )
    if toolchain == UNKNOWN:
        how = "that machine's nvcc is torch's CUDA 13 (the doctor checks it there)"
        return Check(
            "sampler", "PASS", f"FlashInfer stays off unless {how}, or you set UNSLOTH_VLLM_NO_FLASHINFER=0"
        )
    if toolchain is None:
        return Check("sampler", "PASS", "FlashInfer on: nvcc's CUDA is torch's (its JIT builds)")
    user = environ.get(compat.UNSLOTH_NO_FLASHINFER_ENV)
    if user is not None and user in ("", "0") and _uses_unsloth_vllm(config):
        return Check(
            "sampler",
            "FAIL",
            f"{compat.UNSLOTH_NO_FLASHINFER_ENV}={user} turns FlashInfer on, but {toolchain}",
            f"unset {compat.UNSLOTH_NO_FLASHINFER_ENV} (the kit then turns FlashInfer off)",
        )
    return Check("sampler", "PASS", f"FlashInfer off ({toolchain}): vLLM's own sampler and attention")


def four_bit_check(config: dict, declared: dict[str, str], installed: bool | None) -> Check:
    """``declared``: the pins of the [gpu] extra; ``installed``: whether the plugin imports here (None: not this
    machine's business, a card checked from elsewhere)."""
    if not config.get("load_in_4bit"):
        return Check("4-bit", "SKIP", "16-bit weights (load_in_4bit false)")
    if not _uses_unsloth_vllm(config):
        return Check(
            "4-bit", "PASS", f"bitsandbytes=={declared.get('bitsandbytes', '?')} in the [gpu] extra (no vLLM)"
        )
    dist = compat.VLLM_BNB_PLUGIN[0]
    pin = f"{dist}=={compat.PINNED[dist]}"
    if declared.get(dist) != compat.PINNED[dist]:
        return Check(
            "4-bit",
            "FAIL",
            f"load_in_4bit with Unsloth's vLLM needs {dist}; the [gpu] extra lacks it",
            f'pip install "{pin}"',
        )
    if installed is False:
        return Check(
            "4-bit",
            "FAIL",
            f"load_in_4bit with Unsloth's vLLM: {dist} is not installed here",
            f'pip install "{pin}"',
        )
    return Check(
        "4-bit",
        "PASS",
        f"load_in_4bit with Unsloth's vLLM: {pin} ({'installed' if installed else 'in the [gpu] extra'})",
    )


def memory_checks(guess: Estimate | None, card: Card, stage: str) -> list[Check]:
    if guess is None:
        return [Check("memory", "SKIP", "no estimate: the config's model is not one the kit knows offline")]
    fix = (
        "lower per_device_train_batch_size or max_completion_length, set load_in_4bit true or lower "
        "vllm_gpu_memory_utilization, or use a bigger card (estimate, not a measurement)"
        if stage != "eval"
        else "lower gpu_memory_utilization, or use a bigger card (estimate, not a measurement)"
    )
    if any(name.startswith("weights (training copy") for name in guess.parts):
        fix = (
            "TRL's colocated vLLM holds a second copy of the weights: set vllm_enable_sleep_mode true (vLLM "
            "sleeps during the training step), vllm_mode server (vLLM on another GPU), or lower "
            "per_device_train_batch_size; or use a bigger card (estimate, not a measurement)"
        )
    checks = []
    if guess.vllm_holds:
        share = guess.vllm_fraction * card.total_gib
        need = sum(guess.vllm_holds.values())
        status = "PASS" if need <= share * PASS_SHARE else "WARN" if need <= share else "FAIL"
        what_fix = (
            "set load_in_4bit true, lower generation_batch_size or max_completion_length, use a bigger card, or "
            "raise vllm_gpu_memory_utilization if training still fits beside it (estimate, not a measurement)"
            if stage != "eval"
            else "raise gpu_memory_utilization, lower max_model_len, or use a bigger card (estimate)"
        )
        checks.append(Check("memory vllm", status, guess.describe_vllm(card.total_gib), what_fix))
    need = guess.total_gib(card.total_gib)
    status = "PASS" if need <= card.total_gib * PASS_SHARE else "WARN" if need <= card.total_gib else "FAIL"
    label = "memory eval" if stage == "eval" else "memory train"
    checks.append(
        Check(
            label, status, f"{guess.describe(card.total_gib)} of {card.total_gib:.1f} on the {card.name}", fix
        )
    )
    return checks


def driver_check(host: Host, card: Card | None = None) -> Check:
    """The driver of the machine that will run the stage (``--driver`` names it; on a GPU machine nvidia-smi's)
    against CUDA 13, with what to do below 580 (sage_unsloth/doctor/driver.py)."""
    label = card.label if card else "this GPU"
    if host.driver is None:
        return Check(
            "driver",
            "SKIP",
            f"the GPU machine needs NVIDIA driver >= {driver.MIN_DRIVER} for CUDA 13 (torch 2.13): "
            "pass --driver VERSION (nvidia-smi there) to have it judged",
        )
    verdict, line = driver.advice(label, host.driver)
    if verdict == "ok":
        return Check("driver", "PASS", line)
    if verdict == "compat":
        return Check(
            "driver",
            "WARN",
            f"{label}, driver {host.driver}: older than {driver.MIN_DRIVER}; CUDA 13 needs NVIDIA's "
            f"forward-compatibility package there (the notebooks install and check it in their first cell)",
            f"apt-get install {driver.COMPAT_PACKAGE} && export LD_LIBRARY_PATH={driver.COMPAT_DIR}:"
            "$LD_LIBRARY_PATH, then python -m sage_unsloth.doctor.driver --enable checks it loads; if it does "
            f"not, {driver.NEWER_RUNTIME}",
        )
    return Check(
        "driver", "FAIL", line.split(": update")[0], f"update the NVIDIA driver to >= {driver.MIN_DRIVER}"
    )


def _adapter_rank(folder: Path) -> int | None:
    config = folder / "adapter_config.json"
    return int(json.loads(config.read_text()).get("r") or 8) if config.is_file() else None


def adapter_checks(
    config: dict, config_path: str | None, sft_dir: str | None
) -> tuple[list[Check], int | None]:
    """The adapter's rank against vLLM's max_lora_rank and its base against the config's model; (checks, rank)."""
    from sage_unsloth.model.loading import adapter_base_model, same_base_model

    folder = Path(sft_dir) if sft_dir else None
    if folder is None or not (folder / "adapter_config.json").is_file():
        why = f"{sft_dir} holds no adapter" if sft_dir else "pass --sft_dir outputs/<model>/sft to check it"
        return [Check("lora rank", "SKIP", why), Check("base", "SKIP", why)], None
    rank = _adapter_rank(folder)
    checks = []
    if _uses_vllm(config):
        try:
            served = compat.vllm_max_lora_rank(rank)
            checks.append(
                Check("lora rank", "PASS", f"adapter rank {rank}: vLLM gets max_lora_rank {served}")
            )
        except ValueError as exc:
            checks.append(Check("lora rank", "FAIL", str(exc).split(": ")[0], str(exc).split(": ", 1)[-1]))
    else:
        checks.append(Check("lora rank", "SKIP", f"adapter rank {rank}; the config starts no vLLM engine"))
    recorded = adapter_base_model(folder)
    manifest = folder / "manifest.json"
    base = json.loads(manifest.read_text()).get("base_model") if manifest.is_file() else None
    configured = config.get("model_name_or_path") or base or model_of_config(config, config_path)
    named = [n for n in (recorded, base) if n]
    wrong = [n for n in named if configured and not same_base_model(n, configured)]
    if wrong:
        checks.append(
            Check(
                "base",
                "FAIL",
                f"{folder} was trained on {wrong[0]!r}, the config's model is {configured!r}",
                "point --sft_dir to an adapter of this model, or set model_name_or_path to its base",
            )
        )
    else:
        same = (
            "the same model" if len(set(named) | {configured}) <= 1 else "the same model (Unsloth's mapper)"
        )
        checks.append(
            Check("base", "PASS", f"adapter {recorded!r}, manifest {base!r}, config {configured!r}: {same}")
        )
    return checks, rank


def host_checks(guess: Estimate | None, host: Host) -> list[Check]:
    if guess is None:
        return []
    short = "FAIL" if host.on_target else "WARN"
    where = "here" if host.on_target else "on this machine (the GPU machine needs it)"
    checks = []
    if host.free_disk_gib is not None:
        ok = host.free_disk_gib >= guess.cache_gib
        detail = f"{guess.cache_gib:.1f} GiB for the model in the Hugging Face cache; {host.free_disk_gib:.1f} GiB free {where}"
        checks.append(
            Check("disk", "PASS" if ok else short, detail, "free disk space or set HF_HOME to a bigger disk")
        )
    offloaded = sum(guess.cpu_parts.values())
    if host.available_ram_gib is not None and guess.cpu_parts:
        ok = host.available_ram_gib >= offloaded + 2.0  # and ~2 GiB for the process itself
        detail = f"{offloaded:.1f} GiB of offloaded checkpoints + ~2 GiB; {host.available_ram_gib:.1f} GiB available {where}"
        checks.append(
            Check(
                "ram",
                "PASS" if ok else short,
                detail,
                "lower per_device_train_batch_size or use a machine with more RAM",
            )
        )
    return checks


def card_checks(
    config: dict,
    config_path: str | None,
    card: Card,
    *,
    sft_dir: str | None = None,
    host: Host | None = None,
    environ=None,
    plugin_installed: bool | None = None,
    toolchain: str | None = UNKNOWN,
) -> list[Check]:
    """Every check for ``config`` on ``card``; loads no model (the adapter and the configs are read as JSON/YAML)."""
    from sage_unsloth.doctor.env import kit_pins

    environ = os.environ if environ is None else environ
    declared = {p.name: p.version for p in kit_pins() if "gpu" in p.extras or not p.extras}
    sft_dir = sft_dir or (config.get("sft_dir") if Path(str(config.get("sft_dir") or "")).is_dir() else None)
    adapter, rank = adapter_checks(config, config_path, sft_dir)
    guess = estimate(config, config_path, lora_rank=rank)
    stage = _stage(config)
    return [
        capability_check(card),
        precision_check(config, card),
        sampler_check(config, card, environ, toolchain),
        four_bit_check(config, declared, plugin_installed),
        *memory_checks(guess, card, stage),
        driver_check(host or Host(), card),
        *adapter,
        *host_checks(guess, host or Host()),
    ]
