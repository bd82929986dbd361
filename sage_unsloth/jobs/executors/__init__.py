"""Executors: where the jobs of a multi-job command (``sage-unsloth sweep``, the lab's runner) run.

``executor: local`` (the default) runs each job as a child process on this machine's GPU or CPU slots,
``slurm`` submits it through submitit, ``ray`` as a Ray task; ``executor_settings`` (the lab's
``--executor-settings``) is the chosen one's settings. Each is one file and its registration
(:func:`~sage_unsloth.jobs.executors.base.register`, imported below): its settings dataclass, its ``submit``, and
what it refuses of the jobs' shape (``check_jobs``); the optional libraries are imported only when their
executor is chosen, and a missing one is one line naming the extra to install.
"""

from sage_unsloth.jobs.executors import local, ray_tasks, slurm  # noqa: F401  (registrations)
from sage_unsloth.jobs.executors.base import (
    EXECUTORS,
    Executor,
    ExecutorUnavailable,
    Handle,
    MissingExtra,
    Task,
    check_name,
    make_executor,
    parse_settings,
    register,
    require,
    settings_mapping,
)

__all__ = [
    "EXECUTORS",
    "Executor",
    "ExecutorUnavailable",
    "Handle",
    "MissingExtra",
    "Task",
    "check_name",
    "make_executor",
    "parse_settings",
    "register",
    "require",
    "settings_mapping",
]
