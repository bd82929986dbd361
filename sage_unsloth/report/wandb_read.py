"""The report's W&B reader (``--from_wandb``): the kit's runs read back from W&B into a results folder.

Two sources, one result:

- ``ENTITY/PROJECT``: the W&B server, through the wandb package's public API (``wandb.Api().runs``, each run's
  ``config``, ``scan_history()`` and ``file(path).download()`` for its tables);
- a folder of local runs (``wandb/``, one ``offline-run-*`` / ``run-*`` folder, or a folder holding ``wandb/``):
  each ``run-<id>.wandb`` read with the wandb package's own reader (sage_unsloth/compat.py,
  ``wandb_transaction_log``), for users who never synced; the folders of one run id (a run resumed offline, as
  stage 3 does) are read as one run, in the order they were started.

Every evaluation stage 3 logged (the keys: sage_unsloth/runtime/wandb_runs.py) becomes ``<into>/<model>/<run>/`` with the
passk.csv, per_problem.csv and manifest.json the eval stage wrote, and, when it was logged into the run that
trained the checkpoint, ``training_run/`` beside them: that run's stage record (manifest.json: stage, model, variant,
KL placement) and its training log rebuilt from the W&B history (log_history.jsonl). The report then reads that
folder with the same loader as a local one (sage_unsloth/report/loading.py), so both paths share its checks; the
completions behind the reasoning patterns are not logged to W&B (too large): the report reads them where the eval
manifest says, when that folder is on this machine.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sage_unsloth.runtime import layout
from sage_unsloth.runtime import wandb_runs as keys
from sage_unsloth.runtime.manifest import MANIFEST_NAME, atomic_write_json, atomic_write_text
from sage_unsloth.runtime.results import (
    PAPER_AVERAGE,
    PASSK_COLUMNS,
    PASSK_FILE,
    PER_PROBLEM_COLUMNS,
    PER_PROBLEM_FILE,
    TRAINING_RUN_DIR,
)
from sage_unsloth.runtime.training_log import LOG_HISTORY_FILE, log_line

log = logging.getLogger(__name__)

ONLINE_SOURCE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
MARKER = ".from_wandb.json"  # in a folder this reader wrote: what it holds (the only folder it replaces)
_NOT_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # W&B's JSON for them


@dataclass
class LoggedRun:
    """One W&B run as the reader sees it, from either source."""

    record: dict  # id, project, entity, group, job_type, name, source
    config: dict
    rows: list[dict]  # history rows in logged order; a table is {"_type": "table-file", "path": ...}
    table: Callable[[str], dict]  # a table file's path -> {"columns": [...], "data": [[...], ...]}
    order: tuple = ()  # sorts the runs: (start time, ...)


@dataclass
class Evaluation:
    """One evaluation stage 3 logged: its results as the eval stage wrote them, and the run it was logged into."""

    model: str
    run: str
    passk: pd.DataFrame
    per_problem: pd.DataFrame | None
    manifest: dict
    host: LoggedRun
    logged_at: float = 0.0  # the row's _timestamp: where one evaluation was logged twice, the later is kept


def source_kind(source: str) -> str:
    """ "offline" (a folder or run file that exists) or "online" (ENTITY/PROJECT); anything else is one line."""
    if Path(source).expanduser().exists():
        return "offline"
    if ONLINE_SOURCE.match(source):
        return "online"
    raise FileNotFoundError(
        f"--from_wandb {source}: neither a folder of W&B runs (wandb/, an offline-run-* folder) on this machine nor "
        "ENTITY/PROJECT"
    )


# ------------------------------------------------------------------------------------------------- history rows
def _plain(value):
    return _NOT_FINITE.get(value, value) if isinstance(value, str) else value


def normalise_row(item: dict) -> dict:
    """A history row with W&B's non-finite strings as floats and each table as one {"_type", "path"} value (the
    transaction log writes a table's fields as ``<key>._type``, ``<key>.path``, ...; the API nests them)."""
    tables = {k[: -len("._type")] for k, v in item.items() if k.endswith("._type") and v == "table-file"}
    row = {}
    for key, value in item.items():
        table = next((t for t in tables if key.startswith(f"{t}.")), None)
        if table is not None:
            row[table] = {"_type": "table-file", "path": item.get(f"{table}.path")}
        elif isinstance(value, dict) and value.get("_type") == "table-file":
            row[key] = {"_type": "table-file", "path": value.get("path")}
        else:
            row[key] = _plain(value)
    return row


# ------------------------------------------------------------------------------------------------- offline
def offline_run_files(folder: Path) -> list[Path]:
    """The transaction logs under ``folder``: a run file, a run folder, a wandb folder, or a folder holding wandb/."""
    if folder.is_file():
        return [folder]
    for pattern in (
        "run-*.wandb",
        "*run-*/run-*.wandb",
        "wandb/*run-*/run-*.wandb",
        ".wandb/*run-*/run-*.wandb",
    ):
        found = sorted(folder.glob(pattern))
        if found:
            return found
    return []


def _segment(path: Path) -> dict:
    """One run file's run record, config and history (a run resumed elsewhere has several such segments)."""
    from sage_unsloth.compat import wandb_transaction_log

    segment: dict = {"config": {}, "rows": [], "folder": path.parent, "run": {}}
    for record in wandb_transaction_log(path):
        kind = record.get("type")
        body = record.get(kind) or {}
        if kind == "run":
            segment["run"] = body
            segment["config"].update((body.get("config") or {}).get("update") or {})
        elif kind == "config":
            segment["config"].update(body.get("update") or {})
        elif kind == "history":
            segment["rows"].append(normalise_row(body.get("item") or {}))
    return segment


def _local_tables(folders: list[Path]) -> Callable[[str], dict]:
    """Reads a table file of a run from the ``files/`` of whichever of its folders holds it."""
    roots = [(folder / "files").resolve() for folder in folders]

    def read(path: str) -> dict:
        for root in roots:
            target = (root / path).resolve()
            if target.is_relative_to(root) and target.is_file():
                return json.loads(target.read_text(encoding="utf-8"))
        raise FileNotFoundError(
            f"{', '.join(map(str, folders))}: table file {path} not found in the run's files/"
        )

    return read


def _first_of(segments: list[dict]) -> Callable[[str], object]:
    """A run record's field from the first segment that has it (a resumed segment may lack the group)."""
    return lambda name: next((s["run"].get(name) for s in segments if s["run"].get(name)), None)


def offline_runs(folder: str | Path, group: str | None = None) -> list[LoggedRun]:
    """The runs of the transaction logs under ``folder`` (optionally only those of W&B group ``group``)."""
    folder = Path(folder).expanduser()
    files = offline_run_files(folder)
    if not files:
        raise FileNotFoundError(
            f"--from_wandb {folder}: no W&B run files (offline-run-*/run-*.wandb) there: point at the wandb/ folder "
            "the stages logged into (WANDB_DIR, else ./wandb)"
        )
    by_id: dict[str, list[dict]] = {}
    for path in files:
        segment = _segment(path)
        if segment["run"].get("run_id"):
            by_id.setdefault(segment["run"]["run_id"], []).append(segment)
    runs = []
    for run_id, segments in by_id.items():
        segments.sort(key=lambda s: (s["run"].get("start_time") or "", str(s["folder"])))
        first = _first_of(segments)
        config = {k: v for s in segments for k, v in s["config"].items()}
        record = {
            "id": run_id,
            "project": first("project"),
            "entity": first("entity"),
            "group": first("run_group"),
            "job_type": first("job_type"),
            "name": first("display_name"),
            "source": [str(s["folder"]) for s in segments],
        }
        rows = [row for s in segments for row in s["rows"]]
        reader = _local_tables([s["folder"] for s in segments])
        runs.append(
            LoggedRun(
                record, config, rows, reader, order=(segments[0]["run"].get("start_time") or "", run_id)
            )
        )
    return [r for r in sorted(runs, key=lambda r: r.order) if group is None or r.record["group"] == group]


# ------------------------------------------------------------------------------------------------- online
def online_runs(path: str, group: str | None = None, *, cache: Path, api=None) -> list[LoggedRun]:
    """The runs of W&B project ``ENTITY/PROJECT`` (optionally one group), through the wandb package's public API;
    their table files are downloaded into ``cache``."""
    if api is None:
        api = keys.import_wandb("--from_wandb").Api()
    runs = []
    for run in api.runs(path, filters={"group": group} if group else {}):
        if keys.MANIFEST_KEY not in run.summary:  # no evaluation logged into it: its history is not read
            continue
        folder = cache / str(run.id)

        def read(file_path: str, run=run, folder=folder) -> dict:
            with run.file(file_path).download(root=str(folder), replace=True) as fh:
                return json.load(fh)

        record = {
            "id": run.id,
            "project": getattr(run, "project", None) or path.split("/")[1],
            "entity": getattr(run, "entity", None) or path.split("/")[0],
            "group": run.group or None,
            "job_type": run.job_type or None,
            "name": run.name or None,
            "source": getattr(run, "url", None) or f"{path}/{run.id}",
        }
        rows = [normalise_row(dict(row)) for row in run.scan_history()]
        runs.append(
            LoggedRun(
                record, dict(run.config), rows, read, order=(str(getattr(run, "created_at", "")), run.id)
            )
        )
    return sorted(runs, key=lambda r: r.order)


def read_runs(source: str, group: str | None, cache: Path, api=None) -> list[LoggedRun]:
    if source_kind(source) == "offline":
        return offline_runs(source, group)
    return online_runs(source, group, cache=cache, api=api)


# ------------------------------------------------------------------------------------------------- evaluations
def _table(run: LoggedRun, row: dict, key: str) -> pd.DataFrame | None:
    """The table a row logged under ``key``, None when it logged none there."""
    ref = row.get(key)
    if not isinstance(ref, dict) or ref.get("_type") != "table-file" or not ref.get("path"):
        return None
    table = run.table(ref["path"])
    data = [[_plain(v) for v in values] for values in table.get("data") or []]
    return pd.DataFrame(data, columns=table.get("columns"))


def evaluation_of(run: LoggedRun, row: dict) -> Evaluation | None:
    """The evaluation a history row holds (None for any other row)."""
    manifest_frame = _table(run, row, keys.MANIFEST_KEY)
    if manifest_frame is None:
        return None
    where = f"W&B run {run.record['id']}"
    try:
        manifest = json.loads(manifest_frame[keys.MANIFEST_COLUMN].iloc[0])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{where}: its {keys.MANIFEST_KEY} table is not the kit's ({exc}); was it logged by it?"
        ) from None
    if not isinstance(manifest, dict):
        raise ValueError(  # noqa: TRY004 - bad input from W&B: the report's one-line error
            f"{where}: its {keys.MANIFEST_KEY} holds no eval manifest; was it logged by the kit?"
        )
    model, name = str(manifest.get("model_short_name") or ""), str(manifest.get("run") or "")
    layout.check_name(model, f"{where}: its evaluation's model name", "qwen2.5-math-7b")
    layout.check_name(name, f"{where}: its evaluation's run name", "grpo_branch")
    parts = []
    for key in row:
        dataset = keys.dataset_of_table_key(key)
        frame = _table(run, row, key) if dataset else None
        if frame is not None:
            frame = frame.rename(columns={"pass@k": "pass_at_k"})
            frame.insert(0, "dataset", dataset)
            parts.append(frame)
    order = lambda d: (d == PAPER_AVERAGE, d)  # the eval stage's order: sets by name, the average last
    passk = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(PASSK_COLUMNS))
    passk = passk.sort_values(
        ["dataset", "k"], key=lambda c: c.map(order) if c.name == "dataset" else c, kind="stable"
    )
    per_problem = _table(run, row, keys.PER_PROBLEM_KEY)
    return Evaluation(
        model, name, passk.reset_index(drop=True), per_problem, manifest, run, row.get("_timestamp", 0)
    )


def evaluations(runs: list[LoggedRun]) -> dict[tuple[str, str], Evaluation]:
    """Every evaluation the runs hold, by (model, run); where one was logged twice, the later."""
    found: dict[tuple[str, str], Evaluation] = {}
    for run in runs:
        for row in run.rows:
            evaluation = evaluation_of(run, row) if keys.MANIFEST_KEY in row else None
            if evaluation is None:
                continue
            key = (evaluation.model, evaluation.run)
            if key not in found or evaluation.logged_at >= found[key].logged_at:
                found[key] = evaluation
    return found


# ------------------------------------------------------------------------------------------------- training runs
def log_history(rows: list[dict]) -> list[dict]:
    """The Trainer's log entries rebuilt from a training run's W&B history: transformers logs each entry's keys
    as ``train/<key>`` with ``train/global_step``; one entry per step, the later where a step was logged again
    (a resumed run logs the steps after its checkpoint again, as log_history.jsonl's rewrite keeps them)."""
    by_step: dict[int, dict] = {}
    prefix = "train/"
    for row in rows:
        if keys.STEP_KEY not in row:
            continue
        entry = {k[len(prefix) :]: v for k, v in row.items() if k.startswith(prefix) and k != keys.STEP_KEY}
        if not set(entry) - {"epoch"}:  # an evaluation's row, or the end-of-training summary's epoch alone
            continue
        step = int(row[keys.STEP_KEY])
        by_step.setdefault(step, {}).update(entry, step=step)
    return [by_step[step] for step in sorted(by_step)]


def training_record(run: LoggedRun) -> dict | None:
    """A stage manifest for the training run ``run`` (stage, model, variant, KL placement, its log), None when the
    run is not one of the kit's training runs."""
    sage = run.config.get(keys.CONFIG_KEY)
    if not isinstance(sage, dict) or sage.get("stage") not in keys.TRAINING_JOB_TYPES:
        return None
    return {
        "stage": sage["stage"],
        "model_short_name": sage.get("model_short_name"),
        "variant": sage.get("variant"),
        "config": {"training": {"sage_kl_placement": run.config.get("sage_kl_placement", "loss")}},
        "log_history": LOG_HISTORY_FILE,
        "wandb": run.record,
    }


# ------------------------------------------------------------------------------------------------- the folder
def _claim(into: Path) -> None:
    """Empty ``into`` of what this reader wrote there before; a folder it did not write is refused in one line."""
    marker = into / MARKER
    ours = (
        layout.REPORT_MD,
        layout.REPORT_DIR,
    )  # the report's own outputs; hidden names: the lock, the marker
    if into.is_dir() and any(not p.name.startswith(".") and p.name not in ours for p in into.iterdir()):
        if not marker.is_file():
            raise FileExistsError(
                f"{into} holds files the W&B reader did not write: pass another --results (the runs read from W&B "
                "go to <results>/wandb/)"
            )
        for name in json.loads(marker.read_text(encoding="utf-8")).get("runs", []):
            model, _, run = name.partition("/")
            target = into / model / run
            if target.resolve().is_relative_to(into.resolve()) and target.is_dir():
                shutil.rmtree(target)
                if not any(target.parent.iterdir()):
                    target.parent.rmdir()


def write_evaluation(evaluation: Evaluation, into: Path) -> Path:
    folder = into / evaluation.model / evaluation.run
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        folder / PASSK_FILE, evaluation.passk.reindex(columns=list(PASSK_COLUMNS)).to_csv(index=False)
    )
    if evaluation.per_problem is not None:
        frame = evaluation.per_problem.reindex(columns=list(PER_PROBLEM_COLUMNS))
        atomic_write_text(folder / PER_PROBLEM_FILE, frame.to_csv(index=False))
    atomic_write_json(folder / MANIFEST_NAME, {**evaluation.manifest, "wandb": evaluation.host.record})
    training = training_record(evaluation.host)
    if training is not None:
        entries = log_history(evaluation.host.rows)
        atomic_write_text(folder / TRAINING_RUN_DIR / LOG_HISTORY_FILE, "".join(log_line(e) for e in entries))
        atomic_write_json(folder / TRAINING_RUN_DIR / MANIFEST_NAME, training)
    return folder


def read_wandb(source: str, group: str | None, into: str | Path, api=None) -> list[str]:
    """Write every evaluation the W&B runs of ``source`` (ENTITY/PROJECT or a folder; ``group``: one W&B group)
    hold into ``into`` as results folders; returns their ``<model>/<run>`` names."""
    into = Path(into)
    runs = read_runs(source, group, into / ".wandb-files", api=api)
    found = evaluations(runs)
    if not found:
        where = f"{source}" + (f" (group {group})" if group else "")
        raise FileNotFoundError(
            f"--from_wandb: no evaluation of the kit in the {len(runs)} W&B run(s) of {where}: log stage 3 with "
            "--report_to wandb"
        )
    _claim(into)
    names = []
    for (model, run), evaluation in sorted(found.items()):
        write_evaluation(evaluation, into)
        names.append(f"{model}/{run}")
        log.info("%s/%s: read from W&B run %s", model, run, evaluation.host.record["id"])
    atomic_write_json(into / MARKER, {"source": source, "group": group, "runs": names})
    return names
