"""The ``fast_inference`` smoke test of ``sage-unsloth doctor`` on a GPU machine: the tiny offline model through
Unsloth's vLLM engine with the config's dtype and 4-bit setting, a LoRA of the adapter's rank, one generate with
that LoRA. It is what stage 2 does before its first rollout (models.load_for_training with fast_inference), in
seconds instead of after a 15 GB load. Its own process: Unsloth patches TRL and starts vLLM in it.

    python -m sage_unsloth.doctor.smoke WORKDIR --dtype float16 [--load_in_4bit] [--rank 8] --json OUT

Needs a GPU (Unsloth's vLLM does not run on CPU); it has not run on one yet.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from sage_unsloth.doctor.report import Check


def run(work: Path, dtype: str, load_in_4bit: bool, rank: int) -> Check:
    from trl import ModelConfig

    from sage_unsloth.model import loading as models
    from sage_unsloth.model.tiny import build_tiny_model
    from sage_unsloth.runtime.backend import import_unsloth

    import_unsloth()
    model_dir = build_tiny_model(work / "tiny-model", seed=0)
    model_args = ModelConfig(
        model_name_or_path=str(model_dir),
        dtype=dtype,
        load_in_4bit=load_in_4bit,
        lora_r=rank,
        lora_alpha=2 * rank,
    )
    started = time.time()
    model, tokenizer = models.load_for_training(
        model_args,
        backend="unsloth",
        max_seq_length=512,
        seed=0,
        fast_inference=True,
        gpu_memory_utilization=0.2,
    )
    adapter = work / "smoke-lora"
    model.save_lora(str(adapter))  # Unsloth's own save, what its load_lora reads
    from vllm import SamplingParams

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    out = model.fast_generate(
        [prompt],
        sampling_params=SamplingParams(temperature=1.0, max_tokens=8, seed=0),
        lora_request=model.load_lora(str(adapter)),
    )
    tokens = len(out[0].outputs[0].token_ids)
    detail = (
        f"tiny model through Unsloth's vLLM ({dtype}{', 4-bit' if load_in_4bit else ''}, LoRA rank {rank}): "
        f"{tokens} tokens generated with the LoRA in {time.time() - started:.0f} s"
    )
    return Check(
        "fast_inference", "PASS" if tokens > 0 else "FAIL", detail, "" if tokens else "see the log above"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("workdir")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--load_in_4bit", action="store_true")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        check = run(work, args.dtype, args.load_in_4bit, args.rank)
    except Exception as exc:  # noqa: BLE001 - every failure is the check's answer, with its last line
        traceback.print_exc()
        last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
        check = Check("fast_inference", "FAIL", f"{type(exc).__name__}: {last}", "see the traceback above")
    Path(args.json).write_text(json.dumps({"checks": [check.to_dict()]}, indent=1))
    return 0 if check.status != "FAIL" else 1


if __name__ == "__main__":
    sys.exit(main())
