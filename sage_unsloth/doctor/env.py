"""The machine and the installed stack, checked before any GPU hour is spent.

Facts are collected once (:func:`collect_gpu_facts`, :func:`installed_versions`, :func:`probe_vllm`) and judged
by pure functions, so each rule is tested with made-up facts (a P100, an old driver, a wrong pin).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from dataclasses import dataclass, field

from sage_unsloth.doctor.report import Check

DIST = "sage-unsloth"
# Oldest Linux driver that runs a CUDA runtime of this major version (NVIDIA's minor-version compatibility);
# a newer minor of the runtime may want a newer driver for some features, never an older one.
MIN_DRIVER = {13: (580, 0), 12: (525, 60), 11: (450, 80)}


# ----------------------------------------------------------------------------------------------- facts
@dataclass
class Device:
    name: str
    capability: tuple[int, int]
    total_gib: float
    free_gib: float
    bf16: bool


@dataclass
class GpuFacts:
    torch_version: str
    torch_cuda: str | None  # CUDA runtime the torch wheel was built with (None: CPU build)
    arch_list: list[str] = field(default_factory=list)  # kernels in the wheel: sm_XY (SASS), compute_XY (PTX)
    devices: list[Device] = field(default_factory=list)
    driver: str | None = None  # NVIDIA driver version from nvidia-smi (the kernel module's)
    # the CUDA driver API version of the libcuda this process loads (13000 = 13.0): above what ``driver`` runs when
    # NVIDIA's forward-compatibility package is first on LD_LIBRARY_PATH (sage_unsloth/doctor/driver.py)
    driver_api: int | None = None


def nvidia_smi(fields: str) -> list[list[str]]:
    """``nvidia-smi --query-gpu=FIELDS`` (comma-separated): each visible GPU's values, stripped, without units;
    [] without nvidia-smi or a driver. Needs neither torch nor a GPU-enabled Python stack (the notebook uses it
    before installing anything)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]


def _nvidia_smi_driver() -> str | None:
    rows = nvidia_smi("driver_version")
    return rows[0][0] if rows else None


def collect_gpu_facts() -> GpuFacts:
    import torch

    facts = GpuFacts(
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        arch_list=list(torch.cuda.get_arch_list()) if torch.version.cuda else [],
        driver=_nvidia_smi_driver(),
    )
    if torch.cuda.is_available():
        facts.driver_api = loaded_driver_api()
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            free, total = torch.cuda.mem_get_info(index)
            facts.devices.append(
                Device(props.name, (props.major, props.minor), total / 2**30, free / 2**30, props.major >= 8)
            )
    return facts


def loaded_driver_api() -> int | None:
    """cuDriverGetVersion of the libcuda.so.1 this process resolves (torch has loaded it by now); None without."""
    import ctypes

    try:
        version = ctypes.c_int(0)
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
    except (OSError, AttributeError):
        return None
    return version.value or None


def installed_versions(names) -> dict[str, str | None]:
    """Installed version per distribution name (None when absent)."""
    versions = {}
    for name in names:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    return versions


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    extras: tuple[str, ...]  # () = a core dependency


def declared_requirements() -> list[str]:
    """sage-unsloth's requirements as metadata strings: from the checkout's pyproject.toml when the kit runs from
    one (an editable install's metadata is as old as its last install), else the installed metadata."""
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == DIST:
            extras = project.get("optional-dependencies", {})
            return list(project.get("dependencies", [])) + [
                f'{req}; extra == "{extra}"' for extra, reqs in extras.items() for req in reqs
            ]
    return md.requires(DIST) or []


def kit_pins(requirements: list[str] | None = None) -> list[Pin]:
    """The ``==`` pins of sage-unsloth's pyproject.toml (:func:`declared_requirements`), core and per extra; an
    extra that names others (``gpu = ["sage-unsloth[unsloth,wandb]", ...]``) holds their pins too."""
    from packaging.requirements import Requirement

    requirements = declared_requirements() if requirements is None else requirements
    pins: dict[str, Pin] = {}
    includes: dict[str, set[str]] = {}  # extra -> the extras it names
    for text in requirements or []:
        req = Requirement(text)
        extra = re.findall(r'extra\s*==\s*"([^"]+)"', str(req.marker or ""))
        name = req.name.lower().replace("_", "-")
        if name == DIST:
            for outer in extra:
                includes.setdefault(outer, set()).update(req.extras)
            continue
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if not exact:
            continue
        old = pins.get(name)
        pins[name] = Pin(name, exact[0], tuple(sorted(set((old.extras if old else ()) + tuple(extra)))))
    for outer, inner in includes.items():
        for name, pin in pins.items():
            if inner & set(pin.extras) and outer not in pin.extras:
                pins[name] = Pin(name, pin.version, tuple(sorted({*pin.extras, outer})))
    return list(pins.values())


def probe_vllm(python: str | None = None, timeout: int = 240) -> tuple[bool, str]:
    """Does ``import vllm`` work in ``python`` (default: this interpreter)? In a child: on some CPUs vLLM's
    compiled extension dies with SIGILL, and a training process must not hold vLLM (see runtime/backend.py)."""
    code = "import vllm, sys; sys.stdout.write(vllm.__version__)"
    try:
        done = subprocess.run(
            [python or sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if done.returncode == 0:
        return True, done.stdout.strip()
    tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    if done.returncode < 0:
        tail = f"killed by signal {-done.returncode} ({tail})"
    return False, tail[:300]


# ----------------------------------------------------------------------------------------------- rules
def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def same_release(installed: str, pinned: str) -> bool:
    """2.13.0+cu130 and 2.13.0+cpu are the pinned torch 2.13.0 (the local label names the build)."""
    return installed.split("+", 1)[0] == pinned


def stack_checks(pins: list[Pin], versions: dict[str, str | None], needed: set[str]) -> list[Check]:
    """Each pin installed at exactly its version. A pin of an extra is checked when ``needed`` names it or it is
    installed (a wrong version of an optional package is still wrong)."""
    checks = []
    for pin in sorted(pins, key=lambda p: (bool(p.extras), p.name)):
        if pin.extras and pin.name not in needed and versions.get(pin.name) is None:
            continue  # optional here and absent: nothing to say
        have = versions.get(pin.name)
        where = f"[{','.join(pin.extras)}]" if pin.extras else "core"
        if have is None:
            checks.append(
                Check(
                    f"pin {pin.name}",
                    "FAIL",
                    f"not installed (pinned {pin.version}, {where})",
                    f'pip install "{pin.name}=={pin.version}" (or pip install -e ".[gpu]")',
                )
            )
        elif same_release(have, pin.version):
            checks.append(Check(f"pin {pin.name}", "PASS", f"{have} (pinned {pin.version})"))
        else:
            checks.append(
                Check(
                    f"pin {pin.name}",
                    "FAIL",
                    f"{have} installed, the kit is pinned to {pin.version}",
                    f'pip install "{pin.name}=={pin.version}"',
                )
            )
    return checks


def arch_supported(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Does the wheel hold kernels this GPU runs: SASS of the same major and a minor <= the GPU's, or PTX of a
    compute capability <= the GPU's (JIT-compiled by the driver)?"""
    major, minor = capability
    for arch in arch_list:
        match = re.fullmatch(r"(sm|compute)_(\d+)(\d)a?", arch)
        if not match:
            continue
        kind, a_major, a_minor = match[1], int(match[2]), int(match[3])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def _arch_span(arch_list: list[str]) -> str:
    sm = sorted({tuple(map(int, m.groups())) for a in arch_list if (m := re.fullmatch(r"sm_(\d+)(\d)a?", a))})
    return f"sm_{sm[0][0]}{sm[0][1]}..sm_{sm[-1][0]}{sm[-1][1]}" if sm else "none"


def gpu_checks(facts: GpuFacts, *, needs_gpu: bool, wants_bf16: bool) -> list[Check]:
    """GPU present, the torch wheel has its kernels, the driver runs the wheel's CUDA, bf16 when asked."""
    checks = []
    if not facts.devices:
        what = (
            f"torch {facts.torch_version} (CPU build)"
            if not facts.torch_cuda
            else f"torch {facts.torch_version} built for CUDA {facts.torch_cuda}, but no GPU is visible"
        )
        if needs_gpu:
            checks.append(
                Check(
                    "gpu",
                    "FAIL",
                    f"no CUDA GPU: {what}; this config needs one",
                    "run on a GPU machine (compute capability >= 7.5, driver >= 580), or use a "
                    "configs/*/tiny-cpu* config",
                )
            )
        else:
            checks.append(Check("gpu", "SKIP", f"no CUDA GPU ({what}): GPU checks skipped"))
        return checks
    for index, dev in enumerate(facts.devices):
        sm = f"sm_{dev.capability[0]}{dev.capability[1]}"
        label = f"gpu {index}"
        detail = (
            f"{dev.name}, compute capability {dev.capability[0]}.{dev.capability[1]} ({sm}), "
            f"{dev.total_gib:.1f} GiB ({dev.free_gib:.1f} free)"
        )
        if arch_supported(dev.capability, facts.arch_list):
            checks.append(
                Check(label, "PASS", f"{detail}; torch has kernels for it ({_arch_span(facts.arch_list)})")
            )
        else:
            checks.append(
                Check(
                    label,
                    "FAIL",
                    f"{detail}; torch {facts.torch_version} has kernels for "
                    f"{_arch_span(facts.arch_list)} only",
                    "use a GPU of compute capability >= 7.5 (T4, L4, A10, A100, H100...): the CUDA 13 "
                    "wheels of torch 2.13 and vLLM 0.31 have no kernels for P100 (6.0) or V100 (7.0)",
                )
            )
    checks.append(driver_check(facts))
    first = facts.devices[0]
    if wants_bf16 and not first.bf16:
        checks.append(
            Check(
                "bf16",
                "FAIL",
                f"the config asks for bfloat16 but {first.name} (compute capability "
                f"{first.capability[0]}.{first.capability[1]}) has none",
                "pass --bf16 false --dtype float16 (Unsloth then trains with fp16 mixed precision)",
            )
        )
    else:
        checks.append(
            Check(
                "bf16",
                "PASS",
                f"bfloat16 {'supported' if first.bf16 else 'not supported (fp16 used)'}"
                f"{'; the config asks for it' if wants_bf16 else ''}",
            )
        )
    return checks


def driver_check(facts: GpuFacts) -> Check:
    if not facts.torch_cuda:
        return Check(
            "driver",
            "FAIL",
            f"torch {facts.torch_version} is a CPU build on a GPU machine",
            'reinstall the CUDA wheel: pip install "torch==2.13.0" (PyPI default, CUDA 13.0)',
        )
    cuda_major = int(facts.torch_cuda.split(".")[0])
    need = MIN_DRIVER.get(cuda_major)
    if facts.driver is None:
        return Check(
            "driver",
            "WARN",
            f"torch is built for CUDA {facts.torch_cuda}; nvidia-smi gave no driver version",
            f"check the driver is >= {need[0]}.{need[1]:02d}" if need else "",
        )
    if need is None or _version_tuple(facts.driver)[:2] >= need:
        return Check(
            "driver", "PASS", f"driver {facts.driver} runs CUDA {facts.torch_cuda} (torch's runtime)"
        )
    if (facts.driver_api or 0) >= cuda_major * 1000:
        return Check(
            "driver",
            "PASS",
            f"driver {facts.driver} runs CUDA {facts.torch_cuda} through NVIDIA's forward-compatibility libcuda "
            f"(driver API {facts.driver_api // 1000}.{facts.driver_api % 1000 // 10})",
        )
    from sage_unsloth.doctor import driver

    verdict = driver.advice(facts.devices[0].name if facts.devices else "this GPU", facts.driver)[0]
    return Check(
        "driver",
        "FAIL",
        f"driver {facts.driver} is older than {need[0]}.{need[1]:02d}, the oldest that runs "
        f"CUDA {cuda_major}.x (torch {facts.torch_version} is built for CUDA {facts.torch_cuda})",
        "python -m sage_unsloth.doctor.driver --enable (installs NVIDIA's forward-compatibility package, checks it "
        f"loads, prints the LD_LIBRARY_PATH line); if it does not load, {driver.NEWER_RUNTIME}"
        if verdict == "compat" and cuda_major == driver.CUDA_MAJOR
        else f"update the NVIDIA driver to >= {need[0]}",
    )


def vllm_check(ok: bool, detail: str, *, needed: bool, where: str = "this interpreter") -> Check:
    if ok:
        return Check("vllm", "PASS", f"import vllm works in {where} ({detail})")
    status = "FAIL" if needed else "SKIP"
    return Check(
        "vllm",
        status,
        f"import vllm fails in {where}: {detail}",
        'pip install -e ".[gpu]" (vllm==0.31.0) or set use_vllm: false' if needed else "",
    )
