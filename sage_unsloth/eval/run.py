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
from sage_unsloth.config.input_checks import check_output_folder
from sage_unsloth.eval.backend_choice import resolve_backend
from sage_unsloth.eval.benchmarks import Problem, load_benchmark
from sage_unsloth.eval.config import EvalConfig, known_benchmarks, parse_args, validate
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
from sage_unsloth.eval.shard import chunk_keys, select_shard
from sage_unsloth.runtime import layout
from sage_unsloth.runtime.manifest import atomic_write_text, write_manifest

logger = logging.getLogger(__name__)
FAIL_AFTER_ENV = "SAGE_EVAL_FAIL_AFTER_CHUNKS"  # test hook: die after writing this many chunks


def sampling_fingerprint(cfg: EvalConfig, checkpoint) -> dict:
    """What determines the completions; resumed chunks must have been sampled with the same."""
    return {
        "checkpoint": checkpoint.spec,
        "base_model": checkpoint.base_model,
        "adapter": checkpoint.adapter_dir,
        "backend": cfg.backend,
        "n": cfg.n,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "min_p": cfg.min_p,
        "max_tokens": cfg.max_tokens,
        "stop": list(cfg.stop),
        "seed": cfg.seed,
        "user_template": cfg.user_template,
        "problems_per_batch": cfg.problems_per_batch,
    }


# ------------------------------------------------------------------------------------------------ one checkpoint
def read_kept_chunk(path: Path, expected_ids: list[str]) -> list[dict] | None:
    """A chunk on disk to reuse, or None to sample it (absent, for other problems, or corrupt: then it is set
    aside as ``<name>.corrupt``, kept, with a warning naming the file and the line)."""
    from sage_unsloth.eval.records import CorruptChunk, set_aside

    try:
        return read_chunk(path, expected_ids)
    except CorruptChunk as exc:
        try:
            kept = set_aside(path)
        except FileNotFoundError:  # a sibling shard set it aside first
            return None
        logger.warning("%s: set aside as %s, its problems are sampled again", exc, kept.name)
        return None


def grading_pairs(problems: list[Problem], samples) -> list[tuple[str, object]]:
    items = []
    for problem, group in zip(problems, samples):
        gold = (problem.kk_solution, problem.kk_names) if problem.is_kk else problem.gold
        items.extend((s.text, gold) for s in group)
    return items


def settings_difference(theirs: dict, ours: dict) -> tuple[str, str]:
    """The sampling settings that differ, as ``key=value`` lists (theirs, ours)."""
    keys = [k for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)]
    return (
        ", ".join(f"{k}={theirs.get(k)!r}" for k in keys),
        ", ".join(f"{k}={ours.get(k)!r}" for k in keys),
    )


def check_chunk_settings(path: Path, records: list[dict], fingerprint: dict, completions: Path) -> None:
    """Every record of a chunk names the settings it was sampled with; another setting is a one-line error.
    (Chunks written before records carried them are checked through sampling.json only.)"""
    for record in records:
        theirs = record.get("sampling")
        if theirs is not None and theirs != fingerprint:
            was, now = settings_difference(theirs, fingerprint)
            raise ValueError(
                f"{path} was sampled with other settings ({was}); this run samples with {now}: results are "
                f"never mixed, set run_name to a new name or delete {completions}"
            )


LOCK_FIX = "set run_name to a new name (or pass another --outputs_dir / --results_dir)"
SAMPLING_FILE = "sampling.json"


def _read_sampling_file(path: Path) -> tuple[dict | None, str | None]:
    """(the settings sampling.json records, None) or (None, what is wrong with it: missing, not JSON, ...)."""
    try:
        theirs = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "missing"
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte {exc.start})"
    except json.JSONDecodeError as exc:
        return None, f"damaged (line {exc.lineno} is not JSON: {exc.msg})"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if not isinstance(theirs, dict):
        return None, f"damaged (a JSON {type(theirs).__name__}, not the settings)"
    return theirs, None


def check_completions_folder(cfg: EvalConfig, checkpoint, *, repair: bool = False) -> None:
    """Refuse to mix completions: a folder another live process writes into, or whose chunks were sampled with
    other settings, is an error (one line). A folder with a fingerprint but no chunk (a run that stopped before
    its first chunk) is reused. A chunk that cannot be read is left to the run, which sets it aside.

    A damaged or missing ``sampling.json`` beside chunks is repaired (``repair``, under the folder's lock): the
    chunks whose records name this run's settings are kept, those that name none (written before records
    carried them) are set aside and sampled again, and the run writes the file anew."""
    from sage_unsloth.eval.records import CorruptChunk, set_aside
    from sage_unsloth.eval.shard import parse_shard
    from sage_unsloth.runtime.folder_lock import held_error, live_owner

    completions = layout.completions_dir(cfg.outputs_dir, checkpoint.model, checkpoint.run)
    owner = live_owner(completions, parse_shard(cfg.shard))
    if owner is not None:
        raise ValueError(held_error(completions, owner, LOCK_FIX))
    fingerprint = sampling_fingerprint(cfg, checkpoint)
    chunks = sorted(completions.glob("*/chunk_*.jsonl.gz"))
    fp_path = completions / SAMPLING_FILE
    theirs, damage = _read_sampling_file(fp_path)
    if chunks and theirs is not None and theirs != fingerprint:
        was, now = settings_difference(theirs, fingerprint)
        raise ValueError(
            f"{completions} holds completions sampled with other settings ({was}; see {fp_path}); this run "
            f"samples with {now}: set run_name to a new name or delete that folder"
        )
    unverified = []
    for path in chunks:
        try:
            records = read_chunk(path) or []
        except CorruptChunk:
            continue
        check_chunk_settings(path, records, fingerprint, completions)
        if any("sampling" not in r for r in records):
            unverified.append(path)
    if not (repair and chunks and damage):
        return
    for path in unverified:  # nothing says which settings drew them: sampled again, the file kept aside
        set_aside(path)
    logger.warning(
        "%s is %s: rebuilt from the settings the chunks record; %d chunk(s) kept, %d without recorded settings "
        "set aside (*.corrupt) and sampled again",
        fp_path,
        damage,
        len(chunks) - len(unverified),
        len(unverified),
    )


def check_results_folder(cfg: EvalConfig, checkpoint) -> None:
    """Results are keyed by the sampling settings and the completions folder: a results folder holding another
    evaluation's results (another seed, n, ..., or another --outputs_dir) is never replaced (one line)."""
    from sage_unsloth.runtime.manifest import MANIFEST_NAME, read_manifest

    results = layout.results_dir(cfg.results_dir, checkpoint.model, checkpoint.run)
    if not (results / MANIFEST_NAME).is_file():
        return
    try:
        theirs = read_manifest(results)
    except ValueError as exc:
        logger.warning("%s: this run rewrites it", exc)
        return
    ours = sampling_fingerprint(cfg, checkpoint)
    completions = layout.completions_dir(cfg.outputs_dir, checkpoint.model, checkpoint.run)
    their_dir = theirs.get("completions_dir")
    same_dir = their_dir is None or os.path.realpath(their_dir) == os.path.realpath(completions)
    if theirs.get("sampling", ours) == ours and same_dir:
        return
    was, now = settings_difference(theirs.get("sampling") or ours, ours)
    if not same_dir:
        was = ", ".join(x for x in (was, f"completions in {their_dir}") if x)
        now = ", ".join(x for x in (now, f"completions in {completions}") if x)
    raise ValueError(
        f"{results} holds the results of another evaluation ({was}); this run has {now}: results are never "
        f"replaced by another evaluation's: set run_name to a new name, pass another --results_dir, or delete "
        f"{results}"
    )


def check_backend(cfg: EvalConfig) -> None:
    """The vLLM backend needs vllm importable here (on CPU it lives in .venv-eval, not in the training env) and, on
    CPU, the memory its gpu_memory_utilization reserves (compat.vllm_cpu_memory_problem)."""
    from sage_unsloth.eval.backend_choice import vllm_installed

    if cfg.backend != "vllm":
        return
    if not vllm_installed():
        raise ValueError(
            f"backend=vllm: vllm is not installed in {sys.executable}; on CPU run stage 3 with "
            ".venv-eval/bin/sage-unsloth eval or scripts/03_eval.sh (make installs both), or pass --backend hf"
        )
    from sage_unsloth.runtime.backend import cuda_available

    if not cuda_available():
        import psutil  # a dependency of vllm

        from sage_unsloth.compat import vllm_cpu_memory_problem

        memory = psutil.virtual_memory()
        if problem := vllm_cpu_memory_problem(cfg.gpu_memory_utilization, memory.total, memory.available):
            raise ValueError(problem)


def evaluate_checkpoint(
    cfg: EvalConfig,
    checkpoint,
    problem_sets: dict[str, list[Problem]],
    ks: list[int],
    sampler=None,
    backend_choice=None,
) -> Path:
    """Sample, grade and write one checkpoint's results; returns results/<model>/<run>.

    ``backend_choice``: what :func:`~sage_unsloth.eval.backend_choice.resolve_backend` made of ``cfg.backend``
    (``cfg`` then holds the concrete backend); without it, it is resolved here. Printed in one line and recorded
    in the manifest.

    Chunks already on disk are reused; those graded by another grader version are graded again from their
    saved completions (no resampling). Completions whose grading ran out of budget are retried serially with
    the larger budget once every chunk is written; what stays unresolved is counted in the manifest. The
    completions folder and the results folder are locked for the run (sage_unsloth/runtime/folder_lock.py): one writer
    at a time (shards of one run: one per shard)."""
    from sage_unsloth.eval.shard import parse_shard
    from sage_unsloth.runtime.folder_lock import FolderLock

    if backend_choice is None:
        cfg, backend_choice = resolve_backend(cfg, checkpoint, problem_sets)
    print(backend_choice.line(), flush=True)
    completions = layout.completions_dir(cfg.outputs_dir, checkpoint.model, checkpoint.run)
    results = layout.results_dir(cfg.results_dir, checkpoint.model, checkpoint.run)
    shard = parse_shard(cfg.shard)
    with (  # one writer per folder, for the whole run
        FolderLock(completions, fix=LOCK_FIX, shard=shard),
        FolderLock(results, fix=LOCK_FIX, shard=shard),
    ):
        return _evaluate_locked(cfg, checkpoint, problem_sets, ks, sampler, backend_choice)


@dataclass
class _Chunks:
    """What one checkpoint's run has graded so far: each chunk's per-problem summaries, by (benchmark, index),
    and the chunk files with grading timeouts (retried at the end of the run, serially, with a larger budget)."""

    folder: Path  # the checkpoint's completions folder
    fingerprint: dict
    grader: str
    summaries: dict[tuple[str, int], list[dict]] = field(default_factory=dict)
    with_timeouts: set[Path] = field(default_factory=set)
    regraded: int = 0

    def keep(self, path: Path, name: str, index: int, records: list[dict]) -> None:
        if status_counts(records)[grading.TIMEOUT]:
            self.with_timeouts.add(path)
        self.summaries[(name, index)] = [summary(r) for r in records]

    def per_problem(self, problem_sets) -> list[dict]:
        """The summaries in benchmark order, then chunk order."""
        return [
            row
            for name in problem_sets
            for index in sorted(i for (n, i) in self.summaries if n == name)
            for row in self.summaries[(name, index)]
        ]


def _evaluate_locked(cfg: EvalConfig, checkpoint, problem_sets, ks, sampler, backend_choice) -> Path:
    from sage_unsloth.eval.gradepool import GradingPool

    results = layout.results_dir(cfg.results_dir, checkpoint.model, checkpoint.run)
    completions = layout.completions_dir(cfg.outputs_dir, checkpoint.model, checkpoint.run)
    chunks = _Chunks(completions, sampling_fingerprint(cfg, checkpoint), grading.grader_fingerprint())
    _prepare_folders(cfg, checkpoint, completions, results, chunks.fingerprint)
    timings = {"generate_s": 0.0, "total_s": 0.0}
    started = time.perf_counter()
    fail_after = int(os.environ.get(FAIL_AFTER_ENV, "0") or 0)
    pool = GradingPool(cfg.grading_workers, timeout_s=cfg.grading_timeout_s)
    try:
        pending = _reuse_kept_chunks(cfg, problem_sets, chunks, pool)
        keys = chunk_keys(problem_sets, cfg.problems_per_batch)
        pending = select_shard(pending, keys, cfg.shard)  # all of them unless --shard i/N
        n_done = sum(len(v) for v in chunks.summaries.values())
        logger.info(
            "%s/%s: %d problems already graded (%d chunks regraded), %d chunks to sample",
            checkpoint.model,
            checkpoint.run,
            n_done,
            chunks.regraded,
            len(pending),
        )
        if pending:
            _sample_chunks(
                cfg,
                checkpoint,
                problem_sets,
                pending,
                sampler,
                pool,
                chunks,
                timings,
                fail_after,
                estimate_s=(backend_choice.estimate_s or {}).get(backend_choice.backend)
                if backend_choice
                else None,
            )
    finally:
        pool.close()

    retried, unresolved = _retry_timeouts(cfg, chunks)
    timings["total_s"] = time.perf_counter() - started
    if len(chunks.summaries) < len(keys):  # a shard: the other shards' chunks are not all written yet
        logger.info(
            "shard %s done: %d of %d chunks on disk; the CSVs are written once all are (run without "
            "--shard to merge)",
            cfg.shard,
            len(chunks.summaries),
            len(keys),
        )
        return results

    write_tables(results, chunks.per_problem(problem_sets), ks)
    grading_stats = {
        **pool.stats,
        "grader": chunks.grader,
        "budget_s": cfg.grading_timeout_s,
        "retry_budget_s": cfg.grading_retry_timeout_s,
        "retried": retried,
        "unresolved": unresolved,
        "regraded_chunks": chunks.regraded,
    }
    _write_eval_manifest(cfg, checkpoint, problem_sets, ks, chunks, grading_stats, backend_choice, timings)
    if cfg.report_to == "wandb":
        log_to_wandb(cfg, checkpoint, results)
    return results


def log_to_wandb(cfg: EvalConfig, checkpoint, results: Path) -> None:
    """Log the finished results to W&B (sage_unsloth/eval/wandb_log.py) and add the run's record to the manifest
    (``wandb``); a failure is one line saying the results are kept and how to log them."""
    from sage_unsloth.eval.wandb_log import log_checkpoint_results
    from sage_unsloth.runtime.manifest import MANIFEST_NAME, atomic_write_json, read_manifest

    try:
        record = log_checkpoint_results(cfg, checkpoint, results)
    except Exception as exc:  # any W&B failure: the results on disk stay, one line says so
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(
            f"W&B: logging {checkpoint.model}/{checkpoint.run} failed ({type(exc).__name__}: {first}); its results "
            f"are written in {results}: run the same command again to log them (the chunks on disk are reused)"
        ) from exc
    manifest = read_manifest(results, expect_stage="eval")
    atomic_write_json(results / MANIFEST_NAME, {**manifest, "wandb": record})


def _prepare_folders(
    cfg: EvalConfig, checkpoint, completions: Path, results: Path, fingerprint: dict
) -> None:
    """Check both folders (a run alone in them first clears what a run cut short left half-written) and write the
    sampling fingerprint next to the completions."""
    if cfg.shard is None:  # alone in both folders: what a run cut short left half-written goes
        from sage_unsloth.runtime.folder_lock import remove_stale_tmp

        remove_stale_tmp(completions, depth=1)
        remove_stale_tmp(results)
    check_completions_folder(cfg, checkpoint, repair=True)
    check_results_folder(cfg, checkpoint)
    fp_path = completions / SAMPLING_FILE
    atomic_write_text(fp_path, json.dumps(fingerprint, indent=2, sort_keys=True) + "\n")


def _reuse_kept_chunks(cfg: EvalConfig, problem_sets, chunks: _Chunks, pool):
    """Read every chunk already on disk into ``chunks`` (regraded where an older grader wrote it); returns the
    chunks still to sample, as (benchmark, index, problems)."""
    from sage_unsloth.eval.regrade import regrade_records

    pending: list[tuple[str, int, list[Problem]]] = []
    for name, problems in problem_sets.items():
        step = cfg.problems_per_batch
        for index in range((len(problems) + step - 1) // step):
            chunk = problems[index * step : (index + 1) * step]
            path = chunk_path(chunks.folder, name, index)
            records = read_kept_chunk(path, [p.problem_id for p in chunk])
            if records is None:
                pending.append((name, index, chunk))
                continue
            check_chunk_settings(path, records, chunks.fingerprint, chunks.folder)
            if any(r.get("grader") != chunks.grader or "gold" not in r for r in records):
                records = [{**r, "gold": stored_gold(p)} for r, p in zip(records, chunk)]
                records, _ = regrade_records(records, pool, cfg.grading_retry_timeout_s)
                write_chunk(path, records)
                chunks.regraded += 1
            chunks.keep(path, name, index, records)
    return pending


def _sample_chunks(
    cfg, checkpoint, problem_sets, pending, sampler, pool, chunks, timings, fail_after, estimate_s=None
):
    """Sample and grade the ``pending`` chunks, each written as soon as it is graded; the grading of one chunk
    overlaps the next generate call. Progress from measured rates (sage_unsloth/eval/progress.py; ``estimate_s``:
    the backend rule's, said beside the measured time at the end)."""
    from sage_unsloth.eval.progress import SamplingProgress
    from sage_unsloth.eval.sampling import (
        load_tokenizer,
        make_sampler,
        problem_seed,
        prompt_token_limit,
        render_prompts,
    )

    tokenizer = load_tokenizer(checkpoint, cfg.trust_remote_code)
    limit = prompt_token_limit(cfg)  # every prompt is checked before the engine starts: one line, not an OOM
    prompts_of = {(n, i): render_prompts(tokenizer, c, cfg.user_template, limit) for n, i, c in pending}
    bar = SamplingProgress(
        sum(len(p) for p in problem_sets.values()),
        sum(len(v) for v in chunks.summaries.values()),
        f"{checkpoint.model}/{checkpoint.run}",
        estimate_s=estimate_s,
    )
    sampler = sampler or make_sampler(checkpoint, cfg)
    bar.ready()
    in_flight = None  # grading of the previous chunk overlaps the next generate call
    written = 0

    def finish(job):
        nonlocal written
        (name, index, chunk, seeds, samples), future = job
        records = [
            {**r, "sampling": chunks.fingerprint}
            for r in build_records(chunk, seeds, samples, future.result(), chunks.grader)
        ]
        path = chunk_path(chunks.folder, name, index)
        write_chunk(path, records)
        chunks.keep(path, name, index, records)
        bar.update(len(chunk))
        written += 1
        if fail_after and written >= fail_after:
            raise RuntimeError(f"{FAIL_AFTER_ENV}={fail_after}: injected failure")

    for name, index, chunk in pending:
        seeds = [problem_seed(cfg.seed, p.dataset, p.problem_id) for p in chunk]
        prompts = prompts_of.pop((name, index))
        t0 = time.perf_counter()
        samples = sampler.generate(prompts, seeds)
        timings["generate_s"] += time.perf_counter() - t0
        job = ((name, index, chunk, seeds, samples), pool.submit(grading_pairs(chunk, samples)))
        if in_flight is not None:
            finish(in_flight)
        in_flight = job
    if in_flight is not None:
        finish(in_flight)
    bar.close()


def _retry_timeouts(cfg: EvalConfig, chunks: _Chunks) -> tuple[int, int]:
    """The end-of-run retry of the chunks with grading timeouts: serial, with the larger budget; returns (answers
    retried, answers still timed out)."""
    from sage_unsloth.eval.regrade import settle_timeouts

    retried = unresolved = 0
    for path in sorted(chunks.with_timeouts):
        records, n = settle_timeouts(read_chunk(path), cfg.grading_retry_timeout_s)
        retried += n
        write_chunk(path, records)
        name, index = path.parent.name, int(path.name.split("_")[1].split(".")[0])
        chunks.summaries[(name, index)] = [summary(r) for r in records]
        unresolved += status_counts(records)[grading.TIMEOUT]
    return retried, unresolved


def _write_eval_manifest(
    cfg: EvalConfig, checkpoint, problem_sets, ks, chunks: _Chunks, grading_stats, backend_choice, timings
) -> None:
    results = layout.results_dir(cfg.results_dir, checkpoint.model, checkpoint.run)
    write_manifest(
        results,
        stage="eval",
        config=asdict(cfg),
        seed=cfg.seed,
        checkpoint=checkpoint.spec,
        base_model=checkpoint.base_model,
        adapter=checkpoint.adapter_dir,
        model_short_name=checkpoint.model,
        run=checkpoint.run,
        sampling=chunks.fingerprint,
        ks=ks,
        completions_dir=str(chunks.folder),
        problem_seed="sha256(f'{seed}\\x1f{dataset}\\x1f{problem_id}')[:4] little-endian & 0x7fffffff",
        datasets=list(problem_sets),
        problems={name: len(p) for name, p in problem_sets.items()},
        grading=grading_stats,
        backend_choice=backend_choice.as_dict(),
        timings={k: round(v, 3) for k, v in timings.items()},
    )


# ------------------------------------------------------------------------------------------------ entry point
def prepare(cfg: EvalConfig):
    """Validate the config, resolve checkpoints and load benchmarks: every failure before any model loads."""
    from sage_unsloth.eval.sampling import resolve_checkpoint

    ks = validate(cfg)
    checkpoints = [resolve_checkpoint(spec, cfg.run_name) for spec in cfg.checkpoints]
    for checkpoint in checkpoints:  # folder names, also when read from a stage's manifest
        layout.check_name(
            checkpoint.model, f"checkpoint {checkpoint.spec}: its model name", "qwen2.5-math-7b"
        )
        layout.check_name(checkpoint.run, f"checkpoint {checkpoint.spec}: its run name", "grpo_branch")
    known = known_benchmarks(cfg)
    problem_sets: dict[str, list[Problem]] = {}  # keyed by the dataset results are written under
    for name in cfg.benchmarks:
        problems = load_benchmark(name, cfg.data_dir, cfg.limit, source=cfg.source, known=known)
        if not problems:
            raise ValueError(
                f"benchmarks: {name!r} has no problems (an empty file?); fix its file or drop it from benchmarks"
            )
        dataset = problems[0].dataset
        if dataset in problem_sets:
            raise ValueError(
                f"benchmarks {cfg.benchmarks}: {name!r} is {dataset!r} again; list each set once"
            )
        problem_sets[dataset] = problems
    check_output_folder(cfg.results_dir, "results_dir")
    check_output_folder(cfg.outputs_dir, "outputs_dir")
    from sage_unsloth.config.input_checks import check_wandb

    check_wandb(cfg.report_to)  # the package and a key (or offline mode), before any model loads
    return ks, checkpoints, problem_sets


def show_plan(cfg: EvalConfig, ks, checkpoints, problem_sets, choices) -> int:
    """The dry run's plan: per checkpoint, where its results and completions go, the sampler ``auto`` chose, and
    how many chunks are on disk already (those are reused, not sampled again)."""
    from sage_unsloth.config import dry_run

    runs = []
    for checkpoint, (resolved, choice) in zip(checkpoints, choices):
        completions = layout.completions_dir(cfg.outputs_dir, checkpoint.model, checkpoint.run)
        chunks = {
            name: -(-len(problems) // cfg.problems_per_batch) for name, problems in problem_sets.items()
        }
        on_disk = sum(1 for name in problem_sets for _ in completions.glob(f"{name}/chunk_*.jsonl.gz"))
        runs.append(
            {
                "checkpoint": checkpoint.spec,
                "results": layout.results_dir(cfg.results_dir, checkpoint.model, checkpoint.run),
                "completions": completions,
                "sampler": choice.line(),
                "chunks": f"{on_disk} of {sum(chunks.values())} on disk (reused); the rest sampled",
            }
        )
    dry_run.show_plan(
        {
            "benchmarks": {name: len(problems) for name, problems in problem_sets.items()},
            "samples per problem": cfg.n,
            "ks": ks,
            "runs": runs,
        }
    )
    return 0


def _each_checkpoint_in_its_process(cfg, argv: list[str]) -> int:
    """Evaluate each checkpoint in a process of its own (a vLLM engine does not reliably give its memory back
    in-process); the first failing child's exit code, a child stopped by a signal raised here as the stop."""
    from sage_unsloth.runtime.interrupt import QUIET_ENV, exit_code_stopped
    from sage_unsloth.runtime.lifeline import guard_descendants

    env = {**os.environ, QUIET_ENV: "1"}  # on Ctrl-C this process says how to continue, not each child
    guard_descendants()  # a kill -9 of this process ends each child and its engine too
    for spec in cfg.checkpoints:
        command = [sys.executable, "-m", "sage_unsloth.eval", *argv, "--checkpoints", spec]
        code = subprocess.call(command, env=env)
        if (stopped := exit_code_stopped(code)) is not None:
            raise stopped
        if code:
            return code
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    from sage_unsloth.config.schema import refuse_bad_input

    if (code := refuse_bad_input("eval", argv)) is not None:  # every bad input at once, before parsing
        return code
    try:
        cfg = parse_args(argv)
        if cfg.dry_run:
            from sage_unsloth.config import dry_run

            dry_run.show("eval", dry_run.resolved_config("eval", (cfg,), argv))
        ks, checkpoints, problem_sets = prepare(cfg)
        # `auto` becomes a backend per checkpoint (each runs in its own process below and says its choice)
        choices = [resolve_backend(cfg, checkpoint, problem_sets) for checkpoint in checkpoints]
        for (resolved, _), checkpoint in zip(choices, checkpoints):
            check_backend(resolved)
            check_completions_folder(resolved, checkpoint)
            check_results_folder(resolved, checkpoint)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if cfg.dry_run:
        return show_plan(cfg, ks, checkpoints, problem_sets, choices)
    from sage_unsloth.runtime.interrupt import handle_sigterm, interrupted_eval, restore_sigterm

    previous_sigterm = handle_sigterm()

    try:
        if len(checkpoints) > 1:
            return _each_checkpoint_in_its_process(cfg, argv)
        resolved, choice = choices[0]
        out = evaluate_checkpoint(resolved, checkpoints[0], problem_sets, ks, backend_choice=choice)
    except KeyboardInterrupt as exc:
        return interrupted_eval(argv, exc)
    except ValueError as exc:  # a folder another writer took since the checks above; chunks of other settings
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk or quota: one line; the chunks already written are kept
        from sage_unsloth.runtime.checkpoints import NO_ROOM, free_space

        if exc.errno not in NO_ROOM:
            raise
        where = (
            Path(exc.filename).parent
            if exc.filename
            else layout.completions_dir(resolved.outputs_dir, checkpoints[0].model, checkpoints[0].run)
        )
        print(
            f"error: eval: no room to write into {where} ({exc.strerror or exc}; {free_space(where)} there, or "
            "a file-size limit, ulimit -f): make room, then run the same command; the chunks written so far "
            "are kept",
            file=sys.stderr,
        )
        return 2
    finally:
        restore_sigterm(previous_sigterm)
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
