"""Does this run reproduce the committed reference? Fingerprints and the lab's regime, loudly when not.

A lab's numbers are conditional on its pre-training + SFT draw: the base model and the SFT adapter every RL
run starts from. On 2026-12-02 a change of arithmetic (MKL_CBWR=AUTO,STRICT) gave the pre-training other
weights, and a fresh clone's default demo then ran in another regime (SFT pass@1 0.731 against the
reference's 0.604, GRPO's rare-plan share 0.26 against 0.028) without a word (issue 39). So every lab now

- records the sha256 of its base (``<work>/model/demo-tiny/model.safetensors``) and its SFT adapter
  (``<work>/demo-tiny/sft/adapter_model.safetensors``) in its manifest (``demo_budget.json``, ``fingerprints``)
  and in ``lab/regime.csv`` (:func:`fingerprints`);
- measures its **regime** per run (:func:`regime_rows`): SFT's pass@1 on all problems and on the gap
  problems (where the common plan meets the base's missing addition), and GRPO's share of completions off the
  common plan (the minority-plan share, ``minority_share``) and on the pair plans;
- compares every run with its draw's references (:func:`compare`: the committed labs made from the same draw,
  results/demo-reference and results/demo-frontier/draw<D>; the runner finds them, run.draw_references) by
  method, not by run name, so a lab at any seeds is checked: each regime metric of each run against the mean
  of the references' runs of that method, within the tolerance of :data:`TOLERANCE` (GRPO's plan shares for
  every GRPO arm a reference ran, at any beta), and writes ``lab/reproduction.csv``, where a method no
  reference ran says so; a metric beyond its tolerance, or a base that is not the reference's, is a loud
  warning (:func:`warning_lines`) at the top of the console summary and of report.md, and a lab that
  reproduces says so in one line (:func:`agreement_line`). A smoke run (--quick) is compared with nothing
  and says what it is.

Same CPU type, library versions and code: every difference is exactly 0 (the kit is deterministic there).
Another CPU type runs other arithmetic in SFT, RL and evaluation (MKL's AUTO code path depends on the
instruction set), so the adapters' sha256 differ and a run's numbers move like another seed's would; the
tolerances are set well outside that seed-to-seed spread (measured in results/demo-confirm/, 10 seeds: SFT
pass@1 sd 0.002 across evaluation seeds, GRPO's minority-plan share sd 0.004), so a warning means another regime,
not noise.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..config.method_cards import role_holder
from ..runtime import layout
from .strategies import PAIR_PLANS

MODEL_NAME = "demo-tiny"
BASE_WEIGHTS = "model.safetensors"
SFT_WEIGHTS = "adapter_model.safetensors"
REGIME_FILE = "regime.csv"
REPRODUCTION_FILE = "reproduction.csv"
NO_REFERENCE = "no reference run"
COLUMNS = [
    "run",
    "method",
    "metric",
    "this_run",
    "reference",
    "reference_runs",
    "diff",
    "tolerance",
    "status",
]
GRPO = role_holder("control").name  # whose plan shares define the regime (the lab's GRPO at beta 0.05)
# metric -> largest difference from the reference that still reads as the same regime (see the module doc)
TOLERANCE = {
    "sft_pass_at_1": 0.03,
    "sft_gap_pass_at_1": 0.05,
    "grpo_minority_share": 0.05,
    "grpo_pair_share": 0.03,
}


def _sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def fingerprints(work: Path) -> dict[str, str | None]:
    """sha256 of the base model's weights and of the SFT adapter's weights of a demo work folder."""
    work = Path(work)
    return {
        "base": _sha(work / "model" / MODEL_NAME / BASE_WEIGHTS),
        "sft": _sha(layout.sft_dir(work, MODEL_NAME) / SFT_WEIGHTS),
    }


def regime_rows(
    runs: list[str],
    method_of,
    pass1: dict[str, np.ndarray],
    gap: np.ndarray,
    minority_share: dict[str, float],
    pair_share: dict[str, float],
    unguided=lambda run: False,
) -> list[dict]:
    """Per run, the regime metrics: SFT runs' pass@1 on all and on the gap problems (``gap``: a mask over the
    problems); every GRPO run's (the control's, and any run ``unguided`` says trains without a guide: GRPO at
    another beta) minority-plan and pair-plan shares (``pass1[run]``: per-problem pass@1)."""
    rows = []
    for run in runs:
        method = method_of(run)
        if method == "sft":
            values = {"sft_pass_at_1": float(pass1[run].mean())}
            if gap.any():
                values["sft_gap_pass_at_1"] = float(pass1[run][gap].mean())
        elif method == GRPO or unguided(run):
            values = {"grpo_minority_share": minority_share[run], "grpo_pair_share": pair_share[run]}
        else:
            continue
        rows += [{"run": run, "method": method, "metric": m, "value": v} for m, v in values.items()]
    return rows


def reference_regime(reference: Path) -> pd.DataFrame:
    """The reference's regime rows (run, method, metric, value): its lab/regime.csv, or for a reference from
    before it, what its tables hold of the same four metrics (:func:`_regime_from_tables`)."""
    path = Path(reference) / "lab" / REGIME_FILE
    if path.is_file():  # a lab written before the minority plans had their name called the metric rare
        frame = pd.read_csv(path).replace({"metric": {"grpo_rare_share": "grpo_minority_share"}})
    else:
        frame = pd.DataFrame(_regime_from_tables(Path(reference) / "lab"), columns=["run", "metric", "value"])
    if "method" not in frame.columns:  # written before regime.csv named the method: read it from the run
        frame.insert(1, "method", [layout.split_run(run)[0] for run in frame["run"]])
    arms = pd.DataFrame(_unguided_rows(Path(reference)), columns=["run", "method", "metric", "value"])
    known = set(zip(frame["run"], frame["metric"]))
    arms = arms[[(r, m) not in known for r, m in zip(arms["run"], arms["metric"])]]
    return pd.concat([frame, arms], ignore_index=True) if not arms.empty else frame


def _unguided_rows(reference: Path) -> list[dict]:
    """GRPO's plan shares for every unguided run of a reference's runs.csv (a regime.csv written before it recorded
    every GRPO arm holds the control's only)."""
    if not (Path(reference) / "lab" / "runs.csv").is_file():
        return []
    runs = reference_runs(reference)
    if "guide" not in runs.columns or "pair_share" not in runs.columns:
        return []
    guide = runs["guide"].fillna("").astype(str)
    rows = []
    for _, r in runs[guide.isin(["", "none", "nan"]) & (runs["method"] != "sft")].iterrows():
        for metric, column in (("grpo_minority_share", "minority_share"), ("grpo_pair_share", "pair_share")):
            rows.append({"run": r["run"], "method": r["method"], "metric": metric, "value": r[column]})
    return rows


def _regime_from_tables(lab: Path) -> list[dict]:
    """A lab from before regime.csv: SFT's pass@1 and GRPO's minority share per run (runs.csv), SFT's pass@1 on the
    gap problems (gap.csv) and GRPO's pair-plan share (plans.csv: pairs + outer), per method (run = method)."""
    rows = []
    for _, r in (reference_runs(lab.parent) if (lab / "runs.csv").is_file() else pd.DataFrame()).iterrows():
        if r["method"] == "sft":
            rows.append({"run": r["run"], "metric": "sft_pass_at_1", "value": r["pass_at_1"]})
        elif r["method"] == GRPO:
            rows.append({"run": r["run"], "metric": "grpo_minority_share", "value": r["minority_share"]})
    if (lab / "gap.csv").is_file():
        gap = pd.read_csv(lab / "gap.csv")
        for _, r in gap[(gap["method"] == "sft") & (gap["problems"] == "gap")].iterrows():
            rows.append({"run": "sft", "metric": "sft_gap_pass_at_1", "value": r["pass_at_1"]})
    if (lab / "plans.csv").is_file():
        plans = pd.read_csv(lab / "plans.csv")
        pairs = plans[(plans["method"] == GRPO) & plans["strategy"].isin(PAIR_PLANS)]
        if not pairs.empty:
            rows.append({"run": GRPO, "metric": "grpo_pair_share", "value": float(pairs["share"].sum())})
    return rows


def reference_fingerprints(reference: Path) -> dict:
    manifest = Path(reference) / "demo_budget.json"
    if not manifest.is_file():
        return {}
    return json.loads(manifest.read_text()).get("fingerprints") or {}


def reference_runs(reference: Path) -> pd.DataFrame:
    """The reference's lab/runs.csv, its minority-plan share by today's name (a lab written before the minority
    plans had their name called that column rare_share)."""
    return pd.read_csv(Path(reference) / "lab" / "runs.csv").rename(columns={"rare_share": "minority_share"})


def compare(ours: pd.DataFrame, mine: dict, references: list[Path]) -> pd.DataFrame:
    """``lab/reproduction.csv``: every run of this lab against its draw's references (``references``: the committed
    labs made from the same draw), by method, not by run name: the fingerprints (same or not, against every
    reference that recorded them), then each regime metric of each run beside the mean of the references' runs of
    the same method, with the difference, the tolerance and a status: identical, within tolerance, BEYOND
    TOLERANCE, or no reference run (no reference ran that method: nothing to compare, said so)."""
    references = [Path(r) for r in ([references] if isinstance(references, (str, Path)) else references)]
    if "method" not in ours.columns:
        ours = ours.assign(method=[layout.split_run(run)[0] for run in ours["run"]])
    theirs = pd.concat([reference_regime(r) for r in references], ignore_index=True) if references else None
    rows = []
    for what in ("base", "sft"):
        a = mine.get(what)
        recorded = [p[what] for p in map(reference_fingerprints, references) if p.get(what)]
        status = (
            "not recorded" if not (a and recorded) else ("identical" if set(recorded) == {a} else "DIFFERENT")
        )
        rows.append(
            {"run": "", "method": "", "metric": f"{what}_sha256", "this_run": a or "",
             "reference": ",".join(dict.fromkeys(recorded)), "reference_runs": len(recorded), "diff": math.nan,
             "tolerance": math.nan, "status": status}
        )  # fmt: skip
    for _, r in ours.iterrows():
        hit = (
            theirs[(theirs["method"] == r["method"]) & (theirs["metric"] == r["metric"])]
            if theirs is not None
            else pd.DataFrame()
        )
        tol = TOLERANCE[r["metric"]]
        if hit.empty:
            rows.append(
                {"run": r["run"], "method": r["method"], "metric": r["metric"], "this_run": f"{r['value']:.4f}",
                 "reference": "", "reference_runs": 0, "diff": math.nan, "tolerance": tol,
                 "status": NO_REFERENCE}
            )  # fmt: skip
            continue
        value = float(hit["value"].mean())
        diff = float(r["value"]) - value
        status = (
            "identical" if diff == 0 else ("within tolerance" if abs(diff) <= tol else "BEYOND TOLERANCE")
        )
        rows.append(
            {"run": r["run"], "method": r["method"], "metric": r["metric"], "this_run": f"{r['value']:.4f}",
             "reference": f"{value:.4f}", "reference_runs": len(hit), "diff": diff, "tolerance": tol,
             "status": status}
        )  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def agreement_line(table: pd.DataFrame, names: list[str]) -> str:
    """The one console line of a lab that reproduces its draw's references (empty when it does not)."""
    if table is None or table.empty or warning_lines(table, ", ".join(names)):
        return ""
    checked = table[table["status"].isin(["identical", "within tolerance"]) & (table["run"] != "")]
    if checked.empty:
        return ""
    identical = int((checked["status"] == "identical").sum())
    prints = table[table["metric"].str.endswith("_sha256")]
    same = (
        "base and SFT adapter identical"
        if set(prints["status"]) == {"identical"}
        else "fingerprints not recorded"
    )
    missing = int((table["status"] == NO_REFERENCE).sum())
    return (
        f"reproduces its draw's reference ({', '.join(names)}): {same}; {len(checked)} regime checks of "
        f"{checked['run'].nunique()} runs within tolerance ({identical} identical)"
        + (f"; {missing} with no reference run of their method" if missing else "")
    )


def warning_lines(table: pd.DataFrame, reference_name: str) -> list[str]:
    """The loud warning (empty when the run reproduces the reference's regime): what differs and what it means."""
    beyond = table[table["status"] == "BEYOND TOLERANCE"]
    base = table[table["metric"] == "base_sha256"]["status"]
    base_differs = not base.empty and base.iloc[0] == "DIFFERENT"
    if beyond.empty and not base_differs:
        return []
    lines = [f"WARNING: this run does NOT reproduce the reference ({reference_name})."]
    if base_differs:
        lines.append(
            "  Its pre-trained base is not the reference's (sha256 differs): another draw, or a fresh pre-training "
            "on other arithmetic (--pretrain). Every number below is conditional on that other base."
        )
    for _, r in beyond.iterrows():
        lines.append(
            f"  {r['run']} {r['metric']}: {r['this_run']} here, {r['reference']} in the reference "
            f"(difference {r['diff']:+.3f}, tolerance {r['tolerance']:.2f})."
        )
    if not beyond.empty:
        lines.append(
            "  The lab's regime differs: read the reference's claims as not reproduced here (docs/lab.md, "
            "'Reproducing the lab'); lab/reproduction.csv has every figure."
        )
    return lines


def banner(lines: list[str]) -> list[str]:
    """The warning framed so that it cannot be missed in a console log."""
    if not lines:
        return []
    rule = "!" * 100
    return [rule, *lines, rule]
