"""The TrainerCallback that streams a stage's log to ``<output_dir>/log_history.jsonl``.

The format, the resume rule and the reader are in sage_unsloth/runtime/training_log.py; this module is the
training-side writer (it imports transformers, which the report does not need).
"""

from __future__ import annotations

import os
from pathlib import Path

from transformers import TrainerCallback

from sage_unsloth.runtime.manifest import atomic_write_text
from sage_unsloth.runtime.training_log import LOG_HISTORY_FILE, log_line


class LogHistoryWriter(TrainerCallback):
    """Streams ``state.log_history`` to ``<output_dir>/log_history.jsonl`` (main process only)."""

    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir) / LOG_HISTORY_FILE

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            # A fresh run starts an empty file; a resumed one starts from what its checkpoint had logged.
            atomic_write_text(self.path, "".join(log_line(entry) for entry in state.log_history))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not state.log_history:
            return
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(log_line(state.log_history[-1]))  # Trainer.log appended it just before calling us
            fh.flush()
            os.fsync(fh.fileno())
