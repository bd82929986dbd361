"""Exploration baselines from the literature in the SAGE harness: their config fields and their checks; the
trainer runs them as steps of rlvr/taps.py (docs/methods.md says what each optimises).

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

import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sage_unsloth.compat import TOKEN_LEVEL_LOSS_TYPES
from sage_unsloth.config_args import ConfigError
from sage_unsloth.field_rules import Limit, Names
from sage_unsloth.rlvr.advantages import ADVANTAGE_ESTIMATORS
from sage_unsloth.rlvr.policy_terms import POLICY_TERMS


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class ExplorationArgs:
    """Config fields of the exploration baselines (mixed into SageGRPOConfig)."""

    # One field's own bounds and names, read by the pre-import check too (sage_unsloth/field_rules.py).
    FIELD_RULES: ClassVar[dict] = {
        "advantage_estimator": Names(ADVANTAGE_ESTIMATORS.names(), plugins=True),
        "policy_term": Names(("none", *POLICY_TERMS.names()), plugins=True),
        **dict.fromkeys(
            ("entropy_adv_alpha", "clip_cov_ratio", "kl_cov_ratio", "kl_cov_coef"), Limit(gt=0, finite=False)
        ),
        "entropy_adv_kappa": Limit(gt=1, finite=False, note="the bonus must not flip sign(A); e.g. 2"),
        "ref_reset_steps": Limit(ge=0, note="0 = off"),
    }

    advantage_estimator: str = field(
        default="grpo",
        metadata=ADVANTAGE_ESTIMATORS.name_help(
            "Sequence advantage (passk: Pass@k Training, arXiv 2508.10751)"
        ),
    )
    advantage_estimator_args: dict[str, Any] | str | None = field(
        default=None, metadata=ADVANTAGE_ESTIMATORS.args_help()
    )
    passk_k: int = field(
        default=4,
        metadata=_help(
            "advantage_estimator=passk: k (1 <= k <= num_generations); = advantage_estimator_args.k."
        ),
    )
    policy_term: str = field(
        default="none", metadata=POLICY_TERMS.name_help("Per-token policy term (TRL backend)", none=True)
    )
    policy_term_args: dict[str, Any] | str | None = field(default=None, metadata=POLICY_TERMS.args_help())
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
        # <kind>_args over the built-in's flat fields, checked against the function's signature (registry.py)
        estimator_args = ADVANTAGE_ESTIMATORS.settle(advantage, self)
        if self.backend not in advantage.meta["backends"]:
            raise ConfigError(
                f"advantage_estimator={self.advantage_estimator!r} supports backend in "
                f"{tuple(advantage.meta['backends'])}, got backend={self.backend!r}: change one of them"
            )
        term = POLICY_TERMS.resolve(self.policy_term) if self.policy_term != "none" else None
        if term is None and POLICY_TERMS.parse_args(self.policy_term_args):
            raise ConfigError(
                "policy_term_args is set but policy_term=none: set policy_term or drop its args"
            )
        if term is not None:
            POLICY_TERMS.settle(term, self)
        self._validate_group_subset(advantage, estimator_args)
        # a term's backends were checked with the backend's other limits (rlvr/config.py unsloth_conflict)
        if term is not None and self.loss_type not in TOKEN_LEVEL_LOSS_TYPES:
            raise ConfigError(
                f"policy_term={self.policy_term!r} supports loss_type in {TOKEN_LEVEL_LOSS_TYPES}, got "
                f"loss_type={self.loss_type!r}: change one of them"
            )
        if term is not None and (reads := term.meta["needs_reuse"]):
            steps = self.steps_per_generation or self.gradient_accumulation_steps
            if self.num_iterations == 1 and steps == self.gradient_accumulation_steps:
                raise ConfigError(
                    f"policy_term={self.policy_term} {reads}, 0 with zero gradient when every batch is "
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

    def _validate_group_subset(self, advantage, estimator_args: dict) -> None:
        """An estimator that scores k-subsets of a group (its ``group_subset_arg``, passk's ``k``): 1 <= k <= G."""
        key = advantage.meta["group_subset_arg"]
        if not key:
            return
        k = estimator_args.get(key, inspect.signature(advantage.obj).parameters[key].default)
        generations = self.num_generations or 0
        name = (advantage.meta["aliases"] or {}).get(key) or f"advantage_estimator_args.{key}"
        if not 1 <= k <= generations:
            raise ConfigError(f"{name}={k} must be in [1, num_generations={generations}]: lower {name}")
