"""Sharded evaluation: ``--shard i/N`` samples every N-th chunk of a run, so N processes (one per GPU) share it.

A run's chunks are its (benchmark, chunk index) pairs in config order (``problems_per_batch`` problems
each, see eval/run.py). Shard ``i`` of ``N`` samples the chunks at positions ``p`` with ``p % N == i`` in
that order, over every chunk of the run (done or not), so the shards are disjoint and cover the run
whatever each one finds already on disk. Chunk contents and per-problem seeds do not depend on who
samples them, so the chunk files are the ones a single process writes.

Merging is the eval stage itself: it writes per_problem.csv / passk.csv only once every chunk of the run
is on disk. The shard that completes the set writes them; otherwise a run without ``--shard`` finds all
chunks, samples nothing (no model loads) and writes them. Either way the CSVs are those of one process,
byte for byte (tests/eval/test_eval_shard.py).

    CUDA_VISIBLE_DEVICES=0 sage-unsloth eval configs/eval/qwen2.5-math-7b.yaml --shard 0/2 &
    CUDA_VISIBLE_DEVICES=1 sage-unsloth eval configs/eval/qwen2.5-math-7b.yaml --shard 1/2 &
    wait
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from typing import TypeVar

Chunk = TypeVar("Chunk")
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """``"i/N"`` -> (i, N); None for no sharding. One-line error for anything else."""
    if spec is None or str(spec).strip() == "":
        return None
    match = _SHARD.match(str(spec))
    if not match or not 0 <= int(match.group(1)) < int(match.group(2)):
        raise ValueError(f"shard={spec!r}: use i/N with 0 <= i < N, e.g. --shard 0/4 ... --shard 3/4")
    return int(match.group(1)), int(match.group(2))


def chunk_keys(problem_sets: dict[str, Sequence], problems_per_batch: int) -> list[tuple[str, int]]:
    """Every (benchmark, chunk index) of a run, in the order the eval stage walks them."""
    return [
        (name, index)
        for name, problems in problem_sets.items()
        for index in range((len(problems) + problems_per_batch - 1) // problems_per_batch)
    ]


def select_shard(
    pending: list[Chunk], keys: list[Hashable], shard: str | None, key=lambda chunk: (chunk[0], chunk[1])
) -> list[Chunk]:
    """The pending chunks shard ``i/N`` samples: those whose position among all ``keys`` is i mod N."""
    parsed = parse_shard(shard)
    if parsed is None:
        return pending
    index, count = parsed
    position = {k: p for p, k in enumerate(keys)}
    return [chunk for chunk in pending if position[key(chunk)] % count == index]
