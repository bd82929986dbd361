"""The lab's dose-response: per method (one knob setting each), its knob values, pass@1 and net support at
the largest k, so sharpening (pass@1 up) against keeping support (net support at kmax not below 0) is read
at a glance.

Knob values come from each run's stage-2 manifest (``<work>/<model>/<run>/manifest.json``: the resolved
training config the run trained with, each plug-in node resolved with every argument), never from the method's
name: ``beta``, the guide (the ``guide`` node's name; a plug-in guide by its file and function name), ``tau``
and ``gamma`` (branch guides only), ``q_max`` (any guide), the KL placement and term (column ``kl_estimator``),
the guide's other arguments (``guide_args``). ``lab/runs.csv`` carries them per run,
``lab/dose_response.csv`` per method, ``lab/dose_response.png`` plots pass@1 against net support.

Intervals: the lab's (sage_unsloth.report.compare.ci: Student t over the seed-level means, a problem bootstrap
with one seed), kept inside a share's or a difference's range; net support is paired by seed against SFT
(compare.paired_values).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..report import compare
from ..runtime import layout

KNOBS = ("beta", "tau", "gamma", "q_max", "guide")
EXTRA_KNOBS = ("kl_estimator", "kl_placement", "guide_args")
BRANCH_GUIDES = ("branch", "ref_branch")  # the guides whose q reads tau and gamma
CSV = "dose_response.csv"
PNG = "dose_response.png"


def _guide_name(guide) -> str:
    """'branch', 'none', or 'my_guide.py:fn' for a plug-in file (its folder left out: no machine paths)."""
    text = str(guide or "none")
    module, sep, fn = text.partition(":")
    if sep and (module.endswith(".py") or "/" in module):
        return f"{Path(module).name}:{fn}"
    return text


def knobs_from_config(training: dict) -> dict:
    """The knob values of one run's resolved stage-2 training config (its manifest's config.training, where each
    plug-in node holds every argument it ran with)."""
    # A manifest of the flat spelling (sage_guide, sage_tau, ...) is refused, not read as GRPO.
    if "guide" not in training:
        raise ValueError(
            "a stage-2 manifest without the guide node predates plug-in nodes: train the run again"
        )
    node = dict(training["guide"])
    guide = _guide_name(node.pop("name", "none"))
    guided = guide != "none"
    branch = guide in BRANCH_GUIDES
    shown = ("q_min", "q_max", *(("tau", "gamma") if branch else ()))  # the columns' own, or the clip range
    args = {k: v for k, v in node.items() if k not in shown}
    return {
        "beta": float(training.get("beta", math.nan)),
        "tau": float(node["tau"]) if branch and "tau" in node else math.nan,
        "gamma": float(node["gamma"]) if branch and "gamma" in node else math.nan,
        "q_max": float(node["q_max"]) if guided and "q_max" in node else math.nan,
        "guide": guide,
        "kl_estimator": (training.get("kl_term") or {}).get("name", ""),
        "kl_placement": training.get("sage_kl_placement", ""),
        "guide_args": json.dumps(args, sort_keys=True) if guided and args else "",
    }


def run_knobs(work: Path, model: str, runs: list[str]) -> pd.DataFrame:
    """One row per run: its knob values (SFT runs: empty); an RL run without a stage-2 manifest is an error."""
    rows = []
    for run in runs:
        method, _ = compare.split_run(run)
        row = {"run": run, **{k: math.nan for k in ("beta", "tau", "gamma", "q_max")}}
        row.update(guide="", kl_estimator="", kl_placement="", guide_args="")
        if method != compare.REFERENCE_METHOD:
            path = layout.run_dir(work, model, run) / "manifest.json"
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path}: no stage-2 manifest for run {run}: its RL step did not finish"
                )
            row.update(knobs_from_config(json.loads(path.read_text())["config"]["training"]))
        rows.append(row)
    return pd.DataFrame(rows, columns=["run", *KNOBS, *EXTRA_KNOBS])


def method_knobs(work: Path, model: str, runs: list[str]) -> dict[str, dict]:
    """Per method: its knob values, read from its runs' manifests (all seeds must agree)."""
    frame = run_knobs(work, model, [r for r in runs if compare.split_run(r)[0] != compare.REFERENCE_METHOD])
    out = {}
    for method, group in frame.groupby(frame["run"].map(lambda r: compare.split_run(r)[0]), sort=False):
        distinct = group[[*KNOBS, *EXTRA_KNOBS]].astype(str).drop_duplicates()
        if len(distinct) > 1:
            raise ValueError(f"{method}: its seeds trained with different knob values ({list(group['run'])})")
        out[method] = {
            k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in group.iloc[0].items()
        }
        out[method].pop("run")
    return out


def dose_response_table(
    lab: compare.RunCounts,
    knobs: pd.DataFrame,
    kmax: int,
    *,
    pair_share: dict[str, np.ndarray] | None = None,
    **stats,
) -> pd.DataFrame:
    """One row per method (SFT first): knob values, seeds, pass@1 and net support at kmax against SFT (paired
    by seed) with their intervals, and the pair-plan share when given (per run, per problem)."""
    by_run = knobs.set_index("run")
    rows = []
    for method, runs in lab.methods.items():
        first = by_run.loc[runs[0]]
        row = {"method": method, **{k: first[k] for k in (*KNOBS, *EXTRA_KNOBS)}, "seeds": len(runs)}
        one = np.stack([lab.passk(r, [1])[:, 0] for r in runs])
        row.update(
            _cells("pass_at_1", compare.ci(one, stream=f"dose-{method}", bounds=compare.SHARE, **stats))
        )
        if method == compare.REFERENCE_METHOD:
            row.update(_cells(f"net_support_at_{kmax}", (0.0, 0.0, 0.0)))
        else:
            net = compare.paired_values(
                lab, method, compare.REFERENCE_METHOD, lambda r: lab.passk(r, [kmax])[:, 0]
            )
            row.update(
                _cells(
                    f"net_support_at_{kmax}",
                    compare.ci(net, stream=f"dose-net-{method}", bounds=compare.DIFFERENCE, **stats),
                )
            )
        if pair_share is not None:
            shares = np.stack([pair_share[r] for r in runs])
            row.update(
                _cells(
                    "pair_share",
                    compare.ci(shares, stream=f"dose-plans-{method}", bounds=compare.SHARE, **stats),
                )
            )
        rows.append(row)
    frame = pd.DataFrame(rows)
    return pd.concat(
        [
            frame[frame["method"] == compare.REFERENCE_METHOD],
            frame[frame["method"] != compare.REFERENCE_METHOD],
        ],
        ignore_index=True,
    )


def _cells(name: str, value: tuple[float, float, float]) -> dict:
    mean, low, high = value
    return {name: mean, f"{name}_ci_low": low, f"{name}_ci_high": high}


def setting_text(row) -> str:
    """'beta 0.2' / 'beta 0.05, branch tau 0.5 gamma 0.8 q_max 1.4' from a table row's knobs."""
    parts = [] if pd.isna(row["beta"]) else [f"beta {row['beta']:g}"]
    if row["guide"] not in ("", "none") and isinstance(row["guide"], str):
        guide = [row["guide"]]
        guide += [f"{k} {row[k]:g}" for k in ("tau", "gamma", "q_max") if not pd.isna(row[k])]
        parts.append(" ".join(guide))
    return ", ".join(parts)


MARKERS = "osD^v<>Pp*hX"


def interval_words(seeds) -> str:
    """What the intervals of methods with these numbers of seeds are (compare.ci: Student t over seeds from two
    seeds on, a problem bootstrap with one), as a plot title says it."""
    counts = sorted({int(s) for s in seeds}) if seeds is not None else []
    if counts == [1]:
        return "problem bootstrap, one seed"
    if counts and counts[0] >= 2:
        return f"t over {counts[0]} seeds" if len(counts) == 1 else f"t over {counts[0]}-{counts[-1]} seeds"
    return "t over seeds; a problem bootstrap for a method with one seed"


def plot(table: pd.DataFrame, labels: dict[str, str], kmax: int, path: Path) -> Path:
    """pass@1 against net support at kmax, one point per method with its intervals in both directions; each
    method in its palette colour (report/palette.py: the same in every plot, no implied pairs), the legend
    under the axes so that the plot keeps the figure's width."""
    import textwrap

    from ..report import palette, plots

    fig, axes = plots._figure((1100, 640))
    ax = axes[0, 0]
    net = f"net_support_at_{kmax}"
    for i, (_, r) in enumerate(table.iterrows()):
        sft = r["method"] == compare.REFERENCE_METHOD
        setting = setting_text(r)
        label = labels.get(r["method"], r["method"]) + (f": {setting}" if setting else "")
        ax.errorbar(
            r[net],
            r["pass_at_1"],
            xerr=[[r[net] - r[f"{net}_ci_low"]], [r[f"{net}_ci_high"] - r[net]]],
            yerr=[[r["pass_at_1"] - r["pass_at_1_ci_low"]], [r["pass_at_1_ci_high"] - r["pass_at_1"]]],
            fmt="s" if sft else MARKERS[(i - 1) % len(MARKERS)],
            color=palette.colour(r["method"]),
            ms=6,
            lw=1,
            capsize=2,
            label=textwrap.fill(label, 70),
        )
    ax.axvline(0, color="grey", lw=1, ls="--")
    ax.set_xlabel(f"net support against SFT at k = {kmax} (share of problems)")
    ax.set_ylabel("pass@1")
    words = interval_words(table["seeds"] if "seeds" in table.columns else None)
    ax.set_title(f"pass@1 against net support per method (bars: 95% CI, {words})", fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    handles, names = ax.get_legend_handles_labels()
    fig.legend(
        handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=8, frameon=False
    )
    return plots._save(fig, path, tight=True)


def write(
    out: Path,
    lab: compare.RunCounts,
    knobs: pd.DataFrame,
    kmax: int,
    labels: dict[str, str],
    *,
    pair_share: dict[str, np.ndarray] | None = None,
    **stats,
) -> list[str]:
    """Write ``out/dose_response.csv`` and ``out/dose_response.png``; returns the report's markdown lines."""
    from ..runtime.manifest import atomic_write_text

    table = dose_response_table(lab, knobs, kmax, pair_share=pair_share, **stats)
    order = {m: i for i, m in enumerate([compare.REFERENCE_METHOD, *labels])}  # SFT, then the lab's order
    table = table.sort_values(
        "method", key=lambda c: c.map(lambda m: order.get(m, len(order))), kind="stable"
    )
    table = table.reset_index(drop=True)
    atomic_write_text(Path(out) / CSV, table.to_csv(index=False))
    plot(table, labels, kmax, Path(out) / PNG)
    net = f"net_support_at_{kmax}"
    lines = [
        "",
        f"### Dose-response: pass@1 against net support at k = {kmax} (sage_unsloth/demo/dose_response.py)",
        "",
        (
            "Knob values from each run's stage-2 manifest; intervals as above (net support paired by seed "
            "with SFT). lab/dose_response.csv has every knob column."
        ),
        "",
        f"| method | setting | seeds | pass@1 | net support at k = {kmax} |",
        "|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {labels.get(r['method'], r['method'])} | {setting_text(r)} | {int(r['seeds'])} | "
            f"{r['pass_at_1']:.3f} [{r['pass_at_1_ci_low']:.3f}, {r['pass_at_1_ci_high']:.3f}] | "
            f"{r[net]:+.3f} [{r[f'{net}_ci_low']:+.3f}, {r[f'{net}_ci_high']:+.3f}] |"
        )
    lines += ["", f"![pass@1 against net support per method](lab/{PNG})"]
    return lines
