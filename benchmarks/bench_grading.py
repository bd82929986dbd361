"""Grading throughput: the eval grader (extract once, dedup (answer, gold), process pool) against a naive
serial loop (math-verify parse+verify of every full completion, as the official evaluator does), on a
realistic corpus: 600 problems (AIME24+25, AMC23, MATH-500) x 256 completions built from the bundled data.

Each problem's 256 samples repeat a handful of distinct completions with Zipf-like frequencies, as real
sampling does: correct answers in several formats (<SOLUTION>, \\boxed{}, $...$, with a trailing period),
wrong answers (gold + 1, other problems' golds), and answers missing. The naive loop is timed on a random
subsample and its per-item cost extrapolated to the full corpus (said so in the output).

    python benchmarks/bench_grading.py [--data-dir FOLDER] [--naive-sample 400] [--workers N]
"""

import argparse
import os
import random
import sys
import time
from pathlib import Path

from sage_unsloth.eval.benchmarks import load_benchmark
from sage_unsloth.eval.gradepool import GradingPool

THOUGHTS = ("Let me set up the problem. We have the given quantities and need the requested value. "
            "Substituting and simplifying step by step, we compute the intermediate results carefully. ")


def corpus(data_dir: Path | None, per_problem: int, seed: int = 0):
    rng = random.Random(seed)
    problems = [p for name in ("aime24", "aime25", "amc23", "math500") for p in load_benchmark(name, data_dir)]
    golds = [p.gold for p in problems]
    items = []
    for p in problems:
        g = p.gold
        distinct = [
            f"<start_working_out>{THOUGHTS * 3}<end_working_out><SOLUTION>{g}</SOLUTION>",
            f"{THOUGHTS * 4} So the answer is \\boxed{{{g}}}.",
            f"<start_working_out>{THOUGHTS * 2}<end_working_out><SOLUTION>${g}$</SOLUTION>",
            f"<start_working_out>{THOUGHTS}<end_working_out><SOLUTION>{g}.</SOLUTION>",
            f"<start_working_out>{THOUGHTS * 3}<end_working_out><SOLUTION>{g} + 1</SOLUTION>",
            f"<start_working_out>{THOUGHTS * 2}<end_working_out><SOLUTION>{rng.choice(golds)}</SOLUTION>",
            f"{THOUGHTS * 5} The answer is \\boxed{{{rng.choice(golds)}}}",
            f"<start_working_out>{THOUGHTS * 6}",  # ran out of tokens: no answer
            f"<start_working_out>{THOUGHTS}<end_working_out><SOLUTION>{rng.randint(0, 999)}</SOLUTION>",
            f"<start_working_out>{THOUGHTS}<end_working_out><SOLUTION>{rng.randint(0, 999)}</SOLUTION>",
        ]
        weights = [1 / (rank + 1) for rank in range(len(distinct))]
        rng.shuffle(weights)  # which kind dominates varies per problem
        items += [(c, g) for c in rng.choices(distinct, weights, k=per_problem)]
    return items


def naive(items):
    from math_verify import parse, verify

    return [bool(verify(parse(f"\\boxed{{{g}}}"), parse(c))) for c, g in items]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None, help="a local benchmark folder; default: the bundled files")
    ap.add_argument("--per-problem", type=int, default=256)
    ap.add_argument("--naive-sample", type=int, default=400)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    args = ap.parse_args()

    items = corpus(Path(args.data_dir) if args.data_dir else None, args.per_problem)
    print(f"corpus: {len(items)} completions ({len(items) // args.per_problem} problems x {args.per_problem})")

    sample = random.Random(1).sample(items, args.naive_sample)
    naive(sample[:5])  # warm math-verify's imports and grammar outside the timing
    t0 = time.perf_counter()
    naive_verdicts = naive(sample)
    naive_per_item = (time.perf_counter() - t0) / len(sample)
    naive_total = naive_per_item * len(items)
    print(f"naive serial parse+verify: {naive_per_item * 1e3:.2f} ms/completion measured on a random subsample "
          f"of {len(sample)}; extrapolated to {len(items)}: {naive_total:.0f} s")

    with GradingPool(workers=args.workers) as pool:
        pool.grade(items[:2000])  # start and warm the workers outside the timing
        pool.stats = dict.fromkeys(pool.stats, 0)
        t0 = time.perf_counter()
        verdicts = pool.grade(items)
        fast_total = time.perf_counter() - t0
        stats = dict(pool.stats)
    print(f"eval grader ({args.workers} workers): {fast_total:.1f} s for all {len(items)} "
          f"({stats['unique_pairs']} unique (answer, gold) pairs, {stats['verified']} sent to math-verify); "
          f"accuracy {sum(verdicts) / len(verdicts):.3f}")
    index = {id(x): i for i, x in enumerate(items)}
    agree = sum(naive_verdicts[j] == verdicts[index[id(x)]] for j, x in enumerate(sample)) / len(sample)
    print(f"agreement with the naive verdicts on the subsample: {agree:.3f}")
    print(f"RATIO speed-up = {naive_total / fast_total:.1f}x (target >= 20x)")


if __name__ == "__main__":
    sys.exit(main())
