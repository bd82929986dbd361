"""A rough GPU-memory estimate for a stage config, from parameter counts (never a measurement).

RLVR with Unsloth's colocated vLLM (``use_vllm``) reserves ``vllm_gpu_memory_utilization`` of the card for
vLLM, which holds the shared weights and the KV cache; training adds the LoRA states and the activations.
Without vLLM the weights, a generation KV cache and the activations are counted. SFT: weights +
activations. Evaluation: vLLM's reservation. Activations assume gradient checkpointing (one hidden state per
layer kept, plus one layer's working set and one logits chunk) and are the least certain term.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30


@dataclass(frozen=True)
class ModelShape:
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int


# From the models' config.json (hub), so that no download is needed for the estimate.
KNOWN = {
    "qwen2.5-math-7b": ModelShape(7.62e9, 28, 3584, 4, 128, 152064, 18944),
    "qwen2.5-7b": ModelShape(7.62e9, 28, 3584, 4, 128, 152064, 18944),
    "qwen2.5-3b": ModelShape(3.09e9, 36, 2048, 2, 128, 151936, 11008),
    "qwen2.5-1.5b": ModelShape(1.54e9, 28, 1536, 2, 128, 151936, 8960),
    "qwen2.5-math-1.5b": ModelShape(1.54e9, 28, 1536, 2, 128, 151936, 8960),
}


def shape_from_config(config: dict) -> ModelShape:
    """Parameter count and sizes from a transformers config.json (decoder-only, gated MLP)."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads", heads)
    inter = config["intermediate_size"]
    per_layer = h * heads * head_dim * 2 + 2 * h * kv * head_dim + 3 * h * inter
    embeddings = vocab * h * (1 if config.get("tie_word_embeddings") else 2)
    return ModelShape(float(layers * per_layer + embeddings), layers, h, kv, head_dim, vocab, inter)


def model_shape(model: str) -> ModelShape | None:
    """Known hub models by their short name, or a local folder's config.json; None when unknown."""
    from sage_unsloth.models import model_short_name

    path = Path(model)
    if (path / "config.json").is_file():
        return shape_from_config(json.loads((path / "config.json").read_text()))
    return KNOWN.get(model_short_name(model))


def model_of_config(config: dict, config_path: str | None = None) -> str | None:
    """Which base model a stage config trains or evaluates (model_name_or_path, the SFT manifest, or the
    configs/<stage>/<model>/ folder name)."""
    if config.get("model_name_or_path"):
        return str(config["model_name_or_path"])
    sft_dir = config.get("sft_dir")
    if sft_dir and (Path(sft_dir) / "manifest.json").is_file():
        return json.loads((Path(sft_dir) / "manifest.json").read_text()).get("base_model")
    if config_path:
        folder = Path(config_path).parent.name
        if folder in KNOWN:
            return folder
    return None


@dataclass
class Estimate:
    model: str
    parts: dict[str, float]  # GiB per component
    vllm_fraction: float = 0.0  # of the card's total memory, reserved by vLLM on top of the parts

    def total_gib(self, card_gib: float | None) -> float | None:
        if self.vllm_fraction and card_gib is None:
            return None
        return sum(self.parts.values()) + self.vllm_fraction * (card_gib or 0.0)

    def describe(self, card_gib: float | None = None) -> str:
        parts = " + ".join(f"{name} {gib:.1f}" for name, gib in self.parts.items())
        vllm = f"vLLM {self.vllm_fraction:g} x card" if self.vllm_fraction else ""
        total = self.total_gib(card_gib)
        body = " + ".join(p for p in (vllm, parts) if p)
        return f"{self.model}: {body}" + (f" = {total:.1f} GiB" if total is not None else " GiB")


def estimate(config: dict, config_path: str | None = None) -> Estimate | None:
    """GiB needed by the stage ``config`` describes; None when the model is unknown offline."""
    model = model_of_config(config, config_path)
    shape = model_shape(model) if model else None
    if shape is None:
        return None
    four_bit = bool(config.get("load_in_4bit"))
    embeddings = shape.vocab * shape.hidden * 2 * 2  # input + output head stay 16-bit in QLoRA
    weights = (
        (shape.params * 2)
        if not four_bit
        else (shape.params - shape.vocab * shape.hidden * 2) * 0.56 + embeddings
    )
    parts: dict[str, float] = {}
    if "checkpoints" in config:  # stage 3: vLLM alone
        return Estimate(model, {"CUDA context": 0.5}, float(config.get("gpu_memory_utilization", 0.9)))
    batch = int(config.get("per_device_train_batch_size", 1))
    if "max_completion_length" in config:  # stage 2
        seq = int(config.get("max_prompt_length") or 1024) + int(config["max_completion_length"])
    else:  # stage 1
        seq = int(config.get("max_seq_length") or 2048)
    lora_rank = int(config.get("lora_r", 8))
    lora_params = (
        shape.layers
        * lora_rank
        * (4 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 3 * (shape.hidden + shape.intermediate))
    )
    # policy + frozen ref copy (RLVR) in fp32, gradients, two Adam moments (8-bit optimisers store less)
    parts["LoRA + optimiser"] = lora_params * 4 * 5 / GIB
    tokens = batch * seq
    checkpoints = tokens * shape.hidden * 2 * shape.layers
    working_layer = tokens * (4 * shape.hidden + 3 * shape.intermediate) * 2
    logits_chunk = min(tokens, 4096) * shape.vocab * 4 * 2
    parts["activations"] = (checkpoints + working_layer + logits_chunk) / GIB
    parts["CUDA context"] = 0.5
    use_vllm = bool(config.get("use_vllm"))
    if "max_completion_length" in config and use_vllm:
        return Estimate(model, parts, float(config.get("vllm_gpu_memory_utilization", 0.5)))
    parts["weights"] = weights / GIB
    if "max_completion_length" in config:  # HF generation: a KV cache for the generation batch
        generation = int(config.get("generation_batch_size") or batch)
        parts["KV cache"] = generation * seq * shape.layers * 2 * shape.kv_heads * shape.head_dim * 2 / GIB
    return Estimate(model, parts)
