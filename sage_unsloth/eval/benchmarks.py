"""Benchmark loading: the files bundled with the kit by default, a local folder, or the hub.

Every benchmark becomes a list of :class:`Problem` with a normalised gold (see ``sage_unsloth.grading``).
Where the rows come from (``source``):

- ``bundled`` (default): ``sage_unsloth/data/benchmarks/``, checked by row count and sha256 (provenance in
  ``sage_unsloth/data/README.md``). Works offline on a fresh clone.
- ``local``: the same file names in a folder of your own (``data_dir``).
- ``hub``: the public mirrors below (needs the hub). Their K&K set is the official test puzzles, a
  different set from the bundled one (Logic-RL's split).

| name    | hub id (split)                              | file             | gold                                  |
|---------|---------------------------------------------|------------------|---------------------------------------|
| aime24  | HuggingFaceH4/aime_2024 (train)             | aime24.jsonl     | answer (leading zeros dropped)        |
| aime25  | math-ai/aime25 (test)                       | aime25.jsonl     | answer                                |
| amc23   | math-ai/amc23 (test)                        | amc23.jsonl      | answer (floats such as 27.0 -> 27)    |
| math500 | HuggingFaceH4/MATH-500 (test)               | math500.jsonl    | answer                                |
| minerva | math-ai/minervamath (test)                  | minerva.jsonl    | answer, else last \\boxed{} of solution |
| kk      | see below                                   | kk_test.jsonl    | solution booleans (True = knight)     |

Knights-and-Knaves comes in two puzzle sets that must never be compared as one, so the dataset key
written to the results names the set: ``kk_logicrl`` (Logic-RL's held-out split, the bundled file) and
``kk_official`` (``K-and-K/knights-and-knaves`` test, 3-7 people, from the hub). ``kk`` in a config means
the set of the chosen source: ``kk_logicrl`` when bundled, ``kk_official`` from the hub. A local file
(``source: local``) is ``kk_logicrl`` when it is Logic-RL's (its rows say ``data_source: kk_logic``), else
``kk_local``: a set of your own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sage_unsloth.grading import minerva_gold, normalise_gold

SOURCES = ("bundled", "local", "hub")


@dataclass(frozen=True)
class BenchmarkSpec:
    hub_id: str
    split: str
    local_file: str
    hub_config: str | None = None
    hub_data_files: tuple[str, ...] = ()


KK_OFFICIAL_HUB = BenchmarkSpec(
    "K-and-K/knights-and-knaves",
    "test",
    "kk_test.jsonl",
    hub_config="test",
    hub_data_files=tuple(f"test/people{n}_num100.jsonl" for n in range(3, 8)),
)
BENCHMARKS: dict[str, BenchmarkSpec] = {
    "aime24": BenchmarkSpec("HuggingFaceH4/aime_2024", "train", "aime24.jsonl"),
    "aime25": BenchmarkSpec("math-ai/aime25", "test", "aime25.jsonl"),
    "amc23": BenchmarkSpec("math-ai/amc23", "test", "amc23.jsonl"),
    "math500": BenchmarkSpec("HuggingFaceH4/MATH-500", "test", "math500.jsonl"),
    "minerva": BenchmarkSpec("math-ai/minervamath", "test", "minerva.jsonl"),
    "kk": KK_OFFICIAL_HUB,  # the variant follows the source (see the module docstring)
    "kk_logicrl": BenchmarkSpec("", "", "kk_test.jsonl"),  # bundled or local only
    "kk_official": KK_OFFICIAL_HUB,  # hub only
}
KK_BENCHMARKS = ("kk", "kk_logicrl", "kk_official")
DEFAULT_BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva", "kk")
# The dataset keys K&K results are written under; none of them is ever pooled or averaged with another.
KK_VARIANTS = ("kk_logicrl", "kk_official", "kk_local")


@dataclass(frozen=True)
class Problem:
    dataset: str
    problem_id: str
    problem: str
    gold: str = ""  # math benchmarks
    kk_solution: tuple[bool, ...] = field(default=())  # Knights-and-Knaves
    kk_names: tuple[str, ...] = field(default=())

    @property
    def is_kk(self) -> bool:
        return bool(self.kk_names)


def with_local_benchmarks(specs, known: Mapping[str, BenchmarkSpec] = BENCHMARKS) -> dict[str, BenchmarkSpec]:
    """``known`` (the built-ins by default) with the user benchmarks given as "name=path.jsonl" (MATH-500 layout:
    problem, answer, optional unique_id/id) added: a new mapping for this run, ``known`` is left as it is. A name
    may not shadow a built-in benchmark."""
    view = dict(known)
    for spec in specs:
        name, sep, path = str(spec).partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise ValueError(f"local_benchmarks entry {spec!r}: write it as name=path/to/file.jsonl")
        from sage_unsloth.runtime.layout import check_name

        check_name(name, "local_benchmarks name", example="mybench")  # results are written under it
        built_in = view.get(name)
        if built_in is not None and (built_in.hub_id or name in KK_BENCHMARKS or name in KK_VARIANTS):
            raise ValueError(
                f"local_benchmarks entry {spec!r}: {name!r} is a built-in benchmark; pick another name"
            )
        if not Path(path).is_file():
            raise FileNotFoundError(f"local_benchmarks entry {spec!r}: {path} not found")
        # No hub id: always read from the (absolute) local path, whatever source / data_dir say.
        view[name] = BenchmarkSpec(hub_id="", split="", local_file=str(Path(path).resolve()))
    return view


def check_benchmark_names(names, known: Mapping[str, BenchmarkSpec] = BENCHMARKS) -> list[str]:
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown} in `benchmarks`: choose from {sorted(known)}")
    if not names:
        raise ValueError(f"`benchmarks` is empty: choose from {sorted(known)}")
    return list(names)


def check_kk_source(name: str, source: str) -> None:
    """One line when a K&K set is asked from a source that does not hold it."""
    if name == "kk_logicrl" and source == "hub":
        raise ValueError(
            "benchmark kk_logicrl (Logic-RL's split) is bundled, not on the hub: use source=bundled "
            "(or local), or kk_official for the hub's official test puzzles"
        )
    if name == "kk_official" and source != "hub":
        raise ValueError(
            f"benchmark kk_official (the hub's official K&K test puzzles) needs source=hub, not "
            f"{source}: use kk or kk_logicrl for the bundled Logic-RL split"
        )


def _first(row: dict, *keys: str):
    for key in keys:
        value = row.get(key)
        if value not in (None, ""):
            return value
    return None


def check_source(source: str, data_dir: str | Path | None) -> str:
    """The effective source: ``local`` when only ``data_dir`` is given; one-line errors otherwise."""
    if source not in SOURCES:
        raise ValueError(f"source={source!r} is unknown: use one of {', '.join(SOURCES)}")
    if data_dir and source == "bundled":
        return "local"  # a data_dir given on its own means "read my folder"
    if data_dir and source == "hub":
        raise ValueError(
            "source=hub ignores data_dir: drop data_dir, or set source=local to read that folder"
        )
    if source == "local" and not data_dir:
        raise ValueError("source=local needs data_dir: the folder holding the benchmark .jsonl files")
    return source


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _rows(name: str, spec: BenchmarkSpec, source: str, data_dir: str | Path | None) -> list[dict]:
    from sage_unsloth.data import verified_path

    if not spec.hub_id and name not in KK_BENCHMARKS:  # a user benchmark given by path (local_benchmarks)
        return _read_jsonl(Path(spec.local_file))
    if source == "bundled":
        return _read_jsonl(verified_path(spec.local_file))
    if source == "local":
        path = Path(data_dir) / spec.local_file
        if not path.is_file():
            raise FileNotFoundError(
                f"benchmark {name!r}: {path} not found (set `data_dir` to a folder holding "
                f"{spec.local_file}, or drop data_dir to use the bundled files)"
            )
        return _read_jsonl(path)
    import datasets

    if spec.hub_data_files:
        ds = datasets.load_dataset(spec.hub_id, data_files=list(spec.hub_data_files), split="train")
    else:
        ds = datasets.load_dataset(spec.hub_id, spec.hub_config, split=spec.split)
    return [dict(row) for row in ds]


def kk_variant(source: str, rows: list[dict]) -> str:
    """The dataset key of a K&K set read from ``source`` (see the module docstring)."""
    if source == "bundled":
        return "kk_logicrl"
    if source == "hub":
        return "kk_official"
    return "kk_logicrl" if rows and all(r.get("data_source") == "kk_logic" for r in rows) else "kk_local"


def _to_problem(name: str, index: int, row: dict, dataset: str) -> Problem:
    if name in KK_BENCHMARKS:
        names = tuple(row["names"])
        solution = tuple(bool(x) for x in row["solution"])
        # Logic-RL's index repeats across people counts; the count + index is unique.
        pid = f"{len(names)}ppl-{row.get('index', index)}"
        return Problem(dataset, pid, str(row["quiz"]), kk_solution=solution, kk_names=names)
    problem = _first(row, "problem", "question", "Problem")
    gold = _first(row, "answer", "Answer")
    if gold is None and name == "minerva":
        gold = minerva_gold(row["solution"])
    if problem is None or gold is None:
        raise ValueError(f"benchmark {name!r} row {index} has no problem/answer field (keys: {sorted(row)})")
    pid = _first(row, "unique_id", "id", "idx")
    return Problem(dataset, str(index if pid is None else pid), str(problem), gold=normalise_gold(gold))


def load_benchmark(
    name: str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    *,
    source: str = "bundled",
    known: Mapping[str, BenchmarkSpec] = BENCHMARKS,
) -> list[Problem]:
    """The problems of one benchmark in file order (the first ``limit`` when given), from ``source``.
    ``Problem.dataset`` is the key results are written under: the benchmark name, or the K&K variant. ``known``:
    the benchmarks by name (the built-ins, or a run's view with its own: :func:`with_local_benchmarks`)."""
    check_benchmark_names([name], known)
    source = check_source(source, data_dir)
    check_kk_source(name, source)
    rows = _rows(name, known[name], source, data_dir)
    dataset = kk_variant(source, rows) if name in KK_BENCHMARKS else name
    if limit:
        rows = rows[:limit]
    problems = [_to_problem(name, i, row, dataset) for i, row in enumerate(rows)]
    ids = [p.problem_id for p in problems]
    if len(set(ids)) != len(ids):  # ids key the resume state: make them unique, deterministically
        problems = [
            Problem(p.dataset, f"{i}:{p.problem_id}", p.problem, p.gold, p.kk_solution, p.kk_names)
            for i, p in enumerate(problems)
        ]
    return problems
