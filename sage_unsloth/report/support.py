"""Empirical support of a run against a reference run, per benchmark (after "The Invisible Leash",
Wu et al., arXiv 2507.14843): which problems the reference solves at k, which this run solves at k,
and how the two sets overlap.

Per problem ``i`` and k, ``p_i`` is the unbiased pass@k from (n, c) (the probability that k samples drawn
without replacement from the run's n contain a correct one). Drawing k samples from each run
independently, a problem is

- **preserved** when both solve it: ``p_ref * p_run``;
- **shrunk** (lost) when the reference solves it and the run does not: ``p_ref * (1 - p_run)``;
- **expanded** (gained) when the run solves it and the reference does not: ``(1 - p_ref) * p_run``;
- **unsolved** by both: ``(1 - p_ref) * (1 - p_run)``.

The four add up to 1 per problem; their means over the benchmark are the reported shares (times the
problem count = expected number of problems). At k = n they are the paper's counts (a problem is solved
when any of its n samples is correct); below n they are the expected counts for k-sample draws, which keeps
runs evaluated with different n comparable at a common k. ``solved_ref`` = preserved + shrunk and
``solved_run`` = preserved + expanded are the two runs' pass@k; expanded - shrunk is their difference.
CIs: percentile bootstrap over problems, the same resampled problems for every quantity and for every
run of a benchmark (bootstrap.resample_counts, stream = the benchmark name).

The reference is, per model folder, the run named by ``reference`` (a run folder or "<model>/<run>") or, by
default, the run the paper mapping calls "Base" (``sft`` / ``base``); models without one are skipped with a
note.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from sage_unsloth.report import intervals
from sage_unsloth.report.loading import RunResults
from sage_unsloth.report.paper import map_run
from sage_unsloth.runtime.results import pass_at_k_matrix

log = logging.getLogger(__name__)

QUANTITIES = ("preserved", "shrunk", "expanded", "unsolved")
SHARES = ("solved_ref", "solved_run", *QUANTITIES, "net")
REFERENCE_METHOD = "Base"
COLUMNS = [
    "model",
    "run",
    "reference",
    "dataset",
    "k",
    "n_problems",
    *[f"{name}{suffix}" for name in SHARES for suffix in ("", "_ci_low", "_ci_high")],
]


def support_indicators(p_ref: np.ndarray, p_run: np.ndarray) -> dict[str, np.ndarray]:
    """Per-problem probabilities of the four outcomes, from the two runs' per-problem pass@k."""
    p_ref, p_run = np.asarray(p_ref, dtype=np.float64), np.asarray(p_run, dtype=np.float64)
    if p_ref.shape != p_run.shape:
        raise ValueError(f"support: per-problem values must align, got {p_ref.shape} and {p_run.shape}")
    return {
        "preserved": p_ref * p_run,
        "shrunk": p_ref * (1.0 - p_run),
        "expanded": (1.0 - p_ref) * p_run,
        "unsolved": (1.0 - p_ref) * (1.0 - p_run),
    }


def per_problem_shares(p_ref: np.ndarray, p_run: np.ndarray) -> np.ndarray:
    """(N, len(SHARES)) per-problem values whose means are the reported shares."""
    parts = support_indicators(p_ref, p_run)
    columns = [
        np.asarray(p_ref, dtype=np.float64),
        np.asarray(p_run, dtype=np.float64),
        *(parts[name] for name in QUANTITIES),
        parts["expanded"] - parts["shrunk"],
    ]
    return np.stack(columns, axis=1)


def find_reference(
    runs: list[RunResults], model: str, reference: str | None, mapping: dict | None = None
) -> RunResults | None:
    """The reference run of ``model``: the one named ``reference``, else the one mapped to "Base"."""
    candidates = [r for r in runs if r.model == model]
    if reference:
        named = [r for r in candidates if reference in (r.run, r.name)]
        return named[0] if named else None
    based = [r for r in candidates if map_run(r.model, r.run, mapping).method == REFERENCE_METHOD]
    return min(based, key=lambda r: (r.run != "sft", r.run)) if based else None


def _aligned(ref: RunResults, run: RunResults, dataset: str):
    """(ns_ref, cs_ref, ns_run, cs_run) on the problems both runs graded, in the reference's order."""
    frames = []
    for r in (ref, run):
        frame = r.per_problem[r.per_problem["dataset"] == dataset]
        frames.append(frame.set_index(frame["problem_id"].astype(str)))
    common = [pid for pid in frames[0].index if pid in frames[1].index]
    a, b = frames[0].loc[common], frames[1].loc[common]
    return a["n"].to_numpy(), a["c"].to_numpy(), b["n"].to_numpy(), b["c"].to_numpy()


def support_ks(n_ref: np.ndarray, n_run: np.ndarray) -> list[int]:
    """k = 1, 2, 4, ... up to the smallest n of either run (every problem must have n >= k), and that n."""
    top = int(min(n_ref.min(), n_run.min())) if len(n_ref) else 0
    ks = [k for k in (2**i for i in range(32)) if k <= top]
    return ks + ([top] if top and top not in ks else [])


def support_table(
    runs: list[RunResults],
    *,
    reference: str | None = None,
    mapping: dict | None = None,
    resamples: int = intervals.DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
    notes: list[str] | None = None,
) -> pd.DataFrame:
    """Shares (with CIs) of solved / preserved / shrunk / expanded problems, per run, benchmark and k."""
    notes = notes if notes is not None else []
    rows = []
    for model in dict.fromkeys(r.model for r in runs):
        ref = find_reference(runs, model, reference, mapping)
        if ref is None:
            notes.append(f"{model}: no reference run ({reference or 'a Base/sft run'}); no support metrics")
            continue
        if ref.per_problem is None:
            notes.append(f"{ref.name}: per_problem.csv missing; no support metrics")
            continue
        for run in (r for r in runs if r.model == model and r is not ref):
            if run.per_problem is None:
                notes.append(f"{run.name}: per_problem.csv missing; no support metrics")
                continue
            for dataset in sorted(set(ref.per_problem["dataset"]) & set(run.per_problem["dataset"])):
                n_ref, c_ref, n_run, c_run = _aligned(ref, run, dataset)
                if not len(n_ref):
                    continue
                ks = support_ks(n_ref, n_run)
                p_ref, p_run = pass_at_k_matrix(n_ref, c_ref, ks), pass_at_k_matrix(n_run, c_run, ks)
                counts = intervals.resample_counts(len(n_ref), resamples=resamples, seed=seed, stream=dataset)
                for col, k in enumerate(ks):
                    values = per_problem_shares(p_ref[:, col], p_run[:, col])
                    low, high = intervals.percentile_ci(intervals.resampled_means(values, counts), level)
                    row = {
                        "model": model,
                        "run": run.run,
                        "reference": ref.run,
                        "dataset": dataset,
                        "k": k,
                        "n_problems": len(n_ref),
                    }
                    for j, name in enumerate(SHARES):
                        row.update(
                            {
                                name: float(values[:, j].mean()),
                                f"{name}_ci_low": float(low[j]),
                                f"{name}_ci_high": float(high[j]),
                            }
                        )
                    rows.append(row)
    for note in notes:
        log.warning("%s", note)
    return pd.DataFrame(rows, columns=COLUMNS)


def headline_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Per (model, run, dataset) the row at the largest k."""
    if table.empty:
        return table
    index = table.groupby(["model", "run", "dataset"], sort=False)["k"].idxmax()
    return table.loc[index.sort_values()]


def _cell(row, name: str) -> str:
    value, low, high = row[name], row[f"{name}_ci_low"], row[f"{name}_ci_high"]
    sign = "+" if name == "net" else ""
    return f"{value:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def markdown_section(table: pd.DataFrame, images: dict[str, Path], rel, notes: list[str]) -> str:
    """The report's support section: one table at the largest k per run and benchmark, plus the plots."""
    parts = [
        "## Support against the reference run (after The Invisible Leash, arXiv 2507.14843)",
        (
            "Shares of the benchmark's problems, drawing k samples from each run: solved by the reference, "
            "solved by this run, preserved (both), shrunk (reference only: lost), expanded (this run only: "
            "gained); net = expanded - shrunk. At k = n a problem counts as solved when any sample is "
            "correct. 95% bootstrap CIs over problems. Every k: `support.csv`. Rules: "
            "sage_unsloth/report/support.py."
        ),
    ]
    top = headline_rows(table)
    if top.empty:
        parts.append(
            "No support metrics: " + ("; ".join(notes) if notes else "no run pairs with per-problem data.")
        )
        return "\n\n".join(parts)
    header = [
        "model",
        "run",
        "reference",
        "dataset",
        "k",
        "problems",
        "solved by reference",
        "solved by run",
        "preserved",
        "shrunk (lost)",
        "expanded (gained)",
        "net",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, r in top.iterrows():
        lines.append(
            "| "
            + " | ".join(
                [
                    r["model"],
                    r["run"],
                    r["reference"],
                    r["dataset"],
                    str(int(r["k"])),
                    str(int(r["n_problems"])),
                    *(
                        _cell(r, n)
                        for n in ("solved_ref", "solved_run", "preserved", "shrunk", "expanded", "net")
                    ),
                ]
            )
            + " |"
        )
    parts.append("\n".join(lines))
    parts += [f"![support on {dataset}]({rel(path)})" for dataset, path in images.items()]
    if notes:
        parts.append("Notes: " + "; ".join(notes))
    return "\n\n".join(parts)


def plot_support(
    table: pd.DataFrame,
    out_dir: str | Path,
    *,
    size: tuple[int, int] = (960, 600),
    colours: dict | None = None,
) -> dict[str, Path]:
    """Per benchmark, one line or bar group per method (a method's seeds averaged, grouping.method_of), in the
    method's colour from the kit's palette: the shares at the largest k (bars; error bars are the 95% CI of a
    single run, or the range over seeds), and expanded and shrunk against k (one panel each, one line per
    method)."""
    import matplotlib.ticker

    from sage_unsloth.report import grouping, palette, plots

    written = {}
    for dataset, frame in table.groupby("dataset", sort=True):
        frame = frame.assign(method=frame["model"] + "/" + frame["run"].map(grouping.method_of))
        colours = grouping.colours_for(frame["method"], colours)
        styles = palette.model_linestyles(frame["model"])
        fig, axes = plots._figure(size, 1, 3)
        _support_bars(axes[0, 0], headline_rows(frame), dataset, colours)
        for ax, name in ((axes[0, 1], "expanded"), (axes[0, 2], "shrunk")):
            for method, group in frame.groupby("method", sort=True):
                band = grouping.seed_band(group, "k", name)
                seeds = group["run"].nunique()
                label = f"{method} ({seeds} seeds)" if seeds > 1 else method
                ax.plot(
                    band["k"],
                    band["mean"],
                    color=colours[method],
                    ls=styles[method.rpartition("/")[0]],
                    marker="o",
                    ms=3,
                    label=label,
                )
                if seeds > 1:
                    ax.fill_between(band["k"], band["low"], band["high"], color=colours[method], alpha=0.15)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
            ax.set_xlabel("k (log2)")
            ax.set_ylabel("share of problems")
            ax.set_title(f"{name} against k", fontsize=9)
            grouping.floor_at_zero(ax, frame[name])
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6)
        fig.tight_layout()
        written[dataset] = plots._save(fig, Path(out_dir) / f"support_{dataset}.png")
    return written


# How each share's bar is drawn, in its method's colour: preserved filled, shrunk and expanded hatched.
BAR_STYLES = {
    "preserved": {"fill": True, "hatch": None},
    "shrunk": {"fill": False, "hatch": "///"},
    "expanded": {"fill": False, "hatch": "xxx"},
}
BAR_WIDTH = 0.27


def _support_bars(ax, top: pd.DataFrame, dataset: str, colours: dict) -> None:
    """Preserved / shrunk / expanded at the largest k, one group of bars per method in the method's colour
    (the share told apart by its fill). A bar of height 0 is drawn as a thick mark on the axis, so an empty
    share reads as 0 rather than as a missing bar."""
    from matplotlib.patches import Patch

    from sage_unsloth.report import grouping

    methods = sorted(top["method"].unique())
    x = np.arange(len(methods))
    for offset, name in zip((-BAR_WIDTH, 0.0, BAR_WIDTH), BAR_STYLES):
        values, low, high = [], [], []
        for method in methods:
            group = top[top["method"] == method]
            if len(group) == 1:  # one run: its bootstrap CI over problems
                values.append(group[name].iloc[0])
                low.append(group[f"{name}_ci_low"].iloc[0])
                high.append(group[f"{name}_ci_high"].iloc[0])
            else:  # several seeds: their mean and range
                band = grouping.seed_band(group.assign(at=0), "at", name)
                values.append(band["mean"].iloc[0])
                low.append(band["low"].iloc[0])
                high.append(band["high"].iloc[0])
        values = np.asarray(values, dtype=float)
        err = np.stack([values - np.asarray(low), np.asarray(high) - values])
        style = BAR_STYLES[name]
        method_colours = [colours[m] for m in methods]
        ax.bar(
            x + offset,
            values,
            width=BAR_WIDTH,
            color=method_colours if style["fill"] else "white",
            edgecolor=method_colours,
            hatch=style["hatch"],
            lw=1.2,
            label=f"_{name}",
            yerr=err,
            capsize=2,
            ecolor="black",
        )
        zero = np.isclose(values, 0.0)
        for xi, c in zip((x + offset)[zero], np.asarray(method_colours)[zero]):
            ax.plot(
                [xi - BAR_WIDTH * 0.45, xi + BAR_WIDTH * 0.45],
                [0, 0],
                color=c,
                lw=3,
                solid_capstyle="butt",
                clip_on=False,
                zorder=5,
                label="_zero",
            )
    ax.set_xticks(x, methods, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("share of problems")
    ax.set_title(f"{dataset}: at the largest k (vs {', '.join(sorted(set(top['reference'])))})", fontsize=9)
    ax.set_ylim(bottom=0)
    handles = [
        Patch(
            facecolor="grey" if style["fill"] else "white",
            edgecolor="grey",
            hatch=style["hatch"],
            label=name,
        )
        for name, style in BAR_STYLES.items()
    ]
    handles.append(Patch(facecolor="none", edgecolor="none", label="thick mark on the axis: 0"))
    ax.legend(handles=handles, fontsize=7)
