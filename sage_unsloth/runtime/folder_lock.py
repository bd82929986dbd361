"""One writer per folder: ``<folder>/.writer.lock`` names the process that writes into it.

Every folder the kit writes a run into takes this lock for as long as it writes: a training stage's output
folder (stage 1 and 2, held by rank 0 of a multi-process run), an evaluation's completions folder and its
results folder, the report's folder, a sweep's two folders and the demo lab's work and results folders. A
second writer stops in one line naming the holder (pid, host, command, start time) and the fix.

How it holds. The lock file is opened and locked with ``flock`` (exclusive, non-blocking), which the kernel
releases when the holder ends in any way, ``kill -9`` included; the file holds the holder's record (JSON:
pid, host, command, started). On release the file is removed. So:

- a lock whose ``flock`` is free and whose record names *this* host is a crashed run's, whatever its pid (a pid
  is reused after a crash: a live process of that number is unrelated, since the holder's flock would not be
  free): it is taken over with a warning (``taking over the lock of pid N ...``);
- a record from *another* host is never taken over, even when ``flock`` is free (on a shared file system
  mounted without cross-host locks, ``flock`` is local to each node): the message names the host and says to
  delete the file once that host's run has ended. A holder that ends normally removes its file, so only a
  crash on another host leaves one behind;
- on a file system without ``flock`` (it raises), the record alone decides: a live pid of this host holds it.

Sharded evaluation (``--shard i/N``) runs N writers into one folder on purpose: each holds
``.writer.shard-i-of-N.lock``; shards of the same N coexist, anything else conflicts with them.

Stale temporary files (``.<name>.<...>.tmp``, an atomic write cut short by a kill or a full disk) are removed
by :func:`remove_stale_tmp`, which a writer calls once it holds the folder alone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Self

logger = logging.getLogger(__name__)
LOCK_NAME = ".writer.lock"
_SHARD_LOCK = re.compile(r"^\.writer\.shard-(\d+)-of-(\d+)\.lock$")
_COMMAND_CHARS = 200  # of the holder's command, in the record and the message


def lock_name(shard: tuple[int, int] | None = None) -> str:
    return LOCK_NAME if shard is None else f".writer.shard-{shard[0]}-of-{shard[1]}.lock"


def current_command() -> str:
    """This process's command line, credentials redacted (sage_unsloth/runtime/credentials.py), shortened."""
    from sage_unsloth.runtime.credentials import redact_argv

    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    text = shlex.join([Path(argv[0]).name, *redact_argv(argv[1:])])
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 3] + "..."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _read_record(path: Path) -> dict | None:
    """The holder's record, None when the file is absent, {} when it is empty or unreadable."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def describe(owner: dict) -> str:
    what = f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}"
    if owner.get("command"):
        what += f" ({owner['command']})"
    return f"{what} since {owner.get('started', '?')}"


def _flock_free(path: Path) -> bool | None:
    """Whether nobody holds ``path``'s flock now (True), somebody does (False), or flock is unavailable or the
    file is gone (None)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops the probe's own flock
    return True


def _owner_if_live(record: dict | None, free: bool | None) -> dict | None:
    """The record's holder when it may still write (a held flock, another host, or a live pid here), else None.
    ``free``: whether the file's flock is free (None: unknown)."""
    if record is None:
        return None
    if free is False:
        return record
    host, pid = record.get("host"), record.get("pid")
    if host not in (None, socket.gethostname()):
        return record  # cannot be checked from here: never taken over (see the module docstring)
    if free is None and isinstance(pid, int) and pid != os.getpid() and _alive(pid):
        return record  # no flock on this file system: the pid decides
    return None  # a free flock here: the holder has ended, a live process of that pid is another one


def live_owner(folder: str | os.PathLike, shard: tuple[int, int] | None = None) -> dict | None:
    """The holder of ``folder`` that a writer (sharded as ``shard``) would conflict with, or None."""
    for path in _lock_files(Path(folder)):
        if not _conflicts(path.name, shard):
            continue
        owner = _owner_if_live(_read_record(path), _flock_free(path))
        if owner is not None and not (
            owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname()
        ):
            return {**owner, "lock": str(path)}
    return None


def _lock_files(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.name == LOCK_NAME or _SHARD_LOCK.match(p.name))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _conflicts(name: str, shard: tuple[int, int] | None) -> bool:
    """Whether a writer sharded as ``shard`` conflicts with the holder of lock file ``name``: shards of one N
    coexist, every other pair conflicts."""
    if shard is None or name == LOCK_NAME:
        return True
    match = _SHARD_LOCK.match(name)
    return not (match and int(match.group(2)) == shard[1] and int(match.group(1)) != shard[0])


def held_error(folder: Path, owner: dict, fix: str) -> str:
    lock = owner.get("lock") or str(Path(folder) / LOCK_NAME)
    if owner.get("host") not in (None, socket.gethostname()):
        return (
            f"{folder} is locked by {describe(owner)}, a run on another host that cannot be checked from here: "
            f"if it has ended, delete {lock} and rerun; else {fix}"
        )
    return f"{folder} is being written by {describe(owner)}: one writer per folder; wait for it, stop it, or {fix}"


class FolderLock:
    """``with FolderLock(folder, fix=...):`` holds ``folder``'s lock; ValueError (one line naming the holder and
    ``fix``, what the user can do instead) when another live process has it."""

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        fix: str = "choose another folder",
        shard: tuple[int, int] | None = None,
    ):
        self.folder = Path(folder)
        self.fix = fix
        self.shard = shard
        self.path = self.folder / lock_name(shard)
        self._fd: int | None = None
        self._created: Path | None = None  # the outermost folder acquire() created (removed again if empty)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> Self:
        if self.held:
            return self
        try:  # refused: permissions, a file on the path, a name too long, a read-only or special file system
            missing = self.folder.absolute()
            while not missing.parent.exists() and missing.parent != missing:
                missing = missing.parent
            self._created = None if missing.exists() else missing
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(
                f"{self.folder}: cannot create this folder ({_reason(exc)}): {self.fix}"
            ) from None
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise ValueError(
                    f"{self.folder}: cannot write in this folder ({_reason(exc)}): {self.fix}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                os.close(fd)
                owner = _read_record(self.path) or {}
                raise ValueError(
                    held_error(self.folder, {**owner, "lock": str(self.path)}, self.fix)
                ) from None
            except OSError:  # no flock on this file system: the record alone decides
                locked = False
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if not same_file:  # the holder removed the file between our open and our flock: try again
                os.close(fd)
                continue
            previous = _read_record(self.path)
            owner = _owner_if_live(previous, True if locked else None)
            if owner is not None and not (
                owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname()
            ):
                os.close(fd)
                raise ValueError(held_error(self.folder, {**owner, "lock": str(self.path)}, self.fix))
            if previous:
                logger.warning(
                    "%s: taking over the lock of %s, which is no longer running",
                    self.folder,
                    describe(previous),
                )
            self._fd = fd
            self._write_record()
            if conflict := live_owner(self.folder, self.shard):  # a writer of the other kind (sharded or not)
                self.release()
                raise ValueError(held_error(self.folder, conflict, self.fix))
            return self
        raise ValueError(f"{self.path}: could not take the lock (another process keeps taking it): rerun")

    def _write_record(self) -> None:
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": current_command(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        data = (json.dumps(record) + "\n").encode("utf-8")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        try:
            os.fsync(self._fd)
        except OSError as exc:  # pragma: no cover - a file system that cannot sync a small file
            if exc.errno not in (errno.EINVAL, errno.EROFS):
                raise

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if os.fstat(self._fd).st_ino == os.stat(self.path).st_ino:
                self.path.unlink()  # while still locked: a waiter never locks a removed file (acquire re-checks)
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)  # drops the flock
            self._fd = None
        if self._created is not None:  # a run that wrote nothing leaves no empty folders behind
            folder = self.folder.absolute()
            while True:
                try:
                    folder.rmdir()
                except OSError:
                    break
                if folder == self._created:
                    break
                folder = folder.parent
            self._created = None

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def remove_stale_tmp(folder: str | os.PathLike, *, depth: int = 0) -> list[Path]:
    """Delete the temporary files of atomic writes cut short (``.<name>....tmp``) in ``folder`` and, with
    ``depth`` 1, its sub-folders; call it only while holding the folder alone (no sharded sibling). Returns
    what it removed."""
    folder = Path(folder)
    patterns = [".*.tmp"] + (["*/.*.tmp"] if depth >= 1 else [])
    removed = []
    for pattern in patterns:
        for path in sorted(folder.glob(pattern)):
            if path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    if removed:
        logger.warning(
            "%s: removed %d temporary file(s) left by a run that stopped mid-write (%s)",
            folder,
            len(removed),
            ", ".join(p.name for p in removed[:3]) + (", ..." if len(removed) > 3 else ""),
        )
    return removed
