"""The training log of a stage, in its own output folder: ``log_history.jsonl``.

One JSON object per line, exactly the Trainer's ``state.log_history`` entries (the logged metrics plus
``step`` and ``epoch``; TRL's ``reward``, ``kl``, ``entropy``, the SAGE trainer's ``sage/*``), keys sorted.
Each line is appended, flushed and fsync'ed when the Trainer logs it, so a killed run keeps every step it
logged. On resume from ``checkpoint-N`` the file is rewritten (atomically) from the checkpoint's own
``log_history`` before training continues: lines the killed run logged after step N are dropped (the
resumed run logs them again) and none logged up to step N is lost or repeated. ``trainer_state.json``
writes floats with ``json`` too, so the rewritten lines equal the ones first written.

The writer is the TrainerCallback in sage_unsloth/runtime/log_writer.py (training side, imports transformers);
this module is the format and the reader, light enough for the report. With ``report_to: wandb`` the same
entries go to the stage's W&B run (``train/<key>``), from which the report's ``--from_wandb`` rebuilds this file
(sage_unsloth/report/wandb_read.py ``log_history``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

LOG_HISTORY_FILE = "log_history.jsonl"


def log_line(entry: dict) -> str:
    """One entry as written: JSON with sorted keys, as trainer_state.json writes it, and a newline."""
    return json.dumps(entry, sort_keys=True) + "\n"


def read_log_history(path: str | os.PathLike) -> list[dict]:
    """The entries of a ``log_history.jsonl`` (a file, or the stage folder holding one).

    A torn last line (the run was killed while writing it) is dropped; a bad line elsewhere is an error.
    """
    path = Path(path)
    if path.is_dir():
        path = path / LOG_HISTORY_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: the stage wrote no training log (re-run it with this kit)"
        )
    lines = path.read_bytes().splitlines()
    entries = []
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if number == len(lines):
                break
            what = "not valid UTF-8" if isinstance(exc, UnicodeDecodeError) else "not a JSON object"
            raise ValueError(f"{path}:{number}: {what}; the log is damaged") from None
        if not isinstance(entry, dict):
            raise ValueError(f"{path}:{number}: not a JSON object; the log is damaged")  # noqa: TRY004
        entries.append(entry)
    return entries
