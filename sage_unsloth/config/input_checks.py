"""Bad input found before any model loads, each as one line naming the file or field and the fix.

Shared by the training stages (and stage 3 for output folders): local data files that are unreadable,
truncated or empty (naming the line), output folders that are files or not writable, W&B asked for without wandb
installed or with no key and not offline, ``backend=unsloth`` on a machine without a GPU, and a truncated
adapter. Stdlib only, apart from the CUDA probe (torch) of :func:`check_unsloth_has_gpu`.
"""

from __future__ import annotations

import json
import netrc
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from sage_unsloth.runtime.checkpoints import safetensors_problem

ADAPTER_WEIGHTS = "adapter_model.safetensors"
UNSLOTH_ON_CPU_FLAG = "--unsloth_without_gpu true"


# ---------------------------------------------------------------------------------------------- data files
def check_data_file(
    path: str | os.PathLike,
    field: str = "dataset_path",
    row_problem: Callable[[dict], str | None] | None = None,
) -> None:
    """A local JSONL/JSON/parquet file must be readable, non-empty and whole; ValueError names the line. With
    ``row_problem`` (row -> what is wrong with it, e.g. "has no 'expected_answer'", or None) each JSON row is read
    by the stage's own rule too, naming its line (a parquet file's rows are the loader's to check)."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{field}={path} does not exist: fix the path") from None
    except OSError as exc:
        raise ValueError(unreadable_line(f"{field}={path}", exc)) from None
    if not data.strip():
        raise ValueError(f"{field}={path} is empty: point {field} to a file with rows")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        if len(data) < 12 or data[:4] != b"PAR1" or data[-4:] != b"PAR1":
            raise ValueError(f"{field}={path} is not a whole parquet file (truncated?): rewrite it")
        return
    if suffix == ".json":
        try:
            document = json.loads(data)
        except ValueError:
            pass  # else it must be JSON lines
        else:  # one JSON document (datasets reads a list of rows or a dict of columns)
            rows = document if isinstance(document, list) else []
            for number, row in enumerate(rows, 1):
                if row_problem is not None and isinstance(row, dict) and (problem := row_problem(row)):
                    raise ValueError(f"{field}={path} row {number} {problem}: fix or remove that row")
            return
    _check_json_lines(data, path, field, row_problem)


def unreadable_line(what: str, exc: OSError) -> str:
    """``WHAT cannot be read (why): fix its permissions``, for a data or config file the stage cannot open."""
    return f"{what} cannot be read ({exc.strerror or exc}): fix its permissions"


def _check_json_lines(data: bytes, path: Path, field: str, row_problem=None) -> None:
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            last = number == len(data.splitlines())
            why = "truncated" if last and not data.endswith(b"\n") else "not JSON"
            raise ValueError(
                f"{field}={path} line {number} is {why} ({type(exc).__name__}: {str(exc).splitlines()[0]}): "
                "fix or remove that line"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(  # noqa: TRY004  (bad input: the stages report ValueError in one line)
                f"{field}={path} line {number} is not a JSON object (one row per line): fix it"
            )
        if row_problem is not None and (problem := row_problem(row)):
            raise ValueError(f"{field}={path} line {number} {problem}: fix or remove that line")


# ---------------------------------------------------------------------------------------------- output folders
def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long: not there (creating it says why)
        return False


def check_output_folder(folder: str | os.PathLike, field_name: str) -> None:
    """An output folder must be a folder (or not exist yet, below one) that this process can write into: the
    first folder to create is created and removed again, so a refusal that permissions do not show (a special or
    read-only file system, a name too long, root on /sys) is this one line too."""
    path = Path(folder).expanduser().absolute()
    probe, missing = path, None
    while not _exists(probe):
        if probe.parent == probe:
            break
        probe, missing = probe.parent, probe
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"{field_name}={folder}: {probe} is a file, not a folder; pick another {field_name}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{field_name}={folder}: {probe} is not writable; pick another {field_name}")
    if missing is not None:
        try:
            missing.mkdir()
        except FileExistsError:  # another process made it meanwhile
            return
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise ValueError(
                f"{field_name}={folder}: cannot create {missing} ({reason}); pick another {field_name}"
            )
        try:
            missing.rmdir()
        except OSError:  # another process wrote into it meanwhile: it stays
            pass


# ---------------------------------------------------------------------------------------------- W&B
def wandb_has_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return (
            netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
        )  # where `wandb login` writes
    except (OSError, netrc.NetrcParseError):
        return False


def check_wandb_installed(field_name: str) -> None:
    """W&B is an extra of the kit: a field that asks for it without wandb installed is one line naming the
    extra."""
    import importlib.util

    from sage_unsloth.runtime.wandb_runs import INSTALL_HINT

    if importlib.util.find_spec("wandb") is None:
        raise ValueError(f"{field_name}: wandb is not installed: {INSTALL_HINT}, or leave W&B off")


def check_wandb(report_to) -> None:
    """``report_to: wandb`` needs wandb installed and a key (``wandb login`` or WANDB_API_KEY) unless W&B runs
    offline; ``report_to: all`` (the installed integrations) asks for W&B only where wandb is installed."""
    from sage_unsloth.runtime.wandb_runs import reports_to_wandb

    if not reports_to_wandb(report_to):
        return
    check_wandb_installed("report_to=wandb")
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or wandb_has_key():
        return
    raise ValueError(
        "report_to=wandb: no W&B API key and WANDB_MODE is not offline: run `wandb login` (or set WANDB_API_KEY), "
        "set WANDB_MODE=offline to log locally, or pass --report_to none"
    )


# ---------------------------------------------------------------------------------------------- Unsloth
def check_unsloth_has_gpu(backend: str, forced: bool) -> None:
    """``backend=unsloth`` without a GPU trains through Unsloth's CPU fallback, several times slower than
    ``backend=trl``: refused unless ``unsloth_without_gpu`` says it is meant."""
    if backend != "unsloth" or forced:
        return
    from sage_unsloth.runtime.backend import cuda_available

    if not cuda_available():
        raise ValueError(
            "backend=unsloth: this machine has no GPU (Unsloth would run its slow CPU fallback): pass "
            f"--backend trl, or {UNSLOTH_ON_CPU_FLAG} to run the fallback anyway"
        )


# ---------------------------------------------------------------------------------------------- adapters
def check_adapter(folder: str | os.PathLike, field: str) -> None:
    """A stage output's LoRA adapter must be whole (a truncated file is named, before any model loads)."""
    path = Path(folder) / ADAPTER_WEIGHTS
    if path.exists() and (problem := safetensors_problem(path)) is not None:
        raise ValueError(f"{field}={folder}: {problem}: re-run the stage that wrote it, or restore the file")
