"""The one error contract of the plug-in kinds (guide, advantage estimator, policy term, KL term) when they run.

Every call of a plug-in, in training and in the trial call before any model loads (plugins/probe.py), goes
through :func:`call`:

- the plug-in gets a copy of its one input record (:func:`copied`: tensors cloned, the kit's frozen records rebuilt
  around the clones; every kind is called as ``fn(inputs, **arguments)``, sage_unsloth/plugins/registry.py), so a guide that writes into ``signals.mask`` changes its own copy,
  never the mask, entropies or log-probs the loss uses;
- anything it raises, ``sys.exit`` included, becomes one :class:`PluginFault` line naming the kind, the plug-in
  (its registered name or ``file.py:function``), the step and the line of the plug-in that raised;
- it runs inside :func:`sage_unsloth.plugins.guard.guarded`: past its time budget (``SAGE_PLUGIN_TIMEOUT_S``,
  ``SAGE_PLUGIN_TRIAL_TIMEOUT_S`` for the trial call) it is stopped, an ``os._exit`` is caught before it ends the
  process, and a ``KeyboardInterrupt`` it raises itself is its fault (a real Ctrl-C or SIGTERM during the call
  stays the user's, the stage's own line and exit code); each is one :class:`PluginFault` line;
- its output is checked, first where it lives (:func:`placement_problem`: no tensor on the ``meta`` device or in
  a sparse layout, and a policy or KL term's tensors on its inputs' device), then by its kind's check below: the
  type, the shape (one value per row, or per token), a floating dtype, finite values, and no absurd magnitude
  (:data:`LIMITS`); last, a term that must carry a gradient (a policy term's loss, a KL term) carries one
  whenever its inputs' log-probs do (:func:`gradient_problem`). A check that cannot read the output at all is
  that output's fault too, never a traceback.

The trainer raises the fault inside the rollout or the loss, so the run stops before that step's optimizer step:
nothing of the step is applied (sage_unsloth/runtime/finite_steps.py stops any other non-finite step the same way).

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

from sage_unsloth.plugins import guard as plugin_guard
from sage_unsloth.runtime.finite_steps import TrainingFault

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
        if type(value) is dict:
            return {key: copied(item) for key, item in value.items()}
        # a mapping of the kit's own (the trial call's declared logit signals) keeps its class
        out = copy.copy(value)
        for key, item in value.items():
            out[key] = copied(item)
        return out
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
    """``fn(*copies of inputs)`` guarded (plugin_guard.guarded: the budget of a trial call when ``step`` is None,
    else of a training call), its output checked where it lives (:func:`placement_problem`) and by ``check``
    (output -> problem or None); a fault is one :class:`PluginFault` naming ``kind``, ``name`` and ``step``."""
    copies = tuple(copied(value) for value in inputs)

    def hang_line(guard: plugin_guard.Guard) -> str:
        problem = f"{_overtime(guard)} and would not stop: the process ends here"
        return (
            str(PluginFault(kind, name, problem, step))
            if step is not None
            else f"{kind} {name!r}: its trial call {problem}"
        )

    with plugin_guard.guarded(trial=step is None, hang_line=hang_line) as guard:
        try:
            output = fn(*copies)
        except PluginFault:  # a nested plug-in named itself already
            raise
        except BaseException as exc:
            # What a signal's handler raised during the call (the user's Ctrl-C, a SIGTERM the stage turns into
            # one): the stage's own line and exit code. Anything else, SystemExit, os._exit, the budget and a
            # KeyboardInterrupt with no signal behind it included, is the plug-in's: it never ends the run in silence.
            is_signal = guard.signalled and not isinstance(
                exc, (Exception, plugin_guard.Overtime, plugin_guard.ProcessExit)
            )
            if is_signal:
                raise
            raise PluginFault(kind, name, _ended(guard, exc, fn), step) from exc
    # it swallowed what stopped it, or ran past its budget off the main thread
    if guard.exited or guard.over_budget():
        raise PluginFault(kind, name, _ended(guard, None, fn), step)
    problem = placement_problem(kind, output, inputs)
    if problem is None:
        try:
            problem = check(output) or gradient_problem(kind, output, inputs)
        except Exception as exc:  # noqa: BLE001 (an output the checks cannot read is the plug-in's fault)
            problem = (
                f"returned {type(output).__name__} that the kit cannot read ({type(exc).__name__}: {exc})"
            )
    if problem is not None:
        raise PluginFault(kind, name, problem.splitlines()[0], step)
    return output


def _ended(guard: plugin_guard.Guard, exc: BaseException | None, fn) -> str:
    """What ended (or should have ended) the call, with the plug-in's line where there is one."""
    if guard.exited:
        what = f"called os._exit({guard.exit_code!r}), which would end the run with no error and no manifest"
    elif guard.over_budget():
        what = f"{_overtime(guard)} and was stopped"
    else:
        return _raised(exc, fn)
    where = _location(exc, fn) if exc is not None else None
    return what if where is None else f"{what} ({where})"


def _source_file(fn) -> str | None:
    while isinstance(fn, functools.partial):
        fn = fn.func
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isclass(fn) else type(fn)
    try:
        return inspect.getsourcefile(target)
    except TypeError:
        return None


def _overtime(guard: plugin_guard.Guard) -> str:
    return f"ran past its time budget of {guard.budget_s:g} s ({guard.env}=SECONDS sets it, 0: none)"


def _raised(exc: BaseException, fn) -> str:
    """'raised KeyError: 'x' (my_guide.py:12)': the innermost line of the plug-in's own file, else of the call. An
    exception that carries its own ``problem`` phrase (the trial call's undeclared signal) says that instead."""
    if isinstance(exc, SystemExit):
        what = f"called sys.exit({exc.code!r})"
    elif isinstance(exc, KeyboardInterrupt):  # call() re-raises a real Ctrl-C before it gets here
        what = "raised KeyboardInterrupt itself (no Ctrl-C came)"
    elif isinstance(getattr(exc, "problem", None), str):
        what = exc.problem
    else:
        text = str(exc).strip().splitlines()
        what = f"raised {type(exc).__name__}" + (f": {text[0]}" if text else "")
    where = _location(exc, fn)
    return what if where is None else f"{what} ({where})"


def _location(exc: BaseException, fn) -> str | None:
    """'my_guide.py:12': where ``exc`` came from, the innermost line of the plug-in's own file, else of the call."""
    frames = traceback.extract_tb(exc.__traceback__)[1:]  # [0] is call() itself
    source = _source_file(fn)
    own = [f for f in frames if source and Path(f.filename) == Path(source)]
    frame = (own or frames or [None])[-1]
    return None if frame is None else f"{Path(frame.filename).name}:{frame.lineno}"


# --------------------------------------------------------------------------------------------- the checks
# Kinds whose tensors the kit moves to its own device itself (q, advantages); the others' enter the loss as they are.
MOVED_BY_THE_KIT = ("guide", "advantage estimator")
# Kind -> the output field that must carry the gradient of its inputs' log-probs whenever they carry one (it is
# added to the loss: without a gradient it trains nothing, silently).
GRADIENT_FIELDS = {"policy term": "loss", "KL term": "term"}


def placement_problem(kind: str, output, inputs: tuple) -> str | None:
    """Why ``output``'s tensors cannot be read where the kit reads them, or None: a tensor on the ``meta`` device
    (shapes without values) or in a sparse layout; for the kinds the kit does not move, a tensor on another
    device than its inputs'. Checked before anything indexes the output."""
    import torch

    tensors = _output_tensors(output)
    for what, value in tensors:
        if value.device.type == "meta":
            return f"returned {what} on the meta device (a shape without values): compute it from its inputs"
        if value.layout != torch.strided:
            return f"returned {what} in the {value.layout} layout: return a dense tensor (.to_dense())"
    device = _inputs_device(inputs)
    if device is not None and kind not in MOVED_BY_THE_KIT:
        for what, value in tensors:
            if value.device != device:
                return (
                    f"returned {what} on {value.device}, its inputs are on {device}: create it on the inputs' "
                    "device (e.g. torch.zeros_like(inputs.logps))"
                )
    return None


def gradient_problem(kind: str, output, inputs: tuple) -> str | None:
    """Why a term added to the loss (:data:`GRADIENT_FIELDS`) has no gradient while its inputs' log-probs have one,
    or None. Checked after its kind's check (a term of the wrong dtype is said as that)."""
    import torch

    field = GRADIENT_FIELDS.get(kind)
    logps = getattr(inputs[0], "logps", None) if inputs else None
    value = getattr(output, field, None) if field else None
    if torch.is_tensor(value) and torch.is_tensor(logps) and logps.requires_grad and value.grad_fn is None:
        return (
            f"returned its {field} without a gradient (detached, or not computed from its inputs' logps): added to "
            "the loss, it would train nothing; compute it from inputs.logps without .detach()"
        )
    return None


def _output_tensors(output) -> list[tuple[str, Any]]:
    """(what, tensor) of each tensor of an output: the output itself, or a TermOutput's / KLOutput's fields."""
    import torch

    if torch.is_tensor(output):
        return [("a tensor", output)]
    fields = ("advantages", "loss", "term", "value")
    return [(name, v) for name in fields if torch.is_tensor(v := getattr(output, name, None))]


def _inputs_device(inputs: tuple):
    """The device of the first tensor among the inputs (a record's fields in order), or None."""
    import torch

    for value in inputs:
        if torch.is_tensor(value):
            return value.device
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for item in dataclasses.fields(value):
                if torch.is_tensor(tensor := getattr(value, item.name, None)):
                    return tensor.device
    return None


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
    if value.device.type == "meta" or value.layout != torch.strided:  # nothing below could read it
        return f"returned {what} on the {value.device.type} device in the {value.layout} layout: return a dense tensor"
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
