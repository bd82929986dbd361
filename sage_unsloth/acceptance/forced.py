"""Unsloth's GPU-only trainer rewrites forced onto a CPU, for the CPU rehearsal of scripts/gpu_acceptance.sh and the
tests: the kit's stages then train through Unsloth's rewritten ``Trainer.training_step`` and inner loop and its
generated UnslothSFTTrainer / UnslothGRPOTrainer, as on a GPU (sage_unsloth/compat.py, row
``unsloth_gpu_rewrites``).

One part of the GPU path cannot run here: FastLanguageModel's model (its Triton kernels, fast LoRA forwards,
offloaded gradient checkpointing, vLLM). The model is transformers + PEFT instead, given what Unsloth's loader sets on
its model and tokenizer (:func:`sage_unsloth.compat.as_unsloth_model`, :func:`sage_unsloth.compat.as_unsloth_tokenizer`:
a pad token distinct from EOS); docs/verification.md lists what is run and what is read.

:func:`force_on_cpu` must run before TRL, transformers or the stages are imported, once per process: the rewrites
stay for the process (tests run it in a fresh interpreter).
"""

from __future__ import annotations

import os


def force_on_cpu() -> dict[str, str]:
    """Import Unsloth with its GPU path on this CPU, run its trainer rewrites and load stage models as a
    transformers + PEFT stand-in; returns the rewritten names (compat.force_unsloth_gpu_rewrites)."""
    from sage_unsloth import compat

    os.environ.update(compat.UNSLOTH_FORCED_CPU_ENV)
    compat.import_unsloth()
    found = compat.force_unsloth_gpu_rewrites()
    from sage_unsloth.model import loading as models

    models._load_unsloth = _load_stand_in
    return found


def _load_stand_in(model_args, seed, adapter_path, use_4bit, trust_remote_code, **unsloth_options):
    """sage_unsloth.model.loading' Unsloth loader on a CPU: the transformers + PEFT model the trl backend loads, set up as
    FastLanguageModel's would be (``unsloth_options``: its vLLM and checkpointing switches, GPU-only)."""
    from sage_unsloth import compat
    from sage_unsloth.model import loading as models

    model, tokenizer = models._load_trl(model_args, seed, adapter_path, use_4bit, trust_remote_code)
    compat.as_unsloth_model(model)
    compat.as_unsloth_tokenizer(model, tokenizer)
    return model, tokenizer
