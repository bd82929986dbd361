"""W&B input/output for the report; ``wandb`` is imported lazily, only when a W&B option is used.

Training histories come from either
  * the W&B public API (online): ``wandb.Api().run("entity/project/run_id").scan_history()``, or
  * local offline run folders (wandb/offline-run-*/run-*.wandb). wandb 0.31 ships no Python reader
    for these files (the old ``wandb.sdk.internal.datastore.DataStore`` is gone; reading is done by
    the Go ``wandb-core``). The file is the LevelDB log format (7-byte ":W&B" header, then 32 KiB
    blocks of chunks: crc32c u32, length u16, type u8 FULL/FIRST/MIDDLE/LAST); each record is a
    ``wandb.proto.wandb_internal_pb2.Record`` protobuf, decoded with wandb's own generated classes.
    History rows are ``Record.history`` items (key or nested_key, value_json). Pinned by
    tests/test_report_wandb.py, which writes an offline run with the installed wandb and reads it back.
    wandb-core flushes the log asynchronously, shortly after ``finish()``; ``run_finished`` tells whether
    the exit record is there.

TRL's GRPOTrainer logs through transformers' WandbCallback, which prefixes training metrics with
"train/": reward -> train/reward, kl -> train/kl, entropy -> train/entropy, and a metric the SAGE
trainer adds as "sage/q_mean" -> train/sage/q_mean.
"""

from __future__ import annotations

import glob
import html
import json
import logging
import math
import struct
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)

TRAINING_KEYS = ("train/reward", "train/kl", "train/entropy", "train/sage/q_mean")
_HEADER = b":W&B"
_HEADER_LEN = 7  # ":W&B" + u16 magic + u8 version
_BLOCK = 32 * 1024
_CHUNK_HEADER = 7  # crc32c u32 + length u16 + type u8
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(data: bytes) -> list[bytes]:
    """Payloads of a LevelDB-log-framed byte string (after the W&B header); a torn tail is dropped."""
    out, pending, pos = [], None, _HEADER_LEN
    while pos + _CHUNK_HEADER <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _CHUNK_HEADER:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        start, pos = pos + _CHUNK_HEADER, pos + _CHUNK_HEADER + length
        if kind == 0 or pos > len(data):  # zero padding / incomplete write of a live run
            break
        chunk = data[start:pos]
        if kind == _FULL:
            out.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE and pending is not None:
            pending += chunk
        elif kind == _LAST and pending is not None:
            out.append(pending + chunk)
            pending = None
    return out


def _number(value_json: str):
    try:
        value = json.loads(value_json)
    except json.JSONDecodeError:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # media, tables, histograms: not curves
    return value


def _item_key(item) -> str:
    return item.key if item.key else ".".join(item.nested_key)


def _run_file(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("run-*.wandb"))
        if not files:
            raise FileNotFoundError(f"{path}: no run-*.wandb file; pass a wandb/offline-run-* folder")
        path = files[0]
    return path


def _parsed_records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb  # lazy: only the protobuf classes, no wandb.init

    data = path.read_bytes()
    if not data.startswith(_HEADER):
        raise ValueError(f"{path} is not a W&B transaction log (bad header)")
    for payload in _records(data):
        record = pb.Record()
        record.ParseFromString(payload)
        yield record


def run_finished(path: str | Path) -> bool:
    """Whether the run's log holds its exit record (wandb-core flushes the log shortly after finish())."""
    path = _run_file(path)
    return path.is_file() and any(r.WhichOneof("record_type") == "exit" for r in _parsed_records(path))


def offline_run_name(path: str | Path) -> str:
    """ "<display name> (<run id>)" of an offline run, from its run record; the file stem if it has none."""
    path = _run_file(path)
    for record in _parsed_records(path):
        if record.WhichOneof("record_type") == "run":
            run = record.run
            return f"{run.display_name} ({run.run_id})" if run.display_name else run.run_id
    return path.stem


def read_offline_history(path: str | Path) -> pd.DataFrame:
    """Numeric history of an offline run (a run-*.wandb file or the offline-run-* folder holding one)."""
    rows = []
    for record in _parsed_records(_run_file(path)):
        kind = record.WhichOneof("record_type")
        items = None
        if kind == "history":
            items = record.history.item
        elif kind == "request" and record.request.WhichOneof("request_type") == "partial_history":
            items = record.request.partial_history.item
        if items is None:
            continue
        # media (tables, images) arrive flattened as nested keys [name, "_type"], [name, "size"], ...: skip them
        media = {
            item.nested_key[0]
            for item in items
            if len(item.nested_key) > 1 and item.nested_key[-1] == "_type"
        }
        row = {}
        for item in items:
            if item.nested_key and item.nested_key[0] in media:
                continue
            value = _number(item.value_json)
            if value is not None:
                row[_item_key(item)] = value
        if row:
            rows.append(row)
    frame = pd.DataFrame(rows)
    if "_step" in frame.columns:
        frame = frame.sort_values("_step", kind="stable").reset_index(drop=True)
    return frame


def read_api_history(run_path: str, keys=TRAINING_KEYS) -> pd.DataFrame:
    """History of an online run "entity/project/run_id" through the public API (needs network + login)."""
    import wandb

    run = wandb.Api().run(run_path)
    rows = []
    for row in run.scan_history():
        picked = {k: v for k, v in row.items() if k == "_step" or k in keys or k.endswith(tuple(keys))}
        picked = {
            k: v
            for k, v in picked.items()
            if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))
        }
        if len(picked) > 1:
            rows.append(picked)
    return pd.DataFrame(rows)


def resolve_key(columns, key: str) -> str | None:
    """The history column for a training key: exact, else the same without "train/", else a suffix match."""
    columns = list(columns)
    short = key.removeprefix("train/")
    for candidate in (key, short):
        if candidate in columns:
            return candidate
    return next((c for c in columns if c.endswith("/" + short)), None)


def normalise_history(frame: pd.DataFrame, keys=TRAINING_KEYS) -> pd.DataFrame:
    """Keep _step and the training keys, renamed to their canonical names."""
    out = (
        pd.DataFrame({"_step": frame["_step"]})
        if "_step" in frame.columns
        else pd.DataFrame(index=frame.index)
    )
    for key in keys:
        column = resolve_key(frame.columns, key)
        if column is not None:
            out[key] = frame[column]
    return out


def load_histories(offline: str | None = None, online: str | None = None) -> dict[str, pd.DataFrame]:
    """{run name: normalised history} from an offline-run glob and/or comma-separated API run paths."""
    histories = {}
    for folder in sorted(glob.glob(offline)) if offline else []:
        if not run_finished(folder):
            log.warning(
                "%s has no exit record (still running, crashed, or not yet flushed): history may be partial",
                folder,
            )
        histories[offline_run_name(folder)] = normalise_history(read_offline_history(folder))
    for run_path in (p.strip() for p in (online or "").split(",") if p.strip()):
        histories[run_path] = normalise_history(read_api_history(run_path))
    return histories


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
