"""A command run from a test: stdout and stderr captured as text, the exit status returned, not raised (the test
asserts on it), and always a timeout, so a hung child fails the test instead of the CI job."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def env_with_repo(**changes: str) -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH (the child imports this checkout's
    sage_unsloth), plus ``changes``."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **changes}


def run(
    argv: Sequence[str], *, cwd: str | Path, timeout: float, env: dict[str, str] | None = None, **extra
) -> subprocess.CompletedProcess[str]:
    """``argv`` in ``cwd``; ``env`` None inherits this process's environment; ``extra`` goes to subprocess.run."""
    return subprocess.run(
        argv, cwd=cwd, env=env, check=False, capture_output=True, text=True, timeout=timeout, **extra
    )


def run_python(args: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
    """This interpreter with ``args`` (``-m module ...``, ``-c code ...`` or a script), as :func:`run`."""
    return run([sys.executable, *args], **kwargs)
