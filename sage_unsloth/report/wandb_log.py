"""Optional: log the finished report to a W&B run of its own (job_type "report", ``--wandb_project``, joining
``--wandb_group``); ``wandb`` is imported lazily.

Logged: the report's tables (``report/<name>``), its plots (``plots/<name>``), the markdown, the paper's own tables
as reference tables (``paper/passk``, ``paper/reasoning_patterns``: results/paper/*.csv with their sources), and
``report/runs_vs_paper`` (:func:`runs_vs_paper`): one row per run or paper row, dataset and k, ready for a W&B line
or bar panel of pass@k against k (x ``k``, y ``pass_at_k``, grouped by ``series``, filtered by ``dataset``) with the
runs' bootstrap intervals. The report reads W&B too: ``--from_wandb`` (sage_unsloth/report/wandb_read.py).
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd

from sage_unsloth.report.paper import map_run, paper_value

RUNS_VS_PAPER_COLUMNS = (
    "series",  # "<model>/<run>" for a run, "paper: <paper model> / <method>" for the paper's row
    "source",  # "run" | "paper"
    "paper_model",
    "method",  # the paper's method the run maps to (the report's mapping), or the paper row's
    "dataset",
    "k",
    "pass_at_k",
    "ci_low",  # the run's bootstrap interval over problems (empty for the paper)
    "ci_high",
    "paper",  # the paper's value at the same dataset and k, where it has one
    "diff",  # pass_at_k - paper
    "primary",  # the paper's number traced to a primary source (results/paper/*.csv)
)


def runs_vs_paper(curves: pd.DataFrame, published: pd.DataFrame, mapping: dict | None = None) -> pd.DataFrame:
    """Every reported (run, dataset, k) of ``curves`` (the report's passk_all_k table) with the paper's value where
    the paper has one, then every published point of the paper rows the runs map to."""
    rows, paper_rows = [], {}
    for _, point in curves.iterrows():
        row = map_run(point["model"], point["run"], mapping)
        k = int(point["k"])
        paper = paper_value(published, row, point["dataset"], k)
        if row.model and row.method:
            paper_rows[(row.model, row.method)] = None
        rows.append(
            {
                "series": f"{point['model']}/{point['run']}",
                "source": "run",
                "paper_model": row.model,
                "method": row.method,
                "dataset": point["dataset"],
                "k": k,
                "pass_at_k": float(point["value"]),
                "ci_low": float(point["ci_low"]),
                "ci_high": float(point["ci_high"]),
                "paper": paper[0] if paper else np.nan,
                "diff": float(point["value"]) - paper[0] if paper else np.nan,
                "primary": paper[1] if paper else None,
            }
        )
    for model, method in paper_rows:
        own = published[(published["model"] == model) & (published["method"] == method)]
        for _, point in own.sort_values(["dataset", "k"], kind="stable").iterrows():
            rows.append(
                {
                    "series": f"paper: {model} / {method}",
                    "source": "paper",
                    "paper_model": model,
                    "method": method,
                    "dataset": point["dataset"],
                    "k": int(point["k"]),
                    "pass_at_k": float(point["value"]),
                    "ci_low": np.nan,
                    "ci_high": np.nan,
                    "paper": float(point["value"]),
                    "diff": np.nan,
                    "primary": bool(point["primary"]),
                }
            )
    return pd.DataFrame(rows, columns=list(RUNS_VS_PAPER_COLUMNS))


def _table(wandb, frame: pd.DataFrame):
    return wandb.Table(dataframe=frame.astype(object).where(frame.notna(), None))


def log_report(
    project: str,
    *,
    tables: dict[str, pd.DataFrame],
    images: dict[str, Path],
    markdown: str,
    entity: str | None = None,
    name: str = "report",
    group: str | None = None,
    paper: dict[str, pd.DataFrame] | None = None,
) -> str:
    """Log the report's tables (``report/<key>``), plots and markdown, and the paper's tables (``paper/<key>``) to a
    new W&B run (job_type "report", in ``group``); returns the run's dir."""
    from sage_unsloth.runtime.wandb_runs import REPORT_JOB_TYPE, import_wandb

    wandb = import_wandb("--wandb_project")
    run = wandb.init(
        project=project,
        entity=entity,
        name=name,
        group=group,
        job_type=REPORT_JOB_TYPE,
        reinit="finish_previous",
    )
    try:
        payload = {f"report/{key}": _table(wandb, frame) for key, frame in tables.items() if not frame.empty}
        payload.update(
            {f"paper/{key}": _table(wandb, frame) for key, frame in (paper or {}).items() if not frame.empty}
        )
        payload.update({f"plots/{key}": wandb.Image(str(path)) for key, path in images.items()})
        payload["report/markdown"] = wandb.Html(f"<pre>{html.escape(markdown)}</pre>")
        run.log(payload)
        return str(run.dir)
    finally:
        run.finish()
