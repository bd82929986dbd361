"""The whole recipe offline on CPU: ``python -m sage_unsloth.demo [--quick] [--fresh]``.

Steps (each stage is the kit's own entry point, run as a subprocess with the configs in configs/demo/):

0. build the demo model (random tiny Qwen2, sage_unsloth.demo.model) and pre-train it on addition facts
   (sage_unsloth.demo.pretrain), then write the demo data (sage_unsloth.demo.data);
1. SFT (``sage_unsloth.sft``, LoRA) on 90% running-total / 10% pairing solutions;
2. RLVR (``sage_unsloth.rlvr``): grpo, grpo_nokl and grpo_branch from the same SFT adapter, same seed and
   budget, run side by side;
3. eval (``sage_unsloth.eval`` with the demo file registered as the ``demo`` benchmark), pass@k for k up to
   ``eval_n``, for the SFT model ("base" of the comparison) and each RL run;
4. report (``sage_unsloth.report``) into ``results/demo/report.md``, plus the strategy frequencies
   (``strategies.csv``, ``report/strategies.png`` and a section appended to report.md).

Independent steps run in parallel (``--jobs``, default 4) with one torch thread each: on a 2-core machine
that keeps both cores busy through the many small ops of generation. A rerun skips finished steps
(``--fresh`` starts over). Timings go to ``results/demo/timings.csv``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..manifest import MANIFEST_NAME, atomic_write_text
from .data import EVAL_FILE, DemoDataSpec, write_demo_data
from .task import split_problems

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs" / "demo"
MODEL_NAME = "demo-tiny"
DEMO_BENCHMARK = "demo"
RL_VARIANTS = ("grpo", "grpo_nokl", "grpo_branch")
EVAL_RUNS = ("sft", *RL_VARIANTS)
PAIRS = "grpo:sft,grpo_nokl:sft,grpo_branch:sft,grpo_branch:grpo,grpo_nokl:grpo"


@dataclass(frozen=True)
class DemoBudget:
    pretrain_steps: int = 1200
    sft_steps: int = 400
    rl_steps: int = 200
    eval_problems: int = 100
    eval_n: int = 16          # samples per problem = largest k
    data: DemoDataSpec = field(default_factory=DemoDataSpec)
    bootstrap_resamples: int = 1000


FULL = DemoBudget(data=DemoDataSpec(n_eval=100))
QUICK = DemoBudget(pretrain_steps=20, sft_steps=4, rl_steps=2, eval_problems=6, eval_n=4,
                   data=DemoDataSpec(n_eval=6, n_rl=32, n_sft=200), bootstrap_resamples=100)


@dataclass
class Task:
    name: str
    argv: list[str]
    done: Path            # the step is finished when this file exists
    after: tuple[str, ...] = ()
    log: Path | None = None


def _python() -> str:
    return sys.executable


def build_tasks(budget: DemoBudget, work: Path, results: Path) -> list[Task]:
    data, model_dir = work / "data", work / "model" / MODEL_NAME
    runs = work / MODEL_NAME
    py = _python()
    tasks = [Task("sft", [py, "-m", "sage_unsloth.sft", str(CONFIG_DIR / "sft.yaml"),
                          "--model_name_or_path", str(model_dir), "--dataset_path", str(data / "sft.jsonl"),
                          "--output_dir", str(runs / "sft"), "--max_steps", str(budget.sft_steps)],
                  runs / "sft" / MANIFEST_NAME)]
    for variant in RL_VARIANTS:
        tasks.append(Task(variant, [py, "-m", "sage_unsloth.rlvr", str(CONFIG_DIR / f"{variant}.yaml"),
                                    "--sft_dir", str(runs / "sft"), "--output_root", str(work),
                                    "--dataset_path", str(data / "rl.jsonl"), "--max_steps", str(budget.rl_steps)],
                          runs / variant / MANIFEST_NAME, after=("sft",)))
    for run in EVAL_RUNS:
        tasks.append(Task(f"eval_{run}", [py, "-m", "sage_unsloth.eval", str(CONFIG_DIR / "eval.yaml"),
                                          "--checkpoints", str(runs / run),
                                          "--results_dir", str(results), "--outputs_dir", str(work),
                                          "--local_benchmarks", f"{DEMO_BENCHMARK}={data / EVAL_FILE}",
                                          "--benchmarks", DEMO_BENCHMARK, "--n", str(budget.eval_n),
                                          "--limit", str(budget.eval_problems)],
                          results / MODEL_NAME / run / MANIFEST_NAME, after=(run,)))
    tasks.append(Task("report", [py, "-m", "sage_unsloth.report", str(CONFIG_DIR / "report.yaml"),
                                 "--results", str(results), "--out", str(results / "report.md"),
                                 "--pairs", PAIRS, "--resamples", str(budget.bootstrap_resamples)],
                      results / "report.md", after=tuple(f"eval_{r}" for r in EVAL_RUNS)))
    return tasks


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "UNSLOTH_SKIP_TORCHVISION_CHECK": "1",
                "WANDB_MODE": env.get("WANDB_MODE", "offline"), "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_tasks(tasks: list[Task], *, jobs: int, logs: Path, timings: dict[str, float]) -> None:
    """Run tasks whose predecessors finished, at most ``jobs`` at a time; stop at the first failure."""
    logs.mkdir(parents=True, exist_ok=True)
    pending = [t for t in tasks if not t.done.is_file()]
    finished = {t.name for t in tasks if t.done.is_file()}
    for name in sorted(finished):
        print(f"[demo] {name}: already done, skipped", flush=True)
    running: dict[str, tuple[subprocess.Popen, float, Task]] = {}
    cores = os.cpu_count() or 1
    while pending or running:
        ready = [t for t in pending if all(a in finished for a in t.after)]
        while ready and len(running) < jobs:
            task = ready.pop(0)
            pending.remove(task)
            task.log = logs / f"{task.name}.log"
            threads = max(1, cores // max(1, min(jobs, len(ready) + len(running) + 1)))
            print(f"[demo] {task.name}: start ({threads} thread(s)), log {task.log}", flush=True)
            with task.log.open("w") as fh:
                proc = subprocess.Popen(task.argv, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                        env=_child_env(threads))
            running[task.name] = (proc, time.perf_counter(), task)
        if not running and pending:
            raise RuntimeError(f"[demo] cannot schedule {[t.name for t in pending]}: unmet dependencies")
        time.sleep(0.2)
        for name, (proc, started, task) in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            del running[name]
            timings[name] = round(time.perf_counter() - started, 1)
            if code != 0 or not task.done.is_file():
                for other, _, _ in running.values():
                    other.terminate()
                tail = "".join(task.log.read_text(errors="replace").splitlines(keepends=True)[-30:])
                raise RuntimeError(f"[demo] {name} failed (exit {code}); last lines of {task.log}:\n{tail}")
            finished.add(name)
            print(f"[demo] {name}: done in {timings[name]:.0f} s", flush=True)


def prepare_model_and_data(budget: DemoBudget, work: Path, timings: dict[str, float]) -> None:
    from .model import build_demo_model
    from .pretrain import pretrain_base_model

    model_dir = work / "model" / MODEL_NAME
    marker = model_dir / "PRETRAINED.json"
    if not marker.is_file():
        started = time.perf_counter()
        shutil.rmtree(model_dir, ignore_errors=True)
        build_demo_model(model_dir, seed=budget.data.seed)
        spec = budget.data
        pool = split_problems(spec.task, seed=spec.seed, n_eval=spec.n_eval, n_rl=spec.n_rl)["sft"]
        summary = pretrain_base_model(model_dir, pool, steps=budget.pretrain_steps, seed=spec.seed)
        atomic_write_text(marker, json.dumps(summary, indent=2) + "\n")
        timings["model"] = round(time.perf_counter() - started, 1)
        print(f"[demo] model: built and pre-trained in {timings['model']:.0f} s ({summary})", flush=True)
    write_demo_data(work / "data", budget.data)


def finish_report(results: Path, work: Path) -> list[dict]:
    """strategies.csv + strategies.png, and their section appended to report.md."""
    from .strategies import (
        markdown_section,
        plot_strategies,
        read_completions,
        strategy_rows,
        write_strategy_table,
    )

    rows = []
    for run in EVAL_RUNS:
        rows += strategy_rows(run, read_completions(work / MODEL_NAME / "eval" / run, DEMO_BENCHMARK))
    write_strategy_table(rows, results / "strategies.csv")
    image = plot_strategies(rows, results / "report" / "strategies.png")
    report = results / "report.md"
    text = report.read_text()
    marker = "\n## Demo: strategy frequencies"
    if marker in text:
        text = text[:text.index(marker)]
    atomic_write_text(report, text.rstrip("\n") + "\n\n" + markdown_section(rows, image, results))
    return rows


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="python -m sage_unsloth.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few steps of everything (CI smoke run)")
    parser.add_argument("--fresh", action="store_true", help="delete previous demo outputs first")
    parser.add_argument("--work-dir", default=None, help="models, data, completions (default outputs/demo[-quick])")
    parser.add_argument("--results-dir", default=None, help="CSVs, report.md, plots (default results/demo[-quick])")
    parser.add_argument("--jobs", type=int, default=4, help="steps run in parallel")
    parser.add_argument("--rl-steps", type=int, default=None, help="override the RL budget (steps per variant)")
    parser.add_argument("--sft-steps", type=int, default=None, help="override the SFT budget (steps)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[demo] %(message)s")
    budget = QUICK if args.quick else FULL
    if args.rl_steps:
        budget = replace(budget, rl_steps=args.rl_steps)
    if args.sft_steps:
        budget = replace(budget, sft_steps=args.sft_steps)
    suffix = "-quick" if args.quick else ""
    work = Path(args.work_dir or REPO_ROOT / "outputs" / f"demo{suffix}").resolve()
    results = Path(args.results_dir or REPO_ROOT / "results" / f"demo{suffix}").resolve()
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(results, ignore_errors=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    started = time.perf_counter()
    timings: dict[str, float] = {}
    try:
        prepare_model_and_data(budget, work, timings)
        run_tasks(build_tasks(budget, work, results), jobs=max(1, args.jobs), logs=work / "logs", timings=timings)
        rows = finish_report(results, work)
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    timings["total"] = round(time.perf_counter() - started, 1)
    atomic_write_text(results / "timings.csv", "step,seconds\n" + "".join(f"{k},{v}\n" for k, v in timings.items()))
    atomic_write_text(results / "demo_budget.json", json.dumps(asdict(budget), indent=2) + "\n")
    print(f"[demo] finished in {timings['total']:.0f} s: {results / 'report.md'}")
    for row in rows:
        if row["strategy"] != "other":
            print(f"[demo]   {row['run']:12s} strategy {row['strategy']}: share {row['fraction']:.3f}, "
                  f"accuracy {row['accuracy']}")
    return 0
