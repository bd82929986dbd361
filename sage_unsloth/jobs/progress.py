"""What a running step of a job graph shows on the console: its log's last progress bar and metrics, or the count
of the files it has written so far."""

from __future__ import annotations

import os
import re
from pathlib import Path

_TQDM = re.compile(r"^(.*?)(\d+)/(\d+) \[([\d:]+)<([\d:?]+),\s*([\d.?]+)\s*(it/s|s/it)", re.MULTILINE)
_NOT_PROGRESS = (
    "Loading",
    "Writing",
    "shards",
    "Map",
    "Filter",
    "Generating",
)  # library bars, not the step's
_METRIC = re.compile(r"'(reward|loss)': '?(-?[\d.]+(?:e-?\d+)?)'?")


def progress_line(log_text: str) -> str | None:
    """ "40/200 steps, 1.30 steps/s, ETA 02:03, reward 0.41" from the last tqdm bar and metrics in a log."""
    bars = [
        bar
        for bar in _TQDM.findall(log_text.replace("\r", "\n"))
        if not any(word in bar[0] for word in _NOT_PROGRESS)
    ]
    if not bars:
        return None
    _, done, total, _elapsed, remaining, rate, unit = bars[-1]
    speed = (
        ""
        if rate == "?"
        else (f"{float(rate):.2f} steps/s" if unit == "it/s" else f"{1 / max(float(rate), 1e-9):.2f} steps/s")
    )
    parts = [f"{done}/{total}", speed, f"ETA {remaining}"]
    metrics = dict(_METRIC.findall(log_text))
    parts += [f"{key} {float(metrics[key]):.3f}" for key in ("reward", "loss") if key in metrics]
    return ", ".join(p for p in parts if p)


def file_progress(pattern: str, total: int, elapsed: float) -> str:
    """ "4/10 chunks, 0.08 chunks/s, ETA 01:15" from the files written so far."""
    from glob import glob

    done = len(glob(pattern, recursive=True))
    rate = done / max(elapsed, 1e-9)
    eta = (total - done) / rate if rate > 0 else None
    eta_text = "?" if eta is None else f"{int(eta) // 60:02d}:{int(eta) % 60:02d}"
    return f"{done}/{total} chunks, {rate:.2f} chunks/s, ETA {eta_text}"


def tail(path: Path, size: int = 20000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
