"""``sage-unsloth regrade RESULTS_DIR``: grade saved completions again with the current grader.

No model and no GPU: the eval stage kept every completion with its gold (``sage_unsloth.eval.records``),
so a grading fix costs seconds per thousand completions instead of resampling them. Every chunk file is
graded again (pairs that run out of budget are retried one at a time with the larger budget, as in an
eval run), and ``per_problem.csv``, ``passk.csv`` and the manifest's ``grading`` section are rewritten
atomically. Regrading with an unchanged grader rewrites the CSVs byte for byte.

    sage-unsloth regrade results/<model>/<run> [--workers N] [--completions_dir DIR] [--timeout_s S]

Flags are spelt with underscores like every other stage's; the old dashed spellings (--completions-dir,
--timeout-s) still work, with a one-line deprecation notice.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from sage_unsloth import grading
from sage_unsloth.eval.gradepool import GradingPool, retry_timeouts
from sage_unsloth.eval.records import (
    apply_grades,
    chunk_files,
    grading_items,
    read_chunk,
    status_counts,
    stored_gold,
    summary,
    write_chunk,
    write_tables,
)
from sage_unsloth.runtime.manifest import MANIFEST_NAME, atomic_write_json, read_manifest


def settle_timeouts(records: list[dict], retry_timeout_s: float) -> tuple[list[dict], int]:
    """``records`` with their ``timeout`` completions graded again serially under ``retry_timeout_s``."""
    items = grading_items(records)
    grades = [
        grading.Grade(c.get("answer"), c.get("status", grading.WRONG))
        for r in records
        for c in r["completions"]
    ]
    if not any(g.status == grading.TIMEOUT for g in grades):
        return records, 0
    grades, retried = retry_timeouts(items, grades, retry_timeout_s)
    return apply_grades(records, grades, grading.grader_fingerprint()), retried


def regrade_records(records: list[dict], pool: GradingPool, retry_timeout_s: float) -> tuple[list[dict], int]:
    """``records`` graded again from their saved completions and golds; returns (records, retried)."""
    grades = pool.grade(grading_items(records))
    return settle_timeouts(apply_grades(records, grades, grading.grader_fingerprint()), retry_timeout_s)


def _dataset_order(results: Path, manifest: dict) -> list[str]:
    if manifest.get("datasets"):
        return list(manifest["datasets"])
    order = []
    with (results / "per_problem.csv").open(encoding="utf-8") as fh:
        next(fh, None)
        for line in fh:
            name = line.split(",", 1)[0]
            if name and name not in order:
                order.append(name)
    return order


def _fill_golds(records: list[dict], manifest: dict, cache: dict) -> list[dict]:
    """Records written before golds were stored get theirs from the benchmark the run read."""
    if all("gold" in r for r in records):
        return records
    from sage_unsloth.eval.benchmarks import load_benchmark

    config = manifest.get("config") or {}
    out = []
    for record in records:
        if "gold" not in record:
            name = record["dataset"]
            if name not in cache:
                benchmark = "kk" if name.startswith("kk") else name
                problems = load_benchmark(
                    benchmark, config.get("data_dir"), source=config.get("source", "bundled")
                )
                cache[name] = {p.problem_id: p for p in problems}
            problem = cache[name].get(record["problem_id"])
            if problem is None:
                raise ValueError(
                    f"regrade: {name} problem {record['problem_id']} has no stored gold and is not in "
                    "the benchmark the run read"
                )
            record = {**record, "gold": stored_gold(problem)}
        out.append(record)
    return out


def resolve_completions_dir(results: Path, manifest: dict, override: str | None) -> Path:
    if override:
        path = Path(override)
    else:
        stored = manifest.get("completions_dir")
        if not stored:
            raise ValueError(f"{results / MANIFEST_NAME} has no completions_dir: pass --completions_dir")
        path = Path(stored)
    if not path.is_dir():
        raise FileNotFoundError(
            f"completions folder {path} not found: run regrade from the folder the eval ran "
            "in (paths in the manifest are relative to it), or pass --completions_dir"
        )
    return path


def read_eval_manifest(results: Path) -> dict:
    """The manifest of one eval run's folder; a folder that is not one says what regrade expects, and which
    eval runs lie below it."""
    if not results.is_dir():
        raise FileNotFoundError(
            f"regrade: {results} does not exist: pass one eval run's folder, results/<model>/<run>"
        )
    if not (results / MANIFEST_NAME).is_file():
        runs = sorted(
            str(path.parent)
            for path in results.rglob(MANIFEST_NAME)
            if json.loads(path.read_text()).get("stage") == "eval"
        )
        found = (
            f" (eval runs below it: {', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''})" if runs else ""
        )
        raise FileNotFoundError(
            f"regrade: {results} is not an eval run's folder (no {MANIFEST_NAME}): pass one eval run's "
            f"folder, results/<model>/<run>, as stage 3 writes it{found}"
        )
    return read_manifest(results, expect_stage="eval")


def regrade(
    results_dir: str | Path,
    *,
    workers: int | None = None,
    completions_dir: str | None = None,
    timeout_s: float | None = None,
    retry_timeout_s: float | None = None,
) -> dict:
    """Grade a run's saved completions again and rewrite its CSVs and manifest; returns the grading stats."""
    from sage_unsloth.runtime.folder_lock import FolderLock

    results = Path(results_dir)
    manifest = read_eval_manifest(results)
    completions = resolve_completions_dir(results, manifest, completions_dir)
    fix = "let that evaluation finish first"
    with FolderLock(completions, fix=fix), FolderLock(results, fix=fix):  # no writer beside a regrade
        return _regrade_locked(results, manifest, completions, workers, timeout_s, retry_timeout_s)


def _regrade_locked(
    results: Path, manifest: dict, completions: Path, workers, timeout_s, retry_timeout_s
) -> dict:
    config = manifest.get("config") or {}
    timeout_s = timeout_s or config.get("grading_timeout_s") or grading.DEFAULT_TIMEOUT_S
    retry_timeout_s = retry_timeout_s or config.get("grading_retry_timeout_s") or grading.RETRY_TIMEOUT_S
    per_problem, counts, retried, changed, gold_cache = [], dict.fromkeys(grading.STATUSES, 0), 0, 0, {}
    with GradingPool(workers, timeout_s=timeout_s) as pool:
        for dataset in _dataset_order(results, manifest):
            paths = chunk_files(completions, dataset)
            if not paths:
                raise FileNotFoundError(
                    f"regrade: no chunk files for {dataset} under {completions / dataset}"
                )
            for path in paths:
                records = read_chunk(path)
                if records is None:
                    raise ValueError(f"regrade: {path} is unreadable; re-run the eval stage to resample it")
                records = _fill_golds(records, manifest, gold_cache)
                new, n_retried = regrade_records(records, pool, retry_timeout_s)
                retried += n_retried
                if new != records:
                    write_chunk(path, new)
                    changed += 1
                per_problem += [summary(r) for r in new]
                for status, n in status_counts(new).items():
                    counts[status] += n
        stats = dict(pool.stats)
    write_tables(results, per_problem, manifest["ks"])
    manifest["grading"] = {
        **stats,
        "grader": grading.grader_fingerprint(),
        "budget_s": timeout_s,
        "retry_budget_s": retry_timeout_s,
        "retried": retried,
        "unresolved": counts[grading.TIMEOUT],
        "statuses": counts,
    }
    manifest["regraded"] = {"grader": grading.grader_fingerprint(), "chunks_changed": changed}
    atomic_write_json(results / MANIFEST_NAME, manifest)
    return manifest["grading"]


# The old dashed spellings, still accepted with a deprecation line (every other stage uses underscores).
DEPRECATED_FLAGS = {"--completions-dir": "--completions_dir", "--timeout-s": "--timeout_s"}


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        from sage_unsloth.config.args import ConfigError

        raise ConfigError(f"{message} (sage-unsloth regrade --help lists the flags)")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = _OneLineParser(
        prog="sage-unsloth regrade", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("results_dir", help="results/<model>/<run> of an eval run")
    parser.add_argument("--workers", type=int, default=None, help="grading processes (default: all cores)")
    parser.add_argument(
        "--completions_dir",
        "--completions-dir",
        default=None,
        help="the run's completions (default: from its manifest)",
    )
    parser.add_argument(
        "--timeout_s",
        "--timeout-s",
        type=float,
        default=None,
        help="CPU budget per pair (default: the run's)",
    )
    for arg in argv:
        old = arg.split("=", 1)[0]
        if old in DEPRECATED_FLAGS:
            print(
                f"sage-unsloth regrade: {old} is deprecated: use {DEPRECATED_FLAGS[old]}",
                file=sys.stderr,
            )
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    from sage_unsloth.config.args import ConfigError

    try:
        args = parse_args(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        stats = regrade(
            args.results_dir,
            workers=args.workers,
            completions_dir=args.completions_dir,
            timeout_s=args.timeout_s,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"regraded {stats['completions']} completions in {args.results_dir}: "
        f"{json.dumps(stats['statuses'])}; {stats['unresolved']} left unresolved (grading timeout)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
