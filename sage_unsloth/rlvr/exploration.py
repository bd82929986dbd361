"""Exploration baselines from the literature in the SAGE harness: their config fields and their checks; the
trainer runs them as steps of rlvr/taps.py (docs/methods.md says what each optimises).

- ``advantage_estimator`` (plugins/advantages.py): GRPO's group advantage (default) or Pass@k Training's, a node
  ``{name: passk, k: 4}`` like every plug-in's.
- ``policy_term`` (plugins/policy_terms.py): the entropy advantage, Clip-Cov or KL-Cov, inside TRL's loss.
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
from sage_unsloth.config.args import ConfigError
from sage_unsloth.config.field_rules import Limit, Names
from sage_unsloth.plugins.advantages import ADVANTAGE_ESTIMATORS
from sage_unsloth.plugins.policy_terms import POLICY_TERMS


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class ExplorationArgs:
    """Config fields of the exploration baselines (mixed into SageGRPOConfig)."""

    # One field's own bounds and names, read by the pre-import check too (sage_unsloth/config/field_rules.py).
    FIELD_RULES: ClassVar[dict] = {
        "advantage_estimator": Names(ADVANTAGE_ESTIMATORS.names(), plugins=True, node=True),
        "policy_term": Names(("none", *POLICY_TERMS.names()), plugins=True, node=True),
        "ref_reset_steps": Limit(ge=0, note="0 = off"),
    }

    # str for the command line (a bare name, or the node's JSON); a YAML mapping is kept as it is.
    advantage_estimator: dict[str, Any] | str | None = field(
        default="grpo",
        metadata=ADVANTAGE_ESTIMATORS.node_help(
            "Sequence advantage, e.g. {name: passk, k: 4} (Pass@k Training, arXiv 2508.10751); grpo's "
            "scale_rewards is TRL's own field"
        ),
    )
    policy_term: dict[str, Any] | str | None = field(
        default="none",
        metadata=POLICY_TERMS.node_help(
            "Per-token policy term (TRL backend), e.g. {name: clip_cov, ratio: 0.0002}", none=True
        ),
    )
    ref_reset_steps: int = field(
        default=0,
        metadata=_help("Copy the policy adapter into the 'ref' anchor every N steps (ProRL); 0 = off."),
    )
    ref_reset_optimizer: bool = field(
        default=True,
        metadata=_help("With ref_reset_steps: also reset the optimizer moments (ProRL's hard reset)."),
    )

    def validate_exploration(self, plan) -> None:
        """One-line ConfigErrors naming the field and the fix, on the resolved method plan (rlvr/plan.py: each
        node's arguments were checked there); called before any model loads."""
        advantage = plan.estimator
        if self.backend not in advantage.meta["backends"]:
            raise ConfigError(
                f"advantage_estimator={advantage.name!r} supports backend in "
                f"{tuple(advantage.meta['backends'])}, got backend={self.backend!r}: change one of them"
            )
        self._validate_group_subset(advantage, plan.estimator_args)
        term = plan.policy_term
        # a term's backends were checked with the backend's other limits (rlvr/config.py unsloth_conflict)
        if term is not None and self.loss_type not in TOKEN_LEVEL_LOSS_TYPES:
            raise ConfigError(
                f"policy_term={term.name!r} supports loss_type in {TOKEN_LEVEL_LOSS_TYPES}, got "
                f"loss_type={self.loss_type!r}: change one of them"
            )
        if term is not None and (reads := term.meta["needs_reuse"]):
            steps = self.steps_per_generation or self.gradient_accumulation_steps
            if self.num_iterations == 1 and steps == self.gradient_accumulation_steps:
                raise ConfigError(
                    f"policy_term={term.name} {reads}, 0 with zero gradient when every batch is "
                    "used once: set num_iterations > 1 (or steps_per_generation > gradient_accumulation_steps)"
                )
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
        k = estimator_args[key]
        generations = self.num_generations or 0
        name = f"advantage_estimator.{key}"
        if not 1 <= k <= generations:
            raise ConfigError(f"{name}={k} must be in [1, num_generations={generations}]: lower {name}")
