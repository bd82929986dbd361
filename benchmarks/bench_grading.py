"""Grading throughput and the grading budget, on the bundled benchmarks.

Throughput (default): realistic MATH-500 completions (a long working-out, then the answer in the formats
and mistakes models make: ``<SOLUTION>``, ``\\boxed{}``, ``$...$``, prose, wrong values, no answer), a number
of samples per problem that repeat a handful of distinct completions with Zipf-like frequencies, as sampling
does. The corpus states how much it deduplicates (completions, distinct completions, distinct (answer, gold)
pairs). Side by side in one run, each as completions per second of wall time and per CPU second, and as a
ratio to the naive loop:

- naive: math-verify's parse + verify of every full completion, serially, as the official evaluator does
  (timed on a random subsample);
- grader without deduplication: every completion of a random subsample extracted and judged on its own,
  serially in this process with the budget armed (a pool worker's loop without its shared work; only each
  gold's parse is cached, as every sample of a problem shares its gold);
- grader with deduplication: the eval grader's pool (each distinct completion extracted once, each distinct
  (answer, gold) pair judged once, worker processes), per worker: completions / s / workers, and completions
  per CPU second of the parent and the workers together.

The CPU figures do not depend on the machine's load; the wall figures do. The pool's workers run at this
process's priority (``--worker-nice 0``), so that a worker and the naive loop compete for the cores alike; the
eval stage runs them ``gradepool.WORKER_NICE`` (10) above the process that starts them, to leave a sampling
engine its cores, which on a loaded machine lowers their wall throughput without changing their work
(``--worker-nice 10`` measures that).

Budget (``--budget``): the CPU time (grading thread, ``time.thread_time``) of every bundled math gold
against typical answers (the gold in another spelling, and wrong answers of the same shape), each gold met
for the first time in a warmed-up process (its parse is not cached: the worst case a worker sees), plus
the labelled cases of ``tests/fixtures/grading_cases.jsonl``. Prints the distribution per benchmark and
the ratio of the default budget to the largest cost; ``--cold`` adds fresh processes without warm-up.

    python benchmarks/bench_grading.py [--problems 100] [--per-problem 128] [--workers N] [--worker-nice K]
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
from sage_unsloth.eval.gradepool import WORKER_NICE, GradingPool
from sage_unsloth.grading import deadline

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


def _process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of another process so far, from /proc; None where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed_run(fn):
    """(result, wall seconds, CPU seconds of this process) of ``fn()``."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = fn()
    return result, time.perf_counter() - wall0, time.process_time() - cpu0


def _line(name: str, n: int, wall: float, cpu: float | None, base: tuple[float, float] | None, note: str):
    rate, cpu_rate = n / wall, (n / cpu if cpu else None)
    text = f"{name:34s} {rate:9.1f} /s wall"
    text += f" {cpu_rate:9.1f} /CPU-s" if cpu_rate else "       n/a /CPU-s"
    if base:
        text += f"   = {rate / base[0]:6.1f}x wall"
        text += f" {cpu_rate / base[1]:6.1f}x CPU" if cpu_rate else ""
    print(f"{text}   ({note})")
    return rate, cpu_rate


def throughput(args) -> None:
    items = corpus(args.problems, args.per_problem)
    distinct = {c for c, _ in items}
    extracted = {c: grading.extract_answer(c) for c in distinct}
    pairs = {(extracted[c], grading.normalise_gold(g)) for c, g in items if extracted[c]}
    print(
        f"corpus: {len(items)} MATH-500 completions ({args.problems} problems x {args.per_problem}), mean "
        f"{statistics.mean(len(c) for c, _ in items):.0f} characters; {len(distinct)} distinct completions, "
        f"{len(pairs)} distinct (answer, gold) pairs with an answer: deduplication leaves "
        f"{len(distinct) / len(items):.3f} of the extractions and {len(pairs) / len(items):.3f} of the judgements"
    )
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    sample = random.Random(1).sample(items, args.naive_sample)
    naive(sample[:5])  # warm math-verify's imports and grammar outside the timing
    _, naive_wall, naive_cpu = _timed_run(lambda: naive(sample))
    base = (len(sample) / naive_wall, len(sample) / naive_cpu)

    grading.warm_up()
    serial_sample = random.Random(2).sample(items, args.serial_sample)

    def one_by_one():
        with deadline.armed(grading.DEFAULT_TIMEOUT_S):  # as a pool worker holds the timers
            return [grading.grade(c, g) for c, g in serial_sample]

    serial, serial_wall, serial_cpu = _timed_run(one_by_one)

    with GradingPool(workers=args.workers, nice=args.worker_nice) as pool:
        pool.grade(corpus(args.problems, 16, seed=99))  # start and warm the workers outside the timing
        pool.stats = dict.fromkeys(pool.stats, 0)
        pids = [w.process.pid for w in pool._workers]
        before = [_process_cpu(pid) for pid in pids]
        grades, pool_wall, parent_cpu = _timed_run(lambda: pool.grade(items))
        after = [_process_cpu(pid) for pid in pids]
        stats = dict(pool.stats)
    workers_cpu = None if None in before + after else sum(a - b for a, b in zip(after, before))
    pool_cpu = None if workers_cpu is None else parent_cpu + workers_cpu
    index = {id(x): i for i, x in enumerate(items)}
    agree = sum(g == grades[index[id(x)]] for g, x in zip(serial, serial_sample)) / len(serial_sample)

    _line(
        "naive serial parse+verify", len(sample), naive_wall, naive_cpu, None, f"subsample of {len(sample)}"
    )
    _line(
        "grader, without deduplication",
        len(serial_sample),
        serial_wall,
        serial_cpu,
        base,
        f"subsample of {len(serial_sample)}, one by one in this process",
    )
    _line(
        "grader, with deduplication",
        len(items),
        pool_wall * args.workers,
        pool_cpu,
        base,
        f"pool of {args.workers} workers at nice +{pool.nice}, per worker: {len(items)} completions in "
        f"{pool_wall:.1f} s; {stats['unique_pairs']} distinct pairs, {stats['verified']} judged, "
        f"{stats['timeouts']} timeouts",
    )
    print(
        f"correct: {sum(g.correct for g in grades) / len(grades):.3f}; verdicts without and with deduplication "
        f"agree on {agree:.3f} of the subsample"
    )
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


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
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--per-problem", type=int, default=128)
    ap.add_argument("--naive-sample", type=int, default=150)
    ap.add_argument("--serial-sample", type=int, default=600)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument(
        "--worker-nice",
        type=int,
        default=0,
        help=f"the pool workers' niceness above this process (the eval stage's: {WORKER_NICE})",
    )
    ap.add_argument("--budget", action="store_true", help="measure the cost distribution behind the budget")
    ap.add_argument("--cold", type=int, default=0, help="with --budget: fresh processes to time cold")
    args = ap.parse_args()
    budget(args) if args.budget else throughput(args)


if __name__ == "__main__":
    sys.exit(main())
