"""One writer per eval folder: ``<completions_dir>/.writer.lock`` names the process that samples into it.

The lock is a file created exclusively (``O_CREAT | O_EXCL``) holding the owner's pid, host and start time.
A second evaluation of the same checkpoint and run into the same folder is refused with one line naming the
owner. A lock left by a process that is gone (same host, pid not alive) is taken over with a notice; a lock
from another host is never taken over (its pid cannot be checked from here): delete it by hand once that host's
run has ended."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

logger = logging.getLogger(__name__)
LOCK_NAME = ".writer.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def read_lock(folder: Path) -> dict | None:
    path = Path(folder) / LOCK_NAME
    try:
        owner = json.loads(path.read_text())
        return owner if isinstance(owner, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable or half-written: treated as held by an unknown owner on this host


def live_owner(folder: Path) -> dict | None:
    """The lock's owner when it is another process that still runs (or one on another host), else None."""
    owner = read_lock(folder)
    if owner is None:
        return None
    pid, host = owner.get("pid"), owner.get("host")
    if host not in (None, socket.gethostname()):
        return owner
    if isinstance(pid, int) and pid != os.getpid() and _alive(pid):
        return owner
    return None


def describe(owner: dict) -> str:
    return f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')} (since {owner.get('started', '?')})"


def held_error(folder: Path, owner: dict) -> str:
    return (
        f"{folder} is being written by {describe(owner)}: one evaluation per folder; wait for it, stop it, or "
        f"set run_name to a new name (a lock of a finished run on another host: delete {Path(folder) / LOCK_NAME})"
    )


class WriterLock:
    """``with WriterLock(folder):`` holds the folder's lock; ValueError (one line) when another process has it."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.held = False

    def acquire(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        record = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        )
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = live_owner(self.folder)
                if owner is not None:
                    raise ValueError(held_error(self.folder, owner)) from None
                stale = read_lock(self.folder) or {}
                logger.warning(
                    "%s: taking over the lock of %s, which is no longer running",
                    self.folder,
                    describe(stale),
                )
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(record + "\n")
            self.held = True
            return
        raise ValueError(f"{self.path}: could not take the lock (another process keeps taking it)")

    def release(self) -> None:
        if self.held:
            owner = read_lock(self.folder)
            if owner and owner.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
