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
  Backend "unsloth" imports Unsloth via :func:`sage_unsloth.runtime.backend.import_unsloth` and uses
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
- ``same_base_model(a, b)``: the same model, or one of Unsloth's mirrors of it (its mapper, both directions).
- ``check_adapter_base(adapter_path, base, field)``: one-line ValueError when the adapter was trained on another base.
- ``precision_problem(dtype, bf16, capability)`` / ``check_gpu_setup(model_args, args, backend, fast_inference)``:
  bfloat16 on a GPU without it, 4-bit with Unsloth's vLLM without the bnb plugin; raised before any model loads.

Hub ids are loaded as given: Unsloth's loader would otherwise load its mirror (``Qwen/Qwen2.5-Math-7B`` as
``unsloth/Qwen2.5-Math-7B``) and PEFT would record the mirror as the adapter's base (sage_unsloth/compat.py,
``unsloth_name_mapper``). An adapter that records a mirror (an older run, Unsloth's own notebooks) is accepted,
and loaded on the configured base.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import compat
from ..data.prompts import CHAT_TEMPLATE
from ..runtime.backend import cuda_available, cuda_capability, import_unsloth

logger = logging.getLogger(__name__)

BACKENDS = ("unsloth", "trl")
ADAPTER_CONFIG = "adapter_config.json"
BF16_MIN_CAPABILITY = (8, 0)
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
    cfg = Path(adapter_path) / ADAPTER_CONFIG
    if not cfg.is_file():
        raise FileNotFoundError(
            f"adapter_path {adapter_path}: no adapter_config.json; point it at an SFT output folder"
        )
    return json.loads(cfg.read_text()).get("base_model_name_or_path") or ""


def same_base_model(a: str, b: str) -> bool:
    """Is the model recorded as ``a`` the model ``b``? The same hub id or folder, or one of Unsloth's mirrors of
    it as Unsloth's own mapper files them (both directions: ``Qwen/X`` and ``unsloth/X`` are one model)."""
    if not a or not b:
        return a == b
    if a == b or a.rstrip("/") == b.rstrip("/"):
        return True
    if os.path.exists(a) and os.path.exists(b):
        return os.path.realpath(a) == os.path.realpath(b)
    key = compat.unsloth_mirror_key(a)
    return key is not None and key == compat.unsloth_mirror_key(b)


def check_adapter_base(
    adapter_path: str | Path, base: str, field: str = "adapter_path", base_is: str = "the base model"
) -> None:
    """One line when the adapter in ``adapter_path`` was trained on another model than ``base``."""
    recorded = adapter_base_model(adapter_path)
    if recorded and not same_base_model(recorded, base):
        raise ValueError(
            f"{field}={adapter_path} was trained on {recorded!r} but {base_is} is {base!r}: set "
            "model_name_or_path to the adapter's base, or point to an adapter of this model"
        )


def _check_adapter(model_args, adapter_path: str) -> None:
    check_adapter_base(adapter_path, model_args.model_name_or_path, base_is="model_name_or_path")


@contextmanager
def adapter_on_base(adapter_path: str | Path, base: str):
    """``adapter_path``, or, when its recorded base is another name of ``base`` (an Unsloth mirror), a temporary
    view of it that records ``base``: Unsloth's loader reads the base from the adapter folder, and must load the
    configured model, not download the mirror."""
    import tempfile

    recorded = adapter_base_model(adapter_path)
    if not recorded or recorded == base:
        yield str(adapter_path)
        return
    with tempfile.TemporaryDirectory(prefix="sage-adapter-") as view:
        for source in Path(adapter_path).iterdir():
            if source.name != ADAPTER_CONFIG:
                (Path(view) / source.name).symlink_to(source.resolve())
        config = json.loads((Path(adapter_path) / ADAPTER_CONFIG).read_text())
        config["base_model_name_or_path"] = base
        (Path(view) / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
        logger.info(
            "adapter %s records %s, a mirror of %s: loading it on %s", adapter_path, recorded, base, base
        )
        yield view


def adapter_rank(adapter_path: str | Path) -> int:
    """The LoRA rank ``r`` of a saved adapter (its adapter_config.json)."""
    return int(json.loads((Path(adapter_path) / ADAPTER_CONFIG).read_text()).get("r") or 8)


def precision_problem(dtype: str | None, bf16: bool, capability: tuple[int, int] | None) -> str | None:
    """Why a GPU of compute capability ``capability`` cannot run this precision (None: it can). bfloat16, as
    weights or as mixed precision, needs compute capability 8.0 (Ampere); the T4 (7.5) has float16 only."""
    wants = [what for what, asked in (("bf16=true", bf16), ("dtype=bfloat16", _is_bf16(dtype))) if asked]
    if capability is None or tuple(capability) >= BF16_MIN_CAPABILITY or not wants:
        return None
    return (
        f"{' and '.join(wants)}: a GPU of compute capability {capability[0]}.{capability[1]} has no bfloat16: "
        "pass --dtype float16 --bf16 false (float16 mixed precision, as the 16 GB presets and the notebooks)"
    )


def check_gpu_setup(model_args, args, *, backend: str, fast_inference: bool) -> None:
    """Before any model loads, on this machine's GPU: the precision it supports, and the bnb plugin that 4-bit
    weights need in Unsloth's vLLM. Nothing to check without a GPU (the CPU configs fall back to float32)."""
    capability = cuda_capability()
    if (
        problem := precision_problem(model_args.dtype, bool(getattr(args, "bf16", False)), capability)
    ) is not None:
        raise ValueError(problem)
    if capability is not None and (
        problem := bnb_plugin_problem(model_args.load_in_4bit, backend, fast_inference)
    ):
        raise ValueError(problem)


def bnb_plugin_problem(load_in_4bit: bool, backend: str, fast_inference: bool, installed: bool | None = None):
    """4-bit weights in Unsloth's vLLM (vLLM >= 0.28) need the vllm-bnb-plugin package (None: not needed, or there)."""
    if not (load_in_4bit and fast_inference and backend == "unsloth"):
        return None
    dist, module = compat.VLLM_BNB_PLUGIN
    if installed is None:
        installed = importlib.util.find_spec(module) is not None
    if installed:
        return None
    return (
        f"load_in_4bit with use_vllm: vLLM {compat.PINNED['vllm']} loads 4-bit weights through {dist}, which is "
        f'not installed: pip install "{dist}=={compat.PINNED[dist]}" (in the [gpu] extra), or set use_vllm false'
    )


def _is_bf16(dtype) -> bool:
    return str(dtype).replace("torch.", "") == "bfloat16"


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
        compat.EXACT_NAME_KWARG: True,  # the configured hub id, not Unsloth's mirror of it
    }
    if model_args.attn_implementation:
        kwargs["attn_implementation"] = model_args.attn_implementation
    if fast_inference:
        # vLLM must hold the adapter that is trained: its rank (the SFT adapter's when continuing one), rounded up
        # to a rank vLLM accepts.
        rank = adapter_rank(adapter_path) if adapter_path else model_args.lora_r
        kwargs.update(
            fast_inference=True,
            gpu_memory_utilization=gpu_memory_utilization,
            max_lora_rank=compat.vllm_max_lora_rank(rank),
        )
        # before Unsloth starts vLLM: FlashInfer off below 8.0, and unless its JIT toolchain matches torch's CUDA
        toolchain = compat.flashinfer_toolchain_here() if cuda_available() else None
        os.environ.update(compat.vllm_sampler_env(cuda_capability(), toolchain_problem=toolchain))
    weights = weights_repository(model_args.model_name_or_path, use_4bit, model_args.model_revision)
    if adapter_path:
        # Unsloth's own way to continue a LoRA: from_pretrained on the adapter folder loads the recorded base
        # (checked against model_name_or_path above; a mirror's name is replaced by the weights to load) and the
        # adapter, trainable.
        with adapter_on_base(adapter_path, weights) as folder:
            model, tokenizer = FastLanguageModel.from_pretrained(model_name=folder, **kwargs)
        return record_base(model, model_args.model_name_or_path), tokenizer
    revision = model_args.model_revision if weights == model_args.model_name_or_path else None
    model, tokenizer = FastLanguageModel.from_pretrained(model_name=weights, revision=revision, **kwargs)
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
    return record_base(model, model_args.model_name_or_path), tokenizer


def weights_repository(name: str, four_bit: bool, revision: str | None = None) -> str:
    """What Unsloth loads for ``name``: the name itself, or, for a 4-bit load of a hub id without a pinned
    revision, Unsloth's pre-quantised mirror where one exists (the 4-bit files, not the 16-bit ones quantised
    while loading; the same NF4 quantisation: unsloth_zoo's loader uses these mirrors itself)."""
    if not four_bit or Path(name).expanduser().exists() or revision not in (None, "", "main"):
        return name
    return compat.unsloth_four_bit_mirror(name) or name


def record_base(model, base: str):
    """The adapter records ``base`` (the configured model) as its base, whichever repository held the weights."""
    for config in (getattr(model, "peft_config", None) or {}).values():
        config.base_model_name_or_path = base
    return model


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
