"""Stage 3's W&B logging (``report_to: wandb``): one checkpoint's results into the W&B run that trained it.

The run is the one the checkpoint's stage manifest names (``wandb``: stages 1 and 2 record it), resumed by id in
the mode W&B runs in now (offline too: then a second ``offline-run-*`` folder of the same id, which ``wandb sync``
appends to the run); a checkpoint no stage of the kit trained (a base model, a hub id) gets a new run of its
group with job_type "eval". What is logged, read back from the CSVs and the manifest the stage just wrote, and
under which keys: sage_unsloth/runtime/wandb_runs.py.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from pathlib import Path

from sage_unsloth.runtime import wandb_runs as keys
from sage_unsloth.runtime.manifest import MANIFEST_NAME, read_manifest, scrub_secrets
from sage_unsloth.runtime.results import PASSK_COLUMNS, PASSK_FILE, PER_PROBLEM_COLUMNS, PER_PROBLEM_FILE

logger = logging.getLogger(__name__)

_INTEGERS = {"k", "n_problems", "n_samples", "n", "c"}
_NUMBERS = {"pass_at_k", "mean_completion_tokens"}


def read_table(path: Path, columns) -> list[dict]:
    """The rows of a results CSV the stage wrote, with the contract's columns as numbers (an empty cell: None)."""

    def value(column: str, text: str):
        if text == "":
            return None
        if column in _INTEGERS:
            return int(text)
        return float(text) if column in _NUMBERS else text

    with path.open(encoding="utf-8", newline="") as fh:
        return [{c: value(c, row.get(c) or "") for c in columns} for row in csv.DictReader(fh)]


def results_row(wandb, results: Path, manifest: dict) -> dict:
    """The one ``log`` row of a results folder (keys: sage_unsloth/runtime/wandb_runs.py)."""
    passk = read_table(results / PASSK_FILE, PASSK_COLUMNS)
    per_problem = read_table(results / PER_PROBLEM_FILE, PER_PROBLEM_COLUMNS)
    row: dict = {}
    for dataset in dict.fromkeys(r["dataset"] for r in passk):
        rows = sorted((r for r in passk if r["dataset"] == dataset), key=lambda r: r["k"])
        table = wandb.Table(
            columns=list(keys.PASSK_TABLE_COLUMNS),
            data=[[r["k"], r["pass_at_k"], r["n_problems"], r["n_samples"]] for r in rows],
        )
        row[keys.passk_table_key(dataset)] = table
        row[keys.passk_curve_key(dataset)] = wandb.plot.line(table, "k", "pass@k", title=f"{dataset}: pass@k")
        for r in {rows[0]["k"]: rows[0], rows[-1]["k"]: rows[-1]}.values():  # pass@1 and the largest k
            row[keys.passk_key(dataset, r["k"])] = r["pass_at_k"]
    row[keys.PER_PROBLEM_KEY] = wandb.Table(
        columns=list(PER_PROBLEM_COLUMNS),
        data=[
            [None if isinstance(v, float) and not math.isfinite(v) else v for v in r.values()]
            for r in per_problem
        ],
    )
    row[keys.MANIFEST_KEY] = wandb.Table(
        columns=[keys.MANIFEST_COLUMN], data=[[json.dumps(scrub_secrets(manifest), sort_keys=True)]]
    )
    for name, value in sorted((manifest.get("grading") or {}).items()):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[f"{keys.GRADING_PREFIX}{name}"] = value
    return row


def trained_by(spec: str) -> tuple[dict | None, int | None]:
    """(the W&B record of the training run behind a checkpoint, its step), (None, None) for a model no stage of
    the kit trained or trained without W&B."""
    folder = Path(spec).expanduser()
    if not (folder / MANIFEST_NAME).is_file():
        return None, None
    manifest = read_manifest(folder)
    if manifest.get("stage") not in keys.TRAINING_JOB_TYPES:
        return None, None
    return manifest.get("wandb") or None, keys.training_step(manifest)


def log_checkpoint_results(cfg, checkpoint, results: Path) -> dict:
    """Log ``results`` (a finished results folder of ``checkpoint``) to W&B; returns the record of the run."""
    wandb = keys.import_wandb("report_to=wandb")
    manifest = read_manifest(results, expect_stage="eval")
    trained, step = trained_by(checkpoint.spec)
    if trained:
        run = wandb.init(
            id=trained["id"],
            project=trained.get("project") or keys.DEFAULT_PROJECT,
            entity=trained.get("entity"),
            group=trained.get("group"),
            job_type=trained.get("job_type"),
            resume="allow",
            reinit="finish_previous",
        )
    else:
        run = wandb.init(
            project=cfg.wandb_project or os.environ.get("WANDB_PROJECT") or keys.DEFAULT_PROJECT,
            entity=cfg.wandb_entity or os.environ.get("WANDB_ENTITY") or None,
            group=cfg.wandb_group or os.environ.get("WANDB_RUN_GROUP") or checkpoint.model,
            job_type=keys.EVAL_JOB_TYPE,
            name=f"{checkpoint.model}/{checkpoint.run}",
            config={"eval": scrub_secrets(manifest.get("config") or {})},
            reinit="finish_previous",
        )
    try:
        row = results_row(wandb, results, manifest)
        if step is not None:  # plotted at the checkpoint's step, on the x-axis of the run's TRL metrics
            run.define_metric(keys.STEP_KEY)
            run.define_metric(f"{keys.EVAL_PREFIX}*", step_metric=keys.STEP_KEY)
            row[keys.STEP_KEY] = step
        run.log(row)
        record = keys.run_record(run)
    finally:
        run.finish()
    where = "the training run" if trained else "a new eval run"
    print(
        f"W&B: {checkpoint.model}/{checkpoint.run} logged into {where} {record['id']} ({record['mode']}, project "
        f"{record['project']}, group {record['group']}; {record['url'] or record['folder']})",
        flush=True,
    )
    return record
