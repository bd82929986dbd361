"""Find and load the eval stage's outputs: results/<model>/<run>/{passk.csv, per_problem.csv, manifest.json}.

The contract with the eval stage (files, columns, pooled sets, pass@k) is sage_unsloth/runtime/results.py. A pass@k is a
probability: a value of passk.csv outside [0, 1] is refused naming its line, and where per_problem.csv is there
each value of passk.csv is recomputed from its counts (the eval stage's own aggregation, eval/passk.py) and must
agree, so a hand-edited or mixed-up table never reaches the report beside intervals from other numbers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sage_unsloth.runtime.manifest import MANIFEST_NAME, read_manifest
from sage_unsloth.runtime.results import (
    AIME_PARTS,
    PASSK_FILE,
    PASSK_REQUIRED,
    PER_PROBLEM_FILE,
    PER_PROBLEM_REQUIRED,
    POOLED_AIME,
    TRAINING_RUN_DIR,
    pass_at_k_matrix,
    stored_parts,
)

log = logging.getLogger(__name__)


@dataclass
class RunResults:
    model: str
    run: str
    path: Path
    passk: pd.DataFrame  # dataset, k, pass_at_k (+ whatever else the eval wrote)
    per_problem: pd.DataFrame | None  # dataset, problem_id, n, c
    manifest: dict | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.model}/{self.run}"

    @property
    def stage_folder(self) -> Path | None:
        """The folder of the evaluated checkpoint's training stage (its manifest, its training log): the copy the
        W&B reader wrote beside the results (``training_run/``, sage_unsloth/report/wandb_read.py), else the eval
        manifest's ``checkpoint`` when it is a folder on this machine; None otherwise."""
        copy = self.path / TRAINING_RUN_DIR
        if (copy / MANIFEST_NAME).is_file():
            return copy
        checkpoint = (self.manifest or {}).get("checkpoint")
        return Path(checkpoint) if checkpoint and Path(str(checkpoint)).is_dir() else None

    def reported(self, dataset: str, k: int) -> float | None:
        """The eval stage's pass@k for (dataset, k), or None when it did not report it."""
        rows = self.passk[(self.passk["dataset"] == dataset) & (self.passk["k"] == k)]
        if rows.empty or pd.isna(rows["pass_at_k"].iloc[0]):
            return None
        return float(rows["pass_at_k"].iloc[0])

    def reported_ks(self, dataset: str | None = None) -> list[int]:
        frame = self.passk if dataset is None else self.passk[self.passk["dataset"] == dataset]
        return sorted(int(k) for k in frame["k"].dropna().unique())

    def problem_values(self, dataset: str, ks) -> tuple[np.ndarray, np.ndarray] | None:
        """(problem_ids, (N, K) per-problem pass@k) for a set; "aime" pools aime24 + aime25."""
        if self.per_problem is None:
            return None
        parts = stored_parts(dataset)
        frame = self.per_problem[self.per_problem["dataset"].isin(parts)]
        if dataset == POOLED_AIME and set(frame["dataset"]) != set(AIME_PARTS):
            return None
        if frame.empty:
            return None
        ids = (frame["dataset"] + ":" + frame["problem_id"].astype(str)).to_numpy()
        return ids, pass_at_k_matrix(frame["n"], frame["c"], ks)


def _require_columns(frame: pd.DataFrame, columns, path: Path) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{path}: missing column(s) {missing}; expected at least {list(columns)} "
            "(re-run the eval stage, or fix the CSV header)"
        )


def read_results_csv(path: Path, **kwargs) -> pd.DataFrame:
    """A results CSV; one that is empty, binary, not UTF-8 or not a table is a ValueError naming the file (and
    the line where the parser says) and the fix, in one line."""
    fix = "re-run the eval stage for this run (or sage-unsloth regrade it), or restore the file"
    with path.open("rb") as fh:
        head = fh.read(4096)
    if not head.strip():
        raise ValueError(f"{path} is empty: {fix}")
    if b"\0" in head:
        raise ValueError(f"{path} is binary, not a CSV table: {fix}")
    try:
        return pd.read_csv(path, encoding="utf-8", encoding_errors="strict", **kwargs)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not valid UTF-8 (byte {exc.start}): {fix}") from None
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path} is empty: {fix}") from None
    except (pd.errors.ParserError, ValueError) as exc:
        raise ValueError(f"{path} is not a CSV table ({str(exc).strip().splitlines()[0]}): {fix}") from None


def _numbers(frame: pd.DataFrame, column: str, path: Path, *, integer: bool) -> pd.Series:
    """``frame[column]`` as numbers; a value that is not one (an empty cell, where ``integer``) is a ValueError
    naming the file and the line."""
    values = pd.to_numeric(frame[column], errors="coerce")
    bad = values.isna() & frame[column].notna() | (
        values.isna() | (values != values.round()) if integer else False
    )
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        value = frame[column].iloc[row]
        shown = "an empty cell" if pd.isna(value) else f"{column}={str(value)!r}"
        raise ValueError(
            f"{path} line {row + 2}: {shown} is not "  # + the header, 1-based
            f"{'an integer' if integer else 'a number'} ({column}): re-run the eval stage for this run, or restore "
            "the file"
        )
    return values.astype(int) if integer else values


FIX = "re-run the eval stage for this run (or sage-unsloth regrade it), or restore the file"
AGREEMENT = 1e-6  # passk.csv holds the value as computed (10 significant digits in older files)


def _check_probabilities(passk: pd.DataFrame, path: Path) -> None:
    """Every pass@k of ``passk`` in [0, 1] (an empty cell is a missing value); else the line, in one ValueError."""
    values = passk["pass_at_k"]
    bad = values.notna() & ~values.between(0.0, 1.0)
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        item = passk.iloc[row]
        raise ValueError(
            f"{path} line {row + 2}: {item['dataset']} pass@{item['k']} = {item['pass_at_k']:g} is not a "
            f"probability (outside [0, 1]): {FIX}"
        )


def _check_against_counts(passk: pd.DataFrame, per_problem: pd.DataFrame, path: Path) -> None:
    """Each pass@k of ``passk`` the counts of ``per_problem`` give (a set, pooled AIME, the paper's average) must
    be what they give, within :data:`AGREEMENT`; else the line and both values, in one ValueError."""
    from sage_unsloth.eval.passk import passk_rows

    ks = sorted({int(k) for k in passk["k"].dropna()})
    counts = per_problem[["dataset", "n", "c"]].to_dict("records")
    try:
        expected = {(r["dataset"], r["k"]): r["pass_at_k"] for r in passk_rows(counts, ks)}
    except ValueError as exc:  # c > n, k < 1: the counts themselves are wrong
        raise ValueError(f"{path.with_name(PER_PROBLEM_FILE)}: {exc}: {FIX}") from None
    for row, item in enumerate(passk.itertuples(index=False)):
        want = expected.get((str(item.dataset), int(item.k)))
        if want is None or pd.isna(item.pass_at_k) or abs(item.pass_at_k - want) <= AGREEMENT:
            continue
        raise ValueError(
            f"{path} line {row + 2}: {item.dataset} pass@{item.k} = {item.pass_at_k:.6g}, but {PER_PROBLEM_FILE} "
            f"gives {want:.6g}: the two files disagree (one was edited, or they are from different runs): {FIX}"
        )


def load_run(run_dir: str | Path) -> RunResults:
    run_dir = Path(run_dir)
    passk_path = run_dir / PASSK_FILE
    if not passk_path.is_file():
        raise FileNotFoundError(
            f"{passk_path} not found: run the eval stage (scripts/03_eval.sh) for this run first"
        )
    passk = read_results_csv(passk_path)
    _require_columns(passk, PASSK_REQUIRED, passk_path)
    passk["dataset"] = passk["dataset"].astype(str)
    passk["k"] = _numbers(passk, "k", passk_path, integer=True)
    passk["pass_at_k"] = _numbers(passk, "pass_at_k", passk_path, integer=False)  # an empty cell: missing
    _check_probabilities(passk, passk_path)
    notes = []
    per_problem = None
    pp_path = run_dir / PER_PROBLEM_FILE
    if pp_path.is_file():
        per_problem = read_results_csv(pp_path, dtype={"problem_id": str})
        _require_columns(per_problem, PER_PROBLEM_REQUIRED, pp_path)
        per_problem["dataset"] = per_problem["dataset"].astype(str)
        for column in ("n", "c"):
            per_problem[column] = _numbers(per_problem, column, pp_path, integer=True)
        _check_against_counts(passk, per_problem, passk_path)
    else:
        notes.append("per_problem.csv missing: no confidence intervals")
    manifest = None
    if (run_dir / MANIFEST_NAME).is_file():
        try:
            manifest = read_manifest(run_dir, expect_stage="eval")
        except (ValueError, json.JSONDecodeError) as err:
            notes.append(f"manifest unreadable: {err}")
    else:
        notes.append("manifest.json missing")
    return RunResults(run_dir.parent.name, run_dir.name, run_dir, passk, per_problem, manifest, notes)


def discover_runs(results_dir: str | Path) -> list[RunResults]:
    """Every results/<model>/<run>/ holding a passk.csv, sorted by model then run."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(
            f"results folder {results_dir} not found: pass --results DIR "
            "(the eval stage writes results/<model>/<run>/passk.csv)"
        )
    runs = [load_run(p.parent) for p in sorted(results_dir.glob(f"*/*/{PASSK_FILE}"))]
    for run in runs:
        for note in run.notes:
            log.warning("%s: %s", run.name, note)
    return runs
