"""Strategy frequencies per run: the demo's reasoning-mode analysis (rules in task.label_strategy).

Reads the eval stage's saved completions (``<outputs>/<model>/eval/<run>/demo/chunk_*.jsonl.gz``, records
``{"problem_id", "completions": [{"text", "correct"}, ...]}``) and writes, per run and strategy: the share of
completions, their accuracy, and the share of problems that the strategy solved at least once.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from pathlib import Path

from ..manifest import atomic_write_text
from .task import OTHER, STRATEGIES, STRATEGY_NAMES, label_strategy

COLUMNS = ("run", "strategy", "name", "completions", "fraction", "accuracy", "problems_solved_fraction")
LABELS = (*STRATEGIES, OTHER)


def read_completions(run_dir: Path, dataset: str = "demo") -> list[dict]:
    records = []
    for chunk in sorted((run_dir / dataset).glob("chunk_*.jsonl.gz")):
        with gzip.open(chunk, "rt", encoding="utf-8") as fh:
            records.extend(json.loads(line) for line in fh if line.strip())
    return records


def strategy_rows(run: str, records: list[dict]) -> list[dict]:
    """One row per label for one run (fractions over all its completions)."""
    counts = {label: 0 for label in LABELS}
    correct = {label: 0 for label in LABELS}
    solved = {label: 0 for label in LABELS}
    for record in records:
        solved_here = set()
        for completion in record["completions"]:
            label = label_strategy(completion["text"])
            counts[label] += 1
            if completion["correct"]:
                correct[label] += 1
                solved_here.add(label)
        for label in solved_here:
            solved[label] += 1
    total, problems = sum(counts.values()), len(records)
    return [{"run": run, "strategy": label, "name": STRATEGY_NAMES[label], "completions": counts[label],
             "fraction": round(counts[label] / total, 4) if total else float("nan"),
             "accuracy": round(correct[label] / counts[label], 4) if counts[label] else float("nan"),
             "problems_solved_fraction": round(solved[label] / problems, 4) if problems else float("nan")}
            for label in LABELS]


def write_strategy_table(rows: list[dict], path: Path) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def plot_strategies(rows: list[dict], path: Path) -> Path:
    """Stacked bars: share of each strategy per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(dict.fromkeys(r["run"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100)
    bottom = [0.0] * len(runs)
    for label, colour in zip(LABELS, ("tab:blue", "tab:orange", "tab:gray")):
        values = [next(r["fraction"] for r in rows if r["run"] == run and r["strategy"] == label) for run in runs]
        ax.bar(runs, values, bottom=bottom, label=f"{label}: {STRATEGY_NAMES[label]}", color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("fraction of completions")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title("Strategy of the sampled completions (demo eval set)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def markdown_section(rows: list[dict], image: Path | None, report_dir: Path) -> str:
    lines = ["## Demo: strategy frequencies (rules in sage_unsloth/demo/task.py, label_strategy)", "",
             ("A = running total (90% of the SFT rows by default), B = pairing (the rare strategy), "
              "other = neither template (malformed or mixed). Accuracy is within the strategy's completions; "
              "'solved' is the share of problems with at least one correct completion of that strategy."), "",
             "| run | A share | B share | other share | A accuracy | B accuracy | solved by A | solved by B |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(run, label, key):
        value = next(r[key] for r in rows if r["run"] == run and r["strategy"] == label)
        return "n/a" if math.isnan(value) else f"{value:.3f}"

    for run in dict.fromkeys(r["run"] for r in rows):
        lines.append(f"| {run} | {cell(run, 'A', 'fraction')} | {cell(run, 'B', 'fraction')} | "
                     f"{cell(run, OTHER, 'fraction')} | {cell(run, 'A', 'accuracy')} | {cell(run, 'B', 'accuracy')} | "
                     f"{cell(run, 'A', 'problems_solved_fraction')} | {cell(run, 'B', 'problems_solved_fraction')} |")
    if image is not None:
        lines += ["", f"![strategy frequencies]({image.resolve().relative_to(report_dir.resolve()).as_posix()})"]
    return "\n".join(lines) + "\n"
