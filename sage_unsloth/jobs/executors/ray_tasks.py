"""``executor: ray``: each job is a Ray task running the same stage command as a local job, with its log in
the sweep's ``logs/`` folder. ``address: local`` starts a Ray instance on this machine for the sweep (and
stops it after); ``auto`` or ``host:port`` / ``ray://host:10001`` joins a running cluster, whose nodes must
see the same files (the kit, the configs, the sweep's folders) at the same paths.

Ray places each task by its resources: ``resources: {GPU: K, CPU: C, <custom>: n}`` per job; without one,
a job asks for the sweep's ``gpus_per_job`` GPUs (none on CPU) and one CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sage_unsloth.jobs.executors.base import (
    FORWARDED_ENV,
    Executor,
    ExecutorUnavailable,
    Task,
    cancel_quietly,
    register,
    require,
)
from sage_unsloth.jobs.executors.command import run_command


def forwarded_env() -> dict[str, str]:
    """A Ray worker's environment is its node's, not the driver's (unlike a SLURM job's, which sbatch copies):
    what the stages read from the environment travels with each task, except credentials (a task's arguments
    are serialised by Ray), which go through the executor's credentials file (Executor.hand_credentials)."""
    from sage_unsloth.runtime.manifest import is_secret_key

    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV) and not is_secret_key(k)}


@dataclass
class RaySettings:
    address: str = "local"  # local: start one here; auto: the cluster this machine belongs to; or host:port
    resources: dict = field(default_factory=dict)  # per job, e.g. {GPU: 1, CPU: 4}
    num_cpus: int | None = None  # CPUs of a Ray instance started here (default: all)
    max_in_flight: int | None = None  # jobs submitted at once (default: all that are ready)

    def __post_init__(self):
        if not isinstance(self.address, str) or not self.address:
            raise ValueError(f"ray.address={self.address!r}: use local, auto or host:port")
        if not isinstance(self.resources, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for v in self.resources.values()
        ):
            raise ValueError(f"ray.resources={self.resources!r}: a mapping of amounts, e.g. {{GPU: 1}}")
        for name in ("num_cpus", "max_in_flight"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"ray.{name}={value!r}: an integer >= 1 or null")


def task_options(settings: RaySettings, task: Task) -> dict:
    """Ray's ``.options(...)`` for a task: CPU and GPU are Ray's num_cpus / num_gpus, the rest custom."""
    wanted = {"CPU": 1, "GPU": task.gpus, **settings.resources}
    options = {"num_cpus": wanted.pop("CPU"), "num_gpus": wanted.pop("GPU"), "name": task.name}
    if wanted:
        options["resources"] = wanted
    return options


class RayHandle:
    def __init__(self, ray, ref, task: Task):
        self.ray, self.ref, self.task = ray, ref, task

    def poll(self) -> int | None:
        ready, _ = self.ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            return int(self.ray.get(self.ref))
        except Exception as exc:  # noqa: BLE001 - the worker died or the task was cancelled
            with Path(self.task.log).open("a") as fh:
                fh.write(f"\n[executor ray] task did not finish: {type(exc).__name__}\n")
            return 1

    def cancel(self) -> None:
        cancel_quietly(lambda: self.ray.cancel(self.ref, force=True))


@register("ray")
class RayExecutor(Executor):
    """Each task a Ray task on the cluster at ``address`` (one started here for ``local``), placed by its
    resources; ``max_in_flight`` caps the tasks at once."""

    settings_class = RaySettings

    def __init__(self, settings: RaySettings | None, folder: Path):
        super().__init__(settings or RaySettings(), folder)
        self.ray = require("ray", executor="ray", extra="ray")
        self._started = False
        self._remote = None

    def capacity(self, n_jobs: int) -> int:
        return max(1, min(n_jobs, self.settings.max_in_flight or n_jobs))

    def describe(self) -> str:
        return f"ray ({self.settings.address})"

    def _connect(self):
        if self._remote is not None:
            return
        if not self.ray.is_initialized():
            local = self.settings.address == "local"
            try:
                self.ray.init(
                    address=self.settings.address,  # Ray's "local": a new instance even beside a running one
                    num_cpus=self.settings.num_cpus if local else None,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            except Exception as exc:  # noqa: BLE001 - Ray raises bare Exception when its node does not start
                how = "start Ray here" if local else f"reach the Ray cluster at {self.settings.address}"
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise ExecutorUnavailable(f"executor ray: could not {how}: {first}") from None
            self._started = True
        self._remote = self.ray.remote(max_retries=0)(run_command)

    def submit(self, tasks: list[Task]) -> list[RayHandle]:
        self._connect()
        self.hand_credentials(tasks)
        handles = []
        for task in tasks:
            task.env = {**forwarded_env(), **task.env}
            options = task_options(self.settings, task)
            if task.gpus == 0:  # what a local CPU slot sets: torch threads = the CPUs Ray gave the task
                task.env.setdefault("OMP_NUM_THREADS", str(max(1, int(options["num_cpus"]))))
                task.env.setdefault("MKL_NUM_THREADS", str(max(1, int(options["num_cpus"]))))
            handles.append(RayHandle(self.ray, self._remote.options(**options).remote(task), task))
        return handles

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False
        self._remote = None
        super().close()
