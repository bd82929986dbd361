"""The kit's methods as ordered steps at TRL's two interception points.

SageGRPOTrainer (rlvr/trainer.py) intercepts TRL's GRPOTrainer in two places and runs a short list of plain
functions at each, in the order written here; every step reads and writes one record and nothing else:

- after the rollout (``_generate_and_score_completions``), on a :class:`Rollout`: TRL generated, scored the
  rewards (the trainer keeps them in ``rollout.rewards_per_func``) and computed its advantages; DAPO's dynamic
  sampling (rlvr/dapo.py) may run several rollouts, each through :data:`AFTER_EACH_ROLLOUT`, and merges the kept
  groups, which then go through :data:`AFTER_THE_BATCH`.
- in the loss (TRL's ``_compute_loss``, or Unsloth's patched ``compute_loss``), on a :class:`LossBatch`: right
  after the loss's own forward (log-probs, entropies, the guide's logit signals) and before TRL reads the
  advantages or the reference, :data:`IN_THE_LOSS` runs; the trainer adds ``loss.added`` to TRL's loss.

What each kind optimises is in docs/methods.md; the plug-in contract for the four kinds in docs/extending.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sage_unsloth import anchor, compat, guides, plugin_calls
from sage_unsloth.rlvr import dapo
from sage_unsloth.rlvr.advantages import GroupRewards
from sage_unsloth.rlvr.kl_terms import KLTokens
from sage_unsloth.rlvr.policy_terms import TokenBatch

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


@dataclass
class Rollout:
    """One TRL rollout and what the steps after it know of it."""

    output: dict | None = None  # TRL's batch (this process's rows), changed in place by the steps
    rewards_per_func: torch.Tensor | None = None  # (N all processes, reward functions), from TRL's scoring
    rewards: torch.Tensor | None = None  # (N,) the summed weighted reward the estimator reads (shaped or not)
    recompute_advantages: bool = (
        False  # set when ``rewards`` is no longer what TRL's advantage was built from
    )
    policy: dict = field(
        default_factory=dict
    )  # the rollout policy's logps / entropies / logits, if TRL scored them
    reference: dict = field(
        default_factory=dict
    )  # ref_logps / ref_entropies of TRL's reference pass, if captured
    want_policy: dict | None = None  # the capture asked of TRL's old-logp pass ({"need_entropy": bool})
    want_reference: dict | None = None  # the capture asked of TRL's reference pass ({"skip": n})


@dataclass
class LossBatch:
    """One loss call: the copy of TRL's batch its loss reads, and the forward's outputs."""

    batch: dict  # a copy of the buffered batch (TRL reuses that across num_iterations: it must not change)
    layout: str = "trl"  # "trl" (B, C) or "unsloth" (B, C + max_left_pad, Unsloth's loss)
    logps: torch.Tensor | None = None  # current policy, with gradient
    entropies: torch.Tensor | None = None
    logits: dict = field(default_factory=dict)  # the guide's logit signals, from the same chunked pass
    mask: torch.Tensor | None = None  # Unsloth's layout only: its loss mask
    user_quantile: float | None = None  # Unsloth's layout only: the user's own top_entropy_quantile
    added: list = field(default_factory=list)  # losses added to TRL's (policy term, KL correction)
    logged_kl: float | None = None  # the KL term's value, logged in place of TRL's k3


# --------------------------------------------------------------------------- after each rollout


def summed_rewards(trainer, rollout: Rollout) -> None:
    """rewards = sum_f w_f r_f (NaN for a completion no function could score), as TRL sums them."""
    per_func = rollout.rewards_per_func
    if per_func is None:
        raise RuntimeError(
            "SAGE found no rewards from _calculate_rewards: check the pinned trl/unsloth versions"
        )
    unscorable = torch.isnan(per_func).all(dim=1)
    rewards = (per_func * trainer.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[unscorable] = torch.nan
    rollout.rewards = rewards


def reward_placement(trainer, rollout: Rollout) -> None:
    """sage_kl_placement=reward: r~ = r - beta * sum_t [log pi - log pi_ref - log q_t] (rollout policy, no
    gradient); the estimator step then recomputes the advantages from r~."""
    if trainer.sage_plan.placement != "reward":
        return
    output = rollout.output
    mask = compat.loss_mask(output)
    plan = trainer.sage_plan
    logps, entropies, logits = trainer.sage_policy_stats(output, rollout.policy)
    stats = {"logps": logps, "entropies": entropies, "logits": logits}
    # TRL's own reference pass is off here (its beta is 0): a guide reading the reference gets the kit's, which
    # the pseudo-KL needs anyway (with the entropies of the same pass for ref_entropies: no extra pass).
    ref = ref_entropies = None
    if any(n in guides.REFERENCE_SIGNALS for n in plan.guide_needs):
        ref, ref_entropies = trainer.sage_reference_scores(
            output, entropies="ref_entropies" in plan.guide_needs
        )
    q = trainer.sage_compute_q(output, {**stats, "ref_logps": ref, "ref_entropies": ref_entropies})
    trainer.sage_log_q(q, mask)
    if ref is None:
        ref = trainer.sage_reference_scores(output)[0]
    seq_kl = anchor.sequence_pseudo_kl(logps.float(), ref.float(), anchor.log_q(q).to(logps.device), mask)
    all_seq_kl = trainer.accelerator.gather(seq_kl)
    rollout.rewards = rollout.rewards - trainer.sage_beta * all_seq_kl.to(rollout.rewards.device)
    rollout.recompute_advantages = True
    compat.metrics(trainer, trainer.sage_mode)["sage/kl_in_reward"].append(
        (trainer.sage_beta * all_seq_kl.float().mean()).item()
    )


def estimate_advantages(trainer, rollout: Rollout) -> None:
    """The configured estimator on ``rollout.rewards`` (shaped or not) replaces TRL's advantage; with the grpo
    estimator TRL's own stands unless the rewards were shaped, then GRPO's formula is recomputed on them."""
    plan = trainer.sage_plan
    if plan.estimator_fn is None and not rollout.recompute_advantages:
        return
    mode = trainer.sage_mode
    num_generations = trainer.num_generations if mode == "train" else trainer.num_generations_eval
    completions = rollout.rewards.numel()
    advantages = plugin_calls.call(
        "advantage estimator",
        plan.estimator.name,
        plan.estimator_call,
        GroupRewards(rollout.rewards, num_generations),
        step=trainer.sage_step,
        check=lambda out: plugin_calls.advantages_problem(out, completions),
    )
    output = rollout.output
    rows = output["completion_ids"].size(0)
    start = trainer.accelerator.process_index * rows
    output["advantages"] = advantages[start : start + rows].to(output["advantages"])


def shift_reference_at_rollout(trainer, rollout: Rollout) -> None:
    """q at rollout (placement loss, q not computed in the loss): ref_per_token_logps <- ref + log q."""
    plan = trainer.sage_plan
    if plan.placement != "loss" or trainer.sage_q_in_loss:
        return
    output = rollout.output
    captured = {**rollout.policy, **rollout.reference} if (rollout.policy or rollout.reference) else None
    q = trainer.sage_compute_q(output, captured)
    trainer.sage_log_q(q, compat.loss_mask(output))
    if plan.guided and trainer.beta != 0.0:
        trainer.sage_shift_reference(output, q)


# TRL scored the rewards (rollout.rewards_per_func) before these run.
AFTER_EACH_ROLLOUT = (summed_rewards, reward_placement, estimate_advantages, shift_reference_at_rollout)


# --------------------------------------------------------------------------- after the (merged) batch


def log_importance_sampling(trainer, rollout: Rollout) -> None:
    dapo.log_importance_sampling(trainer, rollout.output)


def dapo_normaliser(trainer, rollout: Rollout) -> None:
    dapo.official_normaliser(trainer, rollout.output)


AFTER_THE_BATCH = (log_importance_sampling, dapo_normaliser)


# --------------------------------------------------------------------------- in the loss


def q_in_the_loss(trainer, loss: LossBatch) -> None:
    """The official code's order: q from the current policy's forward (no gradient), ref <- ref + log q."""
    if not trainer.sage_q_in_loss:
        return
    batch = loss.batch
    if loss.layout == "unsloth":
        # Unsloth's loss holds this very tensor (its own copy of the batch's reference): shift it in place.
        q = trainer.sage_unsloth_q(loss.entropies, loss.mask)
        trainer.sage_log_q(q, loss.mask)
        ref = batch["ref_per_token_logps"]
        ref.add_(anchor.log_q(q).to(device=ref.device, dtype=ref.dtype))
        return
    stats = {
        "logps": loss.logps.detach(),
        "entropies": None if loss.entropies is None else loss.entropies.detach(),
        "logits": loss.logits,
    }
    q = trainer.sage_compute_q(batch, stats)
    trainer.sage_log_q(q, compat.loss_mask(batch))
    if trainer.beta != 0.0 and batch.get("ref_per_token_logps") is not None:
        batch["ref_per_token_logps"] = batch["ref_per_token_logps"] + anchor.log_q(q).to(loss.logps.dtype)


def policy_term(trainer, loss: LossBatch) -> None:
    """The configured policy term on the forward's outputs: it may replace batch['advantages'] (read by TRL after
    the forward) and/or add a per-token loss, aggregated as TRL aggregates its own."""
    term = trainer.sage_plan.policy_term_fn
    if term is None or loss.layout != "trl":
        return
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
        epsilon_low=trainer.epsilon_low,
        epsilon_high=trainer.epsilon_high,
        generator=trainer.sage_noise("policy_term", trainer.args.seed),
    )
    out = plugin_calls.call(
        "policy term",
        trainer.sage_plan.policy_term.name,
        term,
        tokens,
        step=trainer.sage_step,
        check=lambda result: plugin_calls.term_output_problem(result, tuple(logps.shape), mask),
    )
    log = compat.metrics(trainer, trainer.sage_mode)
    for name, value in out.metrics.items():
        log[name].append(value)
    if out.advantages is not None:
        batch["advantages"] = out.advantages.detach()
    if out.loss is None:
        return
    added = out.loss
    if trainer.use_vllm and getattr(trainer, "vllm_importance_sampling_correction", False):
        added = added * batch["importance_sampling_ratio"]  # as TRL weighs its policy term
    loss.added.append(compat.aggregate_like_trainer(trainer, added, mask, batch))


def kl_term(trainer, loss: LossBatch) -> None:
    """A KL term other than TRL's own k3: beta * agg(term - TRL's k3 term) swaps TRL's k3 for the term's own,
    leaving the rest of TRL's loss as it is (TRL's path only; the config refuses the others under Unsloth)."""
    if trainer.sage_plan.kl_in_trl_loss or trainer.beta == 0.0 or loss.layout != "trl":
        return
    correction, logged = kl_correction(trainer, loss.batch, loss.logps)
    loss.added.append(correction)
    loss.logged_kl = logged


def kl_correction(trainer, batch: dict, logps: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(beta * agg(term - TRL's k3 term), the term's plain value averaged over the tokens of all processes)."""
    ref = batch["ref_per_token_logps"]  # already shifted by log q
    mask = compat.loss_mask(batch)
    old = batch.get("old_per_token_logps")
    ratio = trainer.args.use_bias_correction_kl
    plan = trainer.sage_plan
    kl = plugin_calls.call(
        "KL term",
        plan.kl_term.name,
        plan.kl_term_fn,
        KLTokens(logps=logps, ref_logps=ref, old_logps=old, ratio=ratio),
        step=trainer.sage_step,
        check=lambda out: plugin_calls.kl_output_problem(out, tuple(logps.shape), mask),
    )
    # What TRL put in its loss: k3, times its importance weight (token or sequence level) if asked.
    trl_term = anchor.shaped_kl(logps, ref, 0.0, estimator="k3")
    if ratio:
        log_ratio = logps - (logps.detach() if old is None else old)
        if trainer.importance_sampling_level == "sequence":
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        trl_term = trl_term * torch.exp(log_ratio)
    correction = trainer.beta * compat.aggregate_like_trainer(trainer, kl.term - trl_term, mask, batch)
    value = kl.value.detach()
    totals = trainer.accelerator.reduce(
        torch.stack([(value * mask).sum(), mask.sum().float()]), reduction="sum"
    )
    return correction, (totals[0] / totals[1].clamp(min=1.0)).item()


IN_THE_LOSS = (q_in_the_loss, policy_term, kl_term)
