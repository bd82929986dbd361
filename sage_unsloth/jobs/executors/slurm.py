"""``executor: slurm``: each job is a SLURM job submitted through submitit, running the same stage command
as a local job with its log in the sweep's ``logs/`` folder (submitit's own pickles and stdout go to the
executor folder, ``<sweep>/submitit/``).

Jobs that become ready together (every RLVR run at the start of a sweep) go in as one job array, and the
driver keeps at most ``array_parallelism`` jobs in SLURM at once. A training job that asks for more GPUs than
one node has (``gpus_per_job > gpus_per_node``) becomes a multi-node job: one task per node, each running
``accelerate launch`` with configs/accelerate/multinode.yaml, its machine rank and the main process's address
and port read from SLURM's environment on the node (:func:`multinode_argv`).

``cluster: local`` (or ``debug``) runs the same path through submitit's local executor on this machine, for
tests and for trying a sweep's SLURM settings before a cluster run.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from sage_unsloth.jobs.executors.base import (
    Executor,
    ExecutorUnavailable,
    Task,
    cancel_quietly,
    register,
    require,
)
from sage_unsloth.jobs.executors.command import run_command

CLUSTERS = (None, "slurm", "local", "debug")


@dataclass
class SlurmSettings:
    partition: str | None = None
    account: str | None = None
    gpus_per_node: int = 8  # a node's GPUs: a training job with more (the sweep's gpus_per_job) spans nodes
    cpus_per_job: int = 8  # CPUs per task (one task per node); also the job's OMP_NUM_THREADS
    time_min: int = 24 * 60  # the job's time limit, minutes
    array_parallelism: int = 64  # jobs in SLURM at once (the array's %N as well)
    mem_gb: int | None = None
    sbatch: dict = field(default_factory=dict)  # extra sbatch options, e.g. {qos: high, constraint: a100}
    setup: list = field(default_factory=list)  # shell lines run before the job (module load, activate env)
    cluster: str | None = None  # submitit's cluster: None / slurm; local or debug run on this machine
    multinode_config: str = "configs/accelerate/multinode.yaml"
    main_process_port: int | None = None  # default: 29500 + SLURM_JOB_ID % 1000 (jobs sharing a node differ)

    def __post_init__(self):
        for name in ("gpus_per_node", "cpus_per_job", "time_min", "array_parallelism"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"slurm.{name}={value!r}: must be an integer >= 1")
        if self.cluster not in CLUSTERS:
            raise ValueError(f"slurm.cluster={self.cluster!r}: use slurm (the default), local or debug")
        if not isinstance(self.sbatch, dict):
            raise ValueError(f"slurm.sbatch={self.sbatch!r}: a mapping of sbatch options, e.g. {{qos: high}}")  # noqa: TRY004
        if not isinstance(self.setup, list):
            raise ValueError(f"slurm.setup={self.setup!r}: a list of shell lines")  # noqa: TRY004


def nodes_for(settings: SlurmSettings, task: Task) -> int:
    """Training spreads over ceil(gpus / gpus_per_node) nodes; every other job runs on one node."""
    if task.kind != "rlvr" or task.gpus <= settings.gpus_per_node:
        return 1
    return math.ceil(task.gpus / settings.gpus_per_node)


def check_gpus(settings: SlurmSettings, gpus_per_job: int) -> None:
    """Before any job: a multi-node job needs whole nodes (accelerate starts the same count on each)."""
    if gpus_per_job > settings.gpus_per_node and gpus_per_job % settings.gpus_per_node:
        raise ValueError(
            f"gpus_per_job={gpus_per_job} spans nodes of slurm.gpus_per_node={settings.gpus_per_node} GPUs: "
            f"use a multiple of {settings.gpus_per_node}"
        )


def job_parameters(settings: SlurmSettings, task: Task) -> dict:
    """submitit's (AutoExecutor) parameters for one task: what the sbatch file will say."""
    nodes = nodes_for(settings, task)
    params = {
        "timeout_min": settings.time_min,
        "nodes": nodes,
        "tasks_per_node": 1,
        "gpus_per_node": min(task.gpus, settings.gpus_per_node),
        "cpus_per_task": settings.cpus_per_job,
        "slurm_array_parallelism": settings.array_parallelism,
    }
    if settings.mem_gb is not None:
        params["mem_gb"] = settings.mem_gb
    if settings.partition:
        params["slurm_partition"] = settings.partition
    if settings.account:
        params["slurm_account"] = settings.account
    if settings.sbatch:
        params["slurm_additional_parameters"] = dict(settings.sbatch)
    if settings.setup:
        params["slurm_setup"] = list(settings.setup)
    return params


# ------------------------------------------------------------------------------------- on the nodes
def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'gpu[007-009,012],cpu1' -> 'gpu007'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ValueError(f"SLURM_JOB_NODELIST={nodelist!r}: not a node list")
    prefix, ranges = match.groups()
    return prefix + (re.split(r"[-,]", ranges)[0] if ranges else "")


def multinode_argv(
    argv: list[str], *, num_machines: int, machine_rank: int, host: str, port: int, config: str
):
    """An ``accelerate launch`` command for one node of a multi-node job: the multi-node config and this
    node's place (``--num_processes`` stays the total over nodes)."""
    try:
        at = argv.index("accelerate.commands.launch")
    except ValueError:
        raise ValueError(f"a multi-node job must be an accelerate launch, got {argv[:4]}") from None
    rest = list(argv[at + 1 :])
    if "--config_file" in rest:
        i = rest.index("--config_file")
        del rest[i : i + 2]
    node = [
        "--config_file", config,
        "--num_machines", str(num_machines),
        "--machine_rank", str(machine_rank),
        "--main_process_ip", host,
        "--main_process_port", str(port),
    ]  # fmt: skip
    return [*argv[: at + 1], *node, *rest]


def run_on_node(task: Task, config: str, port: int | None) -> int:
    """What each node's task runs: its node rank, the first node's host and the port come from SLURM."""
    env = os.environ
    nodes, rank = int(env["SLURM_JOB_NUM_NODES"]), int(env["SLURM_NODEID"])
    port = port if port is not None else 29500 + int(env.get("SLURM_JOB_ID", "0")) % 1000
    argv = multinode_argv(
        task.argv,
        num_machines=nodes,
        machine_rank=rank,
        host=first_host(env["SLURM_JOB_NODELIST"]),
        port=port,
        config=config,
    )
    log = Path(task.log) if rank == 0 else Path(task.log).with_name(f"{Path(task.log).stem}.node{rank}.log")
    return run_command(task, argv, log)


# ------------------------------------------------------------------------------------------- driver
class SubmititHandle:
    def __init__(self, job, task: Task):
        self.job, self.task = job, task

    def poll(self) -> int | None:
        if not self.job.done():
            return None
        try:
            return int(self.job.result())
        except Exception as exc:  # noqa: BLE001 - died outside the stage (time limit, node failure)
            with Path(self.task.log).open("a") as fh:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                fh.write(f"\n[executor slurm] job {self.job.job_id} did not finish: {first}\n")
            return 1

    def cancel(self) -> None:
        cancel_quietly(lambda: self.job.cancel(check=False))


@register("slurm")
class SlurmExecutor(Executor):
    """Each task a SLURM job through submitit (tasks ready together: one job array), at most
    ``array_parallelism`` in SLURM at once."""

    settings_class = SlurmSettings

    def __init__(self, settings: SlurmSettings | None, folder: Path):
        super().__init__(settings or SlurmSettings(), folder)
        self.submitit = require("submitit", executor="slurm", extra="slurm")

    def capacity(self, n_jobs: int) -> int:
        return max(1, min(n_jobs, self.settings.array_parallelism))

    @classmethod
    def check_jobs(cls, settings: SlurmSettings | None, gpus_per_job: int) -> None:
        check_gpus(settings or SlurmSettings(), gpus_per_job)

    @property
    def runs_here(self) -> bool:
        return self.settings.cluster in ("local", "debug")

    def share_this_machine(self, slots: int) -> None:
        """``cluster: local`` / ``debug`` run every job here: at most ``slots`` at once (the sweep's ``jobs``), each
        with its share of the cores; a cluster's defaults (8 CPUs a job, 64 at once) would oversubscribe them."""
        s, slots = self.settings, max(1, slots)
        s.array_parallelism = min(s.array_parallelism, slots)
        s.cpus_per_job = min(s.cpus_per_job, max(1, (os.cpu_count() or 1) // slots))

    def describe(self) -> str:
        s = self.settings
        where = s.cluster or "slurm"
        return (
            f"{where} (partition {s.partition or 'default'}, {s.cpus_per_job} CPUs, {s.time_min} min per job)"
        )

    def _executor(self, params: dict, name: str):
        ex = self.submitit.AutoExecutor(folder=str(self.folder / "%j"), cluster=self.settings.cluster)
        ex.update_parameters(name=name, **params)
        return ex

    def submit(self, tasks: list[Task]) -> list[SubmititHandle]:
        self.hand_credentials(
            tasks
        )  # sbatch may not export the driver's environment (sbatch: {export: NONE})
        for task in tasks:
            if task.gpus == 0:
                task.env.setdefault("OMP_NUM_THREADS", str(self.settings.cpus_per_job))
                task.env.setdefault("MKL_NUM_THREADS", str(self.settings.cpus_per_job))
        groups: dict[tuple, list[Task]] = {}
        for task in tasks:  # one array per set of identical parameters
            groups.setdefault(
                tuple(sorted(map(str, job_parameters(self.settings, task).items()))), []
            ).append(task)
        handles: dict[int, SubmititHandle] = {}
        for group in groups.values():
            params = job_parameters(self.settings, group[0])
            multi = params["nodes"] > 1
            ex = self._executor(
                params, f"sage-{group[0].name}" if len(group) == 1 else f"sage-{group[0].kind}"
            )
            calls = [
                (run_on_node, (t, self.settings.multinode_config, self.settings.main_process_port))
                if multi
                else (run_command, (t,))
                for t in group
            ]
            try:
                if len(group) == 1:
                    jobs = [ex.submit(calls[0][0], *calls[0][1])]
                else:
                    with ex.batch():
                        jobs = [ex.submit(fn, *args) for fn, args in calls]
            except Exception as exc:  # noqa: BLE001 - submitit's FailedSubmissionError, sbatch's own message
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise ExecutorUnavailable(
                    f"executor slurm: submitting {group[0].name} failed: {first}"
                ) from None
            for task, job in zip(group, jobs):
                handles[id(task)] = SubmititHandle(job, task)
        return [handles[id(t)] for t in tasks]
