"""The lab's comparison of methods across training seeds and problems.

Runs are the eval stage's ``results/<model>/<method>_seed<s>/per_problem.csv``. SFT (every RL run starts
from its adapter) is evaluated once per training seed, ``sft_seed<s>``, with that seed's sampling seed, so
a seed-level paired difference has its own evaluation noise; result folders written before have one
seedless ``sft`` run, which pairs with every seed (:func:`paired_runs`). Per run and problem the value is the unbiased pass@k (or a strategy share); a
method's score is the mean over its seeds and the problems.

Intervals: sage_unsloth.report.intervals (``ci`` below): a t-interval with S - 1 degrees of freedom over the
seed-level means (for a paired A - B: the seed-level paired differences), a problem bootstrap with one seed;
the ``interval`` column of every table names which. Paired differences A - B pair the runs by seed (the
same training seed, hence the same initial rollouts, and the same evaluation seed); against a seedless
``sft`` every seed of A is paired with it (its evaluation noise is then shared by every seed and is not in
the interval: the ``interval`` column says ``t(seed), B shared``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..runtime.layout import run_name, split_run  # noqa: F401 - the lab's run names, read here and by its callers
from ..runtime.results import pass_at_k_matrix
from . import intervals
from .support import SHARES, per_problem_shares

REFERENCE_METHOD = "sft"


@dataclass
class RunCounts:
    """Per-problem (n, c) of every run, aligned on one problem order."""

    problems: list[str]
    n: dict[str, np.ndarray]
    c: dict[str, np.ndarray]

    @property
    def methods(self) -> dict[str, list[str]]:
        """method -> its runs, in seed order."""
        out: dict[str, list[str]] = {}
        for run in sorted(self.n, key=lambda r: (split_run(r)[0], split_run(r)[1] or 0)):
            out.setdefault(split_run(run)[0], []).append(run)
        return out

    def passk(self, run: str, ks) -> np.ndarray:
        return pass_at_k_matrix(self.n[run], self.c[run], ks)


def load_run_counts(model_results: Path, dataset: str) -> RunCounts:
    """Every ``<model_results>/<run>/per_problem.csv``; refuses runs that graded different problems."""
    frames = {}
    for path in sorted(Path(model_results).glob("*/per_problem.csv")):
        frame = pd.read_csv(path, dtype={"problem_id": str})
        frame = frame[frame["dataset"] == dataset]
        if frame.empty:
            raise ValueError(f"{path}: no rows for dataset {dataset!r}; the eval step wrote nothing for it")
        frames[path.parent.name] = frame.set_index("problem_id")
    if not frames:
        raise FileNotFoundError(f"no <run>/per_problem.csv under {model_results}: run the eval steps first")
    return aligned_runs(frames)


def aligned_runs(frames: dict[str, pd.DataFrame]) -> RunCounts:
    """RunCounts of per-problem frames (run -> rows indexed by problem_id, with n and c) on the first run's problem
    order; runs that graded other problems are refused."""
    problems = list(next(iter(frames.values())).index)
    for run, frame in frames.items():
        if sorted(frame.index) != sorted(problems):
            raise ValueError(f"run {run} graded other problems than {next(iter(frames))}; rerun with --fresh")
    return RunCounts(
        problems,
        {r: f.loc[problems, "n"].to_numpy() for r, f in frames.items()},
        {r: f.loc[problems, "c"].to_numpy() for r, f in frames.items()},
    )


def lab_ks(n_min: int, kmax: int | None = None) -> tuple[int, list[int]]:
    """(kmax, the ks reported: powers of two up to kmax, and kmax): kmax defaults to the fewest samples per
    problem / 4, and needs n >= 4 kmax."""
    kmax = kmax or max(1, n_min // 4)
    if n_min < 4 * kmax:
        raise ValueError(
            f"--kmax {kmax} needs >= {4 * kmax} samples per problem (n >= 4k), the runs have {n_min}"
        )
    return kmax, [k for k in (2**i for i in range(32)) if k <= kmax] + ([kmax] if kmax & (kmax - 1) else [])


SHARE = (0.0, 1.0)  # the range of a pass@k or a share of problems or completions
DIFFERENCE = (-1.0, 1.0)


def ci(
    values: np.ndarray, *, resamples: int, seed: int, level: float, stream: str = "", bounds=None
) -> tuple[float, float, float]:
    """(mean, low, high) of ``values`` (seeds, problems): the lab's interval (intervals.estimate). ``stream``
    is unused (the lab's earlier bootstrap drew a stream per statistic)."""
    return intervals.estimate(values, resamples=resamples, seed=seed, level=level, bounds=bounds).triple()


def _stack(lab: RunCounts, runs: list[str], fn) -> np.ndarray:
    return np.stack([fn(run) for run in runs])


def paired_runs(lab: RunCounts, method_a: str, method_b: str) -> list[tuple[str, str]]:
    """(run of A, run of B) pairs by training seed. B's runs are either one per seed (``sft_seed<s>``: SFT
    evaluated with seed s's sampling seed, or an RL method) or one seedless run (``sft`` in result folders
    written before SFT was evaluated per seed), which pairs with every seed of A."""
    runs_a, runs_b = lab.methods[method_a], lab.methods[method_b]
    if len(runs_b) == 1 and split_run(runs_b[0])[1] is None:
        return [(a, runs_b[0]) for a in runs_a]
    by_seed = {split_run(r)[1]: r for r in runs_b}
    if sorted(by_seed) != sorted(split_run(a)[1] for a in runs_a):
        raise ValueError(f"{method_a} vs {method_b}: the runs do not share seeds ({runs_a} / {runs_b})")
    return [(a, by_seed[split_run(a)[1]]) for a in runs_a]


def paired_values(lab: RunCounts, method_a: str, method_b: str, fn) -> np.ndarray:
    """(seeds, problems) of fn(run_a) - fn(run_b), runs paired by seed (:func:`paired_runs`)."""
    return np.stack([fn(a) - fn(b) for a, b in paired_runs(lab, method_a, method_b)])


# ------------------------------------------------------------------------------------------ tables
def method_table(lab: RunCounts, ks: list[int], *, resamples: int, seed: int, level: float) -> pd.DataFrame:
    """Per method and k: pass@k with the lab's interval (t over seeds; one seed: problem bootstrap), seeds, problems."""
    rows = []
    for method, runs in lab.methods.items():
        values = _stack(lab, runs, lambda r: lab.passk(r, ks))  # (S, N, K)
        for j, k in enumerate(ks):
            est = intervals.estimate(
                values[:, :, j], resamples=resamples, seed=seed, level=level, bounds=SHARE
            )
            rows.append(
                {
                    "method": method,
                    "k": k,
                    "pass_at_k": est.mean,
                    "ci_low": est.low,
                    "ci_high": est.high,
                    "interval": est.interval,
                    "seeds": len(runs),
                    "problems": len(lab.problems),
                }
            )
    return pd.DataFrame(rows)


def pair_table(
    lab: RunCounts, pairs: list[tuple[str, str]], ks: list[int], *, resamples: int, seed: int, level: float
) -> pd.DataFrame:
    rows = []
    for a, b in pairs:
        if a not in lab.methods or b not in lab.methods:
            continue
        for k in ks:
            diff = paired_values(lab, a, b, lambda r, k=k: lab.passk(r, [k])[:, 0])
            rows.append(
                paired_row(
                    a,
                    b,
                    diff,
                    {"k": k},
                    resamples=resamples,
                    seed=seed,
                    level=level,
                    stream=f"{a}-{b}",
                    shared_b=shares_b(lab, a, b),
                )
            )
    return pd.DataFrame(rows)


def shares_b(lab: RunCounts, method_a: str, method_b: str) -> bool:
    """True when every seed of A pairs with one seedless run of B (a result folder from before SFT was
    evaluated per seed): B's evaluation noise is then common to every seed-level difference."""
    pairs = paired_runs(lab, method_a, method_b)
    return len(pairs) > 1 and len({b for _, b in pairs}) == 1


def interval_label(estimate: intervals.Estimate, shared_b: bool) -> str:
    return f"{estimate.interval}, B shared" if shared_b and estimate.seeds > 1 else estimate.interval


def power_cells(estimate: intervals.Estimate) -> dict:
    """The power columns of a comparison row: its MDE and the seeds that would detect the paper's effect."""
    return {"mde": estimate.mde, f"seeds_for_{intervals.PAPER_EFFECT:g}": estimate.seeds_for_effect}


def paired_row(
    a: str, b: str, diff: np.ndarray, labels: dict, *, stream: str, shared_b: bool = False, **stats
) -> dict:
    """One row of a paired A - B table: the labels, the mean difference and its interval over the
    (seeds, problems) array ``diff`` (intervals.estimate), whether it excludes 0 and the paper's effect, the
    t-test's p, the MDE and the seeds that would detect the paper's effect, and the array's size."""
    est = intervals.estimate(diff, bounds=DIFFERENCE, **stats)
    return {
        "a": a,
        "b": b,
        **labels,
        "diff": est.mean,
        "ci_low": est.low,
        "ci_high": est.high,
        "excludes_0": bool(est.low > 0 or est.high < 0),
        "excludes_paper": bool(est.high < intervals.PAPER_EFFECT),
        "interval": interval_label(est, shared_b),
        "sd_seed": est.sd,
        "p": est.p,
        **power_cells(est),
        "seeds": diff.shape[0],
        "problems": diff.shape[1],
    }


def support_method_table(lab: RunCounts, k: int, *, resamples: int, seed: int, level: float) -> pd.DataFrame:
    """Per method: support shares at k against the SFT model (report/support.py), across seeds and problems."""
    if REFERENCE_METHOD not in lab.methods:
        return pd.DataFrame()
    rows = []
    for method, runs in lab.methods.items():
        if method == REFERENCE_METHOD:
            continue
        pairs = paired_runs(lab, method, REFERENCE_METHOD)  # each run against its seed's SFT evaluation
        shares = np.stack(
            [per_problem_shares(lab.passk(ref, [k])[:, 0], lab.passk(r, [k])[:, 0]) for r, ref in pairs]
        )  # (S, N, Q)
        row = {"method": method, "k": k, "seeds": len(runs)}
        for j, name in enumerate(SHARES):
            bounds = DIFFERENCE if name == "net" else SHARE
            est = intervals.estimate(
                shares[:, :, j], resamples=resamples, seed=seed, level=level, bounds=bounds
            )
            row.update({name: est.mean, f"{name}_ci_low": est.low, f"{name}_ci_high": est.high})
            if name == "net":  # the comparison with SFT: its test and power
                net = est
        row.update(
            interval=interval_label(net, shares_b(lab, method, REFERENCE_METHOD)),
            net_p=net.p,
            **power_cells(net),
        )
        rows.append(row)
    return pd.DataFrame(rows)


def support_table(lab: RunCounts, ks: list[int], **stats) -> pd.DataFrame:
    """Support against SFT (preserved / shrunk / expanded / net) per method at every k of ``ks``."""
    frames = [support_method_table(lab, k, **stats) for k in ks]
    return (
        pd.concat([f for f in frames if not f.empty], ignore_index=True)
        if any(not f.empty for f in frames)
        else pd.DataFrame()
    )


def strategy_method_table(
    per_problem_shares_by_run: dict[str, np.ndarray],
    labels: list[str],
    *,
    resamples: int,
    seed: int,
    level: float,
) -> pd.DataFrame:
    """Per method and strategy: share of completions (mean over seeds and problems) with its CI.

    ``per_problem_shares_by_run[run]`` is (problems, labels): each problem's share of completions per label.
    """
    methods: dict[str, list[str]] = {}
    for run in sorted(per_problem_shares_by_run, key=lambda r: (split_run(r)[0], split_run(r)[1] or 0)):
        methods.setdefault(split_run(run)[0], []).append(run)
    rows = []
    for method, runs in methods.items():
        values = np.stack([per_problem_shares_by_run[r] for r in runs])  # (S, N, L)
        for j, label in enumerate(labels):
            mean, low, high = ci(values[:, :, j], resamples=resamples, seed=seed, level=level, bounds=SHARE)
            rows.append(
                {
                    "method": method,
                    "strategy": label,
                    "share": mean,
                    "ci_low": low,
                    "ci_high": high,
                    "seeds": len(runs),
                }
            )
    return pd.DataFrame(rows)
