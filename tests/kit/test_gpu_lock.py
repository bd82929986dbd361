"""requirements/gpu-lock.txt, the [gpu] extra resolved for Linux x86-64 (`make gpu-lock`), agrees with
pyproject.toml: made by the command the Makefile runs, every pin of the core and the extra at its version, every
other requirement satisfied, nothing direct missing or left over, and vllm-bnb-plugin in it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sage_unsloth import compat

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements" / "gpu-lock.txt"


def _lock() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, version = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip()).groups()  # fully pinned
            pins[canonicalize_name(name)] = version
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["gpu"]]


def test_lock_is_made_by_the_make_target():
    header = LOCK.read_text().splitlines()[:2]
    command = header[1].lstrip("# ").strip()
    make = re.search(
        r"uv pip compile (.+?) --upgrade -o (\S+)", (REPO / "Makefile").read_text().replace("\\\n", " ")
    )
    flags = " ".join(make.group(1).split())
    assert command == f"uv pip compile {flags} -o {make.group(2)}", (command, flags)
    assert "--extra gpu" in command and "--python-platform x86_64-manylinux_2_28" in command


def test_lock_and_pyproject_agree():
    lock = _lock()
    for requirement in _declared():
        name = canonicalize_name(requirement.name)
        assert name in lock, f"{requirement} is not in the lock: run make gpu-lock"
        assert requirement.specifier.contains(lock[name], prereleases=True), (str(requirement), lock[name])
    direct = set()
    for block in re.split(r"\n(?=\S)", LOCK.read_text()):
        if "sage-unsloth (pyproject.toml)" in block:
            direct.add(canonicalize_name(block.split("==")[0]))
    assert direct == {canonicalize_name(r.name) for r in _declared()}  # nothing dropped or added unlocked


def test_lock_names_the_bnb_plugin_and_the_guarded_pins():
    lock = _lock()
    dist = compat.VLLM_BNB_PLUGIN[0]
    assert lock[dist] == compat.PINNED[dist]
    for name in ("unsloth", "unsloth_zoo", "trl", "vllm", "transformers"):
        assert lock[canonicalize_name(name)] == compat.PINNED[name], name
