"""The kit's methods as ordered steps at TRL's two interception points.

SageGRPOTrainer (rlvr/trainer.py) intercepts TRL's GRPOTrainer in two places and runs there the steps that the
method plan chose for this configuration (rlvr/plan.py, ``choose_steps``: only the steps with work to do, so no
step tests a setting). A step is ``step(record)``: it reads its record and the record's :class:`StepContext`
(what the trainer fills once per call: the plan, the step, the mode, the metric buffers, SAGE's KL coefficient,
the processes, the one q entry point, and TRL's own settings the loss reads, :class:`TrlSettings`) and writes
its record; no step sees the trainer, so each is testable on a hand-made record and context:

- after the rollout (``_generate_and_score_completions``), on a :class:`Rollout`: TRL generated, scored the
  rewards (the trainer keeps them in ``rollout.rewards_per_func``) and computed its advantages, and the trainer
  gathered the signals q reads (``rollout.policy`` / ``rollout.reference``); DAPO's dynamic sampling
  (rlvr/dapo.py) may run several rollouts, each through the steps after each rollout, and merges the kept groups,
  which then go through the steps after the batch.
- in the loss (TRL's ``_compute_loss``, or Unsloth's patched ``compute_loss``), on a :class:`LossBatch`: right
  after the loss's own forward (log-probs, entropies, the guide's logit signals) and before TRL reads the
  advantages or the reference, the steps in the loss run; the trainer adds ``loss.added`` to TRL's loss.

What each kind optimises is in docs/methods.md; the plug-in contract for the four kinds in docs/extending.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from sage_unsloth import compat
from sage_unsloth.plugins import anchor
from sage_unsloth.plugins import calls as plugin_calls
from sage_unsloth.plugins.advantages import GroupRewards
from sage_unsloth.plugins.kl_terms import KLTokens
from sage_unsloth.plugins.policy_terms import TokenBatch
from sage_unsloth.rlvr import dapo

# --------------------------------------------------------------------------- per-step seeds

# (seed, step, call) multipliers of each noise stream. A pure function of (seed, step, call, process), so a
# resumed run draws exactly the same noise; the streams differ so that the guide's and the policy term's draws
# are not the same numbers.
SEED_STREAMS = {"guide": (1_000_003, 1009, 7), "policy_term": (1_000_033, 1013, 11)}


def step_seed(seed: int, step: int, call: int, process: int, *, stream: str) -> int:
    """Seed of the ``call``-th draw of optimizer step ``step`` on process ``process`` in one noise stream."""
    a, b, c = SEED_STREAMS[stream]
    return seed * a + step * b + call * c + process


class StepNoise:
    """One noise stream's generator, reseeded for every draw by :func:`step_seed` (calls counted per step)."""

    def __init__(self, stream: str):
        self.stream = stream
        self.generator = torch.Generator(device="cpu")
        self.last_step, self.calls = -1, 0

    def draw(self, seed: int, step: int, process: int) -> torch.Generator:
        if step != self.last_step:
            self.last_step, self.calls = step, 0
        else:
            self.calls += 1
        self.generator.manual_seed(step_seed(seed, step, self.calls, process, stream=self.stream))
        return self.generator


# --------------------------------------------------------------------------- records


class Steps(NamedTuple):
    """The steps that run at each interception point, in order (chosen by the plan: rlvr/plan.py)."""

    after_each_rollout: tuple
    after_the_batch: tuple
    in_the_loss: tuple


@dataclass(frozen=True)
class TrlSettings:
    """TRL's own settings the steps read, as TRL's loss reads them (the trainer copies them once per call)."""

    aggregation: dict = field(default_factory=dict)  # compat.aggregate_like_trl's, but num_items_in_batch
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    importance_sampling_level: str = "token"
    use_bias_correction_kl: bool = False
    # use_vllm with its importance-sampling correction: TRL weighs its policy term by the ratio
    vllm_importance_weights: bool = False
    vllm_importance_sampling: dict = field(default_factory=dict)  # its mode, clip_min, clip_max
    steps_per_generation: int = 1
    accumulation_steps: int = 1  # this window's micro-batches (TRL's current_gradient_accumulation_steps)

    def aggregate(self, per_token: torch.Tensor, mask: torch.Tensor, batch: dict) -> torch.Tensor:
        """A per-token loss (B, T) aggregated exactly as TRL aggregates its own (compat.aggregate_like_trl)."""
        return compat.aggregate_like_trl(
            per_token, mask, num_items_in_batch=batch.get("num_items_in_batch"), **self.aggregation
        )


@dataclass(frozen=True)
class StepContext:
    """What the steps read besides their record, filled by the trainer once per rollout or loss call."""

    plan: Any  # the config's frozen MethodPlan (rlvr/plan.py)
    mode: str  # "train" or "eval"
    log: dict  # TRL's metric buffers of this mode (name -> list of values)
    kl_coef: float  # SAGE's KL coefficient, the config's beta (in the reward placement TRL's own beta is 0)
    accelerator: Any  # gather / reduce over the processes, this process's index
    q: Callable  # q(batch, mask, layout=, policy=, reference=): the trainer's one q entry point (guide, clip, log)
    noise: Callable  # noise(stream) -> the generator of that noise stream for this draw (step_seed)
    step: int = 1  # the optimizer step being computed (1-based), as a plug-in fault names it
    reward_weights: torch.Tensor | None = None  # TRL's weight of each reward function
    num_generations: int = 0  # completions per prompt in this mode
    pad_token_id: int | None = None
    unsloth_patched: bool = False  # the trainer subclasses Unsloth's patched GRPOTrainer (its batch layout)
    trl: TrlSettings = field(default_factory=TrlSettings)


@dataclass
class Rollout:
    """One TRL rollout and what the steps after it know of it."""

    output: dict | None = None  # TRL's batch (this process's rows), changed in place by the steps
    rewards_per_func: torch.Tensor | None = None  # (N all processes, reward functions), from TRL's scoring
    rewards: torch.Tensor | None = None  # (N,) the summed weighted reward the estimator reads (shaped or not)
    context: StepContext | None = None  # filled by the trainer before the steps run
    # The signals q reads, TRL's layout (B, C): the rollout policy's logps / entropies / logits and the reference's
    # ref_logps / ref_entropies, from TRL's own scoring passes when they ran anyway, else the kit's own.
    policy: dict = field(default_factory=dict)
    reference: dict = field(default_factory=dict)
    q: torch.Tensor | None = None  # (B, C), set by q_at_rollout
    # TRL's scoring calls still to come in this rollout, in order (the trainer names them from compat's pinned
    # condition), and which of them to capture: {"old_logps": {"need_entropy": bool}, "reference": {}}.
    scoring_calls: list = field(default_factory=list)
    capture: dict = field(default_factory=dict)


@dataclass
class LossBatch:
    """One loss call: the copy of TRL's batch its loss reads, and the forward's outputs."""

    batch: dict  # a copy of the buffered batch (TRL reuses that across num_iterations: it must not change)
    layout: str = "trl"  # "trl" (B, C) or "unsloth" (B, C + max_left_pad, Unsloth's loss)
    context: StepContext | None = None
    scoring_calls: list = field(default_factory=list)  # "loss_forward": the one scoring call of TRL's loss
    logps: torch.Tensor | None = None  # current policy, with gradient
    entropies: torch.Tensor | None = None
    logits: dict = field(default_factory=dict)  # the guide's logit signals, from the same chunked pass
    mask: torch.Tensor | None = None  # Unsloth's layout only: its loss mask
    user_quantile: float | None = None  # Unsloth's layout only: the user's own top_entropy_quantile
    added: list = field(default_factory=list)  # losses added to TRL's (policy term, KL correction)
    logged_kl: float | None = None  # the KL term's value, logged in place of TRL's k3


# --------------------------------------------------------------------------- after each rollout


def summed_rewards(rollout: Rollout) -> None:
    """rewards = sum_f w_f r_f (NaN for a completion no function could score), as TRL sums them."""
    per_func = rollout.rewards_per_func
    if per_func is None:
        raise RuntimeError(
            "SAGE found no rewards from _calculate_rewards: check the pinned trl/unsloth versions"
        )
    unscorable = torch.isnan(per_func).all(dim=1)
    weights = rollout.context.reward_weights
    rewards = (per_func * weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[unscorable] = torch.nan
    rollout.rewards = rewards


def q_at_rollout(rollout: Rollout) -> None:
    """q of the rollout (TRL's layout, 1 off the mask, logged) from the signals the trainer gathered."""
    output = rollout.output
    rollout.q = rollout.context.q(
        output, compat.loss_mask(output), layout="trl", policy=rollout.policy, reference=rollout.reference
    )


def reward_placement(rollout: Rollout) -> None:
    """sage_kl_placement=reward: r~ = r - beta * sum_t [log pi - log pi_ref - log q_t] (rollout policy, no
    gradient); the estimator step then recomputes the advantages from r~."""
    ctx, output = rollout.context, rollout.output
    mask = compat.loss_mask(output)
    logps, ref = rollout.policy["logps"], rollout.reference["ref_logps"]  # the kit's own reference pass
    log_q = anchor.log_q(rollout.q).to(logps.device)
    seq_kl = anchor.sequence_pseudo_kl(logps.float(), ref.float(), log_q, mask)
    all_seq_kl = ctx.accelerator.gather(seq_kl)
    rollout.rewards = rollout.rewards - ctx.kl_coef * all_seq_kl.to(rollout.rewards.device)
    ctx.log["sage/kl_in_reward"].append((ctx.kl_coef * all_seq_kl.float().mean()).item())


def estimate_advantages(rollout: Rollout) -> None:
    """The configured estimator on ``rollout.rewards`` (shaped or not) replaces TRL's advantage; the grpo
    estimator runs only when the rewards were shaped (TRL's own stands otherwise), as GRPO's formula on them."""
    ctx = rollout.context
    plan = ctx.plan
    num_generations = ctx.num_generations
    completions = rollout.rewards.numel()
    advantages = plugin_calls.call(
        "advantage estimator",
        plan.estimator.name,
        plan.estimator_call,
        GroupRewards(rollout.rewards, num_generations),
        step=ctx.step,
        check=lambda out: plugin_calls.advantages_problem(out, completions),
    )
    output = rollout.output
    rows = output["completion_ids"].size(0)
    start = ctx.accelerator.process_index * rows
    output["advantages"] = advantages[start : start + rows].to(output["advantages"])


def shift_reference_at_rollout(rollout: Rollout) -> None:
    """q at rollout (placement loss, q not computed in the loss): ref_per_token_logps <- ref + log q."""
    ctx = rollout.context
    shift_reference(
        rollout.output, rollout.q, pad_token_id=ctx.pad_token_id, unsloth_patched=ctx.unsloth_patched
    )


def shift_reference(output: dict, q: torch.Tensor, *, pad_token_id, unsloth_patched: bool) -> None:
    """ref_per_token_logps <- ref + log q, in whichever layout the scorer produced: TRL's (B, C), or Unsloth's
    left-packed (B, C + max_left_pad) (compat.to_unsloth_layout)."""
    ref = output.get("ref_per_token_logps")
    if ref is None:
        return
    log_q = anchor.log_q(q).to(ref.dtype)
    completion_len = output["completion_ids"].size(1)
    if ref.shape == log_q.shape and not ("max_left_pad" in output and unsloth_patched):
        output["ref_per_token_logps"] = ref + log_q
        return
    mapped = compat.to_unsloth_layout(log_q, output["prompt_ids"], output["completion_ids"], pad_token_id)
    if mapped.shape != ref.shape:
        raise RuntimeError(
            f"SAGE cannot place log q: ref_per_token_logps has shape {tuple(ref.shape)}, expected (B, C)="
            f"{tuple(log_q.shape)} (TRL) or (B, C + max_left_pad)={tuple(mapped.shape)} (Unsloth); "
            f"completion length {completion_len}. Check the pinned trl/unsloth versions."
        )
    output["ref_per_token_logps"] = ref + mapped.to(ref.device)


# --------------------------------------------------------------------------- after the (merged) batch


def log_importance_sampling(rollout: Rollout) -> None:
    """vLLM importance sampling corrected: the share of ratios TRL truncates / masks."""
    ctx = rollout.context
    fraction = dapo.clipped_importance_fraction(rollout.output, **ctx.trl.vllm_importance_sampling)
    if fraction is not None:
        ctx.log["sampling/importance_sampling_ratio/clipped_frac"].append(fraction)


def dapo_normaliser(rollout: Rollout) -> None:
    """dapo_normalizer=generation with the dapo loss: TRL 0.23's normaliser."""
    ctx = rollout.context
    dapo.generation_normaliser(
        rollout.output,
        training=ctx.mode == "train",
        steps_per_generation=ctx.trl.steps_per_generation,
        accumulation_steps=ctx.trl.accumulation_steps,
    )


# --------------------------------------------------------------------------- in the loss


def q_in_the_loss(loss: LossBatch) -> None:
    """The official code's order: q from the current policy's forward (no gradient), ref <- ref + log q."""
    batch = loss.batch
    policy = {
        "logps": loss.logps.detach(),
        "entropies": None if loss.entropies is None else loss.entropies.detach(),
        "logits": loss.logits,
    }
    q = loss.context.q(batch, compat.loss_mask(batch), layout="trl", policy=policy)
    if batch.get("ref_per_token_logps") is not None:  # TRL scores no reference at beta 0
        batch["ref_per_token_logps"] = batch["ref_per_token_logps"] + anchor.log_q(q).to(loss.logps.dtype)


def q_in_the_unsloth_loss(loss: LossBatch) -> None:
    """q from the entropies Unsloth's loss handed over (its layout), log q added in place to the reference that
    loss holds (its own copy of the batch's: rlvr/unsloth_hooks.py)."""
    q = loss.context.q(loss.batch, loss.mask, layout="unsloth", policy={"entropies": loss.entropies})
    ref = loss.batch["ref_per_token_logps"]
    ref.add_(anchor.log_q(q).to(device=ref.device, dtype=ref.dtype))


def policy_term(loss: LossBatch) -> None:
    """The configured policy term on the forward's outputs: it may replace batch['advantages'] (read by TRL after
    the forward) and/or add a per-token loss, aggregated as TRL aggregates its own."""
    ctx = loss.context
    term = ctx.plan.policy_term_fn
    batch, logps = loss.batch, loss.logps
    mask = compat.loss_mask(batch)
    advantages = batch["advantages"]
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    advantages = advantages.expand_as(logps)
    old = batch.get("old_per_token_logps")
    tokens = TokenBatch(
        logps=logps,
        old_logps=logps.detach() if old is None else old,
        entropies=torch.zeros_like(logps) if loss.entropies is None else loss.entropies.detach(),
        advantages=advantages,
        mask=mask,
        epsilon_low=ctx.trl.epsilon_low,
        epsilon_high=ctx.trl.epsilon_high,
        generator=ctx.noise("policy_term"),
    )
    out = plugin_calls.call(
        "policy term",
        ctx.plan.policy_term.name,
        term,
        tokens,
        step=ctx.step,
        check=lambda result: plugin_calls.term_output_problem(result, tuple(logps.shape), mask),
    )
    for name, value in out.metrics.items():
        ctx.log[name].append(value)
    if out.advantages is not None:
        batch["advantages"] = out.advantages.detach()
    if out.loss is None:
        return
    added = out.loss
    if ctx.trl.vllm_importance_weights:
        added = added * batch["importance_sampling_ratio"]  # as TRL weighs its policy term
    loss.added.append(ctx.trl.aggregate(added, mask, batch))


def kl_term(loss: LossBatch) -> None:
    """A KL term other than TRL's own k3: beta * agg(term - TRL's k3 term) swaps TRL's k3 for the term's own,
    leaving the rest of TRL's loss as it is (TRL's path only; the config refuses the others under Unsloth)."""
    correction, logged = kl_correction(loss.context, loss.batch, loss.logps)
    loss.added.append(correction)
    loss.logged_kl = logged


def kl_correction(ctx: StepContext, batch: dict, logps: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(beta * agg(term - TRL's k3 term), the term's plain value averaged over the tokens of all processes)."""
    ref = batch["ref_per_token_logps"]  # already shifted by log q
    mask = compat.loss_mask(batch)
    old = batch.get("old_per_token_logps")
    ratio = ctx.trl.use_bias_correction_kl
    plan = ctx.plan
    kl = plugin_calls.call(
        "KL term",
        plan.kl_term.name,
        plan.kl_term_fn,
        KLTokens(logps=logps, ref_logps=ref, old_logps=old, ratio=ratio),
        step=ctx.step,
        check=lambda out: plugin_calls.kl_output_problem(out, tuple(logps.shape), mask),
    )
    # What TRL put in its loss: k3, times its importance weight (token or sequence level) if asked.
    trl_term = anchor.shaped_kl(logps, ref, 0.0, estimator="k3")
    if ratio:
        log_ratio = logps - (logps.detach() if old is None else old)
        if ctx.trl.importance_sampling_level == "sequence":
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        trl_term = trl_term * torch.exp(log_ratio)
    correction = ctx.kl_coef * ctx.trl.aggregate(kl.term - trl_term, mask, batch)
    value = kl.value.detach()
    totals = ctx.accelerator.reduce(torch.stack([(value * mask).sum(), mask.sum().float()]), reduction="sum")
    return correction, (totals[0] / totals[1].clamp(min=1.0)).item()
