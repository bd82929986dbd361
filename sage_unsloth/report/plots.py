"""pass@k curves (one PNG per dataset) and training curves (log_history.jsonl), at a fixed pixel size.

Figures are saved without bbox_inches="tight" so the PNG is exactly width x height pixels.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

DEFAULT_SIZE = (960, 600)
DPI = 100
TRAINING_ROW_HEIGHT = 220


def _figure(size: tuple[int, int], nrows: int = 1, ncols: int = 1):
    width, height = size
    return plt.subplots(nrows, ncols, figsize=(width / DPI, height / DPI), dpi=DPI, squeeze=False)


def _save(fig, path: Path) -> Path:
    """Atomic PNG write: render to a temp name, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=DPI)
    plt.close(fig)
    tmp.replace(path)
    return path


def passk_curves(
    curves: pd.DataFrame,
    comparison: pd.DataFrame,
    out_dir: str | Path,
    *,
    size: tuple[int, int] = DEFAULT_SIZE,
) -> dict[str, Path]:
    """One PNG per dataset: pass@k vs k (log2 axis), a line (+ CI band) per run, paper points overlaid.

    Paper points are taken from ``comparison`` (rows with a paper value), drawn as crosses in the
    colour of the run mapped to that paper row.
    """
    out_dir = Path(out_dir)
    written = {}
    for dataset, frame in curves.groupby("dataset", sort=False):
        fig, axes = _figure(size)
        ax = axes[0, 0]
        for i, ((model, run), line) in enumerate(frame.groupby(["model", "run"], sort=True)):
            line = line.sort_values("k")
            color = f"C{i % 10}"
            ax.plot(line["k"], line["value"], marker="o", ms=3, color=color, label=f"{model}/{run}")
            band = line.dropna(subset=["ci_low", "ci_high"])
            if not band.empty:
                ax.fill_between(band["k"], band["ci_low"], band["ci_high"], color=color, alpha=0.15, lw=0)
            paper = comparison[
                (comparison["model"] == model)
                & (comparison["run"] == run)
                & (comparison["dataset"] == dataset)
                & comparison["paper"].notna()
            ]
            if not paper.empty:
                method = paper["method"].iloc[0]
                ax.scatter(
                    paper["k"],
                    paper["paper"],
                    marker="X",
                    s=80,
                    color=color,
                    edgecolor="black",
                    zorder=5,
                    label=f"paper: {method}",
                )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
        ax.set_xlabel("k (log2)")
        ax.set_ylabel("pass@k")
        ax.set_title(f"pass@k on {dataset} (bands: 95% bootstrap CI over problems)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        written[dataset] = _save(fig, out_dir / f"passk_{dataset}.png")
    return written


def training_curves(
    histories: dict[str, pd.DataFrame],
    keys: list[str],
    out_path: str | Path,
    *,
    size: tuple[int, int] = DEFAULT_SIZE,
) -> Path | None:
    """A grid of panels, one per metric key, one line per run (x: the ``step`` column); keys a run lacks are
    skipped. The PNG is ``size`` wide and ``size[1]`` high, or taller (TRAINING_ROW_HEIGHT px per row of
    panels) when there are more than two rows."""
    present = [k for k in keys if any(k in h.columns for h in histories.values())]
    if not present:
        return None
    ncols = 2 if len(present) > 1 else 1
    nrows = int(np.ceil(len(present) / ncols))
    fig, axes = _figure((size[0], max(size[1], TRAINING_ROW_HEIGHT * nrows)), nrows, ncols)
    for ax, key in zip(axes.flat, present):
        for i, (name, hist) in enumerate(sorted(histories.items())):
            if key not in hist.columns:
                continue
            data = hist[["step", key]].dropna()
            marker = "." if len(data) < 30 else None  # a short run's few points stay visible
            ax.plot(data["step"], data[key], color=f"C{i % 10}", label=name, lw=1, marker=marker)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(present) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return _save(fig, Path(out_path))
