"""What per-problem seeding costs stage 3 at n = 256 on vLLM's CPU engine, beside the alternatives, in one run.

    .venv-eval/bin/python benchmarks/bench_vllm_seeding.py                      # the tiny random model
    .venv-eval/bin/python benchmarks/bench_vllm_seeding.py --checkpoint outputs/demo/demo-tiny/sft --n 256

Schemes, each a way to hand one chunk of problems to ``LLM.generate``:

``per_problem``  (the kit's) one request per problem, ``SamplingParams(n=256, seed=problem_seed)``: vLLM gives each
                 of the 256 samples its own generator (seed + index) and its sampler draws for those one by one.
``per_sample``   256 requests per problem, ``n=1`` each, seeded (problem_seed + index): the same draws, as requests.
``unseeded``     one request per problem, ``n=256``, no seed: the engine's own generator, drawn for the whole batch
                 at once. Not resumable exactly: what a chunk gets depends on what the engine sampled before it.

Exactness is measured too: each scheme samples chunk B after chunk A, then again after chunk C, in the same
engine; a scheme keeps resume exact when B's samples are the same both times (a resumed run samples B after
another history than the uninterrupted one). Each round runs every scheme (chunks A and B timed), each scheme
first in turn, so that all see the same load; the script prints completions per second and the CPU seconds of all
the processes (vLLM's engine and worker included) of each, per round, and the medians over rounds of each scheme's
wall time and CPU time relative to ``unseeded`` in the same round. The CPU ratio is the one to quote on a busy
machine: other jobs stretch wall time, not CPU seconds.
The tiny random model never stops early (every sample has max_tokens tokens) and its forward is cheap: the
sampler's share of the time, and so the cost of seeding, is as large here as it gets; on a 7B on a GPU the
forward dominates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SCHEMES = ("per_problem", "per_sample", "unseeded")


def params_for(scheme: str, seeds: list[int], cfg):
    """(prompt index per request, SamplingParams per request) of one chunk under ``scheme``."""
    from vllm import SamplingParams

    def params(n, seed):
        return SamplingParams(
            n=n,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=cfg.max_tokens,
            seed=seed,
            ignore_eos=True,
        )

    if scheme == "per_problem":
        return list(range(len(seeds))), [params(cfg.n, s) for s in seeds]
    if scheme == "per_sample":
        return [i for i in range(len(seeds)) for _ in range(cfg.n)], [
            params(1, s + j) for s in seeds for j in range(cfg.n)
        ]
    return list(range(len(seeds))), [params(cfg.n, None) for _ in seeds]


def cpu_seconds() -> float:
    """User + system seconds of this process and every process below it (vLLM's engine and worker processes):
    unlike wall time, hardly moved by other jobs on the machine."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def generate(llm, scheme: str, prompts, seeds, cfg) -> tuple[list[tuple[int, ...]], float, float]:
    """Token ids of every sample, grouped by problem in sample order, and the wall and CPU seconds of the call."""
    which, params = params_for(scheme, seeds, cfg)
    t0, c0 = time.perf_counter(), cpu_seconds()
    outs = llm.generate([{"prompt_token_ids": prompts[i]} for i in which], params, use_tqdm=False)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return [tuple(c.token_ids) for o in outs for c in o.outputs], wall, cpu


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--checkpoint", help="stage output or model folder (default: the tiny random model)")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--problems", type=int, default=2, help="problems per chunk (chunks A, B, C)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()

    from sage_unsloth.eval.benchmarks import load_benchmark
    from sage_unsloth.eval.config import EvalConfig
    from sage_unsloth.eval.sampling import (
        VLLMSampler,
        load_tokenizer,
        problem_seed,
        render_prompts,
        resolve_checkpoint,
    )

    with tempfile.TemporaryDirectory(prefix="bench-seeding-") as tmp:
        model = args.checkpoint
        if not model:
            from sage_unsloth.model.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        checkpoint = resolve_checkpoint(model)
        cfg = EvalConfig(
            checkpoints=[model],
            n=args.n,
            max_tokens=args.max_tokens,
            temperature=1.0,
            top_p=1.0,
            max_model_len=1024,
            backend="vllm",
            dtype="float32",
            gpu_memory_utilization=0.2,
            enforce_eager=True,
        )
        problems = load_benchmark("math500", None, 3 * args.problems)
        tokenizer = load_tokenizer(checkpoint)
        chunks = {}
        for k, name in enumerate("ABC"):
            part = problems[k * args.problems : (k + 1) * args.problems]
            seeds = [problem_seed(cfg.seed, p.dataset, p.problem_id) for p in part]
            chunks[name] = (render_prompts(tokenizer, part, cfg.user_template), seeds)
        t0 = time.perf_counter()
        llm = VLLMSampler(
            checkpoint, replace(cfg)
        ).llm  # the kit's engine arguments (chunked prefill off on CPU)
        print(
            f"job: chunks of {args.problems} problems x n {args.n}, {args.max_tokens} tokens each, {checkpoint.spec}; "
            f"engine start {time.perf_counter() - t0:.0f} s (not counted); load {load()}",
            flush=True,
        )
        generate(llm, "unseeded", *chunks["C"], cfg)  # warm-up
        figures: dict = {"job": vars(args) | {"model": checkpoint.spec}, "rounds": []}
        exact = {}
        for r in range(args.rounds):
            row = {}
            for scheme in SCHEMES[r % 3 :] + SCHEMES[: r % 3]:  # each scheme goes first in turn
                _, wall_a, cpu_a = generate(llm, scheme, *chunks["A"], cfg)
                first, wall_b, cpu_b = generate(llm, scheme, *chunks["B"], cfg)
                generate(llm, scheme, *chunks["C"], cfg)
                again, _, _ = generate(llm, scheme, *chunks["B"], cfg)
                samples = 2 * args.problems * args.n
                row[scheme] = {
                    "per_s": round(samples / (wall_a + wall_b), 1),
                    "cpu_s": round(cpu_a + cpu_b, 2),
                }
                exact[scheme] = exact.get(scheme, True) and first == again
            row["load"] = load()
            figures["rounds"].append(row)
            shown = ", ".join(f"{s} {row[s]['per_s']}/s ({row[s]['cpu_s']} CPU s)" for s in SCHEMES)
            print(f"round {r}: {shown}; load {row['load']}", flush=True)
        rounds = figures["rounds"]
        for scheme in SCHEMES:
            wall = [row["unseeded"]["per_s"] / row[scheme]["per_s"] for row in rounds]
            cpu = [row[scheme]["cpu_s"] / row["unseeded"]["cpu_s"] for row in rounds]
            figures[scheme] = {
                "per_s_median": statistics.median(row[scheme]["per_s"] for row in rounds),
                "wall_vs_unseeded": round(statistics.median(wall), 2),
                "cpu_vs_unseeded": round(statistics.median(cpu), 2),
                "resume_exact": exact[scheme],
            }
            print(f"{scheme}: {figures[scheme]}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
