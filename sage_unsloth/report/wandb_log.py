"""Optional: log the finished report (tables, plots, markdown) to a W&B run; ``wandb`` is imported lazily.

The report reads nothing from W&B: training curves come from each RLVR folder's log_history.jsonl
(sage_unsloth/report/training.py). This module only writes, for users who keep their runs on W&B.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd


def log_report(
    project: str,
    *,
    tables: dict[str, pd.DataFrame],
    images: dict[str, Path],
    markdown: str,
    entity: str | None = None,
    name: str = "report",
) -> str:
    """Log the report's tables and plots to a new W&B run (job_type "report"); returns the run's dir."""
    import wandb

    run = wandb.init(project=project, entity=entity, name=name, job_type="report", reinit="finish_previous")
    try:
        payload = {
            f"report/{key}": wandb.Table(dataframe=frame.astype(object).where(frame.notna(), None))
            for key, frame in tables.items()
            if not frame.empty
        }
        payload.update({f"plots/{key}": wandb.Image(str(path)) for key, path in images.items()})
        payload["report/markdown"] = wandb.Html(f"<pre>{html.escape(markdown)}</pre>")
        run.log(payload)
        return str(run.dir)
    finally:
        run.finish()
