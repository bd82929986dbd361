"""The lab's closing step: methods compared across seeds and problems, the run compared with the committed
reference, and a plain statement of what GRPO + Branch did against GRPO.

``python -m sage_unsloth.demo.lab --work W --results R --runs sft,A_seed0,... --methods '{"A": "label", ...}'
--pairs A:B,... [--reference results/demo-reference]`` reads the eval stage's per_problem.csv
files and the analysis step's tables and writes ``R/lab/``: ``methods.csv`` (pass@k per method and k with
intervals), ``pairs.csv`` (paired differences: the family of comparisons, with p_holm, mde and
seeds_for_0.015), ``outcome.md`` (the outcome paragraph and table, from pairs.csv: demo/outcome.py),
``support.csv`` (support against SFT per method), ``plans.csv`` (plan shares per method), ``runs.csv`` (one
row per run), ``reference.csv`` (this run against the reference) and ``summary.txt`` (the console lines);
its section is appended to ``R/report.md``. Statistics: stage 4's multi-seed mode, sage_unsloth.report.compare and
sage_unsloth.report.intervals (docs/lab.md, "Intervals and power"). An empty or missing result is an error
(exit 1), never a NaN row.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..report import compare, formatting, intervals
from ..report.tables import md_table
from ..runtime.manifest import atomic_write_text
from . import dose_response, outcome, reproduce
from .analysis import ANALYSIS_DIR, CORRECT_SUFFIX, IDS_SUFFIX, MODEL_NAME, branch_settings
from .data import EVAL_FILE, SPEC_FILE
from .strategies import GROUPS, LABELS, MINORITY, PAIR_PLANS, PLAN_METRICS, markdown_table
from .task import COMMON, GAP_ONES_SUMS, STRATEGIES, parse_problem, plan_needs_gap

BENCHMARK = "demo"
LAB_DIR = "lab"
MARKER = "\n## The lab: "
WARNING_START = "<!-- reproduction-warning -->"  # report.md opens with the warning between these (when any)
WARNING_END = "<!-- /reproduction-warning -->"


def check_complete(lab: compare.RunCounts, runs: list[str]) -> None:
    missing = [r for r in runs if r not in lab.n]
    if missing:
        raise ValueError(f"no eval results for {missing}: the eval step did not finish")
    for run in runs:
        if len(lab.n[run]) == 0 or (lab.n[run] <= 0).any():
            raise ValueError(f"{run}: a problem has no graded samples (per_problem.csv n = 0)")


def mix_text(spec_file: Path) -> str:
    """The SFT plan prior as written beside the data: 'left 74%, right 9%, ...'."""
    mix = json.loads(spec_file.read_text())["spec"]["mix"]
    return ", ".join(f"{name} {share:.1%}".replace(".0%", "%") for name, share in mix)


def gap_flags(eval_file: Path, problems: list[str]) -> np.ndarray:
    """Per problem: does the common plan need an addition of the base model's gap (task.GAP_ONES_SUMS)?"""
    texts = {row["unique_id"]: row["problem"] for row in map(json.loads, eval_file.read_text().splitlines())}
    return np.array([plan_needs_gap(COMMON, parse_problem(texts[pid])) for pid in problems])


def gap_table(
    lab: compare.RunCounts,
    gap: np.ndarray,
    correct_minority: dict[str, np.ndarray],
    pair_share: dict[str, np.ndarray],
    kmax: int,
    **stats,
):
    """Per method, on the problems where the common plan meets the gap and on the others: pass@1, pass@kmax,
    the pair-plan share and the share of completions that are correct and follow a minority plan."""
    rows = []
    for method, runs in lab.methods.items():
        for subset, mask in (("gap", gap), ("no gap", ~gap)):
            if not mask.any():
                continue
            row = {"method": method, "problems": subset, "n_problems": int(mask.sum())}
            values = {
                "pass_at_1": np.stack([lab.passk(r, [1])[mask, 0] for r in runs]),
                f"pass_at_{kmax}": np.stack([lab.passk(r, [kmax])[mask, 0] for r in runs]),
                "pair_share": np.stack([pair_share[r][mask] for r in runs]),
                "correct_minority": np.stack([correct_minority[r][mask] for r in runs]),
            }
            for name, array in values.items():
                mean, low, high = compare.ci(array, bounds=compare.SHARE, **stats)
                row.update({name: mean, f"{name}_ci_low": low, f"{name}_ci_high": high})
            rows.append(row)
    return pd.DataFrame(rows)


def plans_by_type(shares: dict[str, np.ndarray], gap: np.ndarray, **stats) -> pd.DataFrame:
    """Plan shares per method on all problems, the gap problems and the others (CIs over seeds and problems)."""
    frames = []
    for subset, mask in (("all", np.ones_like(gap)), ("gap", gap), ("no gap", ~gap)):
        if mask.any():
            table = compare.strategy_method_table(
                {run: value[mask] for run, value in shares.items()}, list(GROUPS), **stats
            )
            frames.append(table.assign(problems=subset))
    return pd.concat(frames, ignore_index=True)


def run_rows(
    lab: compare.RunCounts, runs: list[str], kmax: int, strategies: pd.DataFrame, branch: pd.DataFrame
) -> pd.DataFrame:
    rows = []
    for run in runs:
        values = lab.passk(run, [1, kmax]).mean(axis=0)
        plans = strategies[strategies["run"] == run].set_index("strategy")
        b = branch[branch["run"] == run].iloc[0]
        rows.append(
            {
                "run": run,
                "method": compare.split_run(run)[0],
                "seed": compare.split_run(run)[1],
                "pass_at_1": values[0],
                f"pass_at_{kmax}": values[1],
                "minority_share": plans.loc[MINORITY, "fraction"],
                "minority_accuracy": plans.loc[MINORITY, "accuracy"],
                f"{COMMON}_share": plans.loc[COMMON, "fraction"],
                f"{COMMON}_accuracy": plans.loc[COMMON, "accuracy"],
                "other_share": plans.loc["other", "fraction"],
                "branch_entropy": b["branch_entropy_mean"],
                "branch_q_gt1": b["branch_q_gt1_fraction"],
                "other_q_gt1": b["other_q_gt1_fraction"],
                "train_frac_boosted": b["train_frac_boosted_mean"],
                "train_q_first": b.get("train_q_first_mean", math.nan),
                "train_first_boosted": b.get("train_first_boosted_mean", math.nan),
                "train_later_boosted": b.get("train_later_boosted_mean", math.nan),
            }
        )
    return pd.DataFrame(rows)


def reference_table(runs: pd.DataFrame, references: list[Path], kmax: int) -> pd.DataFrame:
    """This lab's per-run numbers beside the mean of its draw's references' runs of the same method, with the
    difference (empty reference: no reference ran that method or reported that k)."""
    ref = pd.concat([reproduce.reference_runs(r) for r in references], ignore_index=True)
    rows = []
    for metric in ("pass_at_1", f"pass_at_{kmax}", "minority_share"):
        if metric not in ref.columns:
            continue
        for _, r in runs.iterrows():
            values = ref.loc[ref["method"] == r["method"], metric].dropna()
            theirs = float(values.mean()) if not values.empty else math.nan
            rows.append({"run": r["run"], "metric": metric, "this_run": r[metric], "reference": theirs,
                         "diff": r[metric] - theirs})  # fmt: skip
    return pd.DataFrame(rows)


def plan_pair_table(lab: compare.RunCounts, shares: dict[str, np.ndarray], pairs, **stats) -> pd.DataFrame:
    """A - B of the share of completions that follow a pair plan (pairs, outer: the plans the gap spares),
    runs paired by seed: the guide's direct target is the plan prior at the branch point."""
    columns = [list(GROUPS).index(name) for name in PAIR_PLANS]
    rows = []
    for a, b in pairs:
        if a not in lab.methods or b not in lab.methods:
            continue
        diff = compare.paired_values(lab, a, b, lambda run: shares[run][:, columns].sum(axis=1))
        rows.append(
            compare.paired_row(a, b, diff, {"metric": "pair-plan share"}, stream=f"plans-{a}-{b}", **stats)
        )
    return pd.DataFrame(rows)


def adjust_family(pairs: pd.DataFrame, labels: dict[str, str]) -> pd.DataFrame:
    """pairs.csv's rows are the lab's family of comparisons (every pair at pass@1, pass@kmax and the
    pair-plan share): Holm-adjusted p over all of them, the family's size, and the methods' labels."""
    out = pairs.copy()
    out["p_holm"] = intervals.holm(out["p"].to_numpy())
    out["family"] = f"pairs.csv: {int(out['p'].notna().sum())} comparisons, Holm"
    out["a_label"] = out["a"].map(lambda m: labels.get(m, m))
    out["b_label"] = out["b"].map(lambda m: labels.get(m, m))
    return out


def verdict(
    pairs: pd.DataFrame, plan_pairs: pd.DataFrame, kmax: int, seeds: int, a: str, b: str, labels
) -> str:
    """One plain sentence on method A against method B (paired by seed), read off the paired intervals
    (``pairs``: the family, pass@k and pair-plan share rows; ``plan_pairs`` is in it)."""
    name_a, name_b = labels.get(a, a), labels.get(b, b)
    rows = pairs[(pairs["a"] == a) & (pairs["b"] == b)]
    if rows.empty:
        return f"{name_a} - {name_b}: not run."
    parts = []
    for _, r in rows.iterrows():
        metric = outcome._metric(r)
        what = f"{metric}: {formatting.estimate(r['diff'], r['ci_low'], r['ci_high'], signed=True)} (MDE {r['mde']:.3f})"
        parts.append(f"{what}, {outcome.reading(r)}")
    scope = f"{seeds} seed{'s' if seeds > 1 else ''} x {int(rows['problems'].iloc[0])} problems"
    return f"{name_a} - {name_b} ({scope}): " + "; ".join(parts) + "."


def movement(support: pd.DataFrame, kmax: int, labels) -> str:
    """One line: per method, the problems solved at k = kmax lost and gained against SFT, and the net."""
    rows = support[support["k"] == kmax] if not support.empty else support
    if rows.empty:
        return "Support against SFT: no SFT run."
    parts = []
    for _, r in rows.iterrows():
        net = formatting.estimate(r["net"], r["net_ci_low"], r["net_ci_high"], signed=True)
        tag = "" if r["net_ci_low"] <= 0 <= r["net_ci_high"] else " *"
        parts.append(
            f"{labels.get(r['method'], r['method'])} {net}{tag} (lost {r['shrunk']:.3f}, gained {r['expanded']:.3f})"
        )
    return (
        f"Support against SFT at k = {kmax} (net share of problems solved, * = CI excludes 0): "
        + "; ".join(parts)
        + "."
    )


def in_lab_order(names, labels: dict[str, str]) -> list[str]:
    """The distinct method names of ``names`` in the order of ``labels`` (SFT, then the runner's METHODS)."""
    present = set(names)
    return [m for m in labels if m in present] + sorted(present - set(labels))


def _method_colours(methods: list[str]) -> dict[str, str]:
    """Each method's colour from the kit's palette (sage_unsloth/report/palette.py): the same as in the report's
    plots, whatever else the lab holds."""
    from ..report import palette

    return palette.colours(methods)


def interval_ks(ks, count: int = 3) -> list[int]:
    """The few k where the headline draws intervals: the smallest, the largest and one between (log scale)."""
    ks = sorted({int(k) for k in ks})
    if len(ks) <= count:
        return ks
    return sorted({ks[0], ks[len(ks) // 2], ks[-1]})


def plot_headline(
    methods: pd.DataFrame, support: pd.DataFrame, labels: dict[str, str], kmax: int, path: Path
) -> Path:
    """The lab in one figure: pass@k per method (seeds aggregated; intervals at three k only, each method's
    bar nudged sideways, so that no band hides a line) beside the support movement against SFT at k = kmax
    (lost, gained and net share of the problems, net with its interval). The legend sits under both panels
    and the canvas grows to hold every label (plots._save(tight=True))."""
    from ..report import plots

    order = in_lab_order(methods["method"], labels)
    colours = _method_colours(order)
    fig, axes = plots._figure((1300, 560), ncols=2)
    ax = axes[0, 0]
    at = interval_ks(methods["k"])
    for i, method in enumerate(order):
        frame = methods[methods["method"] == method].sort_values("k")
        style = {"ls": "--", "lw": 2.0} if method == compare.REFERENCE_METHOD else {"lw": 1.3}
        ax.plot(
            frame["k"],
            frame["pass_at_k"],
            marker="o",
            ms=2.5,
            color=colours[method],
            label=labels.get(method, method),
            **style,
        )
        bars = frame[frame["k"].isin(at)]
        nudge = 2.0 ** (0.06 * (i - (len(order) - 1) / 2))  # side by side on the log axis
        ax.errorbar(
            bars["k"] * nudge,
            bars["pass_at_k"],
            yerr=[bars["pass_at_k"] - bars["ci_low"], bars["ci_high"] - bars["pass_at_k"]],
            fmt="none",
            ecolor=colours[method],
            elinewidth=1.0,
            capsize=2,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (log2)")
    ax.set_ylabel("pass@k")
    kinds = ", ".join(sorted(set(methods["interval"]))) if "interval" in methods.columns else "bootstrap"
    ax.set_title(f"pass@k per method (bars at k = {', '.join(map(str, at))}: 95% CI, {kinds})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax = axes[0, 1]
    rows = support[support["k"] == kmax].set_index("method") if not support.empty else pd.DataFrame()
    rl = [m for m in order if m in rows.index]
    y = np.arange(len(rl))[::-1]
    for yi, method in zip(y, rl):
        r = rows.loc[method]
        ax.barh(yi, -r["shrunk"], color=colours[method], alpha=0.35, height=0.6)
        ax.barh(yi, r["expanded"], color=colours[method], alpha=0.75, height=0.6)
        ax.errorbar(
            r["net"],
            yi,
            xerr=[[r["net"] - r["net_ci_low"]], [r["net_ci_high"] - r["net"]]],
            fmt="D",
            color="black",
            ms=4,
            capsize=3,
        )
    ax.axvline(0, color="grey", lw=1)
    reach = max([abs(v) for v in ax.get_xlim()] + [0.01])
    ax.set_xlim(-reach, reach)
    ax.set_yticks(y, [labels.get(m, m) for m in rl], fontsize=8)
    ax.set_xlabel("share of the problems: lost (left), gained (right); diamond: net with its 95% CI")
    ax.set_title(f"support movement against SFT at k = {kmax}", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(
        handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(4, len(names)), fontsize=8
    )
    return plots._save(fig, path, tight=True)


@dataclass(frozen=True)
class LabSection:
    """What the lab's section of report.md and its console summary show: the lab's tables (lab/*.csv) and the
    lab's settings."""

    methods: pd.DataFrame  # pass@k per method and k (methods.csv)
    pairs: pd.DataFrame  # the family of paired differences with p_holm (pairs.csv)
    plan_pairs: pd.DataFrame
    support: pd.DataFrame
    plans: pd.DataFrame
    runs: pd.DataFrame
    gaps: pd.DataFrame
    plan_types: pd.DataFrame
    compared: list  # the (A, B) pairs the verdicts read (B not SFT)
    strategy_rows: list[dict]
    branch: pd.DataFrame
    reference: pd.DataFrame | None
    labels: dict[str, str]
    kmax: int
    seeds: int
    settings: dict
    resamples: int
    mix: str

    def label(self, method: str) -> str:
        return self.labels.get(method, method)


def render(section: LabSection) -> tuple[str, str]:
    """(markdown section, console summary)."""
    headline = _headline(section)
    lines = [
        *_intro_lines(section, headline),
        *_method_lines(section),
        *_pair_lines(section),
        *([] if section.support.empty else _support_lines(section)),
        *([] if section.gaps.empty else _gap_lines(section)),
        *([] if section.plan_types.empty else _plan_type_lines(section)),
        *_plan_lines(section),
        *_branch_lines(section),
        *([] if section.reference is None or section.reference.empty else _reference_lines(section)),
    ]
    return "\n".join(lines) + "\n", "\n".join(_console_lines(section, headline)) + "\n"


def _headline(s: LabSection) -> list[str]:
    """SFT's pass@1 and branch point, the support movement, one verdict per compared pair."""
    m = s.methods.set_index(["method", "k"])
    branch, settings, kmax, seeds, labels = s.branch, s.settings, s.kmax, s.seeds, s.labels
    sft_branch = branch[branch["run"].map(compare.split_run).str[0] == compare.REFERENCE_METHOD].iloc[0]
    sft_pass1 = m.loc[("sft", 1)]
    return [
        (
            f"SFT policy: pass@1 {formatting.estimate(sft_pass1['pass_at_k'], sft_pass1['ci_low'], sft_pass1['ci_high'])}; "
            f"branch-point entropy {sft_branch['branch_entropy_mean']:.2f} nats (lab tau {settings['tau']}, gamma "
            f"{settings['gamma']}, temperature {settings['temperature']}): q > 1 at "
            f"{sft_branch['branch_q_gt1_fraction']:.1%} of the branch-point tokens (RL prompts) and at "
            f"{sft_branch['other_q_gt1_fraction']:.1%} of the other completion tokens."
        ),
        movement(s.support, kmax, labels),
        *(verdict(s.pairs, s.plan_pairs, kmax, seeds, a, b, labels) for a, b in s.compared),
    ]


def _intro_lines(s: LabSection, headline: list[str]) -> list[str]:
    methods, seeds, resamples = s.methods, s.seeds, s.resamples
    return [
        (
            f"{MARKER.lstrip()}methods across {seeds} training seed{'s' if seeds > 1 else ''} and "
            f"{int(methods['problems'].iloc[0])} problems (sage_unsloth/demo/lab.py)"
        ),
        "",
        *headline,
        "",
        (
            (
                f"CIs: 95% Student t with {seeds - 1} degrees of freedom over the {seeds} seed-level means "
                "(paired differences: per seed, the mean over the problems of A - B); the estimand is the mean "
                "over this problem set, in expectation over training seeds and evaluation sampling "
                '(sage_unsloth/report/intervals.py, docs/lab.md "Intervals and power").'
            )
            if seeds > 1
            else (
                f"CIs: 95% percentile bootstrap over the problems ({resamples} resamples): one seed, so the "
                "intervals show this seed's evaluation precision and nothing of the seed-to-seed spread."
            )
        ),
        "",
    ]


def _method_lines(s: LabSection) -> list[str]:
    """The pass@k table, one row per method with its minority-plan share and accuracies."""
    m, kmax, runs = s.methods.set_index(["method", "k"]), s.kmax, s.runs
    plan_rows = s.plans.set_index(["method", "strategy"])
    header = ["method", "seeds", "pass@1", f"pass@{kmax}", "minority-plan share", f"{COMMON} accuracy",
              "minority-plan accuracy"]  # fmt: skip
    rows = []
    for method in in_lab_order(s.methods["method"], s.labels):
        one, big = m.loc[(method, 1)], m.loc[(method, kmax)]
        minority = plan_rows.loc[(method, MINORITY)]
        method_runs = runs[runs["method"] == method]
        rows.append(
            [s.label(method), int(one["seeds"]), formatting.estimate(one["pass_at_k"], one["ci_low"], one["ci_high"]),
             formatting.estimate(big["pass_at_k"], big["ci_low"], big["ci_high"]),
             formatting.estimate(minority["share"], minority["ci_low"], minority["ci_high"]),
             f"{method_runs[f'{COMMON}_accuracy'].mean():.3f}", f"{method_runs['minority_accuracy'].mean():.3f}"]
        )  # fmt: skip
    return ["### pass@k per method", "", md_table(header, rows)]


def _pair_lines(s: LabSection) -> list[str]:
    """The headline plot and the family of paired differences."""
    lines = [
        "",
        "![pass@k per method and support movement against SFT](lab/headline.png)",
        "",
        "### Paired differences (A - B, runs paired by seed)",
        "",
        (
            "The family: every row below (lab/pairs.csv), p-values Holm-adjusted over it; MDE at 80% power, "
            f"two-sided 0.05; 'seeds for {intervals.PAPER_EFFECT:g}': seeds that would detect the paper's "
            "effect at this seed-level spread. lab/outcome.md reads each row."
        ),
        "",
    ]
    header = ["A", "B", "metric", "A - B", "95% CI", "CI excludes 0", "p (Holm)", "MDE", "seeds for 0.015", "seeds",
              "problems"]  # fmt: skip
    rows = [
        [s.label(r["a"]), s.label(r["b"]), r["metric"] if isinstance(r.get("metric"), str) else f"pass@{int(r['k'])}",
         f"{r['diff']:+.3f}", f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]", "yes" if r["excludes_0"] else "no",
         formatting.p_value(r["p_holm"]), f"{r['mde']:.3f}", formatting.seeds(r[outcome.SEEDS_FOR]), int(r["seeds"]),
         int(r["problems"])]
        for _, r in s.pairs.iterrows()
    ]  # fmt: skip
    return [*lines, md_table(header, rows)]


def _support_lines(s: LabSection) -> list[str]:
    """Support against SFT at kmax, and the net movement at every k."""
    support, kmax, labels = s.support, s.kmax, s.labels
    lines = [
        "",
        f"### Support against SFT at k = {kmax} (report/support.py, across seeds and problems)",
        "",
        (
            "Shares of the problems: a problem counts as solved at k with probability pass@k (the unbiased "
            "estimate), so 'shrunk' is SFT solves it and the method does not, 'expanded' the reverse, and "
            "net = expanded - shrunk = the pass@k difference."
        ),
        "",
        "| method | solved by SFT | solved by method | preserved | shrunk (lost) | expanded (gained) | net |",
        "|---|---|---|---|---|---|---|",
    ]
    at_kmax = support[support["k"] == kmax].set_index("method")
    for method in in_lab_order(at_kmax.index, labels):
        r = at_kmax.loc[method]
        cells = [
            formatting.estimate(r[n], r[f"{n}_ci_low"], r[f"{n}_ci_high"], signed=n == "net")
            for n in ("solved_ref", "solved_run", "preserved", "shrunk", "expanded", "net")
        ]
        lines.append(f"| {s.label(method)} | " + " | ".join(cells) + " |")
    ks = sorted(support["k"].unique())
    lines += [
        "",
        "Net support movement against SFT at every k (shrunk / expanded per k: lab/support.csv):",
        "",
        "| method | " + " | ".join(f"k = {k}" for k in ks) + " |",
        "|---|" + "---|" * len(ks),
    ]
    for method in in_lab_order(support["method"], labels):
        by_k = support[support["method"] == method].set_index("k")
        cells = [
            formatting.estimate(
                by_k.loc[k, "net"], by_k.loc[k, "net_ci_low"], by_k.loc[k, "net_ci_high"], signed=True
            )
            for k in ks
        ]
        lines.append(f"| {s.label(method)} | " + " | ".join(cells) + " |")
    return lines


def _gap_lines(s: LabSection) -> list[str]:
    """The problems where the common plan meets the base model's gap, and the others."""
    gaps, kmax, labels = s.gaps, s.kmax, s.labels
    lines = [
        "",
        "### Problems where the common plan meets the base model's gap (sage_unsloth/demo/task.py)",
        "",
        (
            f"The pre-training never showed a two-digit plus one-digit addition whose ones digits add up "
            f"to {' or '.join(map(str, GAP_ONES_SUMS))}, and SFT never used a plan where it needs one; {COMMON} (and the other "
            "running totals) need one on the 'gap' problems, the pair plans never do. Pair-plan share: "
            f"{PLAN_METRICS['pair-plan share']}; 'correct minority': share of the completions that are correct "
            "and follow a minority plan (any but the common one)."
        ),
        "",
        f"| method | problems | count | pass@1 | pass@{kmax} | pair-plan share | correct minority |",
        "|---|---|---|---|---|---|---|",
    ]
    ordered = pd.concat([gaps[gaps["method"] == m] for m in in_lab_order(gaps["method"], labels)])
    for _, r in ordered.iterrows():
        cells = [
            formatting.estimate(r[n], r[f"{n}_ci_low"], r[f"{n}_ci_high"])
            for n in ("pass_at_1", f"pass_at_{kmax}", "pair_share", "correct_minority")
        ]
        lines.append(
            f"| {s.label(r['method'])} | {r['problems']} | {int(r['n_problems'])} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def _plan_type_lines(s: LabSection) -> list[str]:
    plan_types = s.plan_types
    subsets = list(dict.fromkeys(plan_types["problems"]))
    lines = [
        "",
        "### Plan shares per method and problem type (seeds aggregated; lab/plans_by_type.csv has the CIs)",
        "",
        "| method | problems | " + " | ".join(list(GROUPS)) + " |",
        "|---|---|" + "---|" * (len(LABELS) + 1),
    ]
    shares = plan_types.set_index(["method", "problems", "strategy"])["share"]
    for method in in_lab_order(plan_types["method"], s.labels):
        for subset in subsets:
            cells = [f"{shares.loc[(method, subset, name)]:.3f}" for name in list(GROUPS)]
            lines.append(f"| {s.label(method)} | {subset} | " + " | ".join(cells) + " |")
    return lines


def _plan_lines(s: LabSection) -> list[str]:
    mix, strategy_rows = s.mix, s.strategy_rows
    return [
        "",
        "### Plans per run (rules: sage_unsloth/demo/task.py, label_strategy)",
        "",
        (
            f"The SFT data use the plans at {mix}; "
            "accuracy is within the plan's completions; minority-plan share: "
            f"{PLAN_METRICS['minority-plan share']}; 'solved by minority plans' is the share of problems with at "
            "least one correct minority-plan completion."
        ),
        "",
        markdown_table(strategy_rows),
        "",
        "![plans](analysis/strategies.png)",
    ]


def _branch_lines(section: LabSection) -> list[str]:
    """The branch point per run: entropy, q > 1 and plan probabilities, and the guided runs' training logs."""
    lines = [
        "",
        "### The branch point (sage_unsloth/demo/analysis.py)",
        "",
        (
            "Per run's final policy on the RL prompts: mean entropy of the first completion token (the plan "
            "word), share of prompts where the branch guide's q > 1, the policy's probability of each plan "
            "there; q > 1 at the other completion tokens. During training (guided runs, from the training log, "
            "means over the logged steps): sage/frac_boosted (all completion tokens), the mean q at the first "
            "completion token (the branch point) and the shares of first and of later tokens with q > 1."
        ),
        "",
        "| run | branch entropy | q > 1 (branch) | "
        + " | ".join(f"p({s})" for s in STRATEGIES)
        + " | q > 1 (other tokens) | training: frac_boosted | q at branch | q > 1 branch | q > 1 other |",
        "|" + "---|" * (8 + len(STRATEGIES)),
    ]
    for _, b in section.branch.iterrows():
        trained = [
            "" if pd.isna(b.get(c, math.nan)) else f"{b[c]:.3f}"
            for c in (
                "train_frac_boosted_mean",
                "train_q_first_mean",
                "train_first_boosted_mean",
                "train_later_boosted_mean",
            )
        ]
        lines.append(
            f"| {b['run']} | {b['branch_entropy_mean']:.3f} | {b['branch_q_gt1_fraction']:.3f} | "
            + " | ".join(f"{b['p_' + s]:.3f}" for s in STRATEGIES)
            + f" | {b['other_q_gt1_fraction']:.3f} | "
            + " | ".join(trained)
            + " |"
        )
    return lines


def _reference_lines(s: LabSection) -> list[str]:
    reference = s.reference
    lines = [
        "",
        "### This run against the committed reference (results/demo-reference/)",
        "",
        (
            "Same run names; the numbers agree exactly only on the same CPU type, library versions and "
            'budget (docs/stages.md, "The demo runner").'
        ),
        "",
        "| run | metric | this run | reference | difference |",
        "|---|---|---|---|---|",
    ]
    for _, r in reference.iterrows():
        theirs = "missing" if pd.isna(r["reference"]) else f"{r['reference']:.3f}"
        diff = "" if pd.isna(r["diff"]) else f"{r['diff']:+.3f}"
        lines.append(f"| {r['run']} | {r['metric']} | {r['this_run']:.3f} | {theirs} | {diff} |")
    return lines


def _console_lines(s: LabSection, headline: list[str]) -> list[str]:
    """The console summary: the headline, then pass@1, pass@kmax and the plan shares per method."""
    m, kmax = s.methods.set_index(["method", "k"]), s.kmax
    plan_rows = s.plans.set_index(["method", "strategy"])

    def method_line(method: str) -> str:
        one, big = m.loc[(method, 1)], m.loc[(method, kmax)]
        pair_share = sum(plan_rows.loc[(method, p), "share"] for p in PAIR_PLANS)
        return (
            f"[demo]   {s.label(method):28s} pass@1 {formatting.estimate(one['pass_at_k'], one['ci_low'], one['ci_high'])}  "
            f"pass@{kmax} {formatting.estimate(big['pass_at_k'], big['ci_low'], big['ci_high'])}  pair-plan share "
            f"{pair_share:.3f}  minority-plan share {plan_rows.loc[(method, MINORITY), 'share']:.3f}"
        )

    methods = in_lab_order(s.methods["method"], s.labels)
    return ["[demo] " + line for line in headline] + [method_line(method) for method in methods]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m sage_unsloth.demo.lab", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--work", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--runs", required=True)
    parser.add_argument("--methods", required=True, help='JSON {"name": "label", ...} of the RL methods')
    parser.add_argument("--pairs", required=True, help="a:b,... (method names; 'sft' for the SFT model)")
    parser.add_argument("--branch-config", required=True)
    parser.add_argument(
        "--reference",
        action="append",
        default=[],
        help="a committed lab of this draw to compare with (repeat for several; the runner names them)",
    )
    parser.add_argument(
        "--smoke",
        default="",
        help="this is a smoke run (its budget, in words): said so, compared with nothing",
    )
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--kmax", type=int, default=None, help="largest k reported (default: samples / 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level", type=float, default=0.95)
    args = parser.parse_args(argv)
    try:
        return _main(args)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}")
        return 1


@dataclass(frozen=True)
class PlanShares:
    """The analysis step's plan labels of every run, aligned with the lab's problems."""

    strategies: pd.DataFrame  # analysis/strategies.csv
    branch: pd.DataFrame  # analysis/branch.csv
    shares: dict[str, np.ndarray]  # run -> (problems, GROUPS) plan shares
    pair_share: dict[str, np.ndarray]  # run -> per-problem pair-plan share
    correct_minority: dict[str, np.ndarray]  # run -> per-problem share of correct minority-plan completions


def read_runs(results: Path, runs: list[str], kmax: int | None) -> tuple[compare.RunCounts, int, list[int]]:
    """(the runs' per-problem counts, kmax, the ks reported: powers of two up to kmax, and kmax)."""
    lab = compare.load_run_counts(
        results / MODEL_NAME, BENCHMARK
    )  # results/<model>/<run>/ (layout.results_dir)
    check_complete(lab, runs)
    lab = compare.RunCounts(lab.problems, {r: lab.n[r] for r in runs}, {r: lab.c[r] for r in runs})
    kmax, ks = compare.lab_ks(int(min(n.min() for n in lab.n.values())), kmax)
    return lab, kmax, ks


def read_plan_shares(results: Path, lab: compare.RunCounts, runs: list[str]) -> PlanShares:
    analysis = results / ANALYSIS_DIR
    with np.load(analysis / "strategy_problems.npz") as data:
        order = {run: pd.Index(data[f"{run}{IDS_SUFFIX}"]).get_indexer(lab.problems) for run in runs}
        if any((o < 0).any() for o in order.values()):
            raise ValueError("the analysis step labelled other problems than the eval step graded; rerun it")
        shares = {run: data[run][order[run]] for run in runs}
        pair_columns = [list(GROUPS).index(name) for name in PAIR_PLANS]
        minority_column = list(GROUPS).index(MINORITY)
        correct_minority = {run: data[f"{run}{CORRECT_SUFFIX}"][order[run], minority_column] for run in runs}
    return PlanShares(
        strategies=pd.read_csv(analysis / "strategies.csv"),
        branch=pd.read_csv(analysis / "branch.csv"),
        shares=shares,
        pair_share={run: shares[run][:, pair_columns].sum(axis=1) for run in runs},
        correct_minority=correct_minority,
    )


def check_numeric(methods: pd.DataFrame, run_frame: pd.DataFrame) -> None:
    """No empty table and no NaN where every run has a value (a run that produced no usable result)."""
    for frame, what in ((methods, "pass@k"), (run_frame, "per-run")):
        # accuracies are undefined where a plan never occurs, frac_boosted outside Branch runs: not checked
        numeric = frame.select_dtypes("number").drop(
            columns=[
                "seed",
                "train_frac_boosted",
                "train_q_first",
                "train_first_boosted",
                "train_later_boosted",
                "minority_accuracy",
                f"{COMMON}_accuracy",
                *dose_response.KNOBS,  # SFT has no knobs, GRPO no tau
            ],
            errors="ignore",
        )
        if frame.empty or numeric.isna().to_numpy().any():
            raise ValueError(f"the {what} table has empty or NaN values: a run produced no usable result")


def run_table(lab, runs, kmax, plans: PlanShares, knobs: pd.DataFrame) -> pd.DataFrame:
    """lab/runs.csv: one row per run with its knobs (from each run's stage-2 manifest) and pair-plan share."""
    run_frame = run_rows(lab, runs, kmax, plans.strategies, plans.branch).merge(knobs, on="run", how="left")
    run_frame.insert(
        run_frame.columns.get_loc("minority_share") + 1,
        "pair_share",
        [float(plans.pair_share[r].mean()) for r in run_frame["run"]],
    )
    return run_frame


def regime_table(lab, runs, gap, run_frame: pd.DataFrame, plans: PlanShares) -> pd.DataFrame:
    """lab/regime.csv: the numbers that say which regime this lab is in (sage_unsloth.demo.reproduce); GRPO's
    plan shares for every run trained without a guide (its knobs, from its stage-2 manifest)."""
    guides = dict(zip(run_frame["run"], run_frame["guide"].fillna("").astype(str)))
    return pd.DataFrame(
        reproduce.regime_rows(
            runs,
            lambda run: compare.split_run(run)[0],
            {run: lab.passk(run, [1])[:, 0] for run in runs},
            gap,
            dict(zip(run_frame["run"], run_frame["minority_share"])),
            {run: float(plans.pair_share[run].mean()) for run in runs},
            unguided=lambda run: guides.get(run, "") in ("", "none", "nan"),
        ),
        columns=["run", "method", "metric", "value"],
    )


def reproduction_check(regime: pd.DataFrame, work: Path, references: list[Path], smoke: str):
    """(lab/reproduction.csv or None, the banner's lines, a one-line note): every run against its draw's references
    (sage_unsloth.demo.reproduce); a smoke run is said to be one and compared with nothing."""
    if smoke:
        return (
            None,
            [],
            f"a smoke run ({smoke}): it shows that the pipeline runs, not what the lab shows; not compared",
        )
    if not references:
        return None, [], ""
    names = [_reference_name(r) for r in references]
    reproduction = reproduce.compare(regime, reproduce.fingerprints(work), references)
    warning = reproduce.banner(reproduce.warning_lines(reproduction, ", ".join(names)))
    return (
        reproduction,
        warning,
        reproduce.agreement_line(reproduction, names),
    )  # the note: one line when it does


def _reference_name(folder: Path) -> str:
    """results/demo-frontier/draw2 -> demo-frontier/draw2: a reference as the console names it."""
    folder = Path(folder)
    return f"{folder.parent.name}/{folder.name}" if folder.name.startswith("draw") else folder.name


def update_report(report: Path, markdown: str, warning: list[str], note: str = "") -> None:
    """report.md with the lab's section at its end (replacing an earlier one) and the reproduction warning,
    when there is one, at its top (else the one-line ``note``: a smoke run, or a lab that reproduces)."""
    text = report.read_text()
    if MARKER in text:  # the lab step reran on the same report: replace its section
        text = text[: text.index(MARKER)]
    if text.startswith(WARNING_START):  # and its warning
        text = text[text.index(WARNING_END) + len(WARNING_END) :].lstrip("\n")
    if warning:
        quoted = "\n".join(
            f"> **{line.strip()}**" if i == 1 else f"> {line.strip()}"
            for i, line in enumerate(warning[1:-1], 1)
        )
        text = f"{WARNING_START}\n{quoted}\n{WARNING_END}\n\n" + text
    elif note:
        text = f"{WARNING_START}\n> {note}\n{WARNING_END}\n\n" + text
    atomic_write_text(report, text.rstrip("\n") + "\n\n" + markdown)


def _main(args) -> int:
    results, work = Path(args.results), Path(args.work)
    runs = [r for r in args.runs.split(",") if r]
    labels = {"sft": "SFT", **json.loads(args.methods)}
    pairs = [tuple(item.split(":")) for item in args.pairs.split(",") if item]
    stats = {"resamples": args.resamples, "seed": args.seed, "level": args.level}
    lab, kmax, ks = read_runs(results, runs, args.kmax)
    plans = read_plan_shares(results, lab, runs)
    gap = gap_flags(work / "data" / EVAL_FILE, lab.problems)
    others = [len(v) for m, v in lab.methods.items() if m != compare.REFERENCE_METHOD]
    seeds = max(others) if len(lab.methods) > 1 else 1

    methods = compare.method_table(lab, ks, **stats)
    pair_frame = compare.pair_table(lab, pairs, sorted({1, kmax}), **stats)
    support = compare.support_table(lab, ks, **stats)
    plan_table = compare.strategy_method_table(plans.shares, list(GROUPS), **stats)
    plan_types = plans_by_type(plans.shares, gap, **stats)
    gaps = gap_table(lab, gap, plans.correct_minority, plans.pair_share, kmax, **stats)
    plan_pairs = plan_pair_table(lab, plans.shares, pairs, **stats)
    knobs = dose_response.run_knobs(work, MODEL_NAME, runs)  # from each run's stage-2 manifest
    run_frame = run_table(lab, runs, kmax, plans, knobs)
    check_numeric(methods, run_frame)
    references = [Path(r) for r in args.reference]
    reference = reference_table(run_frame, references, kmax) if references else None
    regime = regime_table(lab, runs, gap, run_frame, plans)
    reproduction, warning, note = reproduction_check(regime, work, references, args.smoke)
    family = adjust_family(pd.concat([pair_frame, plan_pairs], ignore_index=True), labels)
    out = results / LAB_DIR
    out.mkdir(parents=True, exist_ok=True)
    tables = {
        "methods": methods,
        "pairs": family,
        "support": support,
        "plans": plan_table,
        "runs": run_frame,
        "gap": gaps,
        "plans_by_type": plan_types,
        "reference": reference,
        "regime": regime,
        "reproduction": reproduction,
    }
    for name, frame in tables.items():
        if frame is not None:
            atomic_write_text(out / f"{name}.csv", frame.to_csv(index=False))
    plot_headline(methods, support, labels, kmax, out / "headline.png")
    outcome.write(out)  # lab/outcome.md: the outcome paragraph and table, from pairs.csv
    dose = dose_response.write(out, lab, knobs, kmax, labels, pair_share=plans.pair_share, **stats)
    markdown, console = render(
        LabSection(
            methods=methods,
            pairs=family,
            plan_pairs=plan_pairs,
            support=support,
            plans=plan_table,
            runs=run_frame,
            gaps=gaps,
            plan_types=plan_types,
            compared=[(a, b) for a, b in pairs if b != compare.REFERENCE_METHOD],
            strategy_rows=plans.strategies.to_dict("records"),
            branch=plans.branch,
            reference=reference,
            labels=labels,
            kmax=kmax,
            seeds=seeds,
            settings=branch_settings(Path(args.branch_config)),
            resamples=args.resamples,
            mix=mix_text(work / "data" / SPEC_FILE),
        )
    )
    markdown = markdown.rstrip("\n") + "\n" + "\n".join(dose) + "\n"  # the dose-response section
    if warning:  # loud: first in the console summary and at the top of report.md
        console = "".join(f"[demo] {line}\n" for line in warning) + console
    elif note:  # a smoke run, or a lab that reproduces its draw's references: one line
        console = f"[demo] {note}\n" + console
    atomic_write_text(out / "summary.txt", console)
    update_report(results / "report.md", markdown, warning, "" if warning else note)
    print(console, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
