"""What a checkpoint holds, checked: a checkpoint whose files are whole (sage_unsloth/runtime/checkpoints.py) is complete
only when its contents are sane too.

- every floating tensor of every weight file (the policy adapter, a second adapter such as RLVR's ``ref/``, a full
  model's shards) and of the optimizer state is finite;
- the LoRA adapter is not degenerate where training has moved it: no ``lora_A`` tensor is all zero (PEFT never
  starts one there, and B's gradient vanishes with it), and after optimizer steps with a non-zero gradient (the
  optimizer's first moments say so) not every ``lora_B`` tensor is zero;
- the optimizer state belongs to these weights: it loads, its parameter groups list as many tensors as the
  trained adapter holds, and each moment has the shape of one of the adapter's tensors.

The save checks the staged checkpoint before it becomes ``checkpoint-N`` (a non-sane one is removed and the run
stops in one line), and the resume rule skips a non-sane one with one line (:func:`checkpoints.choose_checkpoint`).
torch and safetensors are imported when a check runs, not with this module.
"""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

__all__ = ["contents_problem", "stored_weights_problem", "weights_problem"]

ADAPTER_FILE = "adapter_model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
LORA_A, LORA_B = ".lora_A.", ".lora_B."


def weights_problem(tensors, what: str) -> str | None:
    """Why the named tensors of ``what`` (a mapping name -> tensor, or an iterable of (name, tensor) read one at
    a time) cannot be kept: a non-finite value, or a degenerate LoRA factor A; None if they can."""
    import torch

    pairs = tensors.items() if hasattr(tensors, "items") else tensors
    floating, bad, zero_a = 0, [], []
    for name, tensor in pairs:
        if not (torch.is_tensor(tensor) and tensor.is_floating_point()):
            continue
        floating += 1
        if not torch.isfinite(tensor).all():
            bad.append(name)
        elif LORA_A in name and not tensor.any():
            zero_a.append(name)
    if bad:
        return f"{what} holds {len(bad)} non-finite tensors of {floating} (first: {bad[0]})"
    if zero_a:
        return f"{what} has an all-zero lora_A tensor ({zero_a[0]}): the adapter is degenerate"
    return None


def stored_weights_problem(path: str | Path, what: str | None = None) -> str | None:
    """:func:`weights_problem` of a safetensors file, read one tensor at a time (a merged model's shard is never
    held twice in memory)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as stored:
        names = stored.keys()  # a safe_open is not iterable
        return weights_problem(((name, stored.get_tensor(name)) for name in names), what or Path(path).name)


def _safetensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _optimizer_problem(path: Path, adapter: dict | None) -> tuple[str | None, bool]:
    """(why the optimizer state at ``path`` does not fit ``adapter``, or None; whether any first moment is non-zero)."""
    import torch

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        state, groups = saved["state"], saved["param_groups"]
        params = [index for group in groups for index in group["params"]]
    except (OSError, RuntimeError, EOFError, KeyError, TypeError, pickle.UnpicklingError) as exc:
        return f"{path.name} is not an optimizer state ({type(exc).__name__})", False
    tensors = {f"{index}.{key}": value for index, entry in state.items() for key, value in entry.items()}
    if (problem := weights_problem(tensors, path.name)) is not None:
        return problem, False
    moved = any(
        key.endswith(".exp_avg") and bool(t.any()) for key, t in tensors.items() if torch.is_tensor(t)
    )
    if adapter is None:
        return None, moved
    if len(params) != len(adapter) or any(index not in params for index in state):
        return (
            f"{path.name} lists {len(params)} parameters for an adapter of {len(adapter)} tensors: it belongs to "
            "other weights"
        ), moved
    shapes = Counter(tuple(t.shape) for t in adapter.values())
    moments = Counter(tuple(entry["exp_avg"].shape) for entry in state.values() if "exp_avg" in entry)
    if moments - shapes:
        odd = next(iter(moments - shapes))
        return f"{path.name} holds a moment of shape {odd}, which no adapter tensor has", moved
    return None, moved


def contents_problem(folder: str | Path, global_step: int) -> str | None:
    """Why the checkpoint ``folder`` (its files already whole) is not sane (see the module docstring), or None."""
    folder = Path(folder)
    weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob(f"*/{ADAPTER_FILE}"))
    adapter = None
    for path in weights:
        tensors = _safetensors(path)
        if (problem := weights_problem(tensors, str(path.relative_to(folder)))) is not None:
            return problem
        if path == folder / ADAPTER_FILE:
            adapter = tensors  # the adapter the optimizer trains (RLVR: the policy; ref/ is frozen)
    moved = False
    if (folder / OPTIMIZER_FILE).is_file():
        problem, moved = _optimizer_problem(folder / OPTIMIZER_FILE, adapter)
        if problem is not None:
            return problem
    lora_b = [t for name, t in (adapter or {}).items() if LORA_B in name]
    if global_step > 0 and moved and lora_b and not any(bool(t.any()) for t in lora_b):
        return (
            f"every lora_B tensor of {ADAPTER_FILE} is zero after {global_step} steps with non-zero gradients: "
            "the adapter is degenerate"
        )
    return None
