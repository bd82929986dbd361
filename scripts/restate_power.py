#!/usr/bin/env python
"""Restate a committed lab's power columns with the kit's one definition of power (sage_unsloth/report/power.py,
issue 54 item 5): the MDE and the seeds for the paper's effect, from the exact noncentral t instead of the
t-quantile shortcut the lab was written with. Nothing else of a table changes.

    python scripts/restate_power.py results/demo-confirm results/demo-pilot-beta ...

Per lab folder: ``lab/pairs.csv`` (its ``sd_seed`` and ``seeds``: se = sd / sqrt(S), df = S - 1) and
``lab/support.csv`` (which stores no sd: its se is the old MDE over the shortcut's factor at the same df, an exact
inversion) get ``mde`` and ``seeds_for_0.015`` anew; ``lab/outcome.md`` is rewritten from pairs.csv; in
``report.md`` and ``lab/summary.txt`` each line that quoted a row's old MDE or seeds (the pairs table, the
comparison sentences) is replaced by the same line with the new figures, and a line that is not found is an
error (the lab was rendered by other code: re-render it instead).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from sage_unsloth.demo import outcome
from sage_unsloth.report import formatting, power
from sage_unsloth.runtime.manifest import atomic_write_text

SEEDS_FOR = outcome.SEEDS_FOR


def _se(row, old_mde: float) -> float:
    """The row's se: from sd_seed when the table has it, else by inverting the shortcut."""
    if "sd_seed" in row and not pd.isna(row["sd_seed"]):
        return float(row["sd_seed"]) / math.sqrt(int(row["seeds"]))
    return old_mde / (power.approximate_mde(1.0, int(row["seeds"]) - 1))


def restate(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    for i, row in frame.iterrows():
        if pd.isna(row.get("mde")) or int(row["seeds"]) < 2:
            continue  # one seed: a bootstrap's normal MDE, unchanged by the definition
        se = _se(row, float(row["mde"]))
        frame.loc[i, "mde"] = power.mde(se, int(row["seeds"]) - 1)
        frame.loc[i, SEEDS_FOR] = power.seeds_to_detect(se * math.sqrt(int(row["seeds"])))
    return frame


def _pair_lines(row) -> tuple[str, str]:
    """The pairs-table cells and the comparison sentence of one row, as lab.py renders them (the parts with the
    power figures)."""
    metric = outcome._metric(row)
    table = (
        f"| {formatting.p_value(row['p_holm'])} | {row['mde']:.3f} | {formatting.seeds(row[SEEDS_FOR])} | "
        f"{int(row['seeds'])} | {int(row['problems'])} |"
    )
    estimate = formatting.estimate(row["diff"], row["ci_low"], row["ci_high"], signed=True)
    return table, f"{metric}: {estimate} (MDE {row['mde']:.3f})"


def rewrite_text(text: str, old: pd.DataFrame, new: pd.DataFrame, name: str) -> str:
    for (_, a), (_, b) in zip(old.iterrows(), new.iterrows()):
        for before, after in zip(_pair_lines(a), _pair_lines(b)):
            if before == after:
                continue
            head = f"| {a['a_label']} | {a['b_label']} | {outcome._metric(a)} | "
            if before.startswith("|"):  # the table row: replace within the row that starts with the labels
                lines = text.split("\n")
                hits = [j for j, line in enumerate(lines) if line.startswith(head) and line.endswith(before)]
                if len(hits) > 1:
                    raise SystemExit(f"{name}: {len(hits)} table rows for {head!r}")
                for j in hits:
                    lines[j] = lines[j][: -len(before)] + after
                text = "\n".join(lines)
            elif before in text:
                text = text.replace(before, after)
    return text


def main(argv: list[str]) -> int:
    for folder in map(Path, argv):
        lab = folder / "lab"
        pairs_path, support_path = lab / "pairs.csv", lab / "support.csv"
        old = pd.read_csv(pairs_path)
        if "mde" not in old.columns:
            print(f"{folder}: no power columns (a lab from before them): unchanged")
            continue
        new = restate(old)
        atomic_write_text(pairs_path, new.to_csv(index=False))
        support = pd.read_csv(support_path)
        if "mde" in support.columns:
            atomic_write_text(support_path, restate(support).to_csv(index=False))
        outcome.write(lab)
        for text_path in (folder / "report.md", lab / "summary.txt"):
            if text_path.is_file():
                text = text_path.read_text()
                atomic_write_text(text_path, rewrite_text(text, old, new, str(text_path)))
        print(f"{folder}: {int((old['mde'] != new['mde']).sum())} MDEs restated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
