"""Find and load the eval stage's outputs: results/<model>/<run>/{passk.csv, per_problem.csv, manifest.json}.

The contract with the eval stage (files, columns, pooled sets, pass@k) is sage_unsloth/results.py.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sage_unsloth.manifest import MANIFEST_NAME, read_manifest
from sage_unsloth.results import (
    AIME_PARTS,
    PASSK_FILE,
    PASSK_REQUIRED,
    PER_PROBLEM_FILE,
    PER_PROBLEM_REQUIRED,
    POOLED_AIME,
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


def load_run(run_dir: str | Path) -> RunResults:
    run_dir = Path(run_dir)
    passk_path = run_dir / PASSK_FILE
    if not passk_path.is_file():
        raise FileNotFoundError(
            f"{passk_path} not found: run the eval stage (scripts/03_eval.sh) for this run first"
        )
    passk = pd.read_csv(passk_path)
    _require_columns(passk, PASSK_REQUIRED, passk_path)
    passk["dataset"] = passk["dataset"].astype(str)
    passk["k"] = passk["k"].astype(int)
    notes = []
    per_problem = None
    pp_path = run_dir / PER_PROBLEM_FILE
    if pp_path.is_file():
        per_problem = pd.read_csv(pp_path, dtype={"problem_id": str})
        _require_columns(per_problem, PER_PROBLEM_REQUIRED, pp_path)
        per_problem["dataset"] = per_problem["dataset"].astype(str)
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
    return RunResults(
        model=run_dir.parent.name,
        run=run_dir.name,
        path=run_dir,
        passk=passk,
        per_problem=per_problem,
        manifest=manifest,
        notes=notes,
    )


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
