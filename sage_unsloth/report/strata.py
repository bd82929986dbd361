"""Seed-level values grouped in strata (pre-training draws): per group and per paired comparison, per stratum and
pooled, with intervals, tests, power and the robust secondary (the statistics of a multi-draw lab; the frontier
step, sage_unsloth/demo/frontier.py, says which groups and pairs a lab has and which family each row is in).

Input: one row per (stratum, seed) per group, with the value columns. Estimates:

- per stratum: the mean of the seed-level values with Student's t over the seeds (intervals.stratified with one
  stratum);
- pooled: the mean over the strata of the stratum means, each stratum a fixed level (the estimand is
  conditional on these strata), by intervals.stratified: Welch-Satterthwaite's t, or with ``blocked`` the
  draw-blocked t with the pooled within-stratum df N - D;
- paired rows (A - B, runs paired by stratum and seed) add the sd, the exact-power MDE (report/power.py) and the
  seeds per stratum that reach the paper's effect (and ``mde_shortcut``, the t-quantile
  shortcut the kit used before, at the same df, to state the change), how many differences are positive and negative, Shapiro-Wilk's
  p of all the differences (the pooled row) (how far the t's normality is from them), and from 6 differences on the
  Hodges-Lehmann estimate with its exact interval and the exact signed-rank p (intervals.hodges_lehmann); and a
  pooled row without the pairs a mask excludes (the collapse sensitivity analysis).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from . import intervals, power

POOLED = "pooled"
EXCLUDED = "pooled, collapsed pairs dropped"  # the pooled row without the excluded pairs (sensitivity)
ROBUST_MIN = 6  # the fewest differences with a 95% Hodges-Lehmann interval


def _groups(frame: pd.DataFrame, column: str, stratum: str) -> list[np.ndarray]:
    return [g[column].to_numpy(dtype=float) for _, g in frame.groupby(stratum, sort=True)]


def _cells(name: str, est: intervals.Estimate) -> dict:
    return {name: est.mean, f"{name}_ci_low": est.low, f"{name}_ci_high": est.high}


def level_cells(part: pd.DataFrame, columns, *, stratum: str = "draw", blocked: bool = False) -> dict:
    """Per value column: its mean over the strata's means with the interval (no interval with one seed in a
    stratum or a missing value)."""
    cells = {}
    for column in dict.fromkeys(columns):
        groups = _groups(part, column, stratum)
        if min(len(g) for g in groups) >= 2 and part[column].notna().all():
            cells.update(_cells(column, intervals.stratified(groups, blocked=blocked)))
        else:
            cells.update({column: float(part[column].mean()), f"{column}_ci_low": math.nan,
                          f"{column}_ci_high": math.nan})  # fmt: skip
    return cells


def scopes(frame: pd.DataFrame, stratum: str = "draw"):
    """(scope, rows): each stratum's rows (scope: the stratum as text), then every row (scope: POOLED)."""
    return [*((str(s), g) for s, g in frame.groupby(stratum, sort=True)), (POOLED, frame)]


def difference_row(part: pd.DataFrame, *, stratum: str = "draw", blocked: bool = False, pooled: bool) -> dict:
    """The paired difference ``part['d']`` (one row per stratum and seed): estimate, interval, p, sd, MDE, seeds
    for the paper's effect, signs, and (pooled) Shapiro-Wilk and the Hodges-Lehmann secondary."""
    est = intervals.stratified(_groups(part, "d", stratum), blocked=blocked)
    d = part["d"].to_numpy(dtype=float)
    row = {
        "pairs": len(part), "diff": est.mean, "ci_low": est.low, "ci_high": est.high, "interval": est.interval,
        "sd_seed": est.sd, "p": est.p, "mde": est.mde,
        "mde_shortcut": power.approximate_mde(est.se, est.seeds - len(set(part[stratum]))),
        f"seeds_per_draw_for_{intervals.PAPER_EFFECT:g}":
        est.seeds_for_effect, "positive_pairs": int((d > 0).sum()), "negative_pairs": int((d < 0).sum()),
    }  # fmt: skip
    if pooled and len(d) >= 3:
        row["shapiro_p"] = float(stats.shapiro(d).pvalue)
    if len(d) >= ROBUST_MIN:
        hl = intervals.hodges_lehmann(d)
        row.update(hl=hl.estimate, hl_ci_low=hl.low, hl_ci_high=hl.high, hl_p=hl.p, hl_level=hl.level)
    return row


def paired_differences(
    a: pd.Series,
    b: pd.Series,
    *,
    kept: np.ndarray | None = None,
    stratum: str = "draw",
    blocked: bool = False,
) -> list[tuple[str, dict]]:
    """A - B for two series indexed by (stratum, seed), on their common index: (scope, row) per stratum, pooled,
    and pooled without the pairs ``kept`` (a mask over the common index) drops; scopes with a stratum of fewer
    than two pairs are left out."""
    common = a.index.intersection(b.index).sort_values()
    diff = (a.loc[common] - b.loc[common]).rename("d").reset_index()
    kept = np.ones(len(diff), dtype=bool) if kept is None else np.asarray(kept, dtype=bool)
    out = []
    for scope, part in [*scopes(diff, stratum), (EXCLUDED, diff[kept])]:
        if part.empty or min(len(g) for g in _groups(part, "d", stratum)) < 2:
            continue
        out.append((scope, difference_row(part, stratum=stratum, blocked=blocked, pooled=scope == POOLED)))
    return out
