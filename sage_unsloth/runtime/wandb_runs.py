"""The kit's W&B runs: which run each stage logs into, and the keys stage 3 logs (``wandb`` is imported only where
W&B is asked for: ``report_to: wandb``, the report's ``--wandb_project`` or ``--from_wandb``).

Runs that belong together are one W&B run or one group:

- stages 1 and 2 start their run before the Trainer, whose W&B callback (transformers' ``WandbCallback``) then
  logs TRL's metrics into it: project ``WANDB_PROJECT`` (default "sage-unsloth"), entity ``WANDB_ENTITY``, group
  ``WANDB_RUN_GROUP`` (default: the model's short name), job_type "sft" / "rlvr", name ``<model>/<variant>``, and a
  config entry ``sage`` (stage, model short name, variant, output folder). The run's record (id, project, entity,
  group, job_type, mode, folder) is written to ``<output_dir>/wandb_run.json`` when the run starts (``--resume
  true`` continues the same W&B run) and to the stage's manifest (``wandb``) when it ends;
- stage 3 logs each checkpoint's results into the run that trained it (the checkpoint's manifest names it;
  resumed by id, offline too), or, for a model no stage of the kit trained (a base model, a hub checkpoint), into
  a new run of the same group with job_type "eval";
- the report logs into a run of its own, job_type "report" (sage_unsloth/report/wandb_log.py).

What stage 3 logs, one ``log`` call per evaluated checkpoint (``train/global_step``: the checkpoint's step, the
x-axis of TRL's metrics; the scalars are the run's summary too):

  eval/<dataset>/pass@k     Table k, pass@k, n_problems, n_samples: passk.csv's rows of that dataset (pooled
                            sets ``aime`` and ``avg_paper`` included)
  eval/<dataset>/pass@k_curve  the same as a W&B line chart (pass@k against k)
  eval/<dataset>/pass@<k>   the headline values: k = 1 and the largest k evaluated
  eval/per_problem          Table dataset, problem_id, n, c, mean_completion_tokens: per_problem.csv, which the
                            report's bootstrap intervals need
  eval/grading/<stat>       the grading summary (answers graded, retried, unresolved, ...)
  eval/manifest             Table with one cell: the eval manifest as JSON (checkpoint, sampling settings, ...)

The report's reader (sage_unsloth/report/wandb_read.py) rebuilds ``results/<model>/<run>/`` from these rows; the
files side of the same contract is sage_unsloth/runtime/results.py.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_PROJECT = "sage-unsloth"
RUN_RECORD_FILE = "wandb_run.json"  # in a training stage's output folder, written when its run starts
CONFIG_KEY = "sage"  # the kit's entry in a training run's W&B config
TRAINING_JOB_TYPES = ("sft", "rlvr")
EVAL_JOB_TYPE, REPORT_JOB_TYPE = "eval", "report"
INSTALL_HINT = "pip install 'sage-unsloth[wandb]' (or pip install wandb)"  # W&B is an extra of the kit

# Stage 3's keys (the module docstring): the reader matches them, the writer builds them.
EVAL_PREFIX = "eval/"
PASSK_TABLE = "pass@k"
PASSK_TABLE_COLUMNS = ("k", "pass@k", "n_problems", "n_samples")  # passk.csv's columns after dataset
PER_PROBLEM_KEY = "eval/per_problem"
MANIFEST_KEY = "eval/manifest"
MANIFEST_COLUMN = "manifest.json"
GRADING_PREFIX = "eval/grading/"
STEP_KEY = "train/global_step"  # transformers' W&B x-axis


def passk_table_key(dataset: str) -> str:
    return f"{EVAL_PREFIX}{dataset}/{PASSK_TABLE}"


def passk_curve_key(dataset: str) -> str:
    return f"{EVAL_PREFIX}{dataset}/pass@k_curve"


def passk_key(dataset: str, k: int) -> str:
    return f"{EVAL_PREFIX}{dataset}/pass@{k}"


def dataset_of_table_key(key: str) -> str | None:
    """The dataset of an ``eval/<dataset>/pass@k`` key, None for any other key."""
    suffix = f"/{PASSK_TABLE}"
    if not key.startswith(EVAL_PREFIX) or not key.endswith(suffix):
        return None
    dataset = key[len(EVAL_PREFIX) : -len(suffix)]
    return dataset if dataset and "/" not in dataset else None


def reports_to_wandb(report_to) -> bool:
    """Whether a stage's ``report_to`` (TRL's: a name or a list) asks for W&B: "wandb", or "all" (TRL's "every
    installed integration") where wandb is installed."""
    import importlib.util

    values = [
        str(v).strip().lower() for v in (report_to if isinstance(report_to, (list, tuple)) else [report_to])
    ]
    return "wandb" in values or ("all" in values and importlib.util.find_spec("wandb") is not None)


def import_wandb(asked_by: str):
    """The wandb module, or a one-line ValueError naming what asked for W&B and how to install it."""
    try:
        import wandb
    except ImportError:
        raise ValueError(
            f"{asked_by}: the wandb package is not installed in this environment: {INSTALL_HINT} (or drop the "
            "W&B option)"
        ) from None
    return wandb


def is_main_process() -> bool:
    """Rank 0 of a multi-process run (``RANK``, set by accelerate and torchrun), or a single process."""
    return os.environ.get("RANK", "0") in ("", "0")


# ----------------------------------------------------------------------------------------- a run's record
def run_record(run) -> dict:
    """What a manifest keeps of a W&B run: where to find it again (never a credential)."""
    offline = bool(getattr(run.settings, "_offline", False))
    folder = Path(run.dir).parent if getattr(run, "dir", None) else None
    return {
        "id": run.id,
        "project": run.project or None,
        "entity": run.entity or None,
        "group": run.group or None,
        "job_type": run.job_type or None,
        "name": run.name or None,
        "mode": "offline" if offline else "online",
        "folder": str(folder) if folder else None,
        "url": None if offline else (getattr(run, "url", None) or None),
    }


def read_run_record(folder: str | os.PathLike) -> dict | None:
    """The record of the W&B run a training stage's folder logged into (its manifest's ``wandb``, else the
    ``wandb_run.json`` written when the run started), or None."""
    from sage_unsloth.runtime.manifest import MANIFEST_NAME

    folder = Path(folder)
    for name, pick in ((MANIFEST_NAME, lambda m: m.get("wandb")), (RUN_RECORD_FILE, lambda m: m)):
        path = folder / name
        if not path.is_file():
            continue
        try:
            record = pick(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(record, dict) and record.get("id"):
            return record
    return None


# ----------------------------------------------------------------------------------------- stages 1 and 2
def start_training_run(
    report_to,
    *,
    job_type: str,
    model_short: str,
    variant: str,
    output_dir: str | os.PathLike,
    resume: bool,
    name: str | None = None,
):
    """Start the W&B run of a training stage (the Trainer's W&B callback logs into the run it finds), or None when
    the stage does not report to W&B or is not rank 0. ``resume``: continue the run ``wandb_run.json`` names;
    ``name``: the user's ``run_name`` (default ``<model>/<variant>``)."""
    from sage_unsloth.runtime.manifest import atomic_write_json

    if not reports_to_wandb(report_to) or not is_main_process():
        return None
    wandb = import_wandb("report_to=wandb")
    output_dir = Path(output_dir)
    earlier = read_run_record(output_dir) if resume else None
    run = wandb.init(
        project=(earlier or {}).get("project") or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
        entity=(earlier or {}).get("entity") or os.environ.get("WANDB_ENTITY") or None,
        group=(earlier or {}).get("group") or os.environ.get("WANDB_RUN_GROUP") or model_short,
        job_type=job_type,
        name=name if name and name != str(output_dir) else f"{model_short}/{variant}",
        id=(earlier or {}).get("id"),
        resume="allow" if earlier else None,
        config={
            CONFIG_KEY: {
                "stage": job_type,
                "model_short_name": model_short,
                "variant": variant,
                "output_dir": str(output_dir),
            }
        },
        reinit="finish_previous",
    )
    atomic_write_json(output_dir / RUN_RECORD_FILE, run_record(run))
    logger.info("W&B run %s (%s, group %s): %s", run.id, run_record(run)["mode"], run.group, run.name)
    return run


def finish_training_run(run) -> dict | None:
    """The record of the stage's W&B run (for its manifest), the run finished; None without one."""
    if run is None:
        return None
    record = run_record(run)
    run.finish()
    return record


def training_step(manifest: dict) -> int | None:
    """The optimizer step a stage folder's model was saved at (RLVR ``global_step``, SFT ``train.global_step``)."""
    step = manifest.get("global_step", (manifest.get("train") or {}).get("global_step"))
    return step if isinstance(step, int) else None
