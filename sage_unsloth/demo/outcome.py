"""The lab's outcome in words, written from its CSVs only: ``python -m sage_unsloth.demo.outcome``.

:func:`outcome_block` reads ``<results>/lab/pairs.csv`` (written by sage_unsloth.demo.lab) and returns a
short paragraph and a table: per comparison the estimate with its interval, the Holm-adjusted p, the MDE, the
seeds that would detect the paper's 0.015, and the reading -- "excludes 0", "excludes the paper's +0.015", or
"a gain above X is excluded" (X = the interval's upper end). The lab writes it to ``lab/outcome.md``.

Prose that quotes a lab embeds the block between ``<!-- lab-outcome:begin results/<folder> -->`` and
``<!-- lab-outcome:end -->``; ``--update README.md docs/lab.md`` rewrites every such block in place from its
folder's CSVs, and tests/demo/test_lab_numbers.py fails when a committed block differs from its regeneration.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

from ..report import formatting
from ..report.intervals import PAPER_EFFECT
from ..runtime.manifest import atomic_write_text

FILE = "outcome.md"
BEGIN = "<!-- lab-outcome:begin {folder} -->"
END = "<!-- lab-outcome:end -->"
BLOCK = re.compile(
    r"<!-- lab-outcome:begin (?P<folder>\S+) -->\n(?P<body>.*?)<!-- lab-outcome:end -->", re.DOTALL
)
SEEDS_FOR = f"seeds_for_{PAPER_EFFECT:g}"
NEW_COLUMNS = ("interval", "p_holm", "mde", SEEDS_FOR)


def _metric(row) -> str:
    return row["metric"] if isinstance(row.get("metric"), str) else f"pass@{int(row['k'])}"


def _label(row, side: str) -> str:
    label = row.get(f"{side}_label")
    return label if isinstance(label, str) and label else row[side]


def _upper_text(high: float) -> str | None:
    """The upper end as a reading prints it: 3 decimals, more where 3 would print the paper's effect for another
    value (+0.0151, not +0.015; +0.01496, not +0.015); None when it is the paper's effect to 6 decimals."""
    for places in range(3, 7):
        text = f"{high:+.{places}f}"
        if abs(float(text) - PAPER_EFFECT) > 1e-12:
            return text
    return None


def reading(row) -> str:
    """What the interval says: the sign when it excludes 0, and for a pass@k whether it excludes the paper's
    gain, else the largest gain it leaves possible (printed to as many decimals as it takes to differ from the
    paper's effect: a sentence that cannot contradict itself after rounding)."""
    low, high = row["ci_low"], row["ci_high"]
    if not high > low:  # every resample gave the same difference (e.g. all 0 in a quick run): nothing to read
        return "no spread (an interval of width 0): no verdict"
    if low > 0:
        return "excludes 0 (higher with A)"
    if not _metric(row).startswith("pass@"):  # the paper's effect size is a pass@k gain
        return "excludes 0 (lower with A)" if high < 0 else "includes 0"
    if high < 0:
        return f"excludes 0 (lower with A); excludes the paper's +{PAPER_EFFECT:g}"
    upper = _upper_text(high)
    if high < PAPER_EFFECT:
        above = f" (a gain above {upper} is excluded)" if upper else ""
        return f"includes 0; excludes the paper's +{PAPER_EFFECT:g}{above}"
    if upper is None:  # the upper end is the paper's effect itself
        return f"includes 0 and, at its upper end, the paper's +{PAPER_EFFECT:g}"
    return f"includes 0 and the paper's +{PAPER_EFFECT:g}: a gain above {upper} is excluded"


def outcome_block(lab_dir: Path) -> str:
    """The outcome paragraph and table of one lab folder (``<results>/lab``), from its pairs.csv."""
    path = Path(lab_dir) / "pairs.csv"
    pairs = pd.read_csv(path)
    missing = [c for c in NEW_COLUMNS if c not in pairs.columns]
    if missing:
        raise ValueError(
            f"{path}: no column(s) {missing}: the lab was rendered before issue 28; rerun "
            "python -m sage_unsloth.demo.lab on it"
        )
    seeds, problems = int(pairs["seeds"].max()), int(pairs["problems"].max())
    kinds = "; ".join(sorted(set(pairs["interval"])))
    zero = pairs[(pairs["ci_low"] > 0) | (pairs["ci_high"] < 0)]
    held = pairs[pairs["p_holm"] < 0.05]
    metrics = ", ".join(dict.fromkeys(_metric(r) for _, r in pairs.iterrows()))
    lines = [
        (
            f"{seeds} training seed{'s' if seeds > 1 else ''} x {problems} problems. Family: the "
            f"{len(pairs)} paired comparisons of lab/pairs.csv ({metrics}; A - B, runs paired by seed), "
            f"Holm-adjusted over the family. {len(zero)} of {len(pairs)} 95% intervals exclude 0, "
            f'{len(held)} after Holm (p_holm < 0.05). Intervals: {kinds} (docs/lab.md, "Intervals and '
            f'power"); MDE: the smallest effect each comparison detects with 80% power at two-sided 0.05; '
            f"'seeds for {PAPER_EFFECT:g}': the seeds that would detect the paper's effect at this spread."
        ),
        "",
        f"| A - B | metric | estimate [95% CI] | p (Holm) | MDE | seeds for {PAPER_EFFECT:g} | reading |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, r in pairs.iterrows():
        lines.append(
            f"| {_label(r, 'a')} - {_label(r, 'b')} | {_metric(r)} | {r['diff']:+.3f} "
            f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {formatting.p_value(r['p_holm'])} | {r['mde']:.3f} | "
            f"{formatting.seeds(r[SEEDS_FOR])} | {reading(r)} |"
        )
    return "\n".join(lines) + "\n"


def write(lab_dir: Path) -> Path:
    path = Path(lab_dir) / FILE
    atomic_write_text(path, outcome_block(lab_dir))
    return path


def update_text(text: str, root: Path) -> str:
    """``text`` with every marked block regenerated from its folder (relative to ``root``)."""

    def fresh(match: re.Match) -> str:
        folder = match["folder"]
        body = outcome_block(root / folder / "lab")
        return f"{BEGIN.format(folder=folder)}\n{body}{END}"

    return BLOCK.sub(fresh, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m sage_unsloth.demo.outcome", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--update", nargs="+", metavar="FILE", help="rewrite the marked blocks of these files"
    )
    parser.add_argument("--lab", help="print the outcome block of this <results>/lab folder")
    parser.add_argument("--root", default=".", help="where the blocks' results/<folder> paths start")
    args = parser.parse_args(argv)
    if not args.update and not args.lab:
        parser.error("give --update FILE ... or --lab <results>/lab")
    try:
        if args.lab:
            print(outcome_block(Path(args.lab)), end="")
        for name in args.update or []:
            path = Path(name)
            text = path.read_text()
            if not BLOCK.search(text):
                print(f"{path}: no <!-- lab-outcome:begin results/<folder> --> block; nothing to update")
                continue
            atomic_write_text(path, update_text(text, Path(args.root)))
            print(f"{path}: {len(BLOCK.findall(text))} block(s) regenerated")
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
