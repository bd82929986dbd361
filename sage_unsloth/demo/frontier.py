"""The frontier lab across pre-training draws: ``python -m sage_unsloth.demo.frontier --labs R/draw0,R/draw1,...
--out R/frontier --kmax K [--k K]`` (the runner's last step with ``--draws``; docs/lab-plan.md is its plan).

Each ``--labs`` folder is one draw's lab (its own base and SFT adapter, the same task, methods and training
seeds). An **arm** is a method's knob setting as its runs' stage-2 manifests recorded it (``lab/runs.csv``:
guide, beta, ...), never its name, so the arms match across draws and a method is paired by its knobs: each
guided arm against the unguided arm at the same beta, KL estimator and placement (Branch - GRPO at beta b).

Per seed (``seeds.csv``): each run's pass@1 and pass@k (the mean over the problems of the unbiased estimate),
its net support against the same seed's SFT evaluation (pass@k - SFT's pass@k) and its pair-plan share, and
whether it **collapsed**: net support below ``-collapse`` (docs/lab-plan.md fixes 0.15 before the runs).

Estimates (``arms.csv``, ``paired.csv``), per draw and pooled over the draws, by sage_unsloth.report.strata:
the mean of the draw means (each draw a fixed level: three draws cannot estimate a between-draw variance, so
the interval carries each draw's seed spread and not the draws' spread; per-draw rows show how far the draws
agree), Welch-Satterthwaite's t or with ``--blocked-t`` the draw-blocked t (df N - D). Paired rows (A - B in
pass@k, pass@1 and the pair-plan share) add the robust secondary (Hodges-Lehmann with its exact interval, the
exact signed-rank p), the exact-power MDE, the count of positive pairs, and at pass@k the difference as a share
of the unguided arm's support loss at that beta (``share_of_loss``) beside the paper's +0.015 as such a share
(``target_share``). ``p_holm``: Holm within each family (:func:`families`: the primary family is pooled pass@k
at every beta above the paper's 0.05, or the metrics ``--primary`` names; per-draw rows are descriptive); the
collapse rate per arm (``collapses`` of ``runs``) with its exact Clopper-Pearson interval.

``frontier.png`` plots pass@1 against net support at k, one point per arm with both intervals and each guide's
beta curve; ``outcome.md`` is the tables in words (README and docs/lab.md embed it between
``<!-- frontier-outcome:begin results/<folder> -->`` and ``<!-- frontier-outcome:end -->``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..report import compare, formatting, intervals, strata
from ..runtime.manifest import atomic_write_text

MODEL_NAME = "demo-tiny"
BENCHMARK = "demo"
PAPER_BETA = 0.05  # the paper's anchor strength (arXiv 2605.18864): the frontier's unbound end
COLLAPSE = 0.15  # a run whose net support at k is below -COLLAPSE collapsed (docs/lab-plan.md)
GUIDE_LABELS = {"none": "GRPO", "branch": "Branch"}
ARM_KEYS = ("guide", "beta", "tau", "gamma", "q_max", "kl_estimator", "kl_placement")
POOLED = strata.POOLED
NO_COLLAPSE = strata.EXCLUDED  # the pre-registered sensitivity analysis (docs/lab-plan.md)
PAIR_SHARE = "pair-plan share"  # the paired metric's name, as the lab's pairs.csv writes it
FILES = ("seeds.csv", "arms.csv", "paired.csv", "outcome.md", "summary.txt", "frontier.png")
BEGIN = "<!-- frontier-outcome:begin {folder} -->"
END = "<!-- frontier-outcome:end -->"
BLOCK = re.compile(
    r"<!-- frontier-outcome:begin (?P<folder>\S+) -->\n(?P<body>.*?)<!-- frontier-outcome:end -->", re.DOTALL
)


def paper_shape() -> dict[str, str]:
    """The knobs of the lab's paper-shape Branch (the method file whose card has ``role: paper_shape``, resolved
    as stage 2 reads it): a Branch arm with exactly these is labelled 'Branch', any other shows its knobs."""
    from ..config.method_cards import role_holder
    from .run import resolve_method_config

    config, _ = resolve_method_config(role_holder("paper_shape").path)
    return {k: formatting.knob(config["guide"][k]) for k in ("tau", "gamma", "q_max")}


def arm_label(row, paper: dict[str, str] | None = None) -> str:
    """'GRPO, beta 1', 'Branch, beta 0.05' (the paper shape), 'Branch (tau 0.03, gamma 10, q_max 10), beta 0.05',
    'GRPO + ref_branch (tau 0.3, gamma 4, q_max 3), beta 0.05': the guide, its knobs unless the paper's, beta."""
    guide = str(row["guide"]) if isinstance(row["guide"], str) and row["guide"] else "none"
    name = GUIDE_LABELS.get(guide, f"GRPO + {guide}")
    values = {k: formatting.knob(row[k]) for k in ("tau", "gamma", "q_max")}
    shown = guide != "none" and (guide not in GUIDE_LABELS or values != (paper or paper_shape()))
    knobs = [f"{k} {v}" for k, v in values.items() if shown and v]
    extra = [
        str(row[k])
        for k in ("kl_estimator", "kl_placement")
        if str(row.get(k, "")) not in ("", "k3", "loss", "nan")
    ]
    inner = ", ".join(knobs + extra)
    return f"{name}{f' ({inner})' if inner else ''}, beta {formatting.knob(row['beta'])}"


def arm_key(row) -> str:
    return "|".join(
        f"{k}={formatting.knob(row[k]) if k not in ('guide', 'kl_estimator', 'kl_placement') else row[k]}"
        for k in ARM_KEYS
    )


def lab_draw(folder: Path) -> int:
    manifest = Path(folder) / "demo_budget.json"
    return int(json.loads(manifest.read_text()).get("draw", 0)) if manifest.is_file() else 0


def seed_table(folders: list[Path], k: int, collapse: float = COLLAPSE) -> pd.DataFrame:
    """One row per (draw, run): seed, arm, pass@1, pass@k, net support at k against the seed's SFT run, the
    pair-plan share, collapsed; SFT rows have arm 'SFT' and net 0."""
    rows = []
    for folder in folders:
        folder = Path(folder)
        draw = lab_draw(folder)
        lab = compare.load_run_counts(folder / MODEL_NAME, BENCHMARK)
        runs = pd.read_csv(folder / "lab" / "runs.csv", keep_default_na=False, na_values=[""])
        for col in ("guide", "kl_estimator", "kl_placement"):
            runs[col] = runs[col].astype(object).where(runs[col].notna(), "").astype(str)
        sft = {
            int(r["seed"]): r["run"] for _, r in runs.iterrows() if r["method"] == compare.REFERENCE_METHOD
        }
        paper = paper_shape()
        for _, r in runs.iterrows():
            seed = int(r["seed"])
            p1 = float(lab.passk(r["run"], [1]).mean())
            pk = float(lab.passk(r["run"], [k]).mean())
            base = float(lab.passk(sft[seed], [k]).mean())
            is_sft = r["method"] == compare.REFERENCE_METHOD
            net = 0.0 if is_sft else pk - base
            rows.append(
                {
                    "draw": draw,
                    "seed": seed,
                    "method": r["method"],
                    "run": r["run"],
                    "arm": "SFT" if is_sft else arm_label(r, paper),
                    "key": "sft" if is_sft else arm_key(r),
                    **{knob: ("" if is_sft else r[knob]) for knob in ARM_KEYS},
                    "pass_at_1": p1,
                    f"pass_at_{k}": pk,
                    "net_support": net,
                    "pair_share": float(r["pair_share"]) if "pair_share" in r else math.nan,
                    "collapsed": bool(not is_sft and net < -collapse),
                }
            )
    frame = pd.DataFrame(rows)
    if frame.empty:
        raise ValueError(f"no runs under {folders}")
    return frame


def arm_table(
    seeds: pd.DataFrame, k: int, collapse: float = COLLAPSE, *, blocked: bool = False
) -> pd.DataFrame:
    """Per arm, per draw and pooled: seeds, pass@1, net support at k, pair-plan share (report/strata.py),
    collapses with the Clopper-Pearson interval."""
    rows = []
    for key, arm in seeds.groupby("key", sort=False):
        first = arm.iloc[0]
        for scope, part in strata.scopes(arm):
            row = {"arm": first["arm"], "key": key, "draw": scope, **{c: first[c] for c in ARM_KEYS}}
            row["seeds"] = len(part)
            row.update(strata.level_cells(part, ("pass_at_1", f"pass_at_{k}", "net_support", "pair_share"),
                                          blocked=blocked))  # fmt: skip
            count, total = int(part["collapsed"].sum()), len(part)
            low, high = intervals.clopper_pearson(count, total)
            row.update(collapses=count, runs=total, collapse_rate=count / total, collapse_ci_low=low,
                       collapse_ci_high=high, collapse_below=collapse)  # fmt: skip
            rows.append(row)
    return pd.DataFrame(rows)


def pairings(seeds: pd.DataFrame) -> list[tuple[str, str]]:
    """(guided arm key, unguided arm key) at the same beta, KL estimator and placement."""
    arms = seeds[seeds["key"] != "sft"].drop_duplicates("key")
    out = []
    for _, a in arms[arms["guide"] != "none"].iterrows():
        match = arms[
            (arms["guide"] == "none")
            & (arms["beta"].astype(float) == float(a["beta"]))
            & (arms["kl_estimator"] == a["kl_estimator"])
            & (arms["kl_placement"] == a["kl_placement"])
        ]
        if not match.empty:
            out.append((a["key"], match.iloc[0]["key"]))
    return sorted(out, key=lambda p: (float(seeds.loc[seeds["key"] == p[0], "beta"].iloc[0]), p[0]))


def metric_columns(k: int) -> dict[str, str]:
    """The paired metrics, as the tables name them, and their seeds.csv columns."""
    return {f"pass@{k}": f"pass_at_{k}", "pass@1": "pass_at_1", PAIR_SHARE: "pair_share"}


def paired_table(
    seeds: pd.DataFrame, k: int, arms: pd.DataFrame, *, primary: tuple[str, ...] | None = None,
    blocked: bool = False,
) -> pd.DataFrame:  # fmt: skip
    """Per pairing and metric (pass@k, pass@1, pair-plan share), per draw and pooled: the paired difference (runs
    paired by draw and seed; report/strata.py), and at pass@k the share of the unguided arm's support loss;
    Holm over each family (:func:`families`; ``primary``: the primary family's metrics, default pass@k)."""
    rows = []
    for a_key, b_key in pairings(seeds):
        a = seeds[seeds["key"] == a_key].set_index(["draw", "seed"])
        b = seeds[seeds["key"] == b_key].set_index(["draw", "seed"])
        common = a.index.intersection(b.index).sort_values()
        kept = ~(a.loc[common, "collapsed"].to_numpy() | b.loc[common, "collapsed"].to_numpy())
        beta = float(a["beta"].iloc[0])
        for metric, column in metric_columns(k).items():
            if seeds[column].isna().any():
                continue
            for scope, cells in strata.paired_differences(a[column], b[column], kept=kept, blocked=blocked):
                row = {"a": a["arm"].iloc[0], "b": b["arm"].iloc[0], "beta": beta, "metric": metric,
                       "draw": NO_COLLAPSE if scope == strata.EXCLUDED else scope, **cells}  # fmt: skip
                if metric == f"pass@{k}":
                    row.update(loss_share(arms, b_key, scope, cells["diff"]))
                rows.append(row)
    frame = pd.DataFrame(rows)
    return families(frame, k, primary or (f"pass@{k}",)) if not frame.empty else frame


def loss_share(arms: pd.DataFrame, b_key: str, scope: str, diff: float) -> dict:
    """The difference as a share of the unguided arm's support loss in that scope, and the paper's effect as such a
    share (pooled scopes use the pooled loss)."""
    scope = POOLED if scope in (POOLED, strata.EXCLUDED) else scope
    loss = -float(arms[(arms["key"] == b_key) & (arms["draw"] == scope)]["net_support"].iloc[0])
    return {
        "b_support_loss": loss,
        "share_of_loss": diff / loss if loss > 0 else math.nan,
        "target_share": intervals.PAPER_EFFECT / loss if loss > 0 else math.nan,
    }


def families(frame: pd.DataFrame, k: int, primary: tuple[str, ...]) -> pd.DataFrame:
    """The plan's families and Holm within each: ``primary`` = the pooled rows of the primary metrics at every beta
    above the paper's; ``secondary`` = every other pooled row of a registered metric (pass@k, pass@1 and the
    primary ones); ``post hoc`` = pooled rows of any other metric (the pair-plan share where a plan did not
    register it); per-draw rows are descriptive, the collapse-dropped rows the sensitivity analysis."""
    pooled = frame["draw"] == POOLED
    registered = frame["metric"].isin({f"pass@{k}", "pass@1", *primary})
    is_primary = pooled & frame["metric"].isin(primary) & (frame["beta"] > PAPER_BETA)
    other = np.where(frame["draw"] == NO_COLLAPSE, "sensitivity", "per draw")
    frame["family"] = np.where(
        is_primary, "primary", np.where(pooled & registered, "secondary", np.where(pooled, "post hoc", other))
    )
    frame["p_holm"] = math.nan
    for family in ("primary", "secondary", "post hoc"):
        members = frame["family"] == family
        frame.loc[members, "p_holm"] = intervals.holm(frame.loc[members, "p"].to_numpy())
    return frame


# ------------------------------------------------------------------------------------------- the figure
def plot_frontier(arms: pd.DataFrame, k: int, path: Path) -> Path:
    """pass@1 against net support at k: one point per arm (pooled over the draws) with both 95% intervals, each
    guide's points joined in order of beta (its beta curve) and labelled with beta; the per-draw means as small
    hollow markers; SFT at net 0."""
    from ..report import palette, plots

    pooled = arms[arms["draw"] == POOLED]
    per_draw = arms[arms["draw"] != POOLED]
    fig, axes = plots._figure((980, 640))
    ax = axes[0, 0]
    families = list(dict.fromkeys(pooled["guide"].fillna("none").astype(str)))
    colours = palette.colours(families)
    for family in families:
        rows = pooled[pooled["guide"].astype(str) == family].copy()
        if family == "":
            continue
        rows["b"] = rows["beta"].astype(float)
        rows = rows.sort_values("b")
        colour = colours[family]
        name = GUIDE_LABELS.get(family, family)
        ax.plot(
            rows["net_support"],
            rows["pass_at_1"],
            "-",
            color=colour,
            lw=1.2,
            alpha=0.7,
            label=f"{name}: beta curve",
        )
        ax.errorbar(
            rows["net_support"], rows["pass_at_1"],
            xerr=[rows["net_support"] - rows["net_support_ci_low"], rows["net_support_ci_high"] - rows["net_support"]],
            yerr=[rows["pass_at_1"] - rows["pass_at_1_ci_low"], rows["pass_at_1_ci_high"] - rows["pass_at_1"]],
            fmt="o", color=colour, ms=6, capsize=3, lw=1.0,
        )  # fmt: skip
        for _, r in rows.iterrows():
            ax.annotate(f"β={r['b']:g}", (r["net_support"], r["pass_at_1"]), textcoords="offset points",
                        xytext=(6, 6 if family == "none" else -12), fontsize=8, color=colour)  # fmt: skip
        draws = per_draw[per_draw["guide"].astype(str) == family]
        ax.scatter(
            draws["net_support"], draws["pass_at_1"], s=14, facecolors="none", edgecolors=colour, alpha=0.6
        )
    sft = pooled[pooled["key"] == "sft"]
    if not sft.empty:
        r = sft.iloc[0]
        ax.errorbar([0.0], [r["pass_at_1"]], yerr=[[r["pass_at_1"] - r["pass_at_1_ci_low"]],
                    [r["pass_at_1_ci_high"] - r["pass_at_1"]]], fmt="s", color="black", ms=6, capsize=3,
                    label="SFT")  # fmt: skip
    ax.axvline(0.0, color="grey", lw=1, ls="--")
    ax.set_xlabel(
        f"net support against SFT at k = {k} (share of the problems; right of the dashed line: kept)"
    )
    ax.set_ylabel("pass@1")
    ax.set_title(
        f"The frontier: pass@1 against support kept at k = {k}, pooled over {per_draw['draw'].nunique()} draws "
        "(95% t-intervals; hollow: each draw)",
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return plots._save(fig, path)


# ------------------------------------------------------------------------------------------- the words
def _ci(row, name: str, signed: bool = True) -> str:
    return formatting.estimate(row[name], row[f"{name}_ci_low"], row[f"{name}_ci_high"], signed=signed)


def reading(row) -> str:
    """The pre-registered decision rule's words for one pooled paired row (docs/lab-plan.md): a claim needs the
    t-test (Holm within its family) and the robust secondary (HL's exact interval) to agree; at pass@k, a gain
    of the paper's size is excluded when both intervals' upper ends are below it. A pair-plan share row is read
    by the claim rule alone (post hoc rows: what the t-interval shows, labelled so)."""
    hl_low, hl_high = row.get("hl_ci_low", math.nan), row.get("hl_ci_high", math.nan)
    robust_known = not (pd.isna(hl_low) or pd.isna(hl_high))
    what = "pair plans" if row["metric"] == PAIR_SHARE else "support"
    side = "more" if row["diff"] > 0 else "fewer" if what == "pair plans" else "less"
    agrees = robust_known and (hl_low > 0 if row["diff"] > 0 else hl_high < 0)
    if row["family"] in ("primary", "post hoc") and row["p_holm"] < 0.05:
        claim = f"Branch keeps {side} {what}" + ("" if agrees else " by the t-test only: not robust (HL)")
        return claim + (" (post hoc)" if row["family"] == "post hoc" else "")
    if what == "pair plans":
        return "no difference claimed" + (" (post hoc)" if row["family"] == "post hoc" else "")
    if row["ci_high"] < intervals.PAPER_EFFECT and (not robust_known or hl_high < intervals.PAPER_EFFECT):
        return f"a gain of +{intervals.PAPER_EFFECT:g} or more is excluded"
    if row["ci_high"] < intervals.PAPER_EFFECT:
        return f"a gain of +{intervals.PAPER_EFFECT:g} is excluded by the t-interval only (not by HL)"
    return f"inconclusive: the interval holds 0 and +{intervals.PAPER_EFFECT:g}"


def _digits(metric: str) -> int:
    return 4 if metric == PAIR_SHARE else 3  # shares of completions a few thousandths apart


def outcome_block(frontier_dir: Path) -> str:
    """The frontier's tables in words, from arms.csv and paired.csv only (README and docs/lab.md embed it)."""
    arms = pd.read_csv(Path(frontier_dir) / "arms.csv", keep_default_na=False, na_values=[""])
    paired = pd.read_csv(Path(frontier_dir) / "paired.csv", keep_default_na=False, na_values=[""])
    k = int(re.search(r"pass@(\d+)", " ".join(paired["metric"].unique()) + " pass@0").group(1) or 0)
    draws = sorted(d for d in arms["draw"].astype(str).unique() if d != POOLED)
    lines = [*_paired_lines(paired, draws, k), *_arm_lines(arms, k), *_per_draw_lines(arms, paired, draws, k)]
    return "\n".join(lines) + "\n"


def _paired_lines(paired: pd.DataFrame, draws: list[str], k: int) -> list[str]:
    """The pooled paired rows (the primary family, its sensitivity analysis and the secondary rows), read."""
    pooled = paired[paired["draw"].isin([POOLED, NO_COLLAPSE])]
    primary = list(dict.fromkeys(pooled.loc[pooled["family"] == "primary", "metric"]))
    post_hoc = list(dict.fromkeys(pooled.loc[pooled["family"] == "post hoc", "metric"]))
    interval = set(pooled["interval"])
    how = "the draw-blocked t, df N - D" if interval == {intervals.BLOCKED} else "intervals.stratified"
    lines = [
        (
            f"Draws {', '.join(draws)} (pre-training + SFT), pooled with the draws as fixed levels ({how}); runs "
            f"paired by draw and seed. Primary family: Branch - GRPO in {' and '.join(primary) or 'nothing'} at "
            f"every beta above {PAPER_BETA:g}, Holm-adjusted"
            + (
                f"; {' and '.join(post_hoc)}: post hoc (no plan registered it), Holm within itself"
                if post_hoc
                else ""
            )
            + "; MDE: the exact-power MDE (df N - D); HL: Hodges-Lehmann with its exact interval (the robust "
            "secondary); 'share of loss': the difference as a share of GRPO's support loss against SFT at that "
            f"beta, beside the paper's +{intervals.PAPER_EFFECT:g} as such a share."
        ),
        "",
        "| A - B | metric | A - B [95% t] | p (Holm) | MDE | HL [exact CI] | share of B's loss (target) | reading |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, r in pooled.iterrows():
        digits = _digits(r["metric"])
        hl = formatting.estimate(r.get("hl"), r.get("hl_ci_low"), r.get("hl_ci_high"), digits, signed=True)
        share = (
            f"{r['share_of_loss']:+.2f} ({r['target_share']:.2f})"
            if r["metric"] != "pass@1" and not pd.isna(r.get("share_of_loss"))
            else ""
        )
        read = reading(r) if r["metric"] != "pass@1" and r["draw"] == POOLED else ""
        diff = formatting.estimate(r["diff"], r["ci_low"], r["ci_high"], digits, signed=True)
        metric = (
            r["metric"]
            if r["draw"] == POOLED
            else f"{r['metric']}, {int(r['pairs'])} pairs without a collapse"
        )
        lines.append(
            f"| {r['a']} - {r['b']} | {metric} | {diff} | {formatting.p_value(r['p_holm'])} | "
            f"{formatting.number(r['mde'], digits)} | {hl} | {share} | {read} |"
        )
    return lines


def _arm_lines(arms: pd.DataFrame, k: int) -> list[str]:
    """Per arm, pooled: pass@1, net support, pair-plan share and collapses."""
    lines = [
        "",
        (
            f"Per arm, pooled: pass@1, net support against SFT at k = {k} (paired by seed), pair-plan share, "
            f"collapses (runs whose net support is below -{arms['collapse_below'].iloc[0]:g}) with the "
            "Clopper-Pearson interval."
        ),
        "",
        f"| arm | runs | pass@1 | net support at {k} | pair-plan share | collapses [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    for _, r in arms[arms["draw"] == POOLED].iterrows():
        lines.append(
            f"| {r['arm']} | {int(r['runs'])} | {_ci(r, 'pass_at_1', signed=False)} | {_ci(r, 'net_support')} | "
            f"{_ci(r, 'pair_share', signed=False)} | {int(r['collapses'])}/{int(r['runs'])} "
            f"[{r['collapse_ci_low']:.2f}, {r['collapse_ci_high']:.2f}] |"
        )
    return lines


def _per_draw_lines(arms: pd.DataFrame, paired: pd.DataFrame, draws: list[str], k: int) -> list[str]:
    """Per draw: each arm's net support, then each Branch - GRPO pair at pass@k."""
    lines = [
        "",
        f"Per draw: net support at k = {k} against SFT, and Branch - GRPO at pass@{k} (and in pair-plan share).",
        "",
        "| arm | " + " | ".join(f"draw {d}" for d in draws) + " |",
        "|---|" + "---|" * len(draws),
    ]
    per = arms[arms["draw"] != POOLED]
    for key, group in per.groupby("key", sort=False):
        by = group.set_index(group["draw"].astype(str))
        lines.append(
            f"| {group['arm'].iloc[0]} | "
            + " | ".join(_ci(by.loc[d], "net_support") if d in by.index else "" for d in draws)
            + " |"
        )
    per_pairs = paired[(paired["family"] == "per draw") & (paired["metric"] != "pass@1")]
    order = {m: i for i, m in enumerate((f"pass@{k}", PAIR_SHARE))}
    groups = per_pairs.groupby(["beta", "a", "b", "metric"], sort=False)
    for (_, a, b, metric), group in sorted(groups, key=lambda g: (g[0][0], g[0][1], order.get(g[0][3], 9))):
        by = group.set_index(group["draw"].astype(str))
        cells = [
            formatting.estimate(by.loc[d, "diff"], by.loc[d, "ci_low"], by.loc[d, "ci_high"], _digits(metric),
                                signed=True) if d in by.index else ""
            for d in draws
        ]  # fmt: skip
        suffix = "" if metric == f"pass@{k}" else f", {metric}"
        lines.append(f"| {a} - {b}{suffix} | " + " | ".join(cells) + " |")
    return lines


def update_text(text: str, root: Path) -> str:
    """``text`` with every frontier-outcome block regenerated from its folder (relative to ``root``)."""

    def fresh(match: re.Match) -> str:
        folder = match["folder"]
        return f"{BEGIN.format(folder=folder)}\n{outcome_block(root / folder)}{END}"

    return BLOCK.sub(fresh, text)


def parse_primary(spec: str | None, k: int) -> tuple[str, ...]:
    """``--primary pass@64,pair_share`` as the tables name the metrics; refuses a metric the table has not."""
    if not spec:
        return (f"pass@{k}",)
    names = metric_columns(k)
    out = tuple(PAIR_SHARE if item.strip() == "pair_share" else item.strip() for item in spec.split(","))
    unknown = [m for m in out if m not in names]
    if unknown:
        raise ValueError(f"--primary {spec}: {unknown} not among {sorted(names)} (pair_share for the share)")
    return out


def summary_lines(arms: pd.DataFrame, paired: pd.DataFrame, k: int) -> list[str]:
    lines = [
        f"[frontier] pooled over draws {', '.join(sorted(d for d in arms['draw'].astype(str).unique() if d != POOLED))}:"
    ]
    for _, r in arms[arms["draw"] == POOLED].iterrows():
        lines.append(
            f"[frontier]   {r['arm']:28s} pass@1 {_ci(r, 'pass_at_1', signed=False)}  net support at {k} "
            f"{_ci(r, 'net_support')}  collapses {int(r['collapses'])}/{int(r['runs'])}"
        )
    for _, r in paired[(paired["draw"] == POOLED)].iterrows():
        lines.append(
            f"[frontier]   {r['a']} - {r['b']}, {r['metric']}: "
            f"{formatting.estimate(r['diff'], r['ci_low'], r['ci_high'], _digits(r['metric']), signed=True)} "
            f"(MDE {formatting.number(r['mde'], _digits(r['metric']))}, p_holm {formatting.p_value(r['p_holm'])}, "
            f"{r['family']})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m sage_unsloth.demo.frontier", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--labs", required=True, help="the draws' results folders, comma-separated")
    parser.add_argument("--out", required=True)
    parser.add_argument("--kmax", type=int, required=True, help="the largest k the labs report")
    parser.add_argument("--k", type=int, default=None, help="the primary k (default: kmax)")
    parser.add_argument(
        "--collapse", type=float, default=COLLAPSE, help="a run collapsed below -collapse net support"
    )
    parser.add_argument(
        "--primary",
        default=None,
        help="the primary family's metrics, comma-separated: pass@K, pair_share (default pass@k, the frontier "
        "lab's plan)",
    )
    parser.add_argument(
        "--blocked-t",
        action="store_true",
        help="pooled intervals by the draw-blocked t (df N - D) instead of Welch-Satterthwaite's",
    )
    args = parser.parse_args(argv)
    try:
        k = args.k or args.kmax
        primary = parse_primary(args.primary, k)
        folders = [Path(p) for p in args.labs.split(",") if p]
        seeds = seed_table(folders, k, args.collapse)
        arms = arm_table(seeds, k, args.collapse, blocked=args.blocked_t)
        paired = paired_table(seeds, k, arms, primary=primary, blocked=args.blocked_t)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}")
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in (("seeds", seeds), ("arms", arms), ("paired", paired)):
        atomic_write_text(out / f"{name}.csv", frame.to_csv(index=False))
    plot_frontier(arms, k, out / "frontier.png")
    atomic_write_text(out / "outcome.md", outcome_block(out))
    lines = summary_lines(arms, paired, k)
    atomic_write_text(out / "summary.txt", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
