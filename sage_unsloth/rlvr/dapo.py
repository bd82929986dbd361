"""DAPO's pieces for the SAGE trainer (the DAPO recipes, TRL backend where said): dynamic sampling (groups whose
first reward is all equal are dropped and refilled from the training set), TRL 0.23's "dapo" normaliser
(``dapo_normalizer: generation``, by rescaling ``num_items_in_batch``, which TRL 1.15 and unsloth_zoo both divide
by), and the vLLM importance-sampling clipped-fraction metric (TRL logs the ratio's min / mean / max itself).
DAPO's soft overlong punishment is TRL's own reward function, added by the trainer factory.

Functions of the trainer (they read its settings; dynamic sampling reads each rollout record's rewards, see
rlvr/taps.py) and pure helpers (``concat_rollouts``, ``importance_sampling_clipped_fraction``), tested in
tests/rlvr/test_dapo.py.
"""

from __future__ import annotations

import math

import torch

from sage_unsloth import compat


def importance_sampling_clipped_fraction(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> float:
    """Fraction of the vLLM importance ratios exp(old - sampling) that TRL's ``mode`` truncates or masks:
    per completion token for token_* modes, per sequence for sequence_* modes (ratio of the summed log-ratios)."""
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        ratio, valid = torch.exp(diff.sum(-1)), mask.sum(-1) > 0
    else:
        ratio, valid = torch.exp(diff), mask.bool()
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    outside = ((ratio < low) | (ratio > high))[valid]
    return outside.float().mean().item() if outside.numel() else 0.0


# How each per-row tensor of a TRL rollout batch is padded when rollouts are concatenated (dynamic sampling).
_LEFT_PADDED = {"prompt_ids": "pad", "prompt_mask": 0}
_RIGHT_PADDED = {
    "completion_ids": "pad",
    "completion_mask": 0,
    "tool_mask": 1,
    "old_per_token_logps": 0.0,
    "ref_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0,
    "importance_sampling_ratio": 0.0,
}
_PER_ROW_1D = ("advantages",)


def concat_rollouts(parts: list[tuple[dict, torch.Tensor]], pad_token_id: int) -> dict:
    """Concatenate the rows ``index`` of several rollout batches (TRL's (B, P) / (B, C) layout) into one batch.

    Prompts are re-padded on the left and completion-aligned tensors on the right to the widest part;
    ``num_items_in_batch`` is recounted (one process). Keys this does not know (images, Unsloth's layout)
    raise, rather than being merged wrongly.
    """
    keys = set(parts[0][0])
    merged: dict = {}
    for key in keys:
        values = [
            batch[key][index.to(batch[key].device)]
            if torch.is_tensor(batch[key]) and batch[key].dim() > 0
            else batch[key]
            for batch, index in parts
        ]
        if key == "num_items_in_batch":
            continue
        if key in _PER_ROW_1D:
            merged[key] = torch.cat(values)
            continue
        side = "left" if key in _LEFT_PADDED else "right" if key in _RIGHT_PADDED else None
        if side is None:
            raise ValueError(
                f"dynamic sampling cannot merge rollout field {key!r} (text batches in TRL's layout only)"
            )
        fill = {**_LEFT_PADDED, **_RIGHT_PADDED}[key]
        fill = pad_token_id if fill == "pad" else fill
        width = max(v.size(1) for v in values)
        padded = []
        for v in values:
            extra = v.new_full((v.size(0), width - v.size(1)), fill)
            padded.append(torch.cat([extra, v] if side == "left" else [v, extra], dim=1))
        merged[key] = torch.cat(padded)
    loss_mask = compat.loss_mask(merged)
    merged["num_items_in_batch"] = loss_mask.sum()
    return merged


def group_is_degenerate(rewards_per_func: torch.Tensor, num_groups: int) -> torch.Tensor:
    """(groups,) True where the first reward function gave every completion of the group the same value."""
    first = rewards_per_func[:, 0].view(num_groups, -1)
    spread = torch.nan_to_num(first, nan=0.0)
    return (spread.max(dim=1).values - spread.min(dim=1).values) == 0


def refill_rows(trainer, num_prompts: int, round_index: int) -> list[dict]:
    """Fresh prompts for dynamic sampling: a seeded draw from the training set, a pure function of
    (seed, step, round), each prompt repeated num_generations times as TRL's sampler does."""
    generator = torch.Generator().manual_seed(
        trainer.args.seed * 7919 + int(trainer.state.global_step) * 31 + round_index
    )
    order = torch.randperm(len(trainer.train_dataset), generator=generator)[:num_prompts].tolist()
    return [trainer.train_dataset[i] for i in order for _ in range(trainer.num_generations)]


def dynamic_sampling(trainer, inputs, rollout):
    """DAPO's dynamic sampling: keep groups whose first reward varies, refill from fresh prompts until the
    batch has as many groups as asked, at most ``dynamic_sampling_max_rounds`` rollouts; past that the
    batch is completed with degenerate groups (advantage 0) and the shortfall is logged. ``rollout(rows)`` runs
    one rollout with the per-rollout steps (rlvr/taps.py) and returns its record; the merged batch is returned."""
    group = trainer.num_generations
    wanted = len(inputs) // group
    kept, degenerate, rounds = [], [], 0
    batch_rows = list(inputs)
    while True:
        record = rollout(batch_rows)
        output = record.output
        rounds += 1
        flat = group_is_degenerate(record.rewards_per_func, len(batch_rows) // group)
        for g, is_flat in enumerate(flat.tolist()):
            (degenerate if is_flat else kept).append((output, g))
        if rounds == 1:
            first_round_kept = len(kept) / wanted
        if len(kept) >= wanted or rounds >= trainer.args.dynamic_sampling_max_rounds:
            break
        batch_rows = refill_rows(trainer, wanted, rounds)
    chosen = kept[:wanted]
    short = wanted - len(chosen)
    chosen += degenerate[:short]
    parts: dict[int, tuple[dict, list[int]]] = {}
    for batch, g in chosen:
        parts.setdefault(id(batch), (batch, []))[1].extend(range(g * group, (g + 1) * group))
    pad_id = compat.pad_token_id(trainer.processing_class)
    merged = concat_rollouts([(b, torch.tensor(rows)) for b, rows in parts.values()], pad_id)
    metrics = compat.metrics(trainer, "train")
    metrics["dynamic_sampling/rounds"].append(float(rounds))
    metrics["dynamic_sampling/kept_frac_first_round"].append(first_round_kept)
    metrics["dynamic_sampling/degenerate_frac"].append(short / wanted)
    return merged


def official_normaliser(trainer, output: dict) -> None:
    """dapo_normalizer=generation: TRL 0.23's (the official code's) "dapo" normaliser on ``trainer``'s settings
    (:func:`generation_normaliser`, which the method plan's step calls with the settings its context holds)."""
    generation_normaliser(
        output,
        training=trainer.model.training,
        steps_per_generation=trainer.args.steps_per_generation,
        accumulation_steps=getattr(trainer, "current_gradient_accumulation_steps", None)
        or trainer.args.gradient_accumulation_steps,
    )


def generation_normaliser(
    output: dict, *, training: bool, steps_per_generation: int, accumulation_steps: int
) -> None:
    """dapo_normalizer=generation: TRL 0.23's (the official code's) "dapo" normaliser, all completion tokens
    of the generation batch. TRL 1.15 and unsloth_zoo divide num_items_in_batch by steps_per_generation /
    gradient_accumulation_steps in training; scaling it by the inverse here cancels that on both backends. The
    method plan runs it only for loss_type dapo with dapo_normalizer generation (rlvr/plan.py, choose_steps)."""
    if not training:
        return  # eval: neither TRL version rescales
    factor = steps_per_generation / accumulation_steps
    if factor != 1:
        output["num_items_in_batch"] = output["num_items_in_batch"] * factor


def clipped_importance_fraction(output: dict, *, mode, clip_min, clip_max) -> float | None:
    """The fraction of vLLM importance ratios TRL truncates / masks (TRL logs their min / mean / max), None in
    Unsloth's packed layout; the method plan's step runs it only when vLLM's importance-sampling correction is
    on (rlvr/plan.py, choose_steps)."""
    old, sampling = output.get("old_per_token_logps"), output.get("sampling_per_token_logps")
    mask = compat.loss_mask(output)
    if old is None or sampling is None or old.shape != mask.shape or sampling.shape != mask.shape:
        return None  # Unsloth's packed layout (its zoo loss computes the ratios itself)
    return importance_sampling_clipped_fraction(
        old, sampling, mask, mode=mode, clip_min=clip_min, clip_max=clip_max
    )
