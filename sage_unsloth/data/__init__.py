"""Data files the kit carries, so that tests, configs and the demo need no hub and nothing beside the clone.

``benchmarks/`` holds the six evaluation sets byte for byte as published (provenance, licences and
checksums in ``README.md`` beside this file); ``rlvr/dapo_math_sample.jsonl`` is the first 300 rows of
DAPO-Math-17k for the tiny RLVR configs and tests; ``sft/sample.jsonl`` is 48 SFT rows of the demo's addition
task, written by the kit (:func:`sage_unsloth.demo.data.sft_rows`), for the offline stage-1 walk-through. :func:`verified_path` checks a bundled file's row count
and sha256 before it is read, so a truncated or edited copy fails with one clear line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
BENCHMARK_DIR = DATA_DIR / "benchmarks"
DAPO_SAMPLE = DATA_DIR / "rlvr" / "dapo_math_sample.jsonl"
SFT_SAMPLE = DATA_DIR / "sft" / "sample.jsonl"


@dataclass(frozen=True)
class BundledFile:
    path: Path
    rows: int
    sha256: str


BUNDLED: dict[str, BundledFile] = {
    "math500.jsonl": BundledFile(
        BENCHMARK_DIR / "math500.jsonl",
        500,
        "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
    ),
    "aime24.jsonl": BundledFile(
        BENCHMARK_DIR / "aime24.jsonl", 30, "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac"
    ),
    "aime25.jsonl": BundledFile(
        BENCHMARK_DIR / "aime25.jsonl", 30, "5764d239aa9e6dfaa13304e8a12e4c27fe0826fc21223c692e10f1eaa96fa6c1"
    ),
    "amc23.jsonl": BundledFile(
        BENCHMARK_DIR / "amc23.jsonl", 40, "43707e1ca784602d8479de24ee8ce36609dbebc46dd152b0b12a46611aa898a4"
    ),
    "minerva.jsonl": BundledFile(
        BENCHMARK_DIR / "minerva.jsonl",
        272,
        "0e656b430d3a0a1dab6aa853f453ba3805e28e2cabe4fc72486a897cc09d8ba2",
    ),
    "kk_test.jsonl": BundledFile(
        BENCHMARK_DIR / "kk_test.jsonl",
        500,
        "33179637292ba2d3e644ae8dd39dc1f115955939aefc0728671a65cabde63c1b",
    ),
    "dapo_math_sample.jsonl": BundledFile(
        DAPO_SAMPLE, 300, "e65694301809b9e0252bbbeb73e536dfae4b197e627945a1c236dc536efd2279"
    ),
    "sample.jsonl": BundledFile(
        SFT_SAMPLE, 48, "6e664dfecd27bd5f661465acff7e0969bd79ff8dd5628cebad5e1ecde84587be"
    ),
}

_VERIFIED: set[str] = set()


def _repo_relative(path: Path) -> str:
    root = DATA_DIR.parent.parent  # the checkout, for an editable install
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def verified_path(name: str) -> Path:
    """The bundled file ``name`` after checking its sha256 and row count (once per process)."""
    entry = BUNDLED.get(name)
    if entry is None:
        raise KeyError(f"{name!r} is not a bundled data file: choose from {sorted(BUNDLED)}")
    if name in _VERIFIED:
        return entry.path
    if not entry.path.is_file():
        raise FileNotFoundError(
            f"bundled data file {entry.path} is missing: restore it (git checkout -- "
            f"{_repo_relative(entry.path)}) or reinstall the kit"
        )
    data = entry.path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    rows = sum(1 for line in data.splitlines() if line.strip())
    if digest != entry.sha256 or rows != entry.rows:
        raise ValueError(
            f"bundled data file {entry.path} has {rows} rows and sha256 {digest[:12]}…, expected "
            f"{entry.rows} rows and {entry.sha256[:12]}…: restore it (git checkout -- "
            f"{_repo_relative(entry.path)})"
        )
    _VERIFIED.add(name)
    return entry.path
