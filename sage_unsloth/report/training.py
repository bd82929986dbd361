"""Training curves of the RLVR runs behind the evaluated results, read from their stage folders.

Each eval manifest names the checkpoint it evaluated (``checkpoint``: an RLVR output folder; for results read
from W&B, the copy of its training run beside them: RunResults.stage_folder); that folder's manifest names its
training log (``log_history``: ``log_history.jsonl``, written by
sage_unsloth/runtime/training_log.py). More RLVR folders can be given by glob (``--training_runs``), e.g. runs
not evaluated yet. The report plots one panel per metric (TRL's reward, kl, entropy, the SAGE trainer's
``sage/*`` q statistics, completion length) with one line per run, and tabulates first/last values.
"""

from __future__ import annotations

import glob
import logging
from pathlib import Path

import pandas as pd

from sage_unsloth.report import formatting
from sage_unsloth.report.loading import RunResults
from sage_unsloth.report.tables import md_table
from sage_unsloth.runtime.manifest import MANIFEST_NAME, read_manifest
from sage_unsloth.runtime.training_log import read_log_history

log = logging.getLogger(__name__)

# Shown first, in this order; every other ``sage/*`` key a run logged follows, sorted.
LEADING_KEYS = (
    "reward",
    "reward_std",
    "kl",
    "entropy",
    "sage/q_mean",
    "sage/frac_boosted",
    "sage/q_min",
    "sage/q_max",
    "completions/mean_length",
)
# The columns of the summary table in report.md (all keys go to training.csv).
TABLE_KEYS = ("reward", "kl", "entropy", "sage/q_mean", "sage/frac_boosted")
STEP = "step"


def _rlvr_folder(path: Path) -> Path | None:
    """``path`` when it is an RLVR stage folder (manifest stage "rlvr"), else None."""
    if not (path / MANIFEST_NAME).is_file():
        return None
    try:
        manifest = read_manifest(path)
    except ValueError:
        return None
    return path if manifest.get("stage") == "rlvr" else None


def training_folders(runs: list[RunResults], extra_glob: str | None = None) -> dict[str, Path]:
    """{"<model>/<variant>": RLVR folder} for every evaluated RLVR checkpoint and every folder matching the glob."""
    candidates = [run.stage_folder for run in runs if run.stage_folder is not None]
    candidates += [Path(p) for p in sorted(glob.glob(extra_glob))] if extra_glob else []
    found: dict[str, Path] = {}
    seen: set[Path] = set()
    for path in candidates:
        folder = _rlvr_folder(path)
        if folder is None or folder.resolve() in seen:
            continue
        seen.add(folder.resolve())
        manifest = read_manifest(folder)
        name = f"{manifest.get('model_short_name') or folder.parent.name}/{manifest.get('variant') or folder.name}"
        found[name] = folder
    return found


def load_histories(folders: dict[str, Path], notes: list[str]) -> dict[str, pd.DataFrame]:
    """{run: one row per logged step, a column per numeric metric}; a folder without a log gets a note."""
    histories = {}
    for name, folder in folders.items():
        manifest = read_manifest(folder)
        log_name = manifest.get("log_history")
        if not log_name:
            notes.append(
                f"{name}: the RLVR manifest names no log_history (written before the kit logged one)"
            )
            continue
        try:
            entries = read_log_history(folder / log_name)
        except (FileNotFoundError, ValueError) as err:
            notes.append(f"{name}: {err}")
            continue
        rows = [
            {k: v for k, v in e.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            for e in entries
        ]
        # The Trainer's end-of-training summary (train_runtime, train_loss) shares the last step: not a curve.
        rows = [r for r in rows if STEP in r and "train_runtime" not in r]
        if not rows:
            notes.append(f"{name}: {folder / log_name} holds no logged step")
            continue
        histories[name] = pd.DataFrame(rows).sort_values(STEP, kind="stable").reset_index(drop=True)
    return histories


def metric_keys(histories: dict[str, pd.DataFrame]) -> list[str]:
    present = set().union(*(h.columns for h in histories.values())) if histories else set()
    leading = [k for k in LEADING_KEYS if k in present]
    return leading + sorted(k for k in present if k.startswith("sage/") and k not in leading)


def summary_table(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (run, metric): steps logged, first and last step, first/last/min/max value."""
    rows = []
    for name, hist in sorted(histories.items()):
        for key in metric_keys({name: hist}):
            data = hist[[STEP, key]].dropna()
            if data.empty:
                continue
            values = data[key]
            rows.append(
                {
                    "run": name,
                    "metric": key,
                    "points": len(data),
                    "first_step": int(data[STEP].iloc[0]),
                    "last_step": int(data[STEP].iloc[-1]),
                    "first": float(values.iloc[0]),
                    "last": float(values.iloc[-1]),
                    "min": float(values.min()),
                    "max": float(values.max()),
                }
            )
    return pd.DataFrame(
        rows, columns=["run", "metric", "points", "first_step", "last_step", "first", "last", "min", "max"]
    )


def markdown_section(summary: pd.DataFrame, png_rel: str | None, csv_rel: str, notes: list[str]) -> str:
    parts = ["## Training curves (RLVR runs, from each run's log_history.jsonl)"]
    if summary.empty:
        parts.append(
            "No RLVR training log found (the eval manifests name no RLVR folder with a "
            "log_history.jsonl; add folders with --training_runs 'outputs/*/*')."
        )
    else:
        keys = [k for k in TABLE_KEYS if k in set(summary["metric"])]
        rows = []
        for name, group in summary.groupby("run", sort=True):
            by_key = group.set_index("metric")
            cells = [name, int(group["last_step"].max())]
            for key in keys:
                cells.append(
                    f"{formatting.number(by_key.loc[key, 'first'])} → {formatting.number(by_key.loc[key, 'last'])}"
                    if key in by_key.index
                    else "—"
                )
            rows.append(cells)
        parts.append(md_table(["run", "last step", *(f"{k} (first → last)" for k in keys)], rows))
        if png_rel:
            parts.append(f"![training curves]({png_rel})")
        parts.append(f"Every metric with first/last/min/max: `{csv_rel}`.")
    parts += [f"- {note}" for note in notes]
    return "\n\n".join(parts)
