"""Grading throughput and the grading budget, on the bundled benchmarks.

Throughput (default): realistic MATH-500 completions (a long working-out, then the answer in the formats
and mistakes models make: ``<SOLUTION>``, ``\\boxed{}``, ``$...$``, prose, wrong values, no answer), 256
samples per problem repeating a handful of distinct completions with Zipf-like frequencies, as sampling
does. Printed side by side in one run: the eval grader's pool (extract once, dedup (answer, gold), worker
processes) as completions/s in all and per worker, the same grader serially in this process, and a naive
serial loop (math-verify parse+verify of every full completion, as the official evaluator does; timed on a
random subsample and extrapolated, said so in the output).

Budget (``--budget``): the CPU time (grading thread, ``time.thread_time``) of every bundled math gold
against typical answers (the gold in another spelling, and wrong answers of the same shape), each gold met
for the first time in a warmed-up process (its parse is not cached: the worst case a worker sees), plus
the labelled cases of ``tests/fixtures/grading_cases.jsonl``. Prints the distribution per benchmark and
the ratio of the default budget to the largest cost; ``--cold`` adds fresh processes without warm-up.

    python benchmarks/bench_grading.py [--problems 500] [--per-problem 256] [--workers N]
    python benchmarks/bench_grading.py --budget [--cold 6]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sage_unsloth import grading
from sage_unsloth.eval.benchmarks import load_benchmark
from sage_unsloth.eval.gradepool import GradingPool

CASES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "grading_cases.jsonl"
THOUGHTS = (
    "Let me set up the problem. We have the given quantities and need the requested value. "
    "Substituting and simplifying step by step, we compute the intermediate results carefully. "
)


def completions_for(gold: str, golds: list[str], rng: random.Random) -> list[str]:
    """Distinct completions a model might sample for one problem: right in several spellings, wrong, none."""
    think = THOUGHTS * rng.randint(4, 12)
    return [
        f"<start_working_out>{think}<end_working_out><SOLUTION>{gold}</SOLUTION>",
        f"{think} So the answer is \\boxed{{{gold}}}.",
        f"<start_working_out>{think}<end_working_out><SOLUTION>${gold}$</SOLUTION>",
        f"<start_working_out>{think}<end_working_out><SOLUTION>The answer is ${gold}$.</SOLUTION>",
        f"<start_working_out>{think}<end_working_out><SOLUTION>{gold} + 1</SOLUTION>",
        f"<start_working_out>{think}<end_working_out><SOLUTION>2\\left({gold}\\right)</SOLUTION>",
        f"<start_working_out>{think}<end_working_out><SOLUTION>{rng.choice(golds)}</SOLUTION>",
        f"{think} The answer is \\boxed{{{rng.choice(golds)}}}",
        f"<start_working_out>{think * 2}",  # ran out of tokens: no answer
        f"<start_working_out>{think}<end_working_out><SOLUTION>{rng.randint(0, 999)}</SOLUTION>",
    ]


def corpus(problems: int, per_problem: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    math500 = load_benchmark("math500", limit=problems)
    golds = [p.gold for p in math500]
    items = []
    for p in math500:
        distinct = completions_for(p.gold, golds, rng)
        weights = [1 / (rank + 1) for rank in range(len(distinct))]
        rng.shuffle(weights)  # which kind dominates varies per problem
        items += [(c, p.gold) for c in rng.choices(distinct, weights, k=per_problem)]
    return items


def naive(items):
    from math_verify import parse, verify

    return [bool(verify(parse(f"\\boxed{{{g}}}"), parse(c))) for c, g in items]


def throughput(args) -> None:
    items = corpus(args.problems, args.per_problem)
    print(
        f"corpus: {len(items)} MATH-500 completions ({args.problems} problems x {args.per_problem}), "
        f"mean {statistics.mean(len(c) for c, _ in items):.0f} characters"
    )
    sample = random.Random(1).sample(items, args.naive_sample)
    naive(sample[:5])  # warm math-verify's imports and grammar outside the timing
    t0 = time.perf_counter()
    naive(sample)
    naive_rate = len(sample) / (time.perf_counter() - t0)

    grading.warm_up()
    serial_sample = random.Random(2).sample(items, args.serial_sample)
    t0 = time.perf_counter()
    serial = [grading.grade(c, g) for c, g in serial_sample]
    serial_rate = len(serial_sample) / (time.perf_counter() - t0)

    with GradingPool(workers=args.workers) as pool:
        pool.grade(items[:2000])  # start and warm the workers outside the timing
        pool.stats = dict.fromkeys(pool.stats, 0)
        t0 = time.perf_counter()
        grades = pool.grade(items)
        pool_s = time.perf_counter() - t0
        stats = dict(pool.stats)
    index = {id(x): i for i, x in enumerate(items)}
    agree = sum(g == grades[index[id(x)]] for g, x in zip(serial, serial_sample)) / len(serial_sample)
    pool_rate = len(items) / pool_s
    print(f"naive serial parse+verify : {naive_rate:9.1f} completions/s (subsample of {len(sample)})")
    print(f"grader, serial in-process : {serial_rate:9.1f} completions/s (subsample of {len(serial_sample)})")
    print(
        f"grader, pool of {args.workers} workers : {pool_rate:9.1f} completions/s = "
        f"{pool_rate / args.workers:.1f} per worker ({len(items)} completions in {pool_s:.1f} s; "
        f"{stats['unique_pairs']} unique (answer, gold) pairs, {stats['verified']} judged, "
        f"{stats['timeouts']} timeouts)"
    )
    print(
        f"correct: {sum(g.correct for g in grades) / len(grades):.3f}; serial and pool verdicts agree on "
        f"{agree:.3f} of the subsample"
    )
    print(
        f"RATIO pool / naive = {pool_rate / naive_rate:.1f}x; per worker / naive = "
        f"{pool_rate / args.workers / naive_rate:.1f}x"
    )


# ------------------------------------------------------------------------------------------------ budget
def _timed(answer: str, gold: str) -> tuple[float, str]:
    t0 = time.thread_time()
    status = grading.judge(answer, gold, timeout_s=grading.RETRY_TIMEOUT_S)
    return time.thread_time() - t0, status


def budget_costs(benchmark: str) -> dict:
    """Per (gold, answer): CPU seconds, in this process (warmed up; each gold met for the first time)."""
    grading.warm_up()
    costs = []
    for p in load_benchmark(benchmark):
        gold = p.gold
        for answer in (
            f"\\left({gold}\\right)",
            gold.replace(" ", ""),
            f"{gold} + 1",
            f"2\\left({gold}\\right)",
            f"\\frac{{{gold}}}{{3}}",
        ):
            costs.append(_timed(answer, gold)[0])
    if CASES.is_file():
        for case in map(json.loads, CASES.read_text().splitlines()):
            if case["benchmark"] == benchmark:
                answer = grading.extract_answer(case["completion"])
                problems = {q.problem_id: q for q in load_benchmark(benchmark)}
                costs.append(_timed(answer, problems[case["problem_id"]].gold)[0])
    return {"benchmark": benchmark, "costs": costs}


def _cold_cost(pair: tuple[str, str], warm: bool) -> float:
    code = (
        "import json,sys,time; from sage_unsloth import grading as g; a, b, w = json.loads(sys.argv[1]);"
        "w and g.warm_up(); t=time.thread_time(); g.judge(a, b, timeout_s=g.RETRY_TIMEOUT_S);"
        "print(time.thread_time()-t)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps([*pair, warm])], capture_output=True, text=True, check=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def budget(args) -> None:
    import concurrent.futures as cf
    import multiprocessing as mp

    names = ("aime24", "aime25", "amc23", "math500", "minerva")
    with cf.ProcessPoolExecutor(min(len(names), args.workers), mp_context=mp.get_context("forkserver")) as ex:
        results = list(ex.map(budget_costs, names))
    every = sorted(c for r in results for c in r["costs"])
    print(
        f"CPU seconds per (gold, answer) pair, grading thread, warmed-up process, each gold met first here "
        f"({len(every)} pairs):"
    )
    print(f"{'set':8s} {'pairs':>6s} {'p50':>8s} {'p90':>8s} {'p99':>8s} {'p99.9':>8s} {'max':>8s}")
    for r in results + [{"benchmark": "all", "costs": every}]:
        c = sorted(r["costs"])
        q = [c[min(len(c) - 1, int(f * len(c)))] for f in (0.5, 0.9, 0.99, 0.999)]
        print(f"{r['benchmark']:8s} {len(c):6d} " + " ".join(f"{v:8.4f}" for v in q) + f" {c[-1]:8.4f}")
    print(
        f"budget {grading.DEFAULT_TIMEOUT_S} s = {grading.DEFAULT_TIMEOUT_S / every[-1]:.1f}x the largest cost; "
        f"retry budget {grading.RETRY_TIMEOUT_S} s"
    )
    if args.cold:
        heavy = [
            (
                "\\frac{2\\pi c^2 R^2}{d^2 \\lambda^5 (e^{hc/(\\lambda k T)} - 1)}",
                "\\frac{2 \\pi c^{2} R^{2}}{\\lambda^{5}\\left[e^{h c /(\\lambda k T)}-1\\right] d^{2}}",
            ),
            ("\\cos(2t) + \\sin(2t)", "\\sqrt{2} \\cos (2 t-\\pi / 4)"),
            ("\\frac{a}{G M^{1/3} + b M^{-1/3}}", "\\frac{a M^{1 / 3}}{G M^{2 / 3}+b}"),
        ]
        for warm in (False, True):
            cold = [_cold_cost(heavy[i % len(heavy)], warm) for i in range(args.cold)]
            print(
                f"first pair in a fresh process, {'after' if warm else 'without'} warm-up: "
                f"max {max(cold):.3f} s, mean {statistics.mean(cold):.3f} s over {len(cold)} processes"
            )


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--per-problem", type=int, default=256)
    ap.add_argument("--naive-sample", type=int, default=300)
    ap.add_argument("--serial-sample", type=int, default=3000)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--budget", action="store_true", help="measure the cost distribution behind the budget")
    ap.add_argument("--cold", type=int, default=0, help="with --budget: fresh processes to time cold")
    args = ap.parse_args()
    budget(args) if args.budget else throughput(args)


if __name__ == "__main__":
    sys.exit(main())
