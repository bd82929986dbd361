#!/usr/bin/env python
"""The wheel bundle for a GPU machine or cluster node without network (`make wheelhouse`; docs/troubleshooting.md):
every package the kit's training stages need besides torch and vLLM, at the versions of the GPU lock, as wheels for
one Python and Linux x86-64, at most 60 MiB.

    python scripts/wheelhouse.py [OUT] [--python 3.12] [--lock requirements/gpu-py3.12-lock.txt] [--full]

Which packages: the lock's dependency graph (its "# via" lines) walked from sage-unsloth's own requirements, without
the groups of :data:`LEFT_OUT` and whatever only they need. ``--full`` adds the groups a machine's Python usually
has already (numpy, pandas, pyarrow, pillow) and the report's (W&B, scipy, matplotlib): then the 60 MiB limit does
not apply. Writes OUT/*.whl (old wheels there are removed first) and OUT/BUNDLE.txt (what is in it, each wheel's
size and sha256, what was left out and why). Needs pip and the package index (run it where there is network).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT_MIB = 60.0
# Left out of the bundle, by why; a name ending in "-" leaves out every package starting with it.
LEFT_OUT = {
    "built for one torch and CUDA: the machine's torch brings its own (or none: all optional for 16-bit LoRA)": (
        "torch",
        "torchvision",
        "torchaudio",
        "triton",
        "xformers",
        "torchao",
        "bitsandbytes",
        "nvidia-",
        "cuda-",
    ),
    "vLLM: the machine's, where it has one (the acceptance check skips it in one line otherwise)": (
        "vllm",
        "vllm-bnb-plugin",
        "flashinfer-",
    ),
    "torch's own requirements, present wherever torch is": (
        "sympy",
        "mpmath",
        "networkx",
        "jinja2",
        "markupsafe",
    ),
    "downloads only: an offline node downloads nothing": ("hf-xet", "hf-transfer"),
    "Unsloth's image-model support: text training never imports it": ("diffusers",),
    "fsspec's HTTP file system (datasets streaming from URLs): offline runs read local files": ("aiohttp",),
    "SentencePiece tokenizers (Llama 2, Gemma): Qwen's and Llama 3's are BPE (tokenizers)": (
        "sentencepiece",
    ),
}
FULL_ONLY = {
    "the machine's Python usually has them (GPU images do); --full adds them": (
        "numpy",
        "pandas",
        "pyarrow",
        "pillow",
        "python-dateutil",
        "tzdata",
        "six",
    ),
    "W&B (report_to wandb), statistics and plots (stage 4, the lab); --full adds them": (
        "wandb",
        "scipy",
        "matplotlib",
    ),
}
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
)
PLATFORMS += ("manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64", "any")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_graph(lock: Path) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(name -> pinned version, name -> the packages that require it) from a `uv pip compile` lock."""
    pins: dict[str, str] = {}
    required_by: dict[str, set[str]] = {}
    current = None
    for line in lock.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line):
            current = normalise(match.group(1))
            pins[current], required_by[current] = match.group(2), set()
        elif current and line.strip().startswith("#"):
            text = line.strip().lstrip("#").strip()
            text = text[3:].strip() if text.startswith("via") else text
            if text and not text.startswith("-r"):
                required_by[current].add(normalise(text.split()[0].split("[")[0]))
    return pins, required_by


def left_out(name: str, groups: dict) -> str | None:
    for why, names in groups.items():
        if any(name == n or (n.endswith("-") and name.startswith(n)) for n in names):
            return why
    return None


def bundle(lock: Path, full: bool) -> tuple[dict[str, str], dict[str, str]]:
    """(name -> version to bundle, name -> why left out), walking the lock's graph from sage-unsloth."""
    pins, required_by = lock_graph(lock)
    requires: dict[str, set[str]] = {}
    for child, parents in required_by.items():
        for parent in parents:
            requires.setdefault(parent, set()).add(child)
    groups = LEFT_OUT if full else {**LEFT_OUT, **FULL_ONLY}
    chosen, skipped = {}, {}
    stack = sorted(requires.get("sage-unsloth", ()))
    while stack:
        name = stack.pop()
        if name in chosen or name in skipped:
            continue
        if (why := left_out(name, groups)) is not None:
            skipped[name] = why
            continue
        chosen[name] = pins[name]
        stack.extend(sorted(requires.get(name, ())))
    return chosen, skipped


def download(chosen: dict[str, str], out: Path, python: str) -> None:
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", python, "--implementation", "cp", "-d", str(out)]
    command += [item for platform in PLATFORMS for item in ("--platform", platform)]
    subprocess.run([*command, *(f"{n}=={v}" for n, v in sorted(chosen.items()))], check=True)


def describe(out: Path, skipped: dict[str, str], python: str) -> tuple[float, str]:
    """(total MiB, the text of BUNDLE.txt)."""
    wheels = sorted(out.glob("*.whl"), key=lambda p: p.stat().st_size, reverse=True)
    total = sum(p.stat().st_size for p in wheels) / 2**20
    lines = [
        f"# {len(wheels)} wheels for CPython {python}, Linux x86-64: {total:.1f} MiB (scripts/wheelhouse.py)"
    ]
    lines += [
        f"{p.name}  {p.stat().st_size / 2**20:.2f} MiB  sha256:{hashlib.sha256(p.read_bytes()).hexdigest()}"
        for p in wheels
    ]
    lines.append("# left out:")
    lines += [f"#   {name}: {why}" for name, why in sorted(skipped.items())]
    return total, "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("out", nargs="?", type=Path, default=REPO / "wheelhouse")
    parser.add_argument(
        "--python", default="3.12", help="the GPU machine's Python (major.minor; default 3.12)"
    )
    parser.add_argument(
        "--lock",
        type=Path,
        help="the GPU lock to bundle from (default: requirements/gpu-py<PYTHON>-lock.txt)",
    )
    parser.add_argument(
        "--full", action="store_true", help="also numpy, pandas, pyarrow, pillow, W&B, scipy, ..."
    )
    args = parser.parse_args(argv)
    lock = args.lock or REPO / "requirements" / f"gpu-py{args.python}-lock.txt"
    chosen, skipped = bundle(lock, args.full)
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    download(chosen, args.out, args.python)
    total, text = describe(args.out, skipped, args.python)
    (args.out / "BUNDLE.txt").write_text(text)
    print(f"{args.out}: {len(chosen)} wheels, {total:.1f} MiB (BUNDLE.txt lists them and what was left out)")
    if total > LIMIT_MIB and not args.full:
        print(f"error: the bundle is {total:.1f} MiB, over its {LIMIT_MIB:g} MiB limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
