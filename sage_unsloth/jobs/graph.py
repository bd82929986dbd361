"""A job graph's steps and the one rule that says a step is done.

A step is a command with the files it reads and the outputs it writes. It is *done* when its stamp
(``<stamps>/<name>.json``) holds the fingerprint of this run's inputs and a finish time, and every output is
complete (exists; holds ``done_file`` where the step names one, e.g. a stage's manifest.json, written last).
The fingerprint hashes the step's command (the Python executable left out), the contents of the files it reads,
the source of the kit's code it runs (when it names any: ``code``) and the fingerprints of the steps it depends
on, so a changed argument, config, code or upstream result makes the step not done, and everything after it.

A step that is not done runs again. Where its outputs go first depends on the step: a step that ``keep``s its
outputs (a training or evaluation stage, which resumes from its checkpoints or chunks) continues in them when they
were written for the same inputs (it was killed or failed part-way) and refuses, in one line, outputs written
for other inputs or by anyone else (they are never silently reused or deleted); any other step has its outputs
deleted first, so nothing stale is mixed into a new result.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from sage_unsloth.runtime.folder_lock import LOCK_NAME
from sage_unsloth.runtime.manifest import atomic_write_json

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Step:
    name: str
    argv: list[str]  # what the step runs (argv[0] the interpreter); its fingerprint leaves argv[0] out
    outputs: tuple[Path, ...]  # all complete when the step is done
    after: tuple[str, ...] = ()
    configs: tuple[Path, ...] = ()  # files read by the step (their content enters the fingerprint)
    # sage_unsloth subpackages / files the step runs besides the top level; None: no code in the fingerprint
    code: tuple[str, ...] | None = ()
    label: str = ""  # what the console shows while it runs
    # for steps whose log shows no progress bar (the eval stage hides tqdm off a terminal): files that appear
    # one per unit of work (a glob), and how many there will be
    progress_files: tuple[str, int] | None = None
    # seconds of single-threaded work (writing files, a table): one thread, and no share of the idle cores
    light: bool = False
    done_file: str | None = None  # the file each output folder holds once complete (None: the folder itself)
    keep: bool = False  # resume in its own outputs (same inputs); refuse anyone else's; never delete them
    kind: str = "step"  # what an executor is told (sage_unsloth/jobs/executors Task.kind: rlvr | eval | report | step)

    @property
    def command(self) -> list[str]:
        """What the step's stamp records: its command without the interpreter (and its ``-m``)."""
        return list(self.argv[2:] if self.argv[1:2] == ["-m"] else self.argv[1:])


@dataclass
class StepRecord:
    name: str
    status: str  # "ran" | "reused" | "failed" | "blocked" (an input failed)
    wall_s: float
    cpu_s: float
    threads: int
    finished: str
    fingerprint: str = ""
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------- fingerprints
def _file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


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
    payload = {
        "argv": ["python", *step.argv[1:]],
        "configs": {str(p): _file_digest(p) for p in step.configs},
        "after": {name: upstream[name] for name in step.after},
    }
    if step.code is not None:
        payload["code"] = code_digest(step.code)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------------------- stamps
def read_stamp(stamps: Path, name: str) -> dict | None:
    """A step's stamp; None when there is none; ``{"damaged": PATH}`` when it cannot be read (never done)."""
    path = stamps / f"{name}.json"
    try:
        stamp = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        return {"damaged": f"{path} line {exc.lineno}"}
    except (OSError, ValueError):
        return {"damaged": str(path)}
    return stamp if isinstance(stamp, dict) and "damaged" not in stamp else {"damaged": str(path)}


def write_stamp(stamps: Path, step: Step, fingerprint: str, **finished) -> None:
    """The step's stamp: its fingerprint and its command (without credentials), written when a step that keeps
    its outputs starts (they are its inputs' from then on) and, with ``finished`` (time, wall and CPU seconds,
    threads), when any step has finished."""
    from sage_unsloth.runtime.credentials import redact_argv

    stamps.mkdir(parents=True, exist_ok=True)
    record = {"fingerprint": fingerprint, "command": redact_argv(step.command), **finished}
    atomic_write_json(stamps / f"{step.name}.json", record)


def _same_inputs(stamp: dict | None, fingerprint: str, step: Step) -> bool:
    """Whether ``stamp`` was written for these inputs. A record from before fingerprints (the sweep's
    ``{"command": [...]}``) counts as the same inputs when it holds the same command: legacy, read only."""
    if stamp is None or "damaged" in stamp:
        return False
    if "fingerprint" not in stamp:
        from sage_unsloth.runtime.credentials import redact_argv

        return _recorded(stamp) == redact_argv(step.command)
    return stamp["fingerprint"] == fingerprint


def _recorded(stamp: dict) -> list[str] | None:
    """The command a stamp names, without a ``-m`` (the notebooks' records from before fingerprints kept it)."""
    command = stamp.get("command")
    return command[1:] if isinstance(command, list) and command[:1] == ["-m"] else command


def output_complete(step: Step, output: Path) -> bool:
    return output.exists() and (step.done_file is None or (output / step.done_file).is_file())


def is_done(step: Step, stamp: dict | None, fingerprint: str) -> bool:
    """The one rule: the stamp is this fingerprint's and says the step finished, and every output is complete
    (a legacy record has no finish time: its complete outputs say so, their done file written last)."""
    finished = stamp is not None and ("finished" in stamp or "fingerprint" not in stamp)
    return (
        finished
        and _same_inputs(stamp, fingerprint, step)
        and all(output_complete(step, p) for p in step.outputs)
    )


def _written(path: Path) -> bool:
    """Whether ``path`` holds anything (a killed stage's lock file is no output)."""
    if path.is_dir() and not path.is_symlink():
        return any(p.name != LOCK_NAME for p in path.iterdir())
    return path.exists() or path.is_symlink()


def check_owned(step: Step, stamp: dict | None, fingerprint: str) -> None:
    """A step that keeps its outputs continues only in outputs written for the same inputs: any other is a
    ValueError in one line naming the folder, who wrote it and the fix."""
    if not step.keep or _same_inputs(stamp, fingerprint, step):
        return
    written = [p for p in step.outputs if _written(p)]
    if not written:
        return
    from sage_unsloth.runtime.credentials import redact_argv

    if stamp is not None and "damaged" in stamp:
        raise ValueError(f"{stamp['damaged']} is damaged: delete it and {written[0]}, then rerun")
    command = shlex.join(redact_argv(step.command))
    recorded = _recorded(stamp) if stamp is not None else None
    if recorded is None:
        how = "by another driver or by hand"
    elif recorded != redact_argv(step.command):
        how = f"with {shlex.join(recorded)}"
    else:
        how = "with this command from other inputs (a config file, or a step it reads, changed since)"
    raise ValueError(
        f"{written[0]} was written {how}, not by {command}: delete it or choose another output folder"
    )


def prepare(step: Step, stamps: Path, fingerprint: str) -> None:
    """Clear the way for a step about to run: a step that keeps its outputs continues in them, and its stamp
    (without a finish time) claims them for these inputs; any other step's outputs and stamp are deleted."""
    if step.keep:
        write_stamp(stamps, step, fingerprint)
        return
    (stamps / f"{step.name}.json").unlink(missing_ok=True)
    for path in step.outputs:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def missing_outputs(step: Step) -> list[Path]:
    """The outputs a step that exited 0 has not completed (then it failed all the same)."""
    return [p for p in step.outputs if not output_complete(step, p)]


def run_here(step: Step, fingerprint: str, stamps: Path, run, echo=print) -> bool:
    """Run one step in this process's foreground with ``run()`` (a notebook cell streams its stage), under the
    graph's done rule and stamps, without a scheduler; False when it was done. ``run`` raises on a failure."""
    import datetime as _dt
    import time

    stamp = read_stamp(stamps, step.name)
    if is_done(step, stamp, fingerprint):
        echo(
            f"[skip] {step.name}: finished before with the same inputs ({', '.join(map(str, step.outputs))})"
        )
        return False
    check_owned(step, stamp, fingerprint)
    prepare(step, stamps, fingerprint)
    started = time.perf_counter()
    run()
    missing = missing_outputs(step)
    if missing:
        raise RuntimeError(f"{step.name} exited 0 but wrote no complete {missing[0]}: rerun it")
    wall = round(time.perf_counter() - started, 1)
    finished = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    write_stamp(stamps, step, fingerprint, wall_s=wall, cpu_s=0.0, threads=0, finished=finished)
    return True


def plan(steps: list[Step], stamps: Path) -> tuple[dict[str, str], set[str]]:
    """(fingerprint per step, names of the steps to run): a step runs when it is not done (:func:`is_done`) or a
    step it depends on runs. Steps are listed in dependency order. Outputs a step must not touch are refused
    here, before anything starts (:func:`check_owned`)."""
    by_name = {s.name: s for s in steps}
    fingerprints: dict[str, str] = {}
    to_run: set[str] = set()
    for step in steps:
        missing = [a for a in step.after if a not in by_name]
        if missing:
            raise ValueError(f"step {step.name}: unknown predecessor(s) {missing}")
        fingerprints[step.name] = fingerprint(step, fingerprints)
        stamp = read_stamp(stamps, step.name)
        if not is_done(step, stamp, fingerprints[step.name]) or any(a in to_run for a in step.after):
            check_owned(step, stamp, fingerprints[step.name])
            to_run.add(step.name)
    return fingerprints, to_run
