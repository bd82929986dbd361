"""pass@k curves (one PNG per dataset) and training curves (log_history.jsonl), at a fixed pixel size; one
line per method, its seeds folded into a band, one colour per method from the kit's palette
(sage_unsloth/report/palette.py: a method has the same colour in every plot, whatever else is plotted; with
several models in one plot, a model's lines share a line style).

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

from sage_unsloth.report import grouping, palette

DEFAULT_SIZE = (960, 600)
DPI = 100
TRAINING_ROW_HEIGHT = 220


def _figure(size: tuple[int, int], nrows: int = 1, ncols: int = 1):
    width, height = size
    return plt.subplots(nrows, ncols, figsize=(width / DPI, height / DPI), dpi=DPI, squeeze=False)


def integer_ticks(axis) -> None:
    """Ticks at whole numbers only (training steps): a 2-step run gets 1 and 2, not 1.25, 1.5, ..."""
    axis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def _save(fig, path: Path, *, tight: bool = False) -> Path:
    """Atomic PNG write: render to a temp name, then rename. ``tight`` grows the canvas to every label and
    legend outside the axes (bbox_inches='tight'), so none is clipped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=DPI, **({"bbox_inches": "tight", "pad_inches": 0.15} if tight else {}))
    plt.close(fig)
    tmp.replace(path)
    return path


def passk_curves(
    curves: pd.DataFrame,
    comparison: pd.DataFrame,
    out_dir: str | Path,
    *,
    size: tuple[int, int] = DEFAULT_SIZE,
    colours: dict | None = None,
) -> dict[str, Path]:
    """One PNG per dataset: pass@k vs k (log2 axis), one line per method (grouping.method_of), paper points.

    A method with several seeds is drawn as the mean over its seeds with the range of the seeds as a band; a
    method with one run as that run with its 95% bootstrap CI over problems. Paper points are taken from
    ``comparison`` (rows with a paper value), drawn as crosses in the colour of the method mapped to them.
    """
    out_dir = Path(out_dir)
    written = {}
    for dataset, frame in curves.groupby("dataset", sort=False):
        fig, axes = _figure(size)
        ax = axes[0, 0]
        frame = frame.assign(method=frame["run"].map(grouping.method_of))
        groups = frame.groupby(["model", "method"], sort=True)
        colours = grouping.colours_for((f"{m}/{method}" for m, method in groups.groups), colours)
        styles = palette.model_linestyles(frame["model"])
        for (model, method), group in groups:
            label = f"{model}/{method}"
            colour = colours[label]
            runs = sorted(group["run"].unique())
            if len(runs) == 1:
                line = group.sort_values("k")
                ks, values = line["k"], line["value"]
                band = line.dropna(subset=["ci_low", "ci_high"])
                low, high = band["ci_low"], band["ci_high"]
            else:
                band = grouping.seed_band(group, "k", "value")
                ks, values, label = band["k"], band["mean"], f"{label} ({len(runs)} seeds)"
                low, high = band["low"], band["high"]
            ax.plot(ks, values, marker="o", ms=3, color=colour, ls=styles[model], label=label)
            if not band.empty:
                ax.fill_between(band["k"], low, high, color=colour, alpha=0.15, lw=0)
            paper = comparison[
                (comparison["model"] == model)
                & (comparison["run"] == runs[0])
                & (comparison["dataset"] == dataset)
                & comparison["paper"].notna()
            ]
            if not paper.empty:
                ax.scatter(
                    paper["k"],
                    paper["paper"],
                    marker="X",
                    s=80,
                    color=colour,
                    edgecolor="black",
                    zorder=5,
                    label=f"paper: {paper['method'].iloc[0]}",
                )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
        ax.set_xlabel("k (log2)")
        ax.set_ylabel("pass@k")
        ax.set_title(
            f"pass@k on {dataset} (several seeds: their mean, band = their range; one run: "
            "band = 95% bootstrap CI over problems)",
            fontsize=9,
        )
        grouping.floor_at_zero(ax, frame["value"])
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
    colours: dict | None = None,
) -> Path | None:
    """A grid of panels, one per metric key, one line per method (x: the ``step`` column): a method's seeds
    (histories named ``<model>/<method>_seed<N>``) are drawn as their mean with their range as a band; keys a
    run lacks are skipped. The PNG is ``size`` wide and ``size[1]`` high, or taller (TRAINING_ROW_HEIGHT px
    per row of panels) when there are more than two rows."""
    present = [k for k in keys if any(k in h.columns for h in histories.values())]
    if not present:
        return None
    methods: dict[str, dict[str, pd.DataFrame]] = {}
    for name, hist in histories.items():
        model, _, run = name.rpartition("/")
        label = f"{model}/{grouping.method_of(run)}" if model else grouping.method_of(run)
        methods.setdefault(label, {})[name] = hist
    colours = grouping.colours_for(methods, colours)
    styles = palette.model_linestyles(label.rpartition("/")[0] for label in methods)
    ncols = 2 if len(present) > 1 else 1
    nrows = int(np.ceil(len(present) / ncols))
    fig, axes = _figure((size[0], max(size[1], TRAINING_ROW_HEIGHT * nrows)), nrows, ncols)
    for ax, key in zip(axes.flat, present):
        plotted = []
        for label, runs in sorted(methods.items()):
            frames = [h[["step", key]].dropna().assign(run=n) for n, h in runs.items() if key in h.columns]
            if not frames:
                continue
            band = grouping.seed_band(pd.concat(frames), "step", key)
            marker = "." if len(band) < 30 else None  # a short run's few points stay visible
            seeds = f" ({len(frames)} seeds)" if len(frames) > 1 else ""
            ax.plot(
                band["step"],
                band["mean"],
                color=colours[label],
                ls=styles[label.rpartition("/")[0]],
                label=label + seeds,
                lw=1,
                marker=marker,
            )
            if len(frames) > 1:
                ax.fill_between(
                    band["step"], band["low"], band["high"], color=colours[label], alpha=0.15, lw=0
                )
            plotted += [band["low"], band["high"]]
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        integer_ticks(ax.xaxis)
        grouping.floor_at_zero(ax, pd.concat(plotted) if plotted else [])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(present) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return _save(fig, Path(out_path))
