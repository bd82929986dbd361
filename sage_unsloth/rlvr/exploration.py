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

from dataclasses import dataclass, field
from typing import Any, ClassVar

from sage_unsloth.compat import TOKEN_LEVEL_LOSS_TYPES
from sage_unsloth.config_args import ConfigError
from sage_unsloth.field_rules import Limit, Names
from sage_unsloth.rlvr.advantages import ADVANTAGE_ESTIMATORS
from sage_unsloth.rlvr.plan import ESTIMATOR_INPUTS, TERM_INPUTS
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
        k_field = advantage.meta["group_subset_field"]  # passk: passk_k
        if k_field and not 1 <= (k := getattr(self, k_field)) <= generations:
            raise ConfigError(f"{k_field}={k} must be in [1, num_generations={generations}]: lower {k_field}")
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
