"""The demo's step runner: subprocess steps in dependency order, parallel where they can be, with
fingerprinted completion stamps, per-step CPU time, thread counts that suit the machine's load, and
progress on the console.

A step is *done* when ``<work>/steps/<name>.json`` holds the fingerprint of this run's inputs and every
output of the step exists. The fingerprint hashes the step's command (the Python executable left out),
the contents of the config files it reads, the source of the kit's code it runs (the top-level modules
plus the subpackages and files the step names) and the fingerprints of the steps it depends on, so a changed
budget, config, code or upstream result reruns the step and everything after it. A step that reruns has
its outputs deleted first, so nothing stale is mixed into a new result.

CPU time is the user + system time of the step's process and its waited-for children (``os.wait4``).
Thread counts: ``--threads`` if given, else the cores idle when the run starts, shared among the heavy
steps running at once (at least 1 each); a light step (data, report, lab) takes one thread and no share.
"Idle" is read from /proc/stat over half a second, not from the load average: on this VM the 1-minute
load average sits near 1 with nothing running (kernel threads in I/O wait count towards it), which left
the pre-training on one of two idle cores (190 s instead of about 90 s). On a loaded machine it is one
thread per step: torch's OpenMP threads spin while they wait, and two threads on a busy core cost about
five times the CPU of one (measured for the pre-training step: 85 s against 16 s of CPU for the same 60
steps). The results do not depend on the thread count (tests/demo/test_demo_steps.py checks the pre-training;
torch's CPU kernels for these shapes reduce in a fixed order).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..executors import Executor, Task
from ..manifest import atomic_write_json
from ..recipe import start

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE_ROOT.parent
STAMP_DIR = "steps"


@dataclass
class Step:
    name: str
    argv: list[str]
    outputs: tuple[Path, ...]  # all must exist when the step is done; deleted before it reruns
    after: tuple[str, ...] = ()
    configs: tuple[Path, ...] = ()  # files read by the step (their content enters the fingerprint)
    code: tuple[str, ...] = ()  # sage_unsloth subpackages / files the step runs, besides the top level
    label: str = ""  # what the console shows while it runs
    # for steps whose log shows no progress bar (the eval stage hides tqdm off a terminal): files that appear
    # one per unit of work (a glob), and how many there will be
    progress_files: tuple[str, int] | None = None
    # seconds of single-threaded work (writing files, a table): one thread, and no share of the idle cores
    light: bool = False


@dataclass
class StepRecord:
    name: str
    status: str  # "ran" | "reused"
    wall_s: float
    cpu_s: float
    threads: int
    finished: str
    fingerprint: str = ""
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------- fingerprints
def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def code_digest(parts: tuple[str, ...]) -> str:
    """sha256 over the kit's top-level modules and the named subpackages or files (paths and contents)."""
    digest = hashlib.sha256()
    files = sorted(PACKAGE_ROOT.glob("*.py"))
    for part in sorted(set(parts)):
        path = PACKAGE_ROOT / part
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    for path in files:
        digest.update(path.relative_to(PACKAGE_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def fingerprint(step: Step, upstream: dict[str, str]) -> str:
    argv = ["python" if i == 0 else a for i, a in enumerate(step.argv)]
    payload = {
        "argv": argv,
        "configs": {str(p): _file_digest(p) for p in step.configs},
        "code": code_digest(step.code),
        "after": {name: upstream[name] for name in step.after},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def read_stamp(stamps: Path, name: str) -> dict | None:
    path = stamps / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


# ------------------------------------------------------------------------------------------- threads
def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies over all CPUs from /proc/stat; idle counts I/O wait (the CPU is free then)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields[:8])  # user nice system idle iowait irq softirq steal


def idle_fraction(interval: float = 0.5) -> float | None:
    """The share of CPU time spent idle over ``interval`` seconds now, or None where /proc/stat is missing."""
    try:
        idle0, total0 = _cpu_times()
        time.sleep(interval)
        idle1, total1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    return (idle1 - idle0) / (total1 - total0) if total1 > total0 else None


def idle_cores(interval: float = 0.5) -> int:
    """Usable cores not busy with other work now (at least 1): the idle share of all CPUs over ``interval``
    seconds, times their number, capped at the usable ones; off Linux, usable cores minus the load average."""
    fraction = idle_fraction(interval)
    if fraction is not None:
        return max(1, min(usable_cores(), int(fraction * (os.cpu_count() or 1) + 0.5)))
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(1, int(usable_cores() - load + 0.5))


def threads_for(step: Step, *, free: int, heavy_waiting: int, heavy_running: int, jobs: int) -> int:
    """Torch threads for a step starting now: one for a light step; else the idle cores shared among the
    heavy steps that will run at once (this one, those running, and those ready to start beside it)."""
    if step.light:
        return 1
    at_once = min(jobs, heavy_running + 1 + heavy_waiting)
    return max(1, free // max(1, at_once))


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "SAGE_DEMO_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "UNSLOTH_SKIP_TORCHVISION_CHECK": "1",
            "WANDB_MODE": env.get("WANDB_MODE", "offline"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


# ------------------------------------------------------------------------------------------ progress
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


def _tail(path: Path, size: int = 20000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------- running
@dataclass
class _Running:
    step: Step
    proc: subprocess.Popen | object  # a child process, or an executor's handle (poll / cancel)
    started: float
    threads: int
    log: Path


def _plan(steps: list[Step], stamps: Path) -> tuple[dict[str, str], set[str]]:
    """(fingerprint per step, names of steps to run): a step runs when its stamp does not match this
    run's fingerprint, an output is missing, or a step it depends on runs."""
    by_name = {s.name: s for s in steps}
    fingerprints: dict[str, str] = {}
    to_run: set[str] = set()
    for step in steps:  # steps are listed in dependency order
        missing = [a for a in step.after if a not in by_name]
        if missing:
            raise ValueError(f"step {step.name}: unknown predecessor(s) {missing}")
        fingerprints[step.name] = fingerprint(step, fingerprints)
        stamp = read_stamp(stamps, step.name)
        done = (
            stamp is not None
            and stamp.get("fingerprint") == fingerprints[step.name]
            and all(p.exists() for p in step.outputs)
        )
        if not done or any(a in to_run for a in step.after):
            to_run.add(step.name)
    return fingerprints, to_run


def _reused_record(step: Step, stamps: Path, fingerprint: str) -> StepRecord:
    """A step done earlier with the same inputs: its record from its stamp."""
    stamp = read_stamp(stamps, step.name) or {}
    return StepRecord(
        step.name,
        "reused",
        stamp.get("wall_s", 0.0),
        stamp.get("cpu_s", 0.0),
        stamp.get("threads", 0),
        stamp.get("finished", ""),
        fingerprint,
    )


@dataclass
class _Scheduler:
    """The steps running now: starts the ready ones (at most ``jobs``), stamps the finished ones, reports
    progress, stops the rest on a failure."""

    stamps: Path
    logs: Path
    jobs: int
    threads: int | None  # --threads: every step gets this many; None: shared among the running ones
    free: int  # the idle cores shared among the running steps
    fingerprints: dict[str, str]
    records: dict[str, StepRecord]
    executor: Executor | None
    echo: Callable[[str], object]
    running: dict[str, _Running] = field(default_factory=dict)

    def start_ready(self, pending: list[Step]) -> None:
        """Start the pending steps whose dependencies have records, while slots are free."""
        ready = [s for s in pending if all(a in self.records for a in s.after)]
        while ready and len(self.running) < self.jobs:
            step = ready.pop(0)
            pending.remove(step)
            for output in step.outputs:
                _remove(output)
            (self.stamps / f"{step.name}.json").unlink(missing_ok=True)
            n_threads = self.threads or threads_for(
                step,
                free=self.free,
                heavy_waiting=sum(not s.light for s in ready),
                heavy_running=sum(not r.step.light for r in self.running.values()),
                jobs=self.jobs,
            )
            self._launch(step, n_threads)

    def _launch(self, step: Step, n_threads: int) -> None:
        log = self.logs / f"{step.name}.log"
        self.echo(
            f"[demo] {step.name}: start{' (' + step.label + ')' if step.label else ''}, "
            f"{n_threads} thread(s), log {_display(log)}"
        )
        if self.executor is None:
            proc = start(step.argv, log, cwd=REPO_ROOT, env=child_env(n_threads), new_session=True)
        else:  # the executor's worker has its own environment: send what child_env changes
            env = {k: v for k, v in child_env(n_threads).items() if os.environ.get(k) != v}
            task = Task(step.name, step.argv, log.resolve(), env, cwd=str(REPO_ROOT), kind="step")
            (proc,) = self.executor.submit([task])
        self.running[step.name] = _Running(step, proc, time.perf_counter(), n_threads, log)

    def collect(self) -> None:
        """Stamp and record every step that finished; a failed one (an exit code or a missing output) raises
        with its log's last lines."""
        for name, item in list(self.running.items()):
            ended = _exit_of(item)
            if ended is None:
                continue
            code, cpu = ended
            del self.running[name]
            wall = round(time.perf_counter() - item.started, 1)
            missing = [p for p in item.step.outputs if not p.exists()]
            if code != 0 or missing:
                tail = "".join(_tail(item.log).splitlines(keepends=True)[-30:])
                why = f"exit {code}" if code != 0 else f"no {', '.join(_display(p) for p in missing)}"
                raise RuntimeError(
                    f"[demo] {name} failed ({why}); last lines of {_display(item.log)}:\n{tail}"
                )
            finished = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
            record = StepRecord(name, "ran", wall, cpu, item.threads, finished, self.fingerprints[name])
            atomic_write_json(
                self.stamps / f"{name}.json",
                {
                    "fingerprint": record.fingerprint,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "threads": item.threads,
                    "finished": finished,
                },
            )
            self.records[name] = record
            self.echo(f"[demo] {name}: done in {wall:.0f} s ({cpu:.0f} s CPU)")

    def report(self) -> None:
        """One progress line per running step: its log's last progress, else its files' count, else 'running'."""
        for name, item in self.running.items():
            line = progress_line(_tail(item.log))
            if line is None and item.step.progress_files:
                line = file_progress(*item.step.progress_files, time.perf_counter() - item.started)
            self.echo(f"[demo]   {name}: {line or 'running'} ({time.perf_counter() - item.started:.0f} s)")

    def stop(self) -> None:
        """A failure or Ctrl-C: stop the other steps (their whole process group)."""
        for item in self.running.values():
            if not isinstance(item.proc, subprocess.Popen):
                item.proc.cancel()
                continue
            try:
                os.killpg(item.proc.pid, signal.SIGTERM)
                item.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired, ChildProcessError):
                pass


def _exit_of(item: _Running) -> tuple[int, float] | None:
    """(exit code, CPU seconds) of a finished step, None while it runs; a child's CPU time from os.wait4, an
    executor's task's is not measured (0)."""
    if isinstance(item.proc, subprocess.Popen):
        pid, status, usage = os.wait4(item.proc.pid, os.WNOHANG)
        if pid == 0:
            return None
        item.proc.returncode = code = os.waitstatus_to_exitcode(status)
        return code, round(usage.ru_utime + usage.ru_stime, 1)
    code = item.proc.poll()
    return None if code is None else (code, 0.0)


def run_steps(
    steps: list[Step],
    *,
    work: Path,
    jobs: int,
    threads: int | None = None,
    progress_every: float = 20.0,
    echo=print,
    executor: Executor | None = None,
) -> list[StepRecord]:
    """Run every step that is not done; returns one record per step (measured now or read from its stamp).
    ``executor`` (sage_unsloth/executors; None or local: child processes here) runs each step elsewhere, at
    most ``jobs`` at once, with the same stamps; its CPU time is not measured (recorded as 0)."""
    if executor is not None and executor.uses_local_slots:
        executor = None  # today's path: children of this process, their CPU time from os.wait4
    stamps, logs = work / STAMP_DIR, work / "logs"
    stamps.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    fingerprints, to_run = _plan(steps, stamps)
    records: dict[str, StepRecord] = {}
    for step in steps:
        if step.name not in to_run:
            records[step.name] = _reused_record(step, stamps, fingerprints[step.name])
            echo(f"[demo] {step.name}: done earlier with the same inputs, reused")
    free = threads or idle_cores()
    if to_run and not threads:
        echo(
            f"[demo] {usable_cores()} usable core(s), {free} idle now: steps get {free} thread(s) shared "
            f"among those running at once (--threads N to set)"
        )
    scheduler = _Scheduler(stamps, logs, jobs, threads, free, fingerprints, records, executor, echo)
    pending = [s for s in steps if s.name in to_run]
    last_report = time.perf_counter()
    try:
        while pending or scheduler.running:
            scheduler.start_ready(pending)
            if not scheduler.running and pending:
                raise RuntimeError(f"[demo] cannot schedule {[s.name for s in pending]}: unmet dependencies")
            time.sleep(0.25)
            scheduler.collect()
            if scheduler.running and time.perf_counter() - last_report >= progress_every:
                last_report = time.perf_counter()
                scheduler.report()
    finally:
        scheduler.stop()
    return [records[s.name] for s in steps]


def _display(path: Path) -> str:
    """A path relative to the project when it lies inside it."""
    path = Path(path)
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def python() -> str:
    return sys.executable
