"""How many seeds, samples and problems a lab comparison needs: ``python -m sage_unsloth.demo.power_plan``.

``--results R/demo-tiny --a grpo_branch --b grpo --k 64 --out power_plan.csv`` reads the per-problem counts of
both methods' runs (paired by training seed; a seedless ``sft`` pairs with every seed), splits the variance of
the seed-level paired differences of pass@k into

- evaluation noise: the exact variance of the unbiased pass@k estimator from n samples (Chen et al., arXiv
  2107.03374) at each problem's plug-in solve rate (c + 0.5) / (n + 1), summed over problems / P^2, for both
  sides; it shrinks with n and with P;
- the rest, training-seed spread (what the seeds' policies differ by): it shrinks only with S;

and writes the minimum detectable effect (80% power, two-sided 0.05, t quantiles with S - 1 df) for a grid
of seeds S, samples n and problems P. docs/lab.md uses it to choose the confirmatory lab's n, P and S.
"""

from __future__ import annotations

import argparse
from math import comb
from pathlib import Path

import numpy as np
from scipy import stats

from ..manifest import atomic_write_text
from .compare import load_lab_runs, paired_runs, split_run
from .intervals import mde  # the lab tables' MDE is this planner's


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
        prog="python -m sage_unsloth.demo.power_plan",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--results", required=True, help="<results>/<model>: the folder of <run>/per_problem.csv"
    )
    parser.add_argument("--a", required=True)
    parser.add_argument("--b", required=True)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--dataset", default="demo")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    lab = load_lab_runs(Path(args.results), args.dataset)
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
                    f"{s},{samples},{p},{se:.5f},{mde(se, s):.4f},{seed_spread:.3e},{e_n * problems / p:.3e}"
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
