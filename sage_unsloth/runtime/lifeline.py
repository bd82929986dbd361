"""Children die with the kit: a watchdog process that kills a kit process's descendants once it is gone.

vLLM's engine core (and any worker it forks) runs in processes of its own, started by multiprocessing from the
stage-3 process. When that process is SIGKILLed (an OOM killer, a scheduler, ``kill -9``) nothing in it runs:
the engine processes are reparented to init and keep their memory (3.9 GB on CPU; on a GPU, the GPU's).
``PR_SET_PDEATHSIG`` cannot be set from here in processes vLLM forks (it is not inherited across fork, and an
at-fork hook would also fire when a forking *thread* ends), so a watchdog outside the kit does the work:

``guard_descendants()`` starts ``python -m sage_unsloth.runtime.lifeline PID`` in a session of its own (a Ctrl-C to the
terminal does not reach it). Every ``INTERVAL_S`` it notes the kit's descendants (pid and start time); when the
kit has ended, by any signal or normally, it SIGKILLs every noted process still running (psutil checks the start
time, so a reused pid is never hit) and their children, then exits. Linux and macOS; needs psutil.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

logger = logging.getLogger(__name__)
INTERVAL_S = 0.5
_STARTED: dict[int, subprocess.Popen] = {}  # watched pid -> its watchdog: one per process


def guard_descendants(pid: int | None = None) -> subprocess.Popen | None:
    """Start (once per process) the watchdog that kills ``pid``'s (default: this process's) descendants when
    ``pid`` is gone. Returns it, or None without psutil (a notice: children may then outlive a kill -9)."""
    pid = os.getpid() if pid is None else pid
    if pid in _STARTED and _STARTED[pid].poll() is None:
        return _STARTED[pid]
    try:
        import psutil  # noqa: F401
    except ImportError:
        logger.warning("psutil is not installed: engine processes may outlive this process if it is killed")
        return None
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "sage_unsloth.runtime.lifeline", str(pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    _STARTED[pid] = watchdog
    return watchdog


def watch(pid: int, interval: float = INTERVAL_S) -> int:
    """The watchdog's loop; returns how many processes it killed."""
    import psutil

    own = os.getpid()
    try:
        kit = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    noted: dict[int, psutil.Process] = {}
    while True:
        try:
            if not kit.is_running() or kit.status() == psutil.STATUS_ZOMBIE:
                break
            for child in kit.children(recursive=True):
                if child.pid != own:
                    noted.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            break
        time.sleep(interval)
    return _kill_all(list(noted.values()))


def _kill_all(processes) -> int:
    import psutil

    killed, seen = 0, set()
    while processes:
        proc = processes.pop()
        if proc.pid in seen:
            continue
        seen.add(proc.pid)
        try:
            if not proc.is_running():  # gone, or the pid was reused by another process (start time differs)
                continue
            processes.extend(proc.children(recursive=True))  # started after the last look
            proc.kill()
            killed += 1
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:
            continue
    return killed


if __name__ == "__main__":
    watch(int(sys.argv[1]))
