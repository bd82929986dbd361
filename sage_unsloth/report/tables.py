"""Tidy tables: every run's pass@k beside the paper's value, bootstrap CIs, paired differences.

Point values are the eval stage's passk.csv numbers (its product); confidence intervals come from
per_problem.csv. A (dataset, k) the run did not report is "missing" (NaN, status "missing"), never 0.
The pooled AIME set ("aime" = aime24 + aime25, as in the paper) is derived when both parts exist.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sage_unsloth.report import intervals
from sage_unsloth.report.compare import split_run
from sage_unsloth.report.loading import RunResults
from sage_unsloth.report.paper import DEFAULT_METHOD_PAIRS, PaperRow, map_run, paper_value
from sage_unsloth.runtime.results import AIME_PARTS, PAPER_AVERAGE, PAPER_AVERAGE_SETS, POOLED_AIME


# --- markdown tables (the report stage and the training section both write them; cells: report/formatting.py)
def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


log = logging.getLogger(__name__)

DATASET_ORDER = (
    PAPER_AVERAGE,
    POOLED_AIME,
    "aime24",
    "aime25",
    "amc23",
    "math500",
    "minerva",
    "kk_logicrl",
    "kk_official",
    "kk_local",
    "kk",
)
# Section titles that say which puzzle set a K&K result is on (the two sets are never comparable).
DATASET_TITLES = {
    PAPER_AVERAGE: "Paper average (AIME pooled, AMC23, MATH-500)",
    "kk_logicrl": "Knights-and-Knaves, Logic-RL split (kk_logicrl; not comparable with kk_official)",
    "kk_official": "Knights-and-Knaves, official test puzzles (kk_official; not comparable with kk_logicrl)",
    "kk_local": "Knights-and-Knaves, a local puzzle file (kk_local)",
    "kk": "Knights-and-Knaves, puzzle set not recorded (kk: results written before the variant was named)",
}
CONSISTENCY_TOL = 1e-6


@dataclass
class BootstrapSettings:
    resamples: int = intervals.DEFAULT_RESAMPLES
    seed: int = 0
    level: float = 0.95


def report_datasets(runs: list[RunResults]) -> list[str]:
    seen = set()
    for run in runs:
        seen.update(run.passk["dataset"].unique())
        if set(AIME_PARTS) <= seen:
            seen.add(POOLED_AIME)
    ordered = [d for d in DATASET_ORDER if d in seen]
    return ordered + sorted(seen - set(ordered))


def point_value(run: RunResults, dataset: str, k: int) -> float | None:
    """The run's reported pass@k; "aime" pools aime24 and aime25 weighted by problem count."""
    direct = run.reported(dataset, k)
    if direct is not None or dataset != POOLED_AIME:
        return direct
    parts = []
    for part in AIME_PARTS:
        value = run.reported(part, k)
        if value is None:
            return None
        rows = run.passk[(run.passk["dataset"] == part) & (run.passk["k"] == k)]
        if "n_problems" in rows.columns and not pd.isna(rows["n_problems"].iloc[0]):
            weight = float(rows["n_problems"].iloc[0])
        elif run.per_problem is not None:
            weight = float((run.per_problem["dataset"] == part).sum())
        else:
            return None
        parts.append((value, weight))
    total = sum(w for _, w in parts)
    return sum(v * w for v, w in parts) / total if total else None


def _set_values(run: RunResults, dataset: str, ks) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """{set: (problem ids, (N, K) values)} making up ``dataset``; None if any set lacks per-problem data."""
    names = PAPER_AVERAGE_SETS if dataset == PAPER_AVERAGE else (dataset,)
    out = {}
    for name in names:
        got = run.problem_values(name, ks)
        if got is None:
            return None
        out[name] = got
    return out


def bootstrap_ci(run: RunResults, dataset: str, ks, settings: BootstrapSettings):
    """(point from per-problem data, ci_low, ci_high), each (K,), or None without per-problem data."""
    sets = _set_values(run, dataset, ks)
    if sets is None:
        return None
    per_set = [(name, values) for name, (_, values) in sets.items()]
    samples = intervals.stratified_average_samples(per_set, resamples=settings.resamples, seed=settings.seed)
    low, high = intervals.percentile_ci(samples, settings.level)
    point = np.mean([values.mean(axis=0) for _, values in per_set], axis=0)
    return point, low, high


def curve_table(runs: list[RunResults], settings: BootstrapSettings) -> pd.DataFrame:
    """Every reported (run, dataset, k) with its bootstrap CI: the data behind the curves and tables."""
    rows = []
    for run in runs:
        for dataset in report_datasets([run]):
            ks = run.reported_ks(dataset) or (
                run.reported_ks(AIME_PARTS[0]) if dataset == POOLED_AIME else []
            )
            values = [point_value(run, dataset, k) for k in ks]
            ci = bootstrap_ci(run, dataset, ks, settings) if ks else None
            for i, (k, value) in enumerate(zip(ks, values)):
                if value is None:
                    continue
                low = high = np.nan
                if ci is not None and np.isfinite(ci[1][i]):
                    low, high = float(ci[1][i]), float(ci[2][i])
                    if abs(ci[0][i] - value) > CONSISTENCY_TOL:
                        log.warning(
                            "%s %s pass@%d: passk.csv says %.6f but per_problem.csv gives %.6f",
                            run.name,
                            dataset,
                            k,
                            value,
                            ci[0][i],
                        )
                rows.append(
                    {
                        "model": run.model,
                        "run": run.run,
                        "dataset": dataset,
                        "k": k,
                        "value": value,
                        "ci_low": low,
                        "ci_high": high,
                    }
                )
    return pd.DataFrame(rows, columns=["model", "run", "dataset", "k", "value", "ci_low", "ci_high"])


def headline_k(run: RunResults, row: PaperRow) -> int | None:
    """The k of the run's "pass@k" column: the paper's k for its model, else the largest k it reported."""
    if row.k is not None:
        return row.k
    ks = run.reported_ks()
    return max(ks) if ks else None


def comparison_table(
    runs: list[RunResults], curves: pd.DataFrame, published: pd.DataFrame, mapping: dict | None = None
) -> pd.DataFrame:
    """Per run x dataset x {pass@1, pass@k}: value, CI, paper value, difference, status."""
    rows = []
    datasets = report_datasets(runs)
    for run in runs:
        row = map_run(run.model, run.run, mapping)
        big_k = headline_k(run, row)
        for dataset in datasets:
            for metric, k in (("pass@1", 1), ("pass@k", big_k)):
                hit = (
                    curves[
                        (curves["model"] == run.model)
                        & (curves["run"] == run.run)
                        & (curves["dataset"] == dataset)
                        & (curves["k"] == k)
                    ]
                    if k
                    else curves.iloc[0:0]
                )
                paper = paper_value(published, row, dataset, k) if k else None
                value = float(hit["value"].iloc[0]) if not hit.empty else np.nan
                rows.append(
                    {
                        "model": run.model,
                        "run": run.run,
                        "paper_model": row.model,
                        "method": row.method,
                        "dataset": dataset,
                        "metric": metric,
                        "k": k,
                        "value": value,
                        "ci_low": float(hit["ci_low"].iloc[0]) if not hit.empty else np.nan,
                        "ci_high": float(hit["ci_high"].iloc[0]) if not hit.empty else np.nan,
                        "paper": paper[0] if paper else np.nan,
                        "paper_primary": paper[1] if paper else None,
                        "diff": value - paper[0] if paper and not hit.empty else np.nan,
                        "status": "ok" if not hit.empty else "missing",
                    }
                )
    return pd.DataFrame(rows)


def parse_pairs(spec: str | None) -> list[tuple[str, str]]:
    """ "a:b,c:d" -> [(a, b), (c, d)]; each side a run folder name or "<model>/<run>"."""
    if not spec:
        return []
    pairs = []
    for item in spec.split(","):
        if not item.strip():
            continue
        if item.count(":") != 1:
            raise ValueError(f"--pairs: '{item}' is not 'run_a:run_b' (use commas between pairs)")
        a, b = (s.strip() for s in item.split(":"))
        if not a or not b:
            raise ValueError(f"--pairs: '{item}' names no run on one side (write run_a:run_b)")
        pairs.append((a, b))
    return pairs


def _select(runs: list[RunResults], ref: str) -> list[RunResults]:
    return [r for r in runs if ref in (r.name, r.run)]


def _is_method(runs: list[RunResults], name: str) -> bool:
    return any(split_run(r.run)[0] == name and split_run(r.run)[1] is not None for r in runs)


def resolve_pairs(runs: list[RunResults], spec: str | None, mapping: dict | None = None):
    """[(run_a, run_b)] on the same model: from --pairs, else the default method pairs of the paper."""
    resolved = []
    if spec:
        for a_ref, b_ref in parse_pairs(spec):
            a_runs, b_runs = _select(runs, a_ref), _select(runs, b_ref)
            missing = [
                ref
                for ref, found in ((a_ref, a_runs), (b_ref, b_runs))
                if not found and not _is_method(runs, ref)
            ]  # a method's name (runs <method>_seed<N>) is a pair of the multi-seed mode (report/multi_seed.py)
            if missing:  # a pair the user asked for is never silently left out of the report
                raise ValueError(
                    f"--pairs {a_ref}:{b_ref}: no run named {missing[0]!r} under the results folder "
                    f"(runs: {', '.join(r.name for r in runs)})"
                )
            for a in a_runs:
                resolved += [(a, b) for b in b_runs if b.model == a.model and b is not a]
        return resolved
    methods = {id(r): map_run(r.model, r.run, mapping).method for r in runs}
    for method_a, method_b in DEFAULT_METHOD_PAIRS:
        for a in runs:
            for b in runs:
                if a.model == b.model and methods[id(a)] == method_a and methods[id(b)] == method_b:
                    resolved.append((a, b))
    return resolved


PAIR_COLUMNS = [
    "model",
    "run_a",
    "run_b",
    "dataset",
    "metric",
    "k",
    "diff",
    "ci_low",
    "ci_high",
    "n_problems",
    "status",
]


def paired_table(
    pairs,
    runs: list[RunResults],
    published: pd.DataFrame,
    settings: BootstrapSettings,
    mapping: dict | None = None,
) -> pd.DataFrame:
    """A - B with a paired bootstrap CI (same resampled problems for both), per dataset, pass@1 and pass@k."""
    rows = []
    datasets = report_datasets(runs)
    for a, b in pairs:
        big_k = headline_k(a, map_run(a.model, a.run, mapping))
        for dataset in datasets:
            for metric, k in (("pass@1", 1), ("pass@k", big_k)):
                base = {
                    "model": a.model,
                    "run_a": a.run,
                    "run_b": b.run,
                    "dataset": dataset,
                    "metric": metric,
                    "k": k,
                }
                rows.append({**base, **_paired_difference(a, b, dataset, k, settings)})
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def _paired_difference(a: RunResults, b: RunResults, dataset: str, k: int | None, settings) -> dict:
    """diff, CI, problems and status of A - B at pass@k on ``dataset`` ("missing" where either run lacks it)."""
    missing = {"diff": np.nan, "ci_low": np.nan, "ci_high": np.nan, "n_problems": 0, "status": "missing"}
    reported = k is not None and all(point_value(r, dataset, k) is not None for r in (a, b))
    sets_a, sets_b = (_set_values(r, dataset, [k]) if reported else None for r in (a, b))
    if sets_a is None or sets_b is None:
        return missing
    aligned_a, aligned_b, n_common, note = _common_problems(sets_a, sets_b)
    if any(len(v) == 0 or np.isnan(v).any() for v in (*aligned_a.values(), *aligned_b.values())):
        return {**missing, "n_problems": n_common}
    samples = intervals.paired_difference_samples(
        aligned_a, aligned_b, resamples=settings.resamples, seed=settings.seed
    )
    low, high = intervals.percentile_ci(samples, settings.level)
    diff = float(np.mean([aligned_a[n].mean() - aligned_b[n].mean() for n in aligned_a]))
    return {
        "diff": diff,
        "ci_low": float(low),
        "ci_high": float(high),
        "n_problems": n_common,
        "status": note,
    }


def _common_problems(sets_a: dict, sets_b: dict):
    """Both runs' values per problem set on the problems both have, in one order: (A's, B's, how many problems,
    status: "ok", or "ok (common problems only)" where a run has problems the other lacks)."""
    aligned_a, aligned_b, n_common, note = {}, {}, 0, "ok"
    for name, (ids_a, vals_a) in sets_a.items():
        ids_b, vals_b = sets_b[name]
        common = np.intersect1d(ids_a, ids_b)
        if len(common) != len(ids_a) or len(common) != len(ids_b):
            note = "ok (common problems only)"
        pos_a = pd.Index(ids_a).get_indexer(common)
        pos_b = pd.Index(ids_b).get_indexer(common)
        aligned_a[name], aligned_b[name] = vals_a[pos_a, 0], vals_b[pos_b, 0]
        n_common += len(common)
    return aligned_a, aligned_b, n_common, note
