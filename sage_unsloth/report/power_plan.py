"""How many seeds, samples and problems a comparison over training seeds needs:
``python -m sage_unsloth.report.power_plan``.

``--results R/demo-tiny --a A --b B --k 64 --out power_plan.csv`` reads the per-problem counts of
both methods' runs (paired by training seed; a seedless ``sft`` pairs with every seed), splits the variance of
the seed-level paired differences of pass@k into

- evaluation noise: the exact variance of the unbiased pass@k estimator from n samples (Chen et al., arXiv
  2107.03374) at each problem's plug-in solve rate (c + 0.5) / (n + 1), summed over problems / P^2, for both
  sides; it shrinks with n and with P;
- the rest, training-seed spread (what the seeds' policies differ by): it shrinks only with S;

and writes the minimum detectable effect (80% power, two-sided 0.05, t quantiles with S - 1 df) for a grid
of seeds S, samples n and problems P. docs/lab.md uses it to choose the confirmatory lab's n, P and S.

``--labs R/draw0,R/draw1,... --pairs a:b,c:d --out plan.csv`` plans a multi-draw lab (:func:`draw_plan`): per
pair, the seed-level differences' variance pooled within the draws (each draw a fixed level, as
intervals.stratified treats it) with its chi-square 95% interval, split into evaluation noise and training-seed
spread at each k, and projected to other (k, n) with n = 4k: the MDE of the pooled difference at S seeds per
draw, at the point sd and at the sd's upper 95% bound, and the evaluation's share of the variance; beside them
the sd as observed at the runs' own n (no projection: the conservative figure when the projection clips the
seed spread at 0) with its upper bound and MDE. Every MDE is the exact one (sage_unsloth.report.power).
"""

from __future__ import annotations

import argparse
from math import comb
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from ..runtime.manifest import atomic_write_text
from .compare import load_run_counts, paired_runs, split_run
from .power import design_mde, mde  # the tables' MDE is this planner's

PLAN_GRID = ((64, 256), (32, 128), (16, 64))  # (k, n) with n = 4k, the lab's rule
PLAN_SEEDS = range(2, 21)  # seeds per draw


def draw_plan(labs: list[Path], pairs: list[tuple[str, str]], *, dataset: str = "demo") -> list[dict]:
    """Per pair and (k, n) of PLAN_GRID and seeds per draw S: the projected MDE of the pooled paired difference
    (see the module doc). The observed k must be <= the runs' n; the projection keeps the training-seed
    spread measured at k and swaps the evaluation noise at the runs' n for the one at the projected n."""
    rows = []
    loaded = [load_run_counts(Path(lab), dataset) for lab in labs]
    for a, b in pairs:
        for k, n in PLAN_GRID:
            within, df, noise_observed, noise_projected = 0.0, 0, [], []
            for lab in loaded:
                runs = paired_runs(lab, a, b)
                diffs = [float((lab.passk(x, [k])[:, 0] - lab.passk(y, [k])[:, 0]).mean()) for x, y in runs]
                within += float(np.var(diffs, ddof=1)) * (len(diffs) - 1)
                df += len(diffs) - 1
                for x, y in runs:
                    noise_observed.append(
                        sum(eval_variance_of_mean(lab.n[r], lab.c[r], int(lab.n[r][0]), k) for r in (x, y))
                    )
                    noise_projected.append(
                        sum(eval_variance_of_mean(lab.n[r], lab.c[r], n, k) for r in (x, y))
                    )
            total = within / df
            seed = max(total - float(np.mean(noise_observed)), 0.0)
            projected = seed + float(np.mean(noise_projected))
            upper = projected * df / stats.chi2.ppf(0.025, df)  # the variance's upper 95% bound
            lower = projected * df / stats.chi2.ppf(0.975, df)
            observed_upper = total * df / stats.chi2.ppf(0.025, df)
            d = len(loaded)
            for per_draw in PLAN_SEEDS:
                pairs_total = d * per_draw
                rows.append(
                    {
                        "a": a, "b": b, "k": k, "n": n, "seeds_per_draw": per_draw, "draws": d, "df_measured": df,
                        "sd": np.sqrt(projected), "sd_low": np.sqrt(lower), "sd_high": np.sqrt(upper),
                        "eval_share": float(np.mean(noise_projected)) / projected if projected > 0 else np.nan,
                        "mde": design_mde(np.sqrt(projected), pairs_total, d),
                        "mde_at_sd_high": design_mde(np.sqrt(upper), pairs_total, d),
                        "n_observed": int(loaded[0].n[paired_runs(loaded[0], a, b)[0][0]][0]),
                        "sd_observed": np.sqrt(total), "sd_observed_high": np.sqrt(observed_upper),
                        "mde_at_sd_observed_high": design_mde(np.sqrt(observed_upper), pairs_total, d),
                    }
                )  # fmt: skip
    return rows


def estimator_variance(p: float, n: int, k: int) -> float:
    """Exact variance of 1 - C(n - c, k) / C(n, k) over c ~ Binomial(n, p)."""
    cs = np.arange(n + 1)
    pmf = stats.binom.pmf(cs, n, p)
    values = np.array([1.0 - comb(n - c, k) / comb(n, k) for c in cs])
    mean = float((pmf * values).sum())
    return float((pmf * (values - mean) ** 2).sum())


def eval_variance_of_mean(n: np.ndarray, c: np.ndarray, samples: int, k: int) -> float:
    rates = (c + 0.5) / (n + 1.0)
    return float(sum(estimator_variance(p, samples, k) for p in rates)) / len(rates) ** 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m sage_unsloth.report.power_plan",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--results", help="<results>/<model>: the folder of <run>/per_problem.csv")
    parser.add_argument(
        "--labs", help="a multi-draw lab: the draws' <results>/<model> folders, comma-separated"
    )
    parser.add_argument("--pairs", help="with --labs: a:b,c:d (method names)")
    parser.add_argument("--a")
    parser.add_argument("--b")
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--dataset", default="demo")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.labs:
        pairs = [tuple(item.split(":")) for item in (args.pairs or "").split(",") if item]
        rows = draw_plan([Path(p) for p in args.labs.split(",") if p], pairs, dataset=args.dataset)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, pd.DataFrame(rows).to_csv(index=False))
        print(f"wrote {out}: {len(rows)} rows")
        return 0
    if not (args.results and args.a and args.b):
        parser.error("give --results, --a and --b (one lab), or --labs and --pairs (a multi-draw lab)")
    lab = load_run_counts(Path(args.results), args.dataset)
    pairs = paired_runs(lab, args.a, args.b)  # (run of A, run of B) by training seed
    if len(pairs) < 2:
        raise SystemExit(
            f"error: --a {args.a}: needs runs at two training seeds or more under {args.results}"
        )
    seeds = [split_run(a)[1] for a, _ in pairs]

    diffs, noise = [], []
    for a, b in pairs:
        diffs.append(float((lab.passk(a, [args.k])[:, 0] - lab.passk(b, [args.k])[:, 0]).mean()))
        noise.append(sum(eval_variance_of_mean(lab.n[r], lab.c[r], int(lab.n[r][0]), args.k) for r in (a, b)))
    diffs = np.array(diffs)
    total, eval_noise = float(diffs.var(ddof=1)), float(np.mean(noise))
    seed_spread = max(total - eval_noise, 0.0)
    problems = len(lab.problems)
    rows = ["seeds,samples,problems,se,mde,seed_variance,eval_variance"]
    for samples in (64, 128, 256):
        e_n = float(
            np.mean(
                [
                    sum(eval_variance_of_mean(lab.n[r], lab.c[r], samples, args.k) for r in pair)
                    for pair in pairs
                ]
            )
        )
        for p in (100, 200, 400):
            for s in (3, 5, 10, 20):
                var = seed_spread + e_n * problems / p
                se = float(np.sqrt(var / s))
                rows.append(
                    f"{s},{samples},{p},{se:.5f},{mde(se, s - 1):.4f},{seed_spread:.3e},{e_n * problems / p:.3e}"
                )
    header = (
        f"# {args.a} - {args.b}, pass@{args.k}, from training seeds {seeds} at n = {int(lab.n[pairs[0][0]][0])}, "
        f"P = {problems}: seed-level differences {np.round(diffs, 4).tolist()}, variance {total:.3e} = evaluation "
        f"noise {eval_noise:.3e} + training-seed spread {seed_spread:.3e}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, header + "\n" + "\n".join(rows) + "\n")
    print(header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
