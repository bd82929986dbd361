"""Stage 4's multi-seed mode: where a model's runs hold two or more training seeds of a method
(``<method>_seed<N>``), the report compares the methods as the demo lab does, with the lab's own code
(sage_unsloth/report/compare.py, intervals in sage_unsloth/report/intervals.py):

- ``multi_seed_methods.csv``: per model, dataset, method and k, pass@k (the mean over seeds and problems) with
  the t-interval over the seed-level means (a method with one run: the problem bootstrap);
- ``multi_seed_pairs.csv``: per method pair at pass@1 and pass@kmax, the paired difference A - B (runs paired by
  seed; a seedless B pairs with every seed of A) with its t-interval, t-test p, Holm-adjusted p over the pairs of
  that model and dataset, the MDE and the seeds that would detect the paper's +0.015;
- ``multi_seed_support.csv``: support against the reference method (``sft``), paired by seed, at every k.

kmax is the fewest samples per problem / 4 (n >= 4k, as in the lab); the ks are the powers of two up to it. A
dataset with fewer than 4 samples per problem has no such k and is left out of the mode (the report goes on).
The pairs: ``--pairs`` entries that name methods (``grpo_branch:grpo``), else every method against ``sft`` and
the paper's method pairs (GRPO + Branch - GRPO, ...) by the run-name mapping, each where the runs pair by seed
(a seedless B pairs with every seed of A, the lab's rule; a seedless A against B's seeds is left out).
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from sage_unsloth.report import compare, formatting, intervals
from sage_unsloth.report.loading import RunResults
from sage_unsloth.report.paper import DEFAULT_METHOD_PAIRS, map_run
from sage_unsloth.report.tables import md_table, parse_pairs

TABLES = ("multi_seed_methods", "multi_seed_pairs", "multi_seed_support")


def lab_runs(runs: list[RunResults], dataset: str) -> compare.RunCounts | None:
    """One model's runs with per-problem rows on ``dataset`` as the lab's RunCounts (None: no such run)."""
    frames = {}
    for run in runs:
        if run.per_problem is not None:
            rows = run.per_problem[run.per_problem["dataset"] == dataset]
            if not rows.empty:
                frames[run.run] = rows.set_index("problem_id")
    return compare.aligned_runs(frames) if frames else None


def method_pairs(lab: compare.RunCounts, spec: str | None, model: str, mapping=None) -> list[tuple[str, str]]:
    """The method pairs to compare (module doc)."""
    methods = list(lab.methods)
    asked = [(a, b) for a, b in parse_pairs(spec) if a in methods and b in methods]
    if asked:
        return [(a, b) for a, b in asked if _pairable(lab, a, b)]
    reference = compare.REFERENCE_METHOD
    pairs = [(m, reference) for m in methods if reference in methods and m != reference]
    paper = {m: map_run(model, m, mapping).method for m in methods}
    for paper_a, paper_b in DEFAULT_METHOD_PAIRS:
        pairs += [
            (a, b)
            for a in methods
            for b in methods
            if paper[a] == paper_a and paper[b] == paper_b and (a, b) not in pairs
        ]
    return [(a, b) for a, b in pairs if _pairable(lab, a, b)]  # e.g. not a seedless run against seeds


def _pairable(lab: compare.RunCounts, a: str, b: str) -> bool:
    try:
        return bool(compare.paired_runs(lab, a, b))
    except ValueError:
        return False


def multi_seed_tables(
    runs: list[RunResults], spec: str | None, settings, mapping=None
) -> dict[str, pd.DataFrame]:
    """The mode's tables (module doc), keyed by TABLES; empty when no model has a method with two seeds."""
    stats = dataclasses.asdict(settings)
    found: dict[str, list[pd.DataFrame]] = {name: [] for name in TABLES}
    for model in sorted({r.model for r in runs}):
        mine = [r for r in runs if r.model == model]
        datasets = sorted({d for r in mine if r.per_problem is not None for d in r.per_problem["dataset"]})
        for dataset in datasets:
            lab = lab_runs(mine, dataset)
            if lab is None or max(len(v) for v in lab.methods.values()) < 2:
                continue
            n_min = int(min(n.min() for n in lab.n.values()))
            if n_min < 4:  # pass@k over seeds needs n >= 4k (compare.lab_ks): a tiny sweep's n = 2 has no k
                continue
            kmax, ks = compare.lab_ks(n_min)
            pairs = compare.pair_table(
                lab, method_pairs(lab, spec, model, mapping), sorted({1, kmax}), **stats
            )
            if not pairs.empty:
                pairs["p_holm"] = intervals.holm(pairs["p"].to_numpy())
            tables = (compare.method_table(lab, ks, **stats), pairs, compare.support_table(lab, ks, **stats))
            for name, frame in zip(TABLES, tables):
                if not frame.empty:
                    found[name].append(pd.concat([pd.DataFrame({"model": model, "dataset": dataset},
                                                               index=frame.index), frame], axis=1))  # fmt: skip
    return {name: pd.concat(frames, ignore_index=True) for name, frames in found.items() if frames}


def markdown_section(tables: dict[str, pd.DataFrame], folder: str) -> str:
    """The report's "Across training seeds" section (empty when the mode found no method with two seeds)."""
    if not tables:
        return ""
    methods = tables["multi_seed_methods"]
    top = methods.groupby(["model", "dataset"])["k"].transform("max")
    rows = [
        [r["model"], r["dataset"], r["method"], int(r["seeds"]), int(r["k"]), formatting.number(r["pass_at_k"]),
         formatting.interval(r["ci_low"], r["ci_high"]), r["interval"]]
        for _, r in methods[(methods["k"] == 1) | (methods["k"] == top)].iterrows()
    ]  # fmt: skip
    parts = [
        "## Across training seeds (multi-seed mode)",
        (
            "Methods with runs `<method>_seed<N>`: the mean over seeds and problems with the t-interval over the "
            "seed-level means (sage_unsloth/report/multi_seed.py; every k in "
            f"`{folder}/multi_seed_methods.csv`, support against SFT in `{folder}/multi_seed_support.csv`)."
        ),
        md_table(["model", "dataset", "method", "seeds", "k", "pass@k", "95% CI", "interval"], rows),
    ]
    pairs = tables.get("multi_seed_pairs")
    if pairs is not None:
        rows = [
            [r["model"], r["dataset"], r["a"], r["b"], int(r["k"]), formatting.number(r["diff"], signed=True, empty=""),
             formatting.interval(r["ci_low"], r["ci_high"]), f"{r['p']:.3g}", f"{r['p_holm']:.3g}", formatting.number(r["mde"])]
            for _, r in pairs.iterrows()
        ]  # fmt: skip
        header = ["model", "dataset", "A", "B", "k", "A − B", "95% CI", "p", "p (Holm)", "MDE"]
        parts += ["Paired by seed (A − B):", md_table(header, rows)]
    return "\n\n".join(parts) + "\n"
