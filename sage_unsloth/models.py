"""Loading a base model + LoRA adapter for training, shared by SFT (stage 1) and RLVR (stage 2).

Stable API (other stages import these; change only additively):

- ``BACKENDS = ("unsloth", "trl")``
- ``DEFAULT_TARGET_MODULES``: q/k/v/o/gate/up/down projections (the paper's LoRA targets).
- ``load_for_training(model_args, *, backend, max_seq_length, seed, adapter_path=None, fast_inference=False,
  gpu_memory_utilization=0.5, gradient_checkpointing=False, trust_remote_code=False) -> (model, tokenizer)``
  ``model_args`` is a ``trl.ModelConfig`` (model_name_or_path, model_revision, dtype, attn_implementation, load_in_4bit, lora_r/lora_alpha/lora_dropout/lora_target_modules, use_rslora,
  lora_modules_to_save). Without ``adapter_path`` a fresh LoRA is attached; with it, that saved PEFT adapter
  (e.g. ``outputs/<model>/sft``) is loaded *trainable* on the base and no new LoRA is created (its own
  r/alpha/targets win). The returned model is a ``peft.PeftModel``; the tokenizer carries the kit's chat
  template, a pad token and left padding.
  Backend "unsloth" imports Unsloth via :func:`sage_unsloth.backend.import_unsloth` and uses
  ``FastLanguageModel`` (its CPU fallback without a GPU); "trl" uses transformers + peft.
  4-bit (``load_in_4bit``) applies on a GPU only; on CPU it is ignored with a logged notice.
  ``fast_inference``/``gpu_memory_utilization`` are Unsloth's vLLM options (GPU + unsloth backend only).
  ``gradient_checkpointing`` is used by the unsloth backend only (``use_gradient_checkpointing="unsloth"``);
  with "trl" the Trainer enables it from ``TrainingArguments.gradient_checkpointing``.
  ``trust_remote_code``: trl 1.15's ModelConfig has no such field (SFTConfig/GRPOConfig do), so pass the
  training config's value; a ``model_args.trust_remote_code`` attribute, when present, is honoured too.
- ``load_tokenizer(model_args, adapter_path=None, trust_remote_code=False)``: the tokenizer alone, prepared
  (cheap; for data preparation before the model loads).
- ``prepare_tokenizer(tokenizer)``: installs CHAT_TEMPLATE, pad token, left padding (in place, returned).
- ``model_short_name(name_or_path)``: "Qwen/Qwen2.5-Math-7B" -> "qwen2.5-math-7b" (output folder names).
- ``adapter_base_model(adapter_path)``: the base model an adapter folder was trained on (adapter_config.json).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from .backend import cuda_available, import_unsloth
from .prompts import CHAT_TEMPLATE

logger = logging.getLogger(__name__)

BACKENDS = ("unsloth", "trl")
DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def model_short_name(name_or_path: str) -> str:
    """Lower-cased last path component, safe for a folder name: "Qwen/Qwen2.5-Math-7B" -> "qwen2.5-math-7b"."""
    last = str(name_or_path).rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
    short = re.sub(r"[^a-z0-9._-]+", "-", last.lower()).strip("-.")
    if not short:
        raise ValueError(
            f"model_name_or_path {name_or_path!r} gives no usable folder name: set model_short_name"
        )
    return short


def prepare_tokenizer(tokenizer):
    """Install the kit's chat template, a pad token (eos when missing) and left padding."""
    tokenizer.chat_template = CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                "the tokenizer has neither a pad nor an eos token: use a tokenizer that defines eos"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def adapter_base_model(adapter_path: str | Path) -> str:
    """The ``base_model_name_or_path`` recorded in an adapter folder (clear error when it is no adapter)."""
    cfg = Path(adapter_path) / "adapter_config.json"
    if not cfg.is_file():
        raise FileNotFoundError(
            f"adapter_path {adapter_path}: no adapter_config.json; point it at an SFT output folder"
        )
    return json.loads(cfg.read_text()).get("base_model_name_or_path") or ""


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    if os.path.exists(a) and os.path.exists(b):
        return os.path.realpath(a) == os.path.realpath(b)
    return a.rstrip("/") == b.rstrip("/")


def _check_adapter(model_args, adapter_path: str) -> None:
    base = adapter_base_model(adapter_path)
    if base and not _same_model(base, model_args.model_name_or_path):
        raise ValueError(
            f"adapter_path {adapter_path} was trained on {base!r} but model_name_or_path is "
            f"{model_args.model_name_or_path!r}: set model_name_or_path to the adapter's base"
        )


def _torch_dtype(name: str | None):
    """ModelConfig.dtype ("auto", "bfloat16", "float16", "float32" or None) -> torch dtype, "auto" or None."""
    import torch

    if name in (None, "auto"):
        return name
    short = str(name).replace("torch.", "")
    if short not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype {name!r} is not supported: use auto, bfloat16, float16 or float32")
    dtype = getattr(torch, short)
    return dtype


def _lora_targets(model_args) -> list[str] | str:
    targets = model_args.lora_target_modules
    return DEFAULT_TARGET_MODULES if not targets else targets


def _trust(model_args, trust_remote_code: bool) -> bool:
    return bool(trust_remote_code or getattr(model_args, "trust_remote_code", False))


def _has_tokenizer(folder: str | Path) -> bool:
    return (Path(folder) / "tokenizer_config.json").is_file()


def load_tokenizer(model_args, adapter_path: str | None = None, trust_remote_code: bool = False):
    """The tokenizer (the adapter folder's when it saved one, else the base's), prepared for the kit."""
    from transformers import AutoTokenizer

    source = adapter_path if adapter_path and _has_tokenizer(adapter_path) else model_args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(
        source,
        revision=None if source == adapter_path else model_args.model_revision,
        trust_remote_code=_trust(model_args, trust_remote_code),
    )
    return prepare_tokenizer(tokenizer)


def _check_args(model_args, backend: str, fast_inference: bool) -> bool:
    """Validate before anything loads; returns whether 4-bit loading applies."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is unknown: use one of {', '.join(BACKENDS)}")
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is not set: set it in the YAML or pass --model_name_or_path")
    if model_args.load_in_8bit:
        raise ValueError("load_in_8bit is not supported: use load_in_4bit (GPU) or 16-bit weights")
    if model_args.use_dora:
        raise ValueError("use_dora is not supported by this kit: set use_dora false")
    on_gpu = cuda_available()
    if fast_inference and (backend != "unsloth" or not on_gpu):
        raise ValueError(
            "fast_inference (Unsloth's vLLM) needs backend unsloth on a GPU: set fast_inference false"
        )
    if model_args.load_in_4bit and not on_gpu:
        logger.warning("load_in_4bit ignored: 4-bit needs a GPU, loading %s weights on CPU", model_args.dtype)
        return False
    return bool(model_args.load_in_4bit)


def load_for_training(
    model_args,
    *,
    backend: str,
    max_seq_length: int,
    seed: int,
    adapter_path: str | None = None,
    fast_inference: bool = False,
    gpu_memory_utilization: float = 0.5,
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
):
    """Load the base model with a trainable LoRA (fresh, or ``adapter_path``'s) and the prepared tokenizer."""
    use_4bit = _check_args(model_args, backend, fast_inference)
    if adapter_path:
        _check_adapter(model_args, str(adapter_path))
    both = (model_args, seed, adapter_path, use_4bit, trust_remote_code)  # what either backend loads with
    if backend == "unsloth":
        model, tokenizer = _load_unsloth(
            *both,
            max_seq_length=max_seq_length,
            fast_inference=fast_inference,
            gpu_memory_utilization=gpu_memory_utilization,
            gradient_checkpointing=gradient_checkpointing,
        )
    else:
        model, tokenizer = _load_trl(*both)
    prepare_tokenizer(tokenizer)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _load_unsloth(
    model_args,
    seed,
    adapter_path,
    use_4bit,
    trust_remote_code,
    *,
    max_seq_length,
    fast_inference,
    gpu_memory_utilization,
    gradient_checkpointing,
):
    import_unsloth()
    from unsloth import FastLanguageModel

    dtype = _torch_dtype(model_args.dtype)
    checkpointing: Any = "unsloth" if gradient_checkpointing else False
    kwargs: dict[str, Any] = {
        "max_seq_length": max_seq_length,
        "dtype": None if dtype == "auto" else dtype,
        "load_in_4bit": use_4bit,
        "trust_remote_code": _trust(model_args, trust_remote_code),
        "random_state": seed,
        "use_gradient_checkpointing": checkpointing,
    }
    if model_args.attn_implementation:
        kwargs["attn_implementation"] = model_args.attn_implementation
    if fast_inference:
        kwargs.update(
            fast_inference=True,
            gpu_memory_utilization=gpu_memory_utilization,
            max_lora_rank=model_args.lora_r,
        )
    if adapter_path:
        # Unsloth's own way to continue a LoRA: from_pretrained on the adapter folder loads the recorded base
        # (checked against model_name_or_path above) and the adapter on top, trainable.
        model, tokenizer = FastLanguageModel.from_pretrained(model_name=str(adapter_path), **kwargs)
        return model, tokenizer
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=model_args.model_name_or_path, revision=model_args.model_revision, **kwargs
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=_lora_targets(model_args),
        bias="none",
        use_gradient_checkpointing=checkpointing,
        random_state=seed,
        use_rslora=model_args.use_rslora,
        modules_to_save=model_args.lora_modules_to_save,
    )
    return model, tokenizer


def _load_trl(model_args, seed, adapter_path, use_4bit, trust_remote_code):
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, set_seed

    kwargs: dict[str, Any] = {
        "revision": model_args.model_revision,
        "trust_remote_code": _trust(model_args, trust_remote_code),
        "dtype": _torch_dtype(model_args.dtype) or torch.float32,
    }
    if model_args.attn_implementation:
        kwargs["attn_implementation"] = model_args.attn_implementation
    if use_4bit:
        from trl import get_kbit_device_map, get_quantization_config

        kwargs.update(
            quantization_config=get_quantization_config(model_args), device_map=get_kbit_device_map()
        )
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    if use_4bit:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    tokenizer = load_tokenizer(model_args, adapter_path, trust_remote_code)
    if adapter_path:
        return PeftModel.from_pretrained(model, str(adapter_path), is_trainable=True), tokenizer
    set_seed(seed)  # LoRA A matrices are initialised randomly
    config = LoraConfig(
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=_lora_targets(model_args),
        bias="none",
        task_type="CAUSAL_LM",
        use_rslora=model_args.use_rslora,
        modules_to_save=model_args.lora_modules_to_save,
    )
    return get_peft_model(model, config), tokenizer


def merge_lora_into_base(
    base_model: str,
    adapter_dir: str | Path,
    out: str | Path,
    *,
    tokenizer=None,
    dtype: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> Path:
    """Reload ``base_model`` unquantised in ``dtype``, merge the LoRA of ``adapter_dir`` into it (PEFT), and save
    the merged model (and ``tokenizer``, when given) to ``out``."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(
        base_model,
        dtype=dtype if dtype in (None, "auto") else getattr(torch, dtype),
        revision=revision,
        trust_remote_code=trust_remote_code,
    )
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return Path(out)
