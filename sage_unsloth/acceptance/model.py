"""The acceptance check's model, made offline: on a GPU a random-weight model with the real Qwen2.5-1.5B architecture
(the shapes that set memory and kernels: layers, widths, heads, the 151,936-token embedding), its weights made on the
card; on a CPU (``--cpu-rehearsal``) the kit's tiny Qwen2 (sage_unsloth/model/tiny.py). Both use the kit's offline
byte-level tokenizer, so nothing is downloaded; a random model checks the machinery, not the science."""

from __future__ import annotations

import json
from pathlib import Path

# The architecture of Qwen/Qwen2.5-1.5B (its config.json on the Hugging Face hub; the doctor's table,
# sage_unsloth/doctor/memory.py KNOWN, has the same shape). Token ids come from the kit's tokenizer.
QWEN25_1_5B = {
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "use_sliding_window": False,
}
MODEL_NOTE = "ACCEPTANCE_MODEL.json"


def build_gpu_model(out: Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Write the random Qwen2.5-1.5B-shaped model to ``out``: initialised on the GPU, saved in ``dtype``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from sage_unsloth.model.tiny import build_tiny_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        **QWEN25_1_5B,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    (out / MODEL_NOTE).write_text(
        json.dumps({"architecture": "Qwen2.5-1.5B", "params": params, "seed": seed})
    )
    del model
    torch.cuda.empty_cache()
    return out


def build_model(out: Path, *, gpu: bool) -> Path:
    """The model of this run: the 1.5B-shaped one on a GPU, the tiny one on a CPU."""
    from sage_unsloth.model.tiny import build_tiny_model

    return build_gpu_model(out) if gpu else build_tiny_model(out, seed=0)


def main(argv: list[str] | None = None) -> int:  # python -m sage_unsloth.acceptance.model OUT [--gpu]
    import sys

    args = sys.argv[1:] if argv is None else argv
    build_model(Path(args[0]), gpu="--gpu" in args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
