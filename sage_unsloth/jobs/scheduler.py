"""The scheduler of a job graph: starts every step that is not done (sage_unsloth/jobs/graph.py) once the steps
it depends on are, on a free slot of an executor (sage_unsloth/jobs/executors: local child processes, SLURM, Ray),
stamps what finished, reports progress, and on a failure either stops everything (``keep_going=False``: the
demo lab) or runs on and leaves only what reads the failed step (``keep_going=True``: ``sage-unsloth sweep``).

CPU time is the user + system time of a local step's process and its waited-for children (``os.wait4``, the
local executor's handle); an executor elsewhere does not measure it (0).
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sage_unsloth.jobs import cores
from sage_unsloth.jobs.executors import Executor, Task
from sage_unsloth.jobs.graph import (
    Step,
    StepRecord,
    missing_outputs,
    plan,
    prepare,
    read_stamp,
    write_stamp,
)
from sage_unsloth.jobs.progress import file_progress, progress_line, tail

STAMP_DIR = "steps"  # <work>/steps/<name>.json: the stamps; <work>/logs/<name>.log: the logs
# The record folder's names before it had one (the sweep's, the notebooks'): adopted under STAMP_DIR once.
EARLIER_STAMP_DIRS = ("jobs", "stages")
OK = ("ran", "reused")


def stamp_folder(work: Path, *, adopt: bool = True) -> Path:
    """``<work>/steps``, the job graph's one record folder (the lab's, a sweep's, a notebook's). A folder of an
    earlier name (:data:`EARLIER_STAMP_DIRS`) there and none of this one: it is renamed to it (``adopt``), so a
    sweep or a notebook started before keeps its finished steps, or only read (a dry run writes nothing)."""
    import os

    folder = Path(work) / STAMP_DIR
    if not folder.exists():
        for name in EARLIER_STAMP_DIRS:
            earlier = Path(work) / name
            if earlier.is_dir():
                if not adopt:
                    return earlier
                os.replace(earlier, folder)
                break
    return folder


@dataclass
class Slot:
    """Where one step runs at a time: the environment it adds (a GPU group, a CPU share) and its GPUs."""

    name: str = ""
    env: dict[str, str] = field(default_factory=dict)
    gpus: int = 0


def thread_env(threads: int) -> dict[str, str]:
    """The environment a step runs with: unbuffered output and, when set, its torch threads."""
    env = {"PYTHONUNBUFFERED": "1"}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


@dataclass
class _Running:
    step: Step
    handle: object  # an executor's handle: poll() / cancel()
    slot: Slot
    started: float
    threads: int
    log: Path


@dataclass
class Scheduler:
    """The steps running now: starts the ready ones on free slots, records the finished ones, reports progress,
    stops the rest at the end (a failure, Ctrl-C)."""

    stamps: Path
    logs: Path
    free: list[Slot]
    executor: Executor
    fingerprints: dict[str, str]
    records: dict[str, StepRecord]
    echo: Callable[[str], object]
    tag: str = "[jobs]"
    threads: int | None = None  # every step this many torch threads; None: shared_cores, else the slot's env
    shared_cores: int | None = None  # the idle cores shared among the heavy steps running at once
    env: Callable[[int], dict[str, str]] = thread_env
    command: Callable[[Step, Slot], list[str]] | None = None  # the argv a step starts with on a slot
    keep_going: bool = False
    cwd: Path = field(default_factory=Path.cwd)
    running: dict[str, _Running] = field(default_factory=dict)

    def block(self, pending: list[Step]) -> None:
        """keep_going: a step whose input failed is not run (only what reads a failure is lost)."""
        for step in list(pending):
            if any(self.records.get(a, None) and self.records[a].status not in OK for a in step.after):
                pending.remove(step)
                self.records[step.name] = StepRecord(step.name, "blocked", 0.0, 0.0, 0, "")
                self.echo(f"{self.tag} {step.name}: not run, an input failed")

    def start_ready(self, pending: list[Step]) -> None:
        """Start the pending steps whose inputs are done while slots are free, submitted together (the slurm
        executor makes one job array of them)."""
        ready = [s for s in pending if all(self._ok(a) for a in s.after)]
        started: list[tuple[Step, Slot, int]] = []
        while ready and self.free:
            step = ready.pop(0)
            pending.remove(step)
            n_threads = self._threads(step, ready, [s for s, _, _ in started])
            started.append((step, self.free.pop(0), n_threads))
        if not started:
            return
        tasks = [self._task(step, slot, n) for step, slot, n in started]
        for (step, slot, n), task, handle in zip(started, tasks, self.executor.submit(tasks)):
            self.running[step.name] = _Running(step, handle, slot, time.perf_counter(), n, task.log)

    def _ok(self, name: str) -> bool:
        return name in self.records and self.records[name].status in OK

    def _threads(self, step: Step, ready: list[Step], starting: list[Step]) -> int:
        """Torch threads for ``step``: ``threads``, else its share of the idle cores, else 0 (the slot decides)."""
        if self.threads or self.shared_cores is None:
            return self.threads or 0
        running = [r.step for r in self.running.values()] + starting
        return cores.threads_for(
            step,
            free=self.shared_cores,
            heavy_waiting=sum(not s.light for s in ready),
            heavy_running=sum(not s.light for s in running),
            jobs=len(self.free) + len(running),  # every slot: this step's is still free
        )

    def _task(self, step: Step, slot: Slot, n_threads: int) -> Task:
        """Clear the way (sage_unsloth/jobs/graph.py), stamp a step that keeps its outputs, and say what runs."""
        prepare(step, self.stamps, self.fingerprints[step.name])
        log = (self.logs / f"{step.name}.log").resolve()
        label = f" ({step.label})" if step.label else ""
        where = f" on {slot.name}" if slot.name else ""
        threads = f", {n_threads} thread(s)" if n_threads else ""
        self.echo(f"{self.tag} {step.name}: started{label}{where}{threads}, log {self.display(log)}")
        argv = self.command(step, slot) if self.command else step.argv
        env = {**slot.env, **self.env(n_threads)}
        return Task(step.name, argv, log, env, cwd=str(self.cwd), kind=step.kind, gpus=slot.gpus)

    def collect(self) -> None:
        """Record every step that ended: stamped when it exited 0 with every output complete, else failed (raised
        with its log's last lines unless keep_going)."""
        for name, item in list(self.running.items()):
            code = item.handle.poll()
            if code is None:
                continue
            del self.running[name]
            self.free.append(item.slot)
            wall = round(time.perf_counter() - item.started, 1)
            cpu = float(getattr(item.handle, "cpu_s", 0.0))
            missing = missing_outputs(item.step)
            if code != 0 or missing:
                self._failed(item, f"exit {code}" if code != 0 else f"no {self.display(missing[0])}", wall)
                continue
            finished = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
            fingerprint = self.fingerprints[name]
            write_stamp(
                self.stamps,
                item.step,
                fingerprint,
                wall_s=wall,
                cpu_s=cpu,
                threads=item.threads,
                finished=finished,
            )
            self.records[name] = StepRecord(name, "ran", wall, cpu, item.threads, finished, fingerprint)
            self.echo(f"{self.tag} {name}: done in {wall:.0f} s ({cpu:.0f} s CPU)")

    def _failed(self, item: _Running, why: str, wall: float) -> None:
        log = self.display(item.log)
        if not self.keep_going:
            last = "".join(tail(item.log).splitlines(keepends=True)[-30:])
            raise RuntimeError(f"{self.tag} {item.step.name} failed ({why}); last lines of {log}:\n{last}")
        self.records[item.step.name] = StepRecord(item.step.name, "failed", wall, 0.0, item.threads, "")
        self.echo(f"{self.tag} {item.step.name}: FAILED ({why}), see {log} after {wall:.0f} s")

    def report(self) -> None:
        """One progress line per running step: its log's last progress, else its files' count, else 'running'."""
        for name, item in self.running.items():
            elapsed = time.perf_counter() - item.started
            line = progress_line(tail(item.log))
            if line is None and item.step.progress_files:
                line = file_progress(*item.step.progress_files, elapsed)
            self.echo(f"{self.tag}   {name}: {line or 'running'} ({elapsed:.0f} s)")

    def stop(self) -> None:
        """A failure or Ctrl-C: stop the steps still running (a rerun continues)."""
        for item in self.running.values():
            item.handle.cancel()

    def display(self, path: Path) -> str:
        """A path relative to the working folder when it lies inside it."""
        try:
            return Path(path).resolve().relative_to(Path(self.cwd).resolve()).as_posix()
        except ValueError:
            return str(path)


def run_steps(
    steps: list[Step],
    *,
    work: Path,
    jobs: int | None = None,
    slots: list[Slot] | None = None,
    threads: int | None = None,
    share_cores: bool = True,
    executor: Executor | None = None,
    progress_every: float = 20.0,
    echo: Callable[[str], object] = print,
    **how,
) -> list[StepRecord]:
    """Run every step that is not done; returns one record per step (measured now, read from its stamp, or
    failed / blocked with ``keep_going``). Stamps go to ``<work>/steps/`` (:func:`stamp_folder`), logs to
    ``<work>/logs/``.

    ``slots`` (default: ``jobs`` plain ones) bound the steps in flight; ``executor`` (default: local child
    processes) runs them. Torch threads: ``threads`` each, else (``share_cores``) the cores idle now shared
    among the heavy steps running at once, else whatever the slot's environment says. ``how``: the
    :class:`Scheduler`'s ``tag``, ``env``, ``command``, ``keep_going`` and ``cwd``."""
    from sage_unsloth.jobs.executors import make_executor

    stamps, logs = stamp_folder(work), work / "logs"
    stamps.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    fingerprints, to_run = plan(steps, stamps)
    scheduler = Scheduler(
        stamps,
        logs,
        list(slots) if slots is not None else [Slot() for _ in range(jobs or 1)],
        executor or make_executor("local", None, work / "local"),
        fingerprints,
        {},
        echo,
        **how,
    )
    for step in (s for s in steps if s.name not in to_run):
        scheduler.records[step.name] = _reused(step, stamps, fingerprints[step.name])
        echo(f"{scheduler.tag} {step.name}: finished before with the same inputs, reused")
    if to_run and threads is None and share_cores:
        scheduler.shared_cores = cores.idle_cores()
        echo(
            f"{scheduler.tag} {cores.usable_cores()} usable core(s), {scheduler.shared_cores} idle now: steps get "
            f"{scheduler.shared_cores} thread(s) shared among those running at once (--threads N to set)"
        )
    scheduler.threads = threads
    _drive(scheduler, [s for s in steps if s.name in to_run], progress_every)
    return [scheduler.records[s.name] for s in steps]


def _drive(scheduler: Scheduler, pending: list[Step], progress_every: float) -> None:
    last_report = time.perf_counter()
    try:
        while pending or scheduler.running:
            if scheduler.keep_going:
                scheduler.block(pending)
            scheduler.start_ready(pending)
            if not scheduler.running and pending:
                names = [s.name for s in pending]
                raise RuntimeError(f"{scheduler.tag} cannot schedule {names}: unmet dependencies")
            time.sleep(0.2)
            scheduler.collect()
            if scheduler.running and progress_every and time.perf_counter() - last_report >= progress_every:
                last_report = time.perf_counter()
                scheduler.report()
    finally:
        scheduler.stop()


def _reused(step: Step, stamps: Path, fingerprint: str) -> StepRecord:
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
