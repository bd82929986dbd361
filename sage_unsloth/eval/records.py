"""What evaluation keeps on disk: chunk files of graded completions, and the tables built from them.

A chunk file (``<completions_dir>/<dataset>/chunk_00000.jsonl.gz``) holds one record per problem::

    {"dataset", "problem_id", "seed", "n", "c", "mean_completion_tokens",
     "gold": "<gold>" | {"solution": [...], "names": [...]},      # what the completions were graded against
     "grader": "<grading.grader_fingerprint()>",                  # which grading rules gave the statuses
     "completions": [{"text", "tokens", "answer", "status", "correct"}, ...]}

``answer`` is what the grader read (the final answer; for K&K the roles it found), ``status`` one of
``grading.STATUSES``. With the gold and the answer kept, a grader fix re-grades the saved completions
(``sage-unsloth regrade``) instead of resampling them. Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

from sage_unsloth import grading
from sage_unsloth.eval.passk import passk_rows
from sage_unsloth.runtime.manifest import atomic_write_text, fsync_folder
from sage_unsloth.runtime.results import PASSK_COLUMNS, PASSK_FILE, PER_PROBLEM_COLUMNS, PER_PROBLEM_FILE


def chunk_path(completions_dir: Path, dataset: str, index: int) -> Path:
    return Path(completions_dir) / dataset / f"chunk_{index:05d}.jsonl.gz"


def chunk_files(completions_dir: Path, dataset: str) -> list[Path]:
    return sorted((Path(completions_dir) / dataset).glob("chunk_*.jsonl.gz"))


def write_chunk(path: Path, records: list[dict]) -> None:
    """Write a chunk atomically (temp file + rename); a write that fails (a full disk) leaves no temp file."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz:
        for record in records:
            gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(buffer.getvalue())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


class CorruptChunk(ValueError):
    """A chunk file that cannot be read back: the message names the file, the line and what is wrong."""


# What every record of a chunk must hold (the rest is checked where it is used).
CHUNK_KEYS = ("problem_id", "n", "c", "completions")


def _record_problem(record) -> str | None:
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a record"
    missing = [k for k in CHUNK_KEYS if k not in record]
    if missing:
        return f"a record without {', '.join(missing)}"
    completions = record["completions"]
    if not isinstance(completions, list) or not all(
        isinstance(c, dict) and isinstance(c.get("text"), str) for c in completions
    ):
        return "a record whose completions are not a list of {text, ...}"
    if len(completions) != record["n"]:
        return f"a record with n={record['n']!r} but {len(completions)} completions"
    return None


def read_chunk(path: Path, expected_ids: Sequence[str] | None = None) -> list[dict] | None:
    """The chunk's records; None when absent or (given ``expected_ids``) for other problems. A file that cannot
    be read back (not gzip, torn, invalid UTF-8, a line that is not a whole record) raises :class:`CorruptChunk`
    naming the file and the line."""
    if not path.is_file():
        return None
    try:
        with gzip.open(path, "rb") as fh:
            lines = fh.read().split(b"\n")
    except (OSError, EOFError, zlib.error) as exc:
        raise CorruptChunk(f"{path} is not a whole gzip file ({type(exc).__name__}: {exc})") from None
    if lines and lines[-1] == b"":
        lines.pop()
    records = []
    for number, raw in enumerate(lines, start=1):
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise CorruptChunk(f"{path} line {number} is not valid UTF-8 (byte {exc.start})") from None
        except json.JSONDecodeError as exc:
            raise CorruptChunk(f"{path} line {number} is not JSON ({exc.msg}, column {exc.colno})") from None
        if (why := _record_problem(record)) is not None:
            raise CorruptChunk(f"{path} line {number} is {why}")
        records.append(record)
    if not records:
        raise CorruptChunk(f"{path} holds no record")
    if expected_ids is not None and [r.get("problem_id") for r in records] != list(expected_ids):
        return None
    return records


def set_aside(path: Path) -> Path:
    """Rename a corrupt chunk out of the run (``<name>.corrupt``, ``<name>.corrupt-2``, ...: kept for a look, never
    read again); returns the new path."""
    target = path.with_name(f"{path.name}.corrupt")
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}.corrupt-{number}")
    os.replace(path, target)
    return target


def summary(record: dict) -> dict:
    return {k: record[k] for k in PER_PROBLEM_COLUMNS}


# ----------------------------------------------------------------------------------------------- golds
def stored_gold(problem) -> str | dict:
    """A problem's gold as kept in its record."""
    if problem.is_kk:
        return {"solution": list(problem.kk_solution), "names": list(problem.kk_names)}
    return problem.gold


def grading_gold(gold: str | dict):
    """A stored gold as ``grading.grade`` takes it."""
    if isinstance(gold, dict):
        return tuple(bool(x) for x in gold["solution"]), tuple(gold["names"])
    return gold


def grading_items(records: Sequence[dict]) -> list[tuple[str, object]]:
    """(completion text, gold) for every completion of ``records``, in order."""
    items = []
    for record in records:
        gold = grading_gold(record["gold"])
        items.extend((c["text"], gold) for c in record["completions"])
    return items


def apply_grades(records: Sequence[dict], grades: Sequence[grading.Grade], grader: str) -> list[dict]:
    """``records`` with each completion's answer/status/correct, ``c`` and ``grader`` set from ``grades``."""
    out, i = [], 0
    for record in records:
        completions = []
        for completion, g in zip(
            record["completions"], grades[i : i + len(record["completions"])], strict=True
        ):
            completions.append({**completion, "answer": g.answer, "status": g.status, "correct": g.correct})
        i += len(completions)
        out.append(
            {
                **record,
                "c": sum(c["correct"] for c in completions),
                "grader": grader,
                "completions": completions,
            }
        )
    if i != len(grades):
        raise ValueError(f"{len(grades)} grades for {i} completions")
    return out


def status_counts(records: Sequence[dict]) -> dict[str, int]:
    counts = dict.fromkeys(grading.STATUSES, 0)
    for record in records:
        for completion in record["completions"]:
            counts[
                completion.get("status", grading.CORRECT if completion.get("correct") else grading.WRONG)
            ] += 1
    return counts


def build_records(problems, seeds, samples, grades: Sequence[grading.Grade], grader: str) -> list[dict]:
    """Records of freshly sampled and graded problems (``samples[i]``: the completions of ``problems[i]``)."""
    records = []
    for problem, seed, group in zip(problems, seeds, samples, strict=True):
        records.append(
            {
                "dataset": problem.dataset,
                "problem_id": problem.problem_id,
                "seed": seed,
                "n": len(group),
                "c": 0,
                "mean_completion_tokens": round(sum(s.tokens for s in group) / max(len(group), 1), 3),
                "gold": stored_gold(problem),
                "grader": grader,
                "completions": [{"text": s.text, "tokens": s.tokens} for s in group],
            }
        )
    return apply_grades(records, grades, grader)


# ----------------------------------------------------------------------------------------------- tables
def write_csv(path: Path, columns, rows) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def write_tables(results: Path, per_problem: Sequence[dict], ks: Sequence[int]) -> None:
    """per_problem.csv and passk.csv of a run."""
    write_csv(Path(results) / PER_PROBLEM_FILE, PER_PROBLEM_COLUMNS, per_problem)
    write_csv(Path(results) / PASSK_FILE, PASSK_COLUMNS, passk_rows(per_problem, ks))
