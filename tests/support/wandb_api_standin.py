"""A stand-in for the W&B server at the wandb package's documented public API (``wandb.Api``), for the report's
online reader (sage_unsloth/report/wandb_read.py ``online_runs``): no test reaches a live server.

It serves the runs of offline run folders as the API hands synced runs out: ``Api.runs("ENTITY/PROJECT",
filters={"group": G})`` -> runs with ``id``, ``name``, ``group``, ``job_type``, ``project``, ``entity``, ``url``,
``created_at``, ``config`` (a dict), ``summary`` (the last value of each key), ``scan_history()`` (the rows, each table
as the nested ``{"_type": "table-file", "path": ...}`` the API returns) and ``file(path).download(root, replace)``
(an open file, as the API's File.download returns). The offline folders are read with wandb's own reader
(sage_unsloth/compat.py); the folders of one run id become one run, as ``wandb sync`` makes them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sage_unsloth.compat import wandb_transaction_log


def nested(item: dict) -> dict:
    """A transaction-log history item (a table's fields as ``<key>.<field>``) as the API's row (one dict per
    table)."""
    tables = {k[: -len("._type")] for k in item if k.endswith("._type")}
    row: dict = {}
    for key, value in item.items():
        base, _, field = key.rpartition(".")
        if base in tables:
            row.setdefault(base, {})[field] = value
        else:
            row[key] = value
    return row


class StandInFile:
    def __init__(self, source: Path, name: str):
        self.source, self.name = source, name

    def download(self, root: str = ".", replace: bool = False, exist_ok: bool = False):
        target = Path(root) / self.name
        if target.exists() and not replace:
            if exist_ok:
                return open(target)
            raise ValueError("File already exists, pass replace=True to overwrite")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.source, target)
        return open(target)


class StandInRun:
    def __init__(self, entity: str, project: str, segments: list[tuple[Path, list[dict]]]):
        head = [next(r["run"] for r in records if r["type"] == "run") for _, records in segments]
        self.id = head[0]["run_id"]
        self.name = next((h.get("display_name") for h in head if h.get("display_name")), self.id)
        self.group = next((h.get("run_group") for h in head if h.get("run_group")), None)
        self.job_type = next((h.get("job_type") for h in head if h.get("job_type")), None)
        self.entity, self.project = entity, project
        self.url = f"https://wandb.example/{entity}/{project}/runs/{self.id}"
        self.created_at = head[0].get("start_time")
        self.config: dict = {}
        self._rows, self._folders = [], [folder for folder, _ in segments]
        for _, records in segments:
            for record in records:
                if record["type"] == "run":
                    self.config.update((record["run"].get("config") or {}).get("update") or {})
                elif record["type"] == "config":
                    self.config.update(record["config"].get("update") or {})
                elif record["type"] == "history":
                    self._rows.append(nested(record["history"]["item"]))
        self.config.pop("_wandb", None)
        self.summary = {k: v for row in self._rows for k, v in row.items()}

    def scan_history(self, keys=None, page_size=1000, min_step=0, max_step=None, use_cache=True):
        return iter([dict(row) for row in self._rows])

    def file(self, name: str) -> StandInFile:
        for folder in self._folders:
            if (folder / "files" / name).is_file():
                return StandInFile(folder / "files" / name, name)
        raise KeyError(name)


class StandInApi:
    """``wandb.Api`` over the offline runs under ``wandb_dir``, all in project ``ENTITY/PROJECT``."""

    def __init__(self, wandb_dir: Path, entity: str = "me", project: str = "sage-unsloth"):
        self.entity, self.project = entity, project
        by_id: dict[str, list] = {}
        for log_file in sorted(Path(wandb_dir).glob("*run-*/run-*.wandb")):
            records = wandb_transaction_log(log_file)
            run_id = next(r["run"]["run_id"] for r in records if r["type"] == "run")
            by_id.setdefault(run_id, []).append((log_file.parent, records))
        self._runs = [StandInRun(entity, project, segments) for segments in by_id.values()]
        self.calls: list[tuple[str, dict]] = []

    def runs(self, path: str, filters: dict | None = None, **kwargs):
        self.calls.append((path, dict(filters or {})))
        if path != f"{self.entity}/{self.project}":
            return []
        group = (filters or {}).get("group")
        return [run for run in self._runs if group is None or run.group == group]
