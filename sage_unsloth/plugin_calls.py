"""The one error contract of the plug-in kinds (guide, advantage estimator, policy term, KL term) when they run.

Every call of a plug-in, in training and in the trial call before any model loads (rlvr/plugin_probe.py), goes
through :func:`call`:

- the plug-in gets a copy of its one input record (:func:`copied`: tensors cloned, the kit's frozen records rebuilt
  around the clones; every kind is called as ``fn(inputs, **arguments)``, sage_unsloth/registry.py), so a guide that writes into ``signals.mask`` changes its own copy,
  never the mask, entropies or log-probs the loss uses;
- anything it raises, ``sys.exit`` included, becomes one :class:`PluginFault` line naming the kind, the plug-in
  (its registered name or ``file.py:function``), the step and the line of the plug-in that raised;
- its output is checked by its kind's check below: the type, the shape (one value per row, or per token), a
  floating dtype, finite values, and no absurd magnitude (:data:`LIMITS`).

The trainer raises the fault inside the rollout or the loss, so the run stops before that step's optimizer step:
nothing of the step is applied (sage_unsloth/finite_steps.py stops any other non-finite step the same way).

Each check is one function of the output and what the kit knows of the call (its mask, its rows); a new kind adds
its check here. Off the mask a value still has to be finite where the loss reads it, because the loss multiplies
by the mask and NaN * 0 is NaN; q is the exception (the kit sets q = 1 off the mask itself).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sage_unsloth.finite_steps import TrainingFault

__all__ = [
    "LIMITS",
    "PluginFault",
    "advantages_problem",
    "call",
    "copied",
    "kl_output_problem",
    "q_problem",
    "tensor_problem",
    "term_output_problem",
]

# The largest magnitude a plug-in may return on completion tokens, per kind. An advantage or a policy term of 1e6
# is no sane method's (GRPO's advantages are within sqrt(N), a raw reward difference is the reward's scale) and a
# few beyond it overflow the gradient norm in float32. A KL value of 1e10 is a log-ratio of 23 nats, beyond the
# 20 at which Unsloth's own loss clamps. q has no limit: the kit clips it to the guide node's [q_min, q_max].
LIMITS = {"advantages": 1e6, "policy term": 1e6, "KL term": 1e10}


class PluginFault(TrainingFault):
    """A plug-in raised, exited, or returned an unusable output: one line naming it and the step."""

    def __init__(self, kind: str, name: str, problem: str, step: int | None = None):
        self.kind, self.name, self.problem, self.step = kind, name, problem, step
        where = f" at step {step}" if step is not None else ""
        super().__init__(f"{kind} {name!r}{where} {problem}: the step was not applied")


# --------------------------------------------------------------------------------------------- the call
def copied(value):
    """What a plug-in receives: tensors cloned (a clone keeps the autograd graph, so a term's loss still reaches the
    policy), dicts and the kit's frozen input records rebuilt around copies, other dataclasses copied shallowly;
    generators and plain values as they are."""
    import torch

    if torch.is_tensor(value):
        return value.clone()
    if isinstance(value, dict):
        return {key: copied(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if value.__dataclass_params__.frozen:
            fields = {f.name: copied(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
            return dataclasses.replace(value, **fields)
        return copy.copy(value)  # the config: a plug-in's writes stay in its copy
    return value


def call(
    kind: str,
    name: str,
    fn: Callable,
    *inputs,
    step: int | None,
    check: Callable[[Any], str | None],
):
    """``fn(*copies of inputs)``, its output checked by ``check`` (output -> problem or None); a fault is one
    :class:`PluginFault` naming ``kind``, ``name`` and ``step``."""
    try:
        output = fn(*(copied(value) for value in inputs))
    except (KeyboardInterrupt, PluginFault):  # Ctrl-C stays Ctrl-C; a nested plug-in named itself already
        raise
    except BaseException as exc:  # SystemExit too: a plug-in never ends the run in silence
        raise PluginFault(kind, name, _raised(exc, fn), step) from exc
    problem = check(output)
    if problem is not None:
        raise PluginFault(kind, name, problem, step)
    return output


def _source_file(fn) -> str | None:
    while isinstance(fn, functools.partial):
        fn = fn.func
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isclass(fn) else type(fn)
    try:
        return inspect.getsourcefile(target)
    except TypeError:
        return None


def _raised(exc: BaseException, fn) -> str:
    """'raised KeyError: 'x' (my_guide.py:12)': the innermost line of the plug-in's own file, else of the call."""
    if isinstance(exc, SystemExit):
        what = f"called sys.exit({exc.code!r})"
    else:
        text = str(exc).strip().splitlines()
        what = f"raised {type(exc).__name__}" + (f": {text[0]}" if text else "")
    frames = traceback.extract_tb(exc.__traceback__)[1:]  # [0] is call() itself
    source = _source_file(fn)
    own = [f for f in frames if source and Path(f.filename) == Path(source)]
    frame = (own or frames or [None])[-1]
    return what if frame is None else f"{what} ({Path(frame.filename).name}:{frame.lineno})"


# --------------------------------------------------------------------------------------------- the checks
def tensor_problem(
    value,
    what: str,
    shape: tuple,
    *,
    mask=None,
    finite_off_mask: bool = True,
    limit: float | None = None,
) -> str | None:
    """Why ``value`` is not a floating tensor of ``shape`` with finite values (off ``mask`` too unless
    ``finite_off_mask`` is False) whose magnitude on the mask stays within ``limit``; None if it is."""
    import torch

    shape = tuple(shape)
    if not torch.is_tensor(value):
        return f"returned {type(value).__name__}, not a tensor of {what} {shape}"
    if tuple(value.shape) != shape:
        return f"returned {what} of shape {tuple(value.shape)}, expected {shape}"
    if not value.is_floating_point():
        return f"returned {what} of dtype {value.dtype}: return a floating tensor"
    values = value.detach()
    valid = torch.ones_like(values, dtype=torch.bool) if mask is None else mask.to(values.device).bool()
    checked = values if finite_off_mask else values[valid]
    finite = torch.isfinite(checked)
    if not finite.all():
        bad = checked[~finite]
        where = "" if finite_off_mask or mask is None else " on completion tokens"
        return f"returned {bad.numel()} non-finite {what}{where} (first: {bad.flatten()[0].item()})"
    if limit is not None and bool(valid.any()):
        peak = values[valid].abs().max().item()
        if peak > limit:
            return (
                f"returned {what} of magnitude {peak:.3g}, beyond {limit:g} (absurd: a step would overflow)"
            )
    return None


def q_problem(raw, mask) -> str | None:
    """A guide's raw q: (B, T) like the mask, floating, finite on the mask (the kit clips it and sets 1 off it)."""
    return tensor_problem(raw, "q", mask.shape, mask=mask, finite_off_mask=False)


def advantages_problem(advantages, rows: int) -> str | None:
    """An advantage estimator's output: one finite advantage per completion (N,)."""
    return tensor_problem(advantages, "advantages", (rows,), limit=LIMITS["advantages"])


def term_output_problem(out, shape: tuple, mask) -> str | None:
    """A policy term's TermOutput: advantages and loss each None or (B, T) finite, metrics names -> numbers."""
    if not all(hasattr(out, name) for name in ("advantages", "loss", "metrics")):
        return f"returned {type(out).__name__}, not a TermOutput(advantages=..., loss=..., metrics=...)"
    for name in ("advantages", "loss"):
        value = getattr(out, name)
        if value is not None:
            problem = tensor_problem(value, name, shape, mask=mask, limit=LIMITS["policy term"])
            if problem is not None:
                return problem
    return _metrics_problem(out.metrics)


def kl_output_problem(out, shape: tuple, mask) -> str | None:
    """A KL term's KLOutput: term (with gradient) and value, each (B, T) and finite."""
    if not all(hasattr(out, name) for name in ("term", "value")):
        return f"returned {type(out).__name__}, not a KLOutput(term=..., value=...)"
    for name in ("term", "value"):
        problem = tensor_problem(getattr(out, name), f"KL {name}", shape, mask=mask, limit=LIMITS["KL term"])
        if problem is not None:
            return problem
    return None


def _metrics_problem(metrics) -> str | None:
    import numbers

    import torch

    if not isinstance(metrics, dict):
        return f"returned metrics of type {type(metrics).__name__}, not a dict of names to numbers"
    for key, value in metrics.items():
        number = isinstance(value, numbers.Real) or (torch.is_tensor(value) and value.numel() == 1)
        if not isinstance(key, str) or not number:
            return f"returned metric {key!r} = {type(value).__name__}: metrics map names to numbers"
    return None
