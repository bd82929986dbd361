"""The GPU memory a stage needs, per backend, from a model written from first principles (an estimate, never a
measurement; docs/troubleshooting.md says what it counts and the published figures it is checked against).

Each term is counted in bytes from the model's shape (config.json) and the stage's values (the YAML, the flags,
else the stage's own defaults: :func:`stage_values`):

- weights: 2 bytes per parameter (16-bit; 4 in float32), or QLoRA's NF4 for the linear layers, 4 bits plus the
  double-quantised absmax constants (QLoRA, arXiv 2305.14314, section 3: 0.127 bits per parameter), the embedding,
  the output head and the norms left in 16-bit;
- LoRA: A and B of q, k, v, o, gate, up, down, in float32 (PEFT upcasts adapters of a 16-bit base), their float32
  gradients, the optimiser's two moments (8 bytes a parameter with torch's AdamW, 2 with bitsandbytes' 8-bit one)
  and, in stage 2 with ``anchor: sft``, the frozen ``ref`` copy of the adapter;
- activations with gradient checkpointing: one hidden state per layer is kept (2·h bytes a token and a layer) and
  one layer is recomputed at a time, its saved tensors 2·(6h + 2·kv·d + 4·I) bytes a token (the inputs of the
  norms, q/k/v after RoPE, the attention output, the MLP's gate, up, SiLU(gate) and product). Unsloth's
  checkpointing (``use_gradient_checkpointing="unsloth"``) moves the kept hidden states to CPU RAM; TRL's stay on
  the GPU; without checkpointing every layer's tensors stay;
- logits: Unsloth scores a sequence in chunks of its vocabulary logits (float32 with their gradient, at least
  ``max(4, length // 4096)`` chunks: unsloth_zoo sizes them to the free memory); TRL 1.15's fused LM head
  (trl/kernels/chunked_logprob.py) holds one 4096-token x 32768-column float32 tile and the hidden states' float32
  gradient;
- the KV cache, vLLM's arithmetic (vllm/v1/kv_cache_interface.py, ``page_size_bytes``): 2 (K and V) x layers x
  kv_heads x head_dim x 2 bytes a token;
- vLLM's share: ``gpu_memory_utilization`` x the card's total memory, taken whole at start-up (vLLM's own words: the
  fraction of GPU memory for its model executor, a per-instance limit), and it must hold vLLM's weights and the KV
  cache of one generation batch. Unsloth's ``fast_inference`` trains on the weights inside that share (one copy);
  TRL's colocated vLLM (``backend: trl``, ``vllm_mode: colocate``) loads its own copy beside the training model's;
  with ``vllm_enable_sleep_mode`` TRL puts it to sleep during the training step, so the card holds the larger of
  the two phases; ``vllm_mode: server`` generates on another GPU, and the training card holds no vLLM share;
- a CUDA context allowance of :data:`CUDA_CONTEXT_GIB` per process.

Evaluation (stage 3): vLLM's share alone, which must hold the 16-bit weights and the KV cache of one
``max_model_len`` sequence. Disk: the model's 16-bit files in the Hugging Face cache.

:func:`estimate` is the API other checks call (the GPU acceptance script compares its parts with the measured peak).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

GIB = 2**30
CUDA_CONTEXT_GIB = 0.5  # an allowance for the CUDA context and the allocator's slack, not a measurement
# QLoRA's NF4 with double quantisation: 4-bit codes, an 8-bit absmax per 64 weights, a float32 constant per 256 of
# those (arXiv 2305.14314, section 3).
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
# bytes of optimiser state per trainable parameter: two moments, float32 (torch) or 8-bit (bitsandbytes)
OPTIMISER_BYTES = {"adamw_8bit": 2, "paged_adamw_8bit": 2, "adamw_bnb_8bit": 2, "sgd": 0, "adafactor": 4}
TORCH_ADAM_BYTES = 8
TRL_LOGIT_TILE = (4096, 32768)  # TRL 1.15's fused LM head: TOKEN_CHUNK_SIZE x _CHUNKED_LOGPROB_CHUNK_SIZE
PROMPT_FALLBACK = 1024  # max_prompt_length unset: prompts are rarely longer (set it to bound the estimate)
STAGES = ("sft", "rlvr", "eval")


@dataclass(frozen=True)
class ModelShape:
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    tied: bool = False  # the output head is the embedding (one vocab x hidden matrix, not two)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)


# From the models' config.json (hub), so that no download is needed for the estimate.
KNOWN = {
    "qwen2.5-math-7b": ModelShape(7.62e9, 28, 3584, 4, 128, 152064, 18944),
    "qwen2.5-7b": ModelShape(7.62e9, 28, 3584, 4, 128, 152064, 18944),
    "qwen2.5-3b": ModelShape(3.09e9, 36, 2048, 2, 128, 151936, 11008, tied=True),
    "qwen2.5-1.5b": ModelShape(1.54e9, 28, 1536, 2, 128, 151936, 8960, tied=True),
    "qwen2.5-math-1.5b": ModelShape(1.54e9, 28, 1536, 2, 128, 151936, 8960, tied=True),
}


def shape_from_config(config: dict) -> ModelShape:
    """Parameter count and sizes from a transformers config.json (decoder-only, gated MLP)."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads", heads)
    inter = config["intermediate_size"]
    tied = bool(config.get("tie_word_embeddings"))
    per_layer = h * heads * head_dim * 2 + 2 * h * kv * head_dim + 3 * h * inter
    embeddings = vocab * h * (1 if tied else 2)
    return ModelShape(float(layers * per_layer + embeddings), layers, h, kv, head_dim, vocab, inter, tied)


def model_shape(model: str) -> ModelShape | None:
    """Known hub models by their short name, or a local folder's config.json; None when unknown."""
    from sage_unsloth.model.loading import model_short_name

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
    from sage_unsloth.model.loading import model_short_name

    for checkpoint in config.get("checkpoints") or []:
        if model_short_name(checkpoint) in KNOWN and "/" in str(checkpoint) and not Path(checkpoint).exists():
            return str(checkpoint)  # a hub id
    if config_path:
        path = Path(config_path)
        names = [name for name in KNOWN if name == path.parent.name or name in path.stem]
        if names:
            return max(names, key=len)  # qwen2.5-math-1.5b rather than qwen2.5-1.5b
    return None


# ----------------------------------------------------------------------------------------------- the terms
def weights_gib(shape: ModelShape, four_bit: bool, bytes_per_param: int = 2) -> float:
    """The weights: 16-bit (``bytes_per_param``), or NF4 for the linear layers with the embedding and the output
    head in 16-bit."""
    if not four_bit:
        return shape.params * bytes_per_param / GIB
    embeddings = shape.embedding_params
    return ((shape.params - embeddings) * NF4_BYTES + embeddings * 2) / GIB


def kv_bytes_per_token(shape: ModelShape, bytes_per_value: int = 2) -> int:
    """vLLM's KV cache a token: K and V of every layer, kv_heads x head_dim values each."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * bytes_per_value


def kv_cache_gib(shape: ModelShape, tokens: int) -> float:
    """K and V of every layer for ``tokens`` tokens, 16-bit."""
    return tokens * kv_bytes_per_token(shape) / GIB


def lora_params(shape: ModelShape, rank: int) -> int:
    """LoRA A and B on q, k, v, o, gate, up, down of every layer (in + out features times the rank each)."""
    q_out = shape.hidden  # Qwen2 / Llama: heads x head_dim = hidden
    kv = shape.kv_heads * shape.head_dim
    attention = (shape.hidden + q_out) * 2 + (shape.hidden + kv) * 2  # q, o; k, v
    mlp = 3 * (shape.hidden + shape.intermediate)  # gate, up, down
    return shape.layers * rank * (attention + mlp)


def optimiser_bytes(optim: str | None) -> int:
    """Optimiser state a trainable parameter: :data:`OPTIMISER_BYTES`, else torch's AdamW (two float32 moments)."""
    return OPTIMISER_BYTES.get(str(optim or "").lower(), TORCH_ADAM_BYTES)


def layer_bytes_per_token(shape: ModelShape) -> int:
    """What one decoder layer saves for its backward, a token, 16-bit: the inputs of both norms and of q/k/v and
    gate/up (4 x hidden), q after RoPE and the attention output (2 x hidden), k and v (2 x kv x head_dim), and the
    MLP's gate, up, SiLU(gate) and their product (4 x intermediate)."""
    return 2 * (6 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 4 * shape.intermediate)


def checkpoint_bytes_per_token(shape: ModelShape) -> int:
    """Gradient checkpointing keeps each layer's input hidden state, 16-bit."""
    return 2 * shape.hidden * shape.layers


def logits_gib(shape: ModelShape, backend: str, rows: int, seq: int) -> float:
    """The scoring head's working memory: Unsloth's per-sequence logits chunks (float32 and their gradient), or
    TRL's fused head (one float32 tile and the hidden states' float32 gradient)."""
    if backend == "unsloth":
        chunks = max(4, seq // 4096)
        return seq * shape.vocab * 4 * 2 / chunks / GIB
    tokens = rows * seq
    tile = min(tokens, TRL_LOGIT_TILE[0]) * TRL_LOGIT_TILE[1] * 4
    return (tile + tokens * shape.hidden * 4) / GIB


# ----------------------------------------------------------------------------------------------- the estimate
TRAINING_STEP, GENERATION = "training step", "generation"


@dataclass
class Estimate:
    """GiB by term. ``parts`` stay on the card for the whole run; each of ``phases`` ("training step",
    "generation") is on the card only while it runs, so the peak holds the larger one; vLLM's share
    (``vllm_fraction`` x the card) is taken at start-up and kept, unless ``vllm_sleeps`` (TRL's sleep mode), when
    it counts in the generation phase only."""

    model: str
    parts: dict[str, float]
    vllm_fraction: float = 0.0  # of the card's total memory, reserved by vLLM on top of the parts
    cpu_parts: dict[str, float] = field(default_factory=dict)  # GiB of CPU RAM (offloaded checkpoints)
    vllm_holds: dict[str, float] = field(default_factory=dict)  # GiB that must fit inside vLLM's share
    cache_gib: float = 0.0  # the model's files in the Hugging Face cache
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    vllm_sleeps: bool = False
    stage: str = ""

    def _phase_gib(self, name: str, share: float) -> float:
        return sum(self.phases.get(name, {}).values()) + (
            share if self.vllm_sleeps and name == GENERATION else 0
        )

    def total_gib(self, card_gib: float | None) -> float | None:
        """The peak on the card; None when it depends on the card (a vLLM share) and none is given."""
        if self.vllm_fraction and card_gib is None:
            return None
        share = self.vllm_fraction * (card_gib or 0.0)
        resident = sum(self.parts.values()) + (0.0 if self.vllm_sleeps else share)
        return resident + max([self._phase_gib(name, share) for name in (TRAINING_STEP, GENERATION)])

    def breakdown(self, card_gib: float | None = None) -> dict[str, float | None]:
        """Every term in GiB (a phase's terms under "<phase>: <term>", vLLM's share as "vLLM share") and "total"."""
        out: dict[str, float | None] = dict(self.parts)
        if self.vllm_fraction:
            out["vLLM share"] = None if card_gib is None else self.vllm_fraction * card_gib
        for phase, terms in self.phases.items():
            out.update({f"{phase}: {name}": gib for name, gib in terms.items()})
        out["total"] = self.total_gib(card_gib)
        return out

    def describe(self, card_gib: float | None = None) -> str:
        terms = [f"{name} {gib:.1f}" for name, gib in self.parts.items()]
        if self.vllm_fraction:
            terms.insert(
                0,
                f"vLLM {self.vllm_fraction:g} x card" + (" (asleep in training)" if self.vllm_sleeps else ""),
            )
        steps = [
            f"{phase} (" + " + ".join(f"{n} {g:.1f}" for n, g in terms_.items()) + ")"
            for phase, terms_ in self.phases.items()
            if terms_
        ]
        body = " + ".join(terms) + (" + the larger of " + " or ".join(steps) if len(steps) > 1 else "")
        if len(steps) == 1:
            body += " + " + steps[0]
        total = self.total_gib(card_gib)
        return f"{self.model}: {body}" + (f" = {total:.1f} GiB" if total is not None else " GiB")

    def describe_vllm(self, card_gib: float) -> str:
        holds = " + ".join(f"{name} {gib:.1f}" for name, gib in self.vllm_holds.items())
        return f"vLLM's {self.vllm_fraction:g} x {card_gib:.1f} = {self.vllm_fraction * card_gib:.1f} GiB must hold {holds}"


def stage_of(config: dict, config_path: str | None = None) -> str:
    """Which stage a config is for: stage 3 names checkpoints, stage 2 a completion length; else its folder."""
    if "checkpoints" in config:
        return "eval"
    if "max_completion_length" in config:
        return "rlvr"
    parts = Path(config_path).parts if config_path else ()
    return next((stage for stage in ("eval", "rlvr") if stage in parts), "sft")


def stage_values(config: dict, stage: str) -> dict:
    """The stage's defaults (its parser's, from the committed schema) under the config's values."""
    from sage_unsloth.config.schema import stage_defaults

    return {**stage_defaults(stage), **config}


@dataclass(frozen=True)
class Workload:
    """What the stage puts through the model, read from its values."""

    backend: str
    rows: int  # sequences in one forward / backward (per_device_train_batch_size)
    seq: int  # tokens a sequence: prompt + completion (stage 2), max_seq_length (stage 1)
    generation_rows: int  # sequences one generation produces (stage 2)
    four_bit: bool
    bytes_per_param: int
    checkpointing: bool
    rank: int
    adapters: int  # LoRA copies held: the trained one, and stage 2's frozen "ref" copy
    optimiser_bytes: int


def workload(values: dict, stage: str, lora_rank: int | None) -> Workload:
    rows = int(values.get("per_device_train_batch_size") or 1)
    if stage == "rlvr":
        prompt = int(values.get("max_prompt_length") or PROMPT_FALLBACK)
        seq = prompt + int(values.get("max_completion_length") or 0)
        steps = values.get("steps_per_generation") or values.get("gradient_accumulation_steps") or 1
        generation = int(values.get("generation_batch_size") or rows * int(steps))
    else:
        seq, generation = int(values.get("max_seq_length") or values.get("max_length") or 2048), 0
    return Workload(
        backend=str(values.get("backend") or "unsloth"),
        rows=rows,
        seq=seq,
        generation_rows=generation,
        four_bit=bool(values.get("load_in_4bit")),
        bytes_per_param=4 if str(values.get("dtype")) == "float32" else 2,
        checkpointing=bool(values.get("gradient_checkpointing", True)),
        rank=int(lora_rank or values.get("lora_r") or 8),
        adapters=2 if stage == "rlvr" and values.get("anchor", "sft") == "sft" else 1,
        optimiser_bytes=optimiser_bytes(values.get("optim")),
    )


def training_terms(shape: ModelShape, work: Workload) -> tuple[dict, dict, dict]:
    """(resident LoRA states, the training step's activations and logits, CPU RAM) in GiB."""
    lora = lora_params(shape, work.rank)
    trained = lora * (4 + 4 + work.optimiser_bytes)  # float32 weights, gradients, optimiser state
    resident = {"LoRA + optimiser": (trained + lora * 4 * (work.adapters - 1)) / GIB}
    tokens = work.rows * work.seq
    layer = tokens * layer_bytes_per_token(shape) / GIB
    kept = tokens * checkpoint_bytes_per_token(shape) / GIB
    step, cpu = {}, {}
    if not work.checkpointing:
        step["activations (every layer)"] = layer * shape.layers
    elif work.backend == "unsloth":
        step["activations (1 layer)"] = layer
        cpu["offloaded checkpoints"] = kept
    else:
        step["activations (1 layer + checkpoints)"] = layer + kept
    step["logits"] = logits_gib(shape, work.backend, work.rows, work.seq)
    return resident, step, cpu


def estimate(config: dict, config_path: str | None = None, lora_rank: int | None = None) -> Estimate | None:
    """GiB needed by the stage ``config`` describes (its YAML values, or every field as the stage parsed them);
    None when the model is unknown offline. ``lora_rank``: the adapter's rank when known (stage 2 continues the
    SFT adapter), else the config's lora_r. Fields the config leaves out take the stage's defaults."""
    model = model_of_config(config, config_path)
    shape = model_shape(model) if model else None
    if shape is None:
        return None
    stage = stage_of(config, config_path)
    values = stage_values(config, stage)
    cache = shape.params * 2 / GIB
    if stage == "eval":
        return _evaluation(model, shape, values, cache)
    work = workload(values, stage, lora_rank)
    resident, step, cpu = training_terms(shape, work)
    weights = weights_gib(shape, work.four_bit, work.bytes_per_param)
    guess = Estimate(model, {}, cpu_parts=cpu, cache_gib=cache, phases={TRAINING_STEP: step}, stage=stage)
    colocated = (
        stage == "rlvr" and bool(values.get("use_vllm")) and values.get("vllm_mode", "colocate") != "server"
    )
    if colocated:
        _colocated_vllm(guess, shape, values, work, weights)
    else:
        guess.parts["weights"] = weights
        if stage == "rlvr" and not values.get("use_vllm"):  # transformers' generate: a KV cache per rollout
            guess.phases[GENERATION] = {"KV cache": kv_cache_gib(shape, work.generation_rows * work.seq)}
    guess.parts.update(resident)
    guess.parts["CUDA context"] = CUDA_CONTEXT_GIB
    return guess


def _colocated_vllm(guess: Estimate, shape: ModelShape, values: dict, work: Workload, weights: float) -> None:
    """vLLM on the training card: its share holds the weights it generates with and a generation batch's KV
    cache. Unsloth's fast_inference trains on those weights; TRL's vLLM loads its own, so the training model's
    weights are a second copy beside the share."""
    guess.vllm_fraction = float(values.get("vllm_gpu_memory_utilization") or 0.3)
    kv = kv_cache_gib(shape, work.generation_rows * work.seq)
    guess.vllm_holds = {"weights": weights, f"KV cache ({work.generation_rows} x {work.seq} tokens)": kv}
    if work.backend == "unsloth":
        return
    guess.parts["weights (training copy; TRL's vLLM holds its own)"] = weights
    guess.vllm_sleeps = bool(values.get("vllm_enable_sleep_mode"))


def _evaluation(model: str, shape: ModelShape, values: dict, cache: float) -> Estimate:
    length = int(values.get("max_model_len") or 4096)
    holds = {
        "weights": weights_gib(shape, False),
        f"KV cache ({length} tokens)": kv_cache_gib(shape, length),
    }
    fraction = float(values.get("gpu_memory_utilization") or 0.9)
    return Estimate(
        model, {"CUDA context": CUDA_CONTEXT_GIB}, fraction, vllm_holds=holds, cache_gib=cache, stage="eval"
    )
