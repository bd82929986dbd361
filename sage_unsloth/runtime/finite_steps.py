"""No non-finite step is ever applied, whatever its cause: the guard the kit's trainers run (SFT, and RLVR on TRL's
GRPOTrainer or Unsloth's patched one; CheckpointMixin in sage_unsloth/runtime/checkpoints.py calls it).

The Trainer's own answer to a NaN loss is to leave it out of the logged mean (``logging_nan_inf_filter``) and apply
the step anyway: NaN gradients turn every weight they touch into NaN, the next checkpoint holds them, and the run
dies steps later somewhere unrelated (a sampler fed NaN probabilities). :func:`check_micro_step` checks each
micro-batch's loss and :func:`check_gradient_norm` the norm of the window's gradients, before the optimizer step:
the norm gradient clipping computes anyway (compat.clip_with_norm, between that norm and the clip), or, where the
Trainer clips otherwise (DeepSpeed, FSDP, ...), its own on the micro-batch after which the optimizer steps. A
non-finite one stops the run with one :class:`NonFiniteStep` line saying where it came from (the batch entries
that were already non-finite, else the loss or the gradient of the first parameter concerned). A step
with finite gradients can still leave weights that overflow the next forward (a learning rate of 1e30): the RLVR
rollout that then samples from NaN probabilities stops in one line too (:func:`sampling_fault`), not in a
traceback from ``torch.multinomial``.

Contact (sage_unsloth/compat.py, row ``step_guard``): ``training_step(model, inputs, num_items_in_batch)``
returns the micro-batch's detached loss after its backward; ``_prepare_inputs`` returns the batch the loss reads
(GRPOTrainer's scored rollout slice); ``accelerator.sync_gradients`` is True on the micro-batch after which
``_run_epoch`` steps the optimizer. Unsloth replaces ``Trainer.training_step`` with its own, which the kit's
trainers override like TRL's.

This module imports no heavy library at import time (the stage CLI imports :class:`TrainingFault` before torch).
"""

from __future__ import annotations

__all__ = [
    "NonFiniteStep",
    "TrainingFault",
    "check_gradient_norm",
    "check_micro_step",
    "gradient_problem",
    "nonfinite_entries",
    "sampling_fault",
    "weights_summary",
]


class TrainingFault(RuntimeError):
    """Stops a run before its optimizer step; the message is one line (the stage CLI prints it, exit 1, with the
    newest checkpoint to continue from when ``resumable``: the fault's cause came after that checkpoint)."""

    resumable = True


class NonFiniteStep(TrainingFault):
    """A step whose loss or gradients are not finite: not applied, the run stops."""


def nonfinite_entries(batch) -> list[str]:
    """'advantages (8 of 8 nan)' for each floating tensor of ``batch`` (a dict) holding a non-finite value."""
    import torch

    found = []
    for key, value in (batch or {}).items() if isinstance(batch, dict) else ():
        if torch.is_tensor(value) and value.is_floating_point():
            bad = ~torch.isfinite(value.detach())
            if bad.any():
                first = value.detach()[bad].flatten()[0].item()
                found.append(f"{key} ({int(bad.sum())} of {value.numel()}, e.g. {first})")
    return found


def gradient_problem(named_parameters) -> str | None:
    """Why the accumulated gradients of ``named_parameters`` cannot be applied (a non-finite value, or a norm that
    overflows float32), or None. One stacked norm and one device sync per optimizer step."""
    import torch

    grads = [(name, p.grad) for name, p in named_parameters if p.requires_grad and p.grad is not None]
    if not grads:
        return None
    norms = torch.stack([g.detach().float().norm() for _, g in grads])
    if torch.isfinite(norms.norm()).item():
        return None
    bad = [name for (name, g), norm in zip(grads, norms.tolist()) if not torch.isfinite(g).all()]
    if bad:
        return f"{len(bad)} of {len(grads)} trainable tensors have non-finite gradients (first: {bad[0]})"
    return f"the gradient norm overflows float32 (largest tensor norm {norms.max().item():.3g})"


def weights_summary(named_parameters) -> str:
    """'2 of 28 trainable tensors hold non-finite weights (first: x)' or 'the largest trainable weight is 1.2e+30 in
    magnitude': what a policy that can no longer sample looks like."""
    import torch

    weights = [(name, p.detach()) for name, p in named_parameters if p.requires_grad]
    bad = [name for name, w in weights if not torch.isfinite(w).all()]
    if bad:
        return f"{len(bad)} of {len(weights)} trainable tensors hold non-finite weights (first: {bad[0]})"
    largest = max((w.abs().max().item() for _, w in weights if w.numel()), default=0.0)
    return f"the largest trainable weight is {largest:.3g} in magnitude"


def sampling_fault(trainer, model, exc: BaseException) -> NonFiniteStep | None:
    """The one line for a rollout whose sampling met non-finite next-token probabilities (the weights an earlier,
    finite step made overflow the forward), or None for any other error."""
    from sage_unsloth.compat import nonfinite_sampling_error

    if not nonfinite_sampling_error(exc):
        return None
    step = int(trainer.state.global_step) + 1
    fault = NonFiniteStep(
        f"step {step}: sampling its rollout met non-finite next-token probabilities: the policy overflows "
        f"({weights_summary(model.named_parameters())}), made so by an earlier step whose gradients were finite: "
        "lower the learning rate and start over (the newest checkpoint may hold those weights too)"
    )
    fault.resumable = False
    return fault


def check_micro_step(trainer, model, loss, batch, *, gradients: bool = True) -> None:
    """Raise :class:`NonFiniteStep` (one line) when this micro-batch's ``loss`` is not finite (naming what of its
    ``batch`` was already non-finite), or, with ``gradients`` (the Trainer's clip does not measure them for the
    guard) on the micro-batch after which the optimizer steps, when the accumulated gradients of ``model`` are not
    (see the module docstring). Called by the trainers' ``training_step`` (sage_unsloth/runtime/checkpoints.py,
    CheckpointMixin) right after the backward, before the optimizer step."""
    import torch

    step = int(trainer.state.global_step) + 1
    if not torch.isfinite(loss.detach()).all():
        entries = nonfinite_entries(batch)
        origin = (
            f"non-finite in its batch: {'; '.join(entries)}"
            if entries
            else "its batch is finite, so the model's forward or the loss itself overflowed (lower the "
            "learning rate, or train in float32/bfloat16 rather than float16)"
        )
        raise NonFiniteStep(
            f"step {step}: the loss is {loss.detach().float().mean().item()}: {origin}; {_KEPT}"
        )
    if gradients and trainer.accelerator.sync_gradients:
        problem = gradient_problem(model.named_parameters())
        if problem is not None:
            raise NonFiniteStep(f"step {step}: the loss is finite but {problem}; {_KEPT}")


def check_gradient_norm(trainer, model, total_norm) -> None:
    """Raise :class:`NonFiniteStep` (the words of :func:`check_micro_step`) when ``total_norm``, the norm gradient
    clipping computed over the window's gradients before clipping them, is not finite; the gradients are still as
    the backward left them, so the line names the first non-finite one. One device sync per optimizer step (the
    Trainer reads the same norm for its log)."""
    import torch

    if torch.isfinite(total_norm).item():
        return
    step = int(trainer.state.global_step) + 1
    problem = gradient_problem(model.named_parameters()) or f"the gradient norm is {total_norm.item()}"
    raise NonFiniteStep(f"step {step}: the loss is finite but {problem}; {_KEPT}")


_KEPT = "the step was not applied and no checkpoint of it was written"
