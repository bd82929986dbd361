"""What every executor shares: a :class:`Task` (one stage command, its log, its environment), the
:class:`Executor` interface (submit tasks, poll their handles) and the registry that ``executor: NAME``
picks from.

An executor only decides *where* a command runs. Which jobs run, in which order, what counts as finished
(the input fingerprint in a stamp beside complete outputs) and resume stay in the kit's one job graph
(sage_unsloth/jobs), so the semantics are the same on every executor.
"""

from __future__ import annotations

import difflib
import importlib
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol


@dataclass
class Task:
    """One job as an executor sees it: run ``argv`` in ``cwd`` with ``env`` over the worker's environment,
    stdout and stderr to ``log`` (truncated at start, like a local job's)."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = field(default_factory=os.getcwd)
    kind: str = ""  # rlvr | eval | report | step: the slurm executor spreads only training over nodes
    gpus: int = 0  # GPUs the job asks its executor for


class Handle(Protocol):
    def poll(self) -> int | None:
        """None while the job runs, then its exit status (negative: killed by that signal)."""

    def cancel(self) -> None:
        """Stop the job (a driver interrupted by Ctrl-C stops what it started)."""


def cancel_quietly(cancel) -> None:
    """Call a handle's ``cancel``: a job that already finished or is gone is no error (Ctrl-C stops what is left)."""
    try:
        cancel()
    except Exception:  # noqa: BLE001, S110 - already finished or gone
        pass


class ExecutorUnavailable(RuntimeError):
    """The executor cannot take jobs: Ray did not start or is unreachable, sbatch refused a job (one line)."""


class MissingExtra(ValueError):
    """An executor's optional library is not installed (one line naming the extra)."""


def require(module: str, *, executor: str, extra: str):
    """``import module``, or one line saying which extra of the kit installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            f"executor: {executor} needs {module}, which is not installed: pip install 'sage-unsloth[{extra}]' "
            f"(or choose executor: local)"
        ) from None


# What the stages read from the environment: a job on another machine (a Ray worker, a SLURM node whose sbatch
# may not export it) gets these from its driver.
FORWARDED_ENV = ("HF_", "WANDB_", "SAGE_", "UNSLOTH_", "TRANSFORMERS_", "TOKENIZERS_", "PYTHONPATH")


def job_credentials() -> dict[str, str]:
    """The credentials a job started elsewhere needs: the credential variables among those the stages read
    (HF_TOKEN, WANDB_API_KEY, ...) and any a driver moved into its environment from a flag."""
    from sage_unsloth.runtime.credentials import MOVED, secret_environment

    return {k: v for k, v in secret_environment().items() if k.startswith(FORWARDED_ENV) or k in MOVED}


class Executor:
    """Runs tasks somewhere. Subclasses register under a name and declare their settings (a dataclass).

    A task's ``argv`` and ``env`` may be serialised (submitit's pickles, Ray's task arguments): they never hold
    a credential. An executor whose jobs do not inherit the driver's environment calls :meth:`hand_credentials`
    on its tasks: the credentials go to a file only the user can read, and each task carries its path."""

    name: ClassVar[str] = ""
    settings_class: ClassVar[type | None] = None
    # True: the driver's own slots (GPU groups / CPU slots) decide where and how many; False: the executor's
    # scheduler places jobs and the driver keeps at most capacity() of them in flight
    uses_local_slots: ClassVar[bool] = False

    def __init__(self, settings: Any, folder: Path):
        self.settings = settings
        self.folder = Path(folder)  # the executor's own bookkeeping (submitit's pickles, ...)

    def capacity(self, n_jobs: int) -> int:
        return n_jobs

    @classmethod
    def check_jobs(cls, settings: Any, gpus_per_job: int) -> None:
        """Before any job starts: what this executor refuses of the jobs' shape (one ValueError line)."""

    @property
    def runs_here(self) -> bool:
        """Whether the jobs run on this machine though the executor's own scheduler starts them (submitit's
        local cluster): then the driver's slots (``jobs``, the GPU groups) bound them as they bound local jobs."""
        return False

    def share_this_machine(self, slots: int) -> None:
        """Keep at most ``slots`` jobs at once and give each its share of this machine's cores (``runs_here``)."""

    def describe(self) -> str:
        return self.name

    def submit(self, tasks: list[Task]) -> list[Handle]:
        raise NotImplementedError

    _credentials_file: Path | None = None

    def hand_credentials(self, tasks: list[Task]) -> None:
        """Point each task at the credentials file (written once, in the executor's folder, mode 0600), if any
        credential is set; the job's command (sage_unsloth/jobs/executors/command.py) reads it on the worker."""
        from sage_unsloth.runtime.credentials import CREDENTIALS_FILE_ENV, write_credentials_file

        secrets = job_credentials()
        if not secrets:
            return
        if self._credentials_file is None:
            self._credentials_file = write_credentials_file(self.folder, secrets)
        for task in tasks:
            task.env[CREDENTIALS_FILE_ENV] = str(self._credentials_file.resolve())

    def close(self) -> None:
        """Release what the executor started (a Ray cluster it started itself) and its credentials file."""
        from sage_unsloth.runtime.credentials import remove_credentials_file

        remove_credentials_file(self._credentials_file)
        self._credentials_file = None


EXECUTORS: dict[str, type[Executor]] = {}


def register(name: str):
    def add(cls: type[Executor]) -> type[Executor]:
        if name in EXECUTORS:
            raise ValueError(f"executor {name!r} is registered twice")
        cls.name = name
        EXECUTORS[name] = cls
        return cls

    return add


def check_name(name: str) -> str:
    if name not in EXECUTORS:
        from sage_unsloth.config.args import suggestion

        raise ValueError(
            f"executor={name!r} is unknown{suggestion(name, EXECUTORS)}: choose one of {', '.join(sorted(EXECUTORS))}"
        )
    return name


def settings_mapping(value, field: str = "executor_settings") -> dict:
    """An executor's settings as the sweep's ``executor_settings`` and the lab's ``--executor-settings`` take them:
    a YAML mapping, or a flag's text holding one; one line otherwise."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        import yaml

        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            value = None
    if not isinstance(value, dict):
        raise ValueError(f"{field}={value!r}: a mapping, e.g. --{field} '{{key: value}}'")  # noqa: TRY004 - one line
    return value


def parse_settings(name: str, mapping: dict | None) -> Any:
    """The executor's settings (``executor_settings: {...}``), checked field by field: an unknown key is one line
    with "did you mean"."""
    cls = EXECUTORS[check_name(name)].settings_class
    mapping = dict(mapping or {})
    if cls is None:
        if mapping:
            raise ValueError(f"{name}: executor {name} takes no settings; remove {sorted(mapping)}")
        return None
    known = [f.name for f in fields(cls)]
    for key in mapping:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(known)}"
            raise ValueError(f"{name}.{key} is not a setting of executor {name}{hint}")
    return cls(**mapping)


def make_executor(name: str, mapping: dict | None, folder: Path) -> Executor:
    return EXECUTORS[check_name(name)](parse_settings(name, mapping), folder)
