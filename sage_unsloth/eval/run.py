"""Stage 3: ``python -m sage_unsloth.eval CONFIG [--key value ...]``.

For every checkpoint: sample ``n`` completions per problem, grade them, write
``results/<model>/<run>/{per_problem.csv, passk.csv, manifest.json}`` and the completions as gzip JSONL
under ``outputs/<model>/eval/<run>/``.

Resume. Problems are cut into fixed chunks (``problems_per_batch`` in file order). A chunk is sampled in
one engine call with per-problem seeds and written atomically with its grades; a rerun skips chunks
already on disk. Since chunk contents and seeds never depend on what ran before, a run killed mid-way
and rerun produces the same CSVs as an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sage_unsloth import grading
from sage_unsloth.eval.benchmarks import (
    DEFAULT_BENCHMARKS,
    Problem,
    check_benchmark_names,
    check_source,
    load_benchmark,
    register_local_benchmarks,
)
from sage_unsloth.eval.passk import check_ks, default_ks
from sage_unsloth.eval.records import (
    build_records,
    chunk_path,
    read_chunk,
    status_counts,
    stored_gold,
    summary,
    write_chunk,
    write_tables,
)
from sage_unsloth.eval.shard import chunk_keys, parse_shard, select_shard
from sage_unsloth.manifest import atomic_write_text, write_manifest
from sage_unsloth.prompts import EVAL_USER_TEMPLATE, SOLUTION_END

logger = logging.getLogger(__name__)
FAIL_AFTER_ENV = "SAGE_EVAL_FAIL_AFTER_CHUNKS"  # test hook: die after writing this many chunks


@dataclass
class EvalConfig:
    checkpoints: list[str] = field(default_factory=list, metadata={
        "help": "hub ids, model folders, or stage output folders (outputs/<model>/sft, outputs/<model>/<variant>)"})
    benchmarks: list[str] = field(default_factory=lambda: list(DEFAULT_BENCHMARKS), metadata={
        "help": f"any of {list(DEFAULT_BENCHMARKS)} or kk_logicrl / kk_official (kk = the variant of the source)"})
    n: int = field(default=256, metadata={"help": "samples per problem"})
    ks: list[int] = field(default_factory=list, metadata={"help": "pass@k values; empty = 1, 2, 4, ..., n"})
    # The official evaluator used 0.3 / 0.95; pass@k at large k is usually measured hotter. 0.6 / 0.95 is
    # the common choice for pass@k curves (DeepSeek-R1, simpleRL); the paper's setting is unknown.
    temperature: float = 0.6
    top_p: float = 0.95
    min_p: float = 0.0
    max_tokens: int = field(default=3072, metadata={"help": "new tokens per sample (Qwen2.5-Math has 4096 context)"})
    max_model_len: int = 4096
    stop: list[str] = field(default_factory=lambda: [SOLUTION_END])
    user_template: str = field(default=EVAL_USER_TEMPLATE, metadata={"help": "user turn; {problem} is replaced"})
    backend: str = field(default="vllm", metadata={"help": "vllm | hf"})
    seed: int = 0
    source: str = field(default="bundled", metadata={
        "help": "benchmark rows: 'bundled' (the kit's checked files, offline), 'local' (data_dir), 'hub'"})
    data_dir: str | None = field(default=None, metadata={
        "help": "folder with benchmark JSONL files named like the bundled ones (implies source=local)"})
    local_benchmarks: list[str] = field(default_factory=list, metadata={
        "help": "extra benchmarks as name=path.jsonl (MATH-500 layout: problem, answer); list them in benchmarks"})
    results_dir: str = "results"
    outputs_dir: str = "outputs"
    run_name: str | None = field(default=None, metadata={"help": "results/<model>/<run_name> (one checkpoint)"})
    limit: int | None = field(default=None, metadata={"help": "max problems per benchmark (smoke runs)"})
    problems_per_batch: int = field(default=64, metadata={"help": "problems per engine call = resume unit"})
    shard: str | None = field(default=None, metadata={
        "help": "i/N: sample only every N-th chunk (one process per GPU); CSVs come once all chunks exist"})
    grading_workers: int | None = None
    grading_timeout_s: float = field(default=grading.DEFAULT_TIMEOUT_S, metadata={
        "help": "CPU seconds per (answer, gold) pair; a pair over it is retried at the end of the run"})
    grading_retry_timeout_s: float = field(default=grading.RETRY_TIMEOUT_S, metadata={
        "help": "CPU seconds per pair in the end-of-run retry; pairs over it are counted as unresolved"})
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    enforce_eager: bool = False
    trust_remote_code: bool = False


# ------------------------------------------------------------------------------------------------ config
def parse_args(argv: list[str]) -> EvalConfig:
    from sage_unsloth.config_args import parse_stage_args

    (cfg,), _ = parse_stage_args((EvalConfig,), argv, stage="eval", configs_dir="configs/eval/")
    return cfg


def validate(cfg: EvalConfig) -> list[int]:
    """Every config error as one clear line, before any model or dataset loads. Returns the k list."""
    if not cfg.checkpoints:
        raise ValueError("`checkpoints` is empty: list hub ids or stage output folders to evaluate")
    register_local_benchmarks(cfg.local_benchmarks)
    check_benchmark_names(cfg.benchmarks)
    check_source(cfg.source, cfg.data_dir)
    if cfg.n < 1:
        raise ValueError(f"n={cfg.n}: need at least one sample per problem")
    if cfg.backend not in ("vllm", "hf"):
        raise ValueError(f"backend={cfg.backend!r}: choose 'vllm' or 'hf'")
    if cfg.run_name and len(cfg.checkpoints) > 1:
        raise ValueError("run_name names one checkpoint's results; drop it or evaluate one checkpoint")
    if cfg.problems_per_batch < 1:
        raise ValueError("problems_per_batch must be >= 1")
    if "{problem}" not in cfg.user_template:
        raise ValueError("user_template must contain {problem}")
    if not (0 < cfg.grading_timeout_s <= cfg.grading_retry_timeout_s):
        raise ValueError(f"grading_timeout_s={cfg.grading_timeout_s}, grading_retry_timeout_s="
                         f"{cfg.grading_retry_timeout_s}: need 0 < grading_timeout_s <= grading_retry_timeout_s")
    parse_shard(cfg.shard)
    return check_ks(cfg.ks, cfg.n) if cfg.ks else default_ks(cfg.n)


def sampling_fingerprint(cfg: EvalConfig, checkpoint) -> dict:
    """What determines the completions; resumed chunks must have been sampled with the same."""
    return {"checkpoint": checkpoint.spec, "base_model": checkpoint.base_model, "adapter": checkpoint.adapter_dir,
            "backend": cfg.backend, "n": cfg.n, "temperature": cfg.temperature, "top_p": cfg.top_p,
            "min_p": cfg.min_p, "max_tokens": cfg.max_tokens, "stop": list(cfg.stop), "seed": cfg.seed,
            "user_template": cfg.user_template, "problems_per_batch": cfg.problems_per_batch}


# ------------------------------------------------------------------------------------------------ one checkpoint
def _progress(total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="problem", dynamic_ncols=True, disable=None)


def _grading_items(problems: list[Problem], samples) -> list[tuple[str, object]]:
    items = []
    for problem, group in zip(problems, samples):
        gold = (problem.kk_solution, problem.kk_names) if problem.is_kk else problem.gold
        items.extend((s.text, gold) for s in group)
    return items


def evaluate_checkpoint(cfg: EvalConfig, checkpoint, problem_sets: dict[str, list[Problem]], ks: list[int],
                        sampler=None) -> Path:
    """Sample, grade and write one checkpoint's results; returns results/<model>/<run>.

    Chunks already on disk are reused; those graded by another grader version are graded again from their
    saved completions (no resampling). Completions whose grading ran out of budget are retried serially with
    the larger budget once every chunk is written; what stays unresolved is counted in the manifest."""
    from sage_unsloth.eval.gradepool import GradingPool
    from sage_unsloth.eval.regrade import regrade_records, settle_timeouts
    from sage_unsloth.eval.sampling import load_tokenizer, make_sampler, problem_seed, render_prompts

    results = Path(cfg.results_dir) / checkpoint.model / checkpoint.run
    completions = Path(cfg.outputs_dir) / checkpoint.model / "eval" / checkpoint.run
    fingerprint = sampling_fingerprint(cfg, checkpoint)
    fp_path = completions / "sampling.json"
    if fp_path.is_file() and json.loads(fp_path.read_text()) != fingerprint:
        raise ValueError(f"{completions} holds completions sampled with other settings (see {fp_path}); "
                         "set run_name to a new name or delete that folder")
    atomic_write_text(fp_path, json.dumps(fingerprint, indent=2, sort_keys=True) + "\n")
    grader = grading.grader_fingerprint()

    timings = {"generate_s": 0.0, "total_s": 0.0}
    started = time.perf_counter()
    fail_after = int(os.environ.get(FAIL_AFTER_ENV, "0") or 0)
    pool = GradingPool(cfg.grading_workers, timeout_s=cfg.grading_timeout_s)
    summaries: dict[tuple[str, int], list[dict]] = {}
    with_timeouts: set[Path] = set()  # chunks to retry at the end
    pending: list[tuple[str, int, list[Problem]]] = []
    regraded = 0
    try:
        for name, problems in problem_sets.items():
            step = cfg.problems_per_batch
            for index in range((len(problems) + step - 1) // step):
                chunk = problems[index * step:(index + 1) * step]
                path = chunk_path(completions, name, index)
                records = read_chunk(path, [p.problem_id for p in chunk])
                if records is None:
                    pending.append((name, index, chunk))
                    continue
                if any(r.get("grader") != grader or "gold" not in r for r in records):
                    records = [{**r, "gold": stored_gold(p)} for r, p in zip(records, chunk)]
                    records, _ = regrade_records(records, pool, cfg.grading_retry_timeout_s)
                    write_chunk(path, records)
                    regraded += 1
                if status_counts(records)[grading.TIMEOUT]:
                    with_timeouts.add(path)
                summaries[(name, index)] = [summary(r) for r in records]
        keys = chunk_keys(problem_sets, cfg.problems_per_batch)
        pending = select_shard(pending, keys, cfg.shard)  # all of them unless --shard i/N
        n_done = sum(len(v) for v in summaries.values())
        logger.info("%s/%s: %d problems already graded (%d chunks regraded), %d chunks to sample",
                    checkpoint.model, checkpoint.run, n_done, regraded, len(pending))

        if pending:
            tokenizer = load_tokenizer(checkpoint, cfg.trust_remote_code)
            sampler = sampler or make_sampler(checkpoint, cfg)
            bar = _progress(sum(len(p) for p in problem_sets.values()), f"{checkpoint.model}/{checkpoint.run}")
            bar.update(n_done)
            in_flight = None  # grading of the previous chunk overlaps the next generate call
            written = 0

            def finish(job):
                nonlocal written
                (name, index, chunk, seeds, samples), future = job
                records = build_records(chunk, seeds, samples, future.result(), grader)
                path = chunk_path(completions, name, index)
                write_chunk(path, records)
                if status_counts(records)[grading.TIMEOUT]:
                    with_timeouts.add(path)
                summaries[(name, index)] = [summary(r) for r in records]
                bar.update(len(chunk))
                written += 1
                if fail_after and written >= fail_after:
                    raise RuntimeError(f"{FAIL_AFTER_ENV}={fail_after}: injected failure")

            for name, index, chunk in pending:
                seeds = [problem_seed(cfg.seed, p.dataset, p.problem_id) for p in chunk]
                prompts = render_prompts(tokenizer, chunk, cfg.user_template)
                t0 = time.perf_counter()
                samples = sampler.generate(prompts, seeds)
                timings["generate_s"] += time.perf_counter() - t0
                job = ((name, index, chunk, seeds, samples), pool.submit(_grading_items(chunk, samples)))
                if in_flight is not None:
                    finish(in_flight)
                in_flight = job
            if in_flight is not None:
                finish(in_flight)
            bar.close()
    finally:
        pool.close()

    retried = unresolved = 0
    for path in sorted(with_timeouts):  # the end-of-run retry: serial, larger budget
        records, n = settle_timeouts(read_chunk(path), cfg.grading_retry_timeout_s)
        retried += n
        write_chunk(path, records)
        name, index = path.parent.name, int(path.name.split("_")[1].split(".")[0])
        summaries[(name, index)] = [summary(r) for r in records]
        unresolved += status_counts(records)[grading.TIMEOUT]
    timings["total_s"] = time.perf_counter() - started
    if len(summaries) < len(keys):  # a shard: the other shards' chunks are not all written yet
        logger.info("shard %s done: %d of %d chunks on disk; the CSVs are written once all are (run without "
                    "--shard to merge)", cfg.shard, len(summaries), len(keys))
        return results

    per_problem = [row for name in problem_sets for index in sorted(i for (n, i) in summaries if n == name)
                   for row in summaries[(name, index)]]
    write_tables(results, per_problem, ks)
    grading_stats = {**pool.stats, "grader": grader, "budget_s": cfg.grading_timeout_s,
                     "retry_budget_s": cfg.grading_retry_timeout_s, "retried": retried, "unresolved": unresolved,
                     "regraded_chunks": regraded}
    write_manifest(results, stage="eval", config=asdict(cfg), seed=cfg.seed, checkpoint=checkpoint.spec,
                   base_model=checkpoint.base_model, adapter=checkpoint.adapter_dir, model_short_name=checkpoint.model,
                   run=checkpoint.run, sampling=fingerprint, ks=ks, completions_dir=str(completions),
                   problem_seed="sha256(f'{seed}\\x1f{dataset}\\x1f{problem_id}')[:4] little-endian & 0x7fffffff",
                   datasets=list(problem_sets), problems={name: len(p) for name, p in problem_sets.items()},
                   grading=grading_stats, timings={k: round(v, 3) for k, v in timings.items()})
    return results


# ------------------------------------------------------------------------------------------------ entry point
def prepare(cfg: EvalConfig):
    """Validate the config, resolve checkpoints and load benchmarks: every failure before any model loads."""
    from sage_unsloth.eval.sampling import resolve_checkpoint

    ks = validate(cfg)
    checkpoints = [resolve_checkpoint(spec, cfg.run_name) for spec in cfg.checkpoints]
    problem_sets: dict[str, list[Problem]] = {}  # keyed by the dataset results are written under
    for name in cfg.benchmarks:
        problems = load_benchmark(name, cfg.data_dir, cfg.limit, source=cfg.source)
        dataset = problems[0].dataset if problems else name
        if dataset in problem_sets:
            raise ValueError(f"benchmarks {cfg.benchmarks}: {name!r} is {dataset!r} again; list each set once")
        problem_sets[dataset] = problems
    return ks, checkpoints, problem_sets


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = parse_args(argv)
        ks, checkpoints, problem_sets = prepare(cfg)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if len(checkpoints) > 1:
        # One process per checkpoint: a vLLM engine does not reliably give its memory back in-process.
        for spec in cfg.checkpoints:
            code = subprocess.call([sys.executable, "-m", "sage_unsloth.eval", *argv, "--checkpoints", spec])
            if code:
                return code
        return 0
    out = evaluate_checkpoint(cfg, checkpoints[0], problem_sets, ks)
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
