"""Exploration baselines from the literature in the SAGE harness: their config fields, their checks and the
trainer hooks that run them (docs/methods.md says what each optimises).

- ``advantage_estimator`` (rlvr/advantages.py): GRPO's group advantage (default) or Pass@k Training's.
- ``policy_term`` (rlvr/policy_terms.py): the entropy advantage, Clip-Cov or KL-Cov, inside TRL's loss.
- ``ref_reset_steps`` (rlvr/ref_reset.py): ProRL's periodic reference reset.
- The 80/20 high-entropy-token baseline is TRL's ``top_entropy_quantile`` (config only; both backends).

Which combinations compose: every SAGE guide composes with all of them (q reshapes the KL anchor, the
baselines reshape the advantage / the policy term or move the anchor). Refused in one line: a policy term
under Unsloth (its compiled loss has no additive slot and no per-token advantage input), a policy term with a loss type
other than the four token-level ones, KL-Cov where every batch is used once (pi_old == pi, its penalty and gradient are 0), a reference reset
without a KL anchor (beta 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sage_unsloth import compat
from sage_unsloth.compat import TOKEN_LEVEL_LOSS_TYPES
from sage_unsloth.config_args import ConfigError
from sage_unsloth.rlvr.advantages import ADVANTAGE_ESTIMATORS
from sage_unsloth.rlvr.policy_terms import POLICY_TERMS, TokenBatch

# The per-call inputs of each kind, before its own keyword arguments: estimator(rewards, num_generations, args)
# and term(batch, args), ``args`` the whole config (what the built-ins read their flat fields from).
ESTIMATOR_INPUTS = 3
TERM_INPUTS = 2


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class ExplorationArgs:
    """Config fields of the exploration baselines (mixed into SageGRPOConfig)."""

    advantage_estimator: str = field(
        default="grpo",
        metadata=_help(
            f"Sequence advantage: one of {ADVANTAGE_ESTIMATORS.names()} (passk: Pass@k Training, arXiv "
            "2508.10751), package.module:function or file.py:function (rewards, num_generations, args)."
        ),
    )
    advantage_estimator_args: dict[str, Any] | str | None = field(
        default=None,
        metadata=_help(
            "Keyword arguments of the advantage estimator (a plug-in's, after rewards, num_generations, args), a "
            "mapping; JSON on the command line."
        ),
    )
    passk_k: int = field(
        default=4, metadata=_help("advantage_estimator=passk: k (1 <= k <= num_generations).")
    )
    policy_term: str = field(
        default="none",
        metadata=_help(
            f"Per-token policy term (TRL backend): none, one of {POLICY_TERMS.names()}, package.module:function "
            "or file.py:function (batch, args)."
        ),
    )
    policy_term_args: dict[str, Any] | str | None = field(
        default=None,
        metadata=_help(
            "Keyword arguments of the policy term (a plug-in's, after batch, args), a mapping; JSON on the "
            "command line."
        ),
    )
    entropy_adv_alpha: float = field(
        default=0.4, metadata=_help("entropy_adv: alpha in min(alpha * H.detach(), |A| / kappa).")
    )
    entropy_adv_kappa: float = field(default=2.0, metadata=_help("entropy_adv: kappa (> 1 keeps sign(A))."))
    clip_cov_ratio: float = field(default=2e-4, metadata=_help("clip_cov: fraction of tokens detached."))
    clip_cov_lb: float = field(default=1.0, metadata=_help("clip_cov: lower covariance bound."))
    clip_cov_ub: float = field(default=5.0, metadata=_help("clip_cov: upper covariance bound."))
    kl_cov_ratio: float = field(
        default=2e-3, metadata=_help("kl_cov: fraction of tokens (largest covariance) penalised.")
    )
    kl_cov_coef: float = field(default=1.0, metadata=_help("kl_cov: coefficient of |log pi - log pi_old|."))
    ref_reset_steps: int = field(
        default=0,
        metadata=_help("Copy the policy adapter into the 'ref' anchor every N steps (ProRL); 0 = off."),
    )
    ref_reset_optimizer: bool = field(
        default=True,
        metadata=_help("With ref_reset_steps: also reset the optimizer moments (ProRL's hard reset)."),
    )

    def validate_exploration(self) -> None:
        """One-line ConfigErrors naming the field and the fix; called before any model loads."""
        advantage = ADVANTAGE_ESTIMATORS.resolve(self.advantage_estimator)
        # <kind>_args checked against the function's signature after its per-call inputs, before any model loads
        self.advantage_estimator_args = (
            ADVANTAGE_ESTIMATORS.check_args(
                advantage,
                ADVANTAGE_ESTIMATORS.parse_args(self.advantage_estimator_args),
                leading=ESTIMATOR_INPUTS,
            )
            or None
        )
        if self.backend not in advantage.meta["backends"]:
            raise ConfigError(
                f"advantage_estimator={self.advantage_estimator!r} supports backend in "
                f"{tuple(advantage.meta['backends'])}, got backend={self.backend!r}: change one of them"
            )
        term = POLICY_TERMS.resolve(self.policy_term) if self.policy_term != "none" else None
        term_args = POLICY_TERMS.parse_args(self.policy_term_args)
        if term is None and term_args:
            raise ConfigError(
                "policy_term_args is set but policy_term=none: set policy_term or drop its args"
            )
        if term is not None:
            term_args = POLICY_TERMS.check_args(term, term_args, leading=TERM_INPUTS)
        self.policy_term_args = term_args or None
        generations = self.num_generations or 0
        if advantage.name == "passk" and not 1 <= self.passk_k <= generations:
            raise ConfigError(
                f"passk_k={self.passk_k} must be in [1, num_generations={generations}]: lower passk_k"
            )
        if term is not None:
            if self.backend not in term.meta["backends"]:
                raise ConfigError(
                    f"policy_term={self.policy_term!r} needs TRL's loss (Unsloth's compiled loss has no slot for "
                    "it): set backend=trl"
                )
            if self.loss_type not in TOKEN_LEVEL_LOSS_TYPES:
                raise ConfigError(
                    f"policy_term={self.policy_term!r} supports loss_type in {TOKEN_LEVEL_LOSS_TYPES}, got "
                    f"loss_type={self.loss_type!r}: change one of them"
                )
        if self.policy_term == "kl_cov":
            steps = self.steps_per_generation or self.gradient_accumulation_steps
            if self.num_iterations == 1 and steps == self.gradient_accumulation_steps:
                raise ConfigError(
                    "policy_term=kl_cov penalises |log pi - log pi_old|, 0 with zero gradient when every batch is "
                    "used once: set num_iterations > 1 (or steps_per_generation > gradient_accumulation_steps)"
                )
        for name in ("entropy_adv_alpha", "clip_cov_ratio", "kl_cov_ratio", "kl_cov_coef"):
            if getattr(self, name) <= 0.0:
                raise ConfigError(f"{name}={getattr(self, name)} must be > 0")
        if self.entropy_adv_kappa <= 1.0:
            raise ConfigError(
                f"entropy_adv_kappa={self.entropy_adv_kappa} must be > 1 (the bonus must not flip sign(A)): e.g. 2"
            )
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ConfigError(f"clip_cov_lb={self.clip_cov_lb} must be < clip_cov_ub={self.clip_cov_ub}")
        if self.ref_reset_steps < 0:
            raise ConfigError(f"ref_reset_steps={self.ref_reset_steps} must be >= 0 (0 = off)")
        if self.ref_reset_steps and self.beta == 0.0:
            raise ConfigError(
                "ref_reset_steps resets the KL anchor, which beta=0 removes: set beta > 0 or ref_reset_steps=0"
            )


class ExplorationMixin:
    """Trainer side of the baselines. Sits after SageTrainerMixin in the MRO (rlvr/trainer.py's factory):
    SAGE's rollout and in-loss q shift run around these hooks unchanged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.args
        advantage = ADVANTAGE_ESTIMATORS.resolve(cfg.advantage_estimator)
        self._advantage_fn = (
            ADVANTAGE_ESTIMATORS.bind(
                advantage,
                ADVANTAGE_ESTIMATORS.parse_args(getattr(cfg, "advantage_estimator_args", None)),
                leading=ESTIMATOR_INPUTS,
            )
            if advantage.meta["recomputed"]
            else None
        )
        self._policy_term = (
            None
            if cfg.policy_term == "none"
            else POLICY_TERMS.bind(
                POLICY_TERMS.resolve(cfg.policy_term),
                POLICY_TERMS.parse_args(getattr(cfg, "policy_term_args", None)),
                leading=TERM_INPUTS,
            )
        )
        if self._policy_term is not None and compat.is_unsloth_patched(type(self)):
            raise ValueError(
                f"policy_term={cfg.policy_term!r} needs TRL's loss, not Unsloth's: set backend=trl"
            )
        self._term_generator = torch.Generator(device="cpu")
        self._term_step, self._term_calls = -1, 0
        if cfg.ref_reset_steps:
            from sage_unsloth.rlvr.ref_reset import ReferenceReset

            self.add_callback(ReferenceReset(cfg.ref_reset_steps, cfg.ref_reset_optimizer))

    # -- sequence advantage ------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        # The reward placement feeds its shaped reward to the estimator itself (SageTrainerMixin._sage_kl_in_reward).
        if self._advantage_fn is not None and self.args.sage_kl_placement != "reward":
            self._replace_advantages(output)
        return output

    def _replace_advantages(self, output: dict) -> None:
        rewards_per_func = self._sage_rewards_per_func  # all processes (SageTrainerMixin._calculate_rewards)
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        advantages = self._advantage_fn(rewards, num_generations, self.args)
        rows = output["completion_ids"].size(0)
        start = self.accelerator.process_index * rows
        output["advantages"] = advantages[start : start + rows].to(output["advantages"])

    # -- per-token policy term ---------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        if self._policy_term is None:
            return super()._compute_loss(model, inputs)
        given, inputs = inputs, dict(inputs)  # TRL reuses the batch across iterations: change a copy
        added = {}
        had_own = "_get_per_token_logps_and_entropies" in self.__dict__  # SAGE's in-loss capture, if active
        inner = self._get_per_token_logps_and_entropies

        def with_term(*a, **kw):
            result = inner(*a, **kw)
            if not added:  # the loss's own forward; TRL reads the advantages only after it
                # SAGE's capture (inner) may have shifted the reference in `given`: carry that over.
                inputs.update({k: v for k, v in given.items() if k != "advantages"})
                added["term"] = self._apply_policy_term(inputs, result[0], result[1])
            return result

        self._get_per_token_logps_and_entropies = with_term
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            if had_own:
                self._get_per_token_logps_and_entropies = inner
            else:
                del self._get_per_token_logps_and_entropies
        term = added.get("term")
        return loss if term is None else loss + term

    def _term_seed(self) -> int:
        step = int(self.state.global_step)
        if step != self._term_step:
            self._term_step, self._term_calls = step, 0
        else:
            self._term_calls += 1
        return (
            self.args.seed * 1_000_033 + step * 1013 + self._term_calls * 11 + self.accelerator.process_index
        )

    def _apply_policy_term(self, inputs: dict, logps: torch.Tensor, entropies: torch.Tensor | None):
        """Run the term on the loss forward's outputs: replace inputs['advantages'] and/or return the
        aggregated added loss (None when the term adds none)."""
        mask = compat.loss_mask(inputs)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        advantages = advantages.expand_as(logps)
        old = inputs.get("old_per_token_logps")
        self._term_generator.manual_seed(self._term_seed())
        batch = TokenBatch(
            logps=logps,
            old_logps=logps.detach() if old is None else old,
            entropies=torch.zeros_like(logps) if entropies is None else entropies.detach(),
            advantages=advantages,
            mask=mask,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            generator=self._term_generator,
        )
        out = self._policy_term(batch, self.args)
        training = self.model.training
        log = compat.metrics(self, "train" if training else "eval")
        for name, value in out.metrics.items():
            log[name].append(value)
        if out.advantages is not None:
            inputs["advantages"] = out.advantages.detach()
        if out.loss is None:
            return None
        term = out.loss
        if self.use_vllm and getattr(self, "vllm_importance_sampling_correction", False):
            term = term * inputs["importance_sampling_ratio"]  # as TRL weighs its policy term
        return compat.aggregate_like_trainer(self, term, mask, inputs)
