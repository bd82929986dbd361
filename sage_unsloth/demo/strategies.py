"""Strategy frequencies per run: the demo's reasoning-mode analysis (rules in task.label_strategy).

Reads the eval stage's saved completions (``<outputs>/<model>/eval/<run>/demo/chunk_*.jsonl.gz``, records
``{"problem_id", "completions": [{"text", "correct"}, ...]}``) and gives, per run and plan: the share of
completions, their accuracy, and the share of problems that the plan solved at least once; and per problem
the share of each plan (for the CIs across seeds and problems in :mod:`sage_unsloth.report.compare`).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from pathlib import Path

import numpy as np

from ..runtime.manifest import atomic_write_text
from .task import COMMON, OTHER, STRATEGIES, label_strategy

COLUMNS = ("run", "strategy", "completions", "fraction", "accuracy", "problems_solved_fraction")
LABELS = (*STRATEGIES, OTHER)
# The two plan groups the lab reports, each with one name and one definition (console, CSVs, report, docs):
# - the minority plans (row and key "minority", "minority-plan share"): every plan but the common one;
# - the pair plans ("pair-plan share"): pairs and outer, the two plans the base model's gap spares.
MINORITY = "minority"
MINORITY_PLANS = tuple(s for s in STRATEGIES if s != COMMON)
PAIR_PLANS = ("pairs", "outer")
PLAN_METRICS = {
    "minority-plan share": f"share of the completions whose plan is not the common one ({COMMON}): "
    + ", ".join(MINORITY_PLANS),
    "pair-plan share": "share of the completions whose plan is "
    + " or ".join(PAIR_PLANS)
    + " (the plans the base model's gap spares)",
}
GROUPS = (*LABELS, MINORITY)  # the columns of a run's per-problem shares


def read_completions(run_dir: Path, dataset: str = "demo") -> list[dict]:
    records = []
    for chunk in sorted((run_dir / dataset).glob("chunk_*.jsonl.gz")):
        with gzip.open(chunk, "rt", encoding="utf-8") as fh:
            records.extend(json.loads(line) for line in fh if line.strip())
    return records


def labelled(records: list[dict]) -> list[list[tuple[str, bool]]]:
    """Per problem, (label, correct) of each completion."""
    return [[(label_strategy(c["text"]), bool(c["correct"])) for c in r["completions"]] for r in records]


def strategy_rows(run: str, records: list[dict]) -> list[dict]:
    """One row per label for one run (fractions over all its completions), plus a "minority" row (every plan
    but the common one, together). An empty run is an error: its shares would be undefined."""
    problems = labelled(records)
    total = sum(len(p) for p in problems)
    if not total:
        raise ValueError(f"{run}: no completions to label (did the eval step write its chunks?)")
    groups = {label: (label,) for label in LABELS} | {MINORITY: MINORITY_PLANS}
    rows = []
    for name, members in groups.items():
        hits = [(lab, ok) for problem in problems for lab, ok in problem if lab in members]
        solved = sum(any(lab in members and ok for lab, ok in problem) for problem in problems)
        rows.append(
            {
                "run": run,
                "strategy": name,
                "completions": len(hits),
                "fraction": round(len(hits) / total, 4),
                "accuracy": round(sum(ok for _, ok in hits) / len(hits), 4) if hits else float("nan"),
                "problems_solved_fraction": round(solved / len(problems), 4),
            }
        )
    return rows


def problem_shares(records: list[dict], labels=GROUPS, *, correct_only: bool = False) -> np.ndarray:
    """(problems, labels) share of each problem's completions per label ("minority" = every plan but the common one); with
    ``correct_only``, the share of its completions that have the label and are correct."""
    out = np.zeros((len(records), len(labels)))
    for i, problem in enumerate(labelled(records)):
        for j, label in enumerate(labels):
            members = MINORITY_PLANS if label == MINORITY else (label,)
            hits = sum(lab in members and (ok or not correct_only) for lab, ok in problem)
            out[i, j] = hits / max(len(problem), 1)
    return out


def write_strategy_table(rows: list[dict], path: Path) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def plot_strategies(rows: list[dict], path: Path) -> Path:
    """Stacked bars: share of each plan per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(dict.fromkeys(r["run"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * len(runs) + 3), 3.8), dpi=100)
    bottom = [0.0] * len(runs)
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:gray")
    for label, colour in zip(LABELS, colours):
        values = [
            next(r["fraction"] for r in rows if r["run"] == run and r["strategy"] == label) for run in runs
        ]
        ax.bar(runs, values, bottom=bottom, label=label, color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("fraction of completions")
    ax.set_ylim(0, 1)
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title("Plan of the sampled completions (demo eval set)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def markdown_table(rows: list[dict]) -> str:
    """Per run: share of each plan, share and accuracy of the minority plans, accuracy of the common plan."""

    def cell(run, label, key):
        value = next(r[key] for r in rows if r["run"] == run and r["strategy"] == label)
        return "n/a" if isinstance(value, float) and math.isnan(value) else f"{value:.3f}"

    header = [
        "run",
        *[f"{s} share" for s in LABELS],
        "minority-plan share",
        f"{COMMON} accuracy",
        "minority-plan accuracy",
        "solved by minority plans",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in dict.fromkeys(r["run"] for r in rows):
        cells = [cell(run, s, "fraction") for s in LABELS] + [
            cell(run, MINORITY, "fraction"),
            cell(run, COMMON, "accuracy"),
            cell(run, MINORITY, "accuracy"),
            cell(run, MINORITY, "problems_solved_fraction"),
        ]
        lines.append("| " + " | ".join([run, *cells]) + " |")
    return "\n".join(lines)
