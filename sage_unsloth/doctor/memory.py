"""A rough memory estimate for a stage config, from parameter counts (never a measurement).

Each term is counted where it lives:

- the GPU: with Unsloth's colocated vLLM (``use_vllm``) the card's ``vllm_gpu_memory_utilization`` share is vLLM's, and
  it must hold the weights (shared with training) and a KV cache for one generation batch (:attr:`Estimate.vllm_holds`);
  training adds the LoRA states, one layer's activations being recomputed, a logits chunk and the CUDA context.
  Without vLLM the weights and a generation KV cache are on the GPU too. Evaluation: vLLM's share alone, which
  must hold the 16-bit weights and the KV cache of one ``max_model_len`` sequence.
- CPU RAM: Unsloth's gradient checkpointing (``use_gradient_checkpointing="unsloth"``, backend unsloth with
  ``gradient_checkpointing`` on, the default) offloads each layer's checkpointed hidden states to the host; with
  the trl backend they stay on the GPU.
- disk: the model's 16-bit files in the Hugging Face cache (the kit loads the configured repository as named; a
  4-bit run quantises it while loading).

Activations are the least certain term. Unsloth sizes its logits chunks to the free memory (unsloth_zoo's
``autotune_batch_and_chunks``); the estimate counts its smallest step, one sequence split in
``max(4, length // 4096)`` chunks, in float32 with its gradient.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

GIB = 2**30
CUDA_CONTEXT_GIB = 0.5


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
    """Which base model a stage config trains or evaluates: model_name_or_path, the SFT manifest, the first
    checkpoint that names one (stage 3), or a known model's name in the config's path (configs/rlvr/<model>/,
    configs/eval/notebook-<model>.yaml)."""
    if config.get("model_name_or_path"):
        return str(config["model_name_or_path"])
    for folder in [config.get("sft_dir"), *(config.get("checkpoints") or [])]:
        if folder and (Path(folder) / "manifest.json").is_file():
            return json.loads((Path(folder) / "manifest.json").read_text()).get("base_model")
    from sage_unsloth.models import model_short_name

    for checkpoint in config.get("checkpoints") or []:
        if model_short_name(checkpoint) in KNOWN and "/" in str(checkpoint) and not Path(checkpoint).exists():
            return str(checkpoint)  # a hub id
    if config_path:
        path = Path(config_path)
        names = [name for name in KNOWN if name == path.parent.name or name in path.stem]
        if names:
            return max(names, key=len)  # qwen2.5-math-1.5b rather than qwen2.5-1.5b
    return None


@dataclass
class Estimate:
    model: str
    parts: dict[str, float]  # GiB on the GPU besides vLLM's share
    vllm_fraction: float = 0.0  # of the card's total memory, reserved by vLLM on top of the parts
    cpu_parts: dict[str, float] = field(default_factory=dict)  # GiB of CPU RAM (offloaded checkpoints)
    vllm_holds: dict[str, float] = field(default_factory=dict)  # GiB that must fit inside vLLM's share
    cache_gib: float = 0.0  # the model's files in the Hugging Face cache

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

    def describe_vllm(self, card_gib: float) -> str:
        holds = " + ".join(f"{name} {gib:.1f}" for name, gib in self.vllm_holds.items())
        return f"vLLM's {self.vllm_fraction:g} x {card_gib:.1f} = {self.vllm_fraction * card_gib:.1f} GiB must hold {holds}"


def weights_gib(shape: ModelShape, four_bit: bool) -> float:
    """16-bit weights, or QLoRA's: NF4 (0.5 B + double-quantised scales) for the linear layers, the embedding
    and the output head in 16-bit."""
    embeddings = shape.vocab * shape.hidden * 2
    if not four_bit:
        return shape.params * 2 / GIB
    return ((shape.params - embeddings) * 0.56 + embeddings * 2) / GIB


def kv_cache_gib(shape: ModelShape, tokens: int) -> float:
    """K and V of every layer for ``tokens`` tokens, 16-bit."""
    return tokens * shape.layers * 2 * shape.kv_heads * shape.head_dim * 2 / GIB


def lora_params(shape: ModelShape, rank: int) -> int:
    """LoRA A and B on q, k, v, o, gate, up, down of every layer (in + out features times the rank each)."""
    kv = shape.kv_heads * shape.head_dim
    attention = (shape.hidden + shape.hidden) * 2 + (shape.hidden + kv) * 2  # q, o; k, v
    mlp = 3 * (shape.hidden + shape.intermediate)  # gate, up, down
    return shape.layers * rank * (attention + mlp)


def estimate(config: dict, config_path: str | None = None, lora_rank: int | None = None) -> Estimate | None:
    """GiB needed by the stage ``config`` describes; None when the model is unknown offline. ``lora_rank``: the
    adapter's rank when known (stage 2 continues the SFT adapter), else the config's lora_r (default 8)."""
    model = model_of_config(config, config_path)
    shape = model_shape(model) if model else None
    if shape is None:
        return None
    cache = shape.params * 2 / GIB
    if "checkpoints" in config:  # stage 3: vLLM alone, serving the adapters on the 16-bit base
        length = int(config.get("max_model_len") or 4096)
        holds = {
            "weights": weights_gib(shape, False),
            f"KV cache ({length} tokens)": kv_cache_gib(shape, length),
        }
        fraction = float(config.get("gpu_memory_utilization", 0.9))
        return Estimate(
            model, {"CUDA context": CUDA_CONTEXT_GIB}, fraction, vllm_holds=holds, cache_gib=cache
        )
    rlvr = "max_completion_length" in config
    four_bit = bool(config.get("load_in_4bit"))
    batch = int(config.get("per_device_train_batch_size", 1))
    if rlvr:
        seq = int(config.get("max_prompt_length") or 1024) + int(config["max_completion_length"])
    else:
        seq = int(config.get("max_seq_length") or 2048)
    tokens = batch * seq
    unsloth = config.get("backend", "unsloth") == "unsloth"
    checkpointing = bool(config.get("gradient_checkpointing", True))  # TRL 1.15's default
    parts: dict[str, float] = {}
    cpu_parts: dict[str, float] = {}
    rank = int(lora_rank or config.get("lora_r") or 8)
    # policy (+ the frozen "ref" copy in RLVR) in fp32, gradients, two Adam moments (8-bit optimisers store less)
    parts["LoRA + optimiser"] = lora_params(shape, rank) * 4 * (5 if rlvr else 4) / GIB
    layer = tokens * (4 * shape.hidden + 3 * shape.intermediate) * 2  # one layer's working set, 16-bit
    saved = tokens * shape.hidden * 2 * shape.layers  # one hidden state per layer (the checkpoints)
    if not checkpointing:
        parts["activations"] = layer * shape.layers / GIB
    elif unsloth:
        parts["activations (1 layer)"] = layer / GIB
        cpu_parts["offloaded checkpoints"] = saved / GIB
    else:
        parts["activations"] = (layer + saved) / GIB
    if unsloth:
        chunks = max(4, seq // 4096)
        parts["logits chunk"] = seq * shape.vocab * 4 * 2 / chunks / GIB
    else:
        parts["logits chunk"] = min(tokens, 4096) * shape.vocab * 4 * 2 / GIB
    parts["CUDA context"] = CUDA_CONTEXT_GIB
    weights = weights_gib(shape, four_bit)
    if rlvr:
        generation = int(config.get("generation_batch_size") or batch)
        kv = kv_cache_gib(shape, generation * seq)
        if bool(config.get("use_vllm")):
            holds = {"weights": weights, f"KV cache ({generation} x {seq} tokens)": kv}
            fraction = float(config.get("vllm_gpu_memory_utilization", 0.5))
            return Estimate(model, parts, fraction, cpu_parts, holds, cache)
        parts["weights"] = weights
        parts["KV cache"] = kv  # HF generation: a KV cache for the generation batch
        return Estimate(model, parts, 0.0, cpu_parts, cache_gib=cache)
    parts["weights"] = weights
    return Estimate(model, parts, 0.0, cpu_parts, cache_gib=cache)
