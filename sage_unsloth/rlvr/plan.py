"""The method plan: what one SageGRPOConfig asks the trainer to run, resolved once.

A config names up to four plug-ins -- the guide (``sage_guide``), the advantage estimator, the policy term and
the KL term -- each a registered name, ``package.module:function`` or ``file.py:function`` with its
``<kind>_args``. :func:`build_plan` resolves and binds all four (sage_unsloth/registry.py checks each argument
against the function's signature) and decides where q is computed and where the KL goes. The trainer
(rlvr/trainer.py) and its steps (rlvr/taps.py) only read the plan; none of them resolves a name again.

The plan is frozen. ``SageGRPOConfig.method_plan`` builds it in ``__post_init__`` and builds a new one only when a
field it was built from changes (a test or the doctor's self-test switching the guide on a live trainer); it is
never pickled with the config (it holds the bound plug-ins).

The plan also chooses the steps (rlvr/taps.py) that run at TRL's interception points for this configuration:
:func:`choose_steps` keeps, for each of the two trainer classes (TRL's, Unsloth's patched), only the steps that
have something to do, so no step tests a setting when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from sage_unsloth import guides
from sage_unsloth.registry import Entry
from sage_unsloth.rlvr import taps
from sage_unsloth.rlvr.advantages import ADVANTAGE_ESTIMATORS
from sage_unsloth.rlvr.kl_terms import KL_TERMS
from sage_unsloth.rlvr.policy_terms import POLICY_TERMS

# Every kind is called as fn(inputs, **<kind>_args): one frozen record, then its keyword arguments
# (sage_unsloth/registry.py). The flat config fields the built-ins' keywords alias, by kind:
REGISTRIES = (guides.GUIDES, ADVANTAGE_ESTIMATORS, POLICY_TERMS, KL_TERMS)
ALIAS_FIELDS = tuple(sorted({flat for registry in REGISTRIES for flat in registry.aliased_fields()}))

# The config fields a plan is built from: a change to any of them builds a new plan.
PLAN_FIELDS = (
    "sage_guide",
    "sage_guide_args",
    "sage_q_source",
    "sage_kl_placement",
    "backend",
    "advantage_estimator",
    "advantage_estimator_args",
    "policy_term",
    "policy_term_args",
    "kl_estimator",
    "kl_term_args",
    *ALIAS_FIELDS,
    # what chooses the steps besides the plug-ins (choose_steps)
    "beta",
    "loss_type",
    "dapo_normalizer",
    "use_vllm",
    "vllm_importance_sampling_correction",
)


@dataclass(frozen=True)
class MethodPlan:
    """One run's method: the four plug-ins (entry, and the callable with its arguments bound) and the placement."""

    guide: Entry
    guide_needs: tuple[str, ...]
    guide_fn: Callable  # Signals -> raw q
    q_source_requested: str  # sage_q_source: auto, loss or rollout
    expected_q_source: (
        str  # where q goes for the backend the config names (the trainer checks the class it got)
    )
    placement: str  # sage_kl_placement: loss or reward
    estimator: Entry
    estimator_fn: Callable | None  # None: TRL's own group advantage stands (the grpo estimator)
    estimator_call: Callable  # the estimator with its arguments bound (the grpo one too: a shaped reward)
    policy_term: Entry | None
    policy_term_fn: Callable | None
    kl_term: Entry
    kl_term_fn: Callable
    steps_by_class: dict  # {unsloth_patched: taps.Steps}, chosen by choose_steps when the plan is built

    @property
    def guided(self) -> bool:
        """Does the anchor differ from pi_ref at all (any guide but the registered 'none')?"""
        return not (self.guide.registered and self.guide.name == "none")

    @property
    def reads_policy(self) -> bool:
        """Does the guide read a signal of the policy (entropies, log-probs or a logit signal)?"""
        return guides.reads_policy(self.guide_needs)

    @property
    def logit_signals(self) -> tuple[str, ...]:
        return guides.logit_signal_names(self.guide_needs)

    @property
    def kl_in_trl_loss(self) -> bool:
        """Is the KL term TRL's own k3 against the shifted reference (no loss-level correction)?"""
        return bool(self.kl_term.meta["shifted_reference"])

    def q_source(self, *, unsloth_patched: bool) -> str:
        """'loss' or 'rollout' on the class the trainer really subclasses (guides.q_source is the rule); the reward
        placement needs q when the reward is computed, i.e. at rollout."""
        source = guides.q_source(
            self.guide_needs, requested=self.q_source_requested, unsloth_patched=unsloth_patched
        )
        return source if self.placement == "loss" else "rollout"

    def steps(self, *, unsloth_patched: bool) -> taps.Steps:
        """The steps that run on the class the trainer really subclasses (chosen when the plan was built)."""
        return self.steps_by_class[unsloth_patched]


def choose_steps(plan: MethodPlan, cfg, *, unsloth_patched: bool) -> taps.Steps:
    """The steps of rlvr/taps.py that have work to do for this method on this trainer class, in their order.

    q at rollout whenever it is not computed in the loss (it is logged, as q = 1 for no guide); the reference is
    shifted by log q only for a guide with a KL anchor; the estimator runs when it replaces TRL's advantage or the
    reward was shaped; the policy term and a KL term other than TRL's own k3 exist on TRL's loss only (Unsloth's
    compiled loss has no slot for them, and the config refuses them there); DAPO's normaliser and the vLLM
    importance-sampling metric only when their settings ask."""
    q_at_rollout = plan.q_source(unsloth_patched=unsloth_patched) == "rollout"
    kl_anchor = cfg.beta != 0.0 and plan.placement == "loss"
    estimate = plan.estimator_fn is not None or plan.placement == "reward"
    if plan.placement == "reward":
        rollout = (taps.summed_rewards, taps.q_at_rollout, taps.reward_placement)
        rollout += (taps.estimate_advantages,) * estimate
    else:
        rollout = (taps.summed_rewards,) + (taps.estimate_advantages,) * estimate
        rollout += (taps.q_at_rollout,) * q_at_rollout
        rollout += (taps.shift_reference_at_rollout,) * (q_at_rollout and plan.guided and cfg.beta != 0.0)
    batch = (taps.log_importance_sampling,) * bool(cfg.use_vllm and cfg.vllm_importance_sampling_correction)
    batch += (taps.dapo_normaliser,) * (
        cfg.loss_type == "dapo" and getattr(cfg, "dapo_normalizer", "window") == "generation"
    )
    if unsloth_patched:  # Unsloth's layout: its loss hands over the entropies only (rlvr/unsloth_hooks.py)
        loss = (taps.q_in_the_unsloth_loss,) * (not q_at_rollout)
    else:
        loss = (taps.q_in_the_loss,) * (not q_at_rollout)
        loss += (taps.policy_term,) * (plan.policy_term_fn is not None)
        loss += (taps.kl_term,) * (kl_anchor and not plan.kl_in_trl_loss)
    return taps.Steps(after_each_rollout=rollout, after_the_batch=batch, in_the_loss=loss)


def plan_key(cfg) -> tuple:
    return tuple(repr(getattr(cfg, name, None)) for name in PLAN_FIELDS)


def bind_plugin(registry, entry: Entry, cfg) -> Callable:
    """``entry`` with its arguments bound: ``<kind>_args`` over the built-in's flat fields (Registry.knobs)."""
    return registry.bind(entry, registry.knobs(entry, cfg, getattr(cfg, registry.args_field, None)))


def build_plan(cfg) -> MethodPlan:
    """Resolve and bind the config's four plug-ins (one line naming the field on bad input)."""
    guide, needs = guides.resolve_guide(cfg)
    estimator = ADVANTAGE_ESTIMATORS.resolve(cfg.advantage_estimator)
    estimator_call = bind_plugin(ADVANTAGE_ESTIMATORS, estimator, cfg)
    policy_term = None if cfg.policy_term == "none" else POLICY_TERMS.resolve(cfg.policy_term)
    kl_term = KL_TERMS.resolve(cfg.kl_estimator)
    requested = cfg.sage_q_source
    expected = (
        requested
        if requested != "auto"
        else guides.q_source(needs, requested="loss", unsloth_patched=cfg.backend == "unsloth")
    )
    plan = MethodPlan(
        guide=guide,
        guide_needs=needs,
        guide_fn=guides.build_guide(cfg, guide),
        q_source_requested=requested,
        expected_q_source=expected,
        placement=cfg.sage_kl_placement,
        estimator=estimator,
        estimator_fn=estimator_call if estimator.meta["recomputed"] else None,
        estimator_call=estimator_call,
        policy_term=policy_term,
        policy_term_fn=None if policy_term is None else bind_plugin(POLICY_TERMS, policy_term, cfg),
        kl_term=kl_term,
        kl_term_fn=bind_plugin(KL_TERMS, kl_term, cfg),
        steps_by_class={},
    )
    steps = {patched: choose_steps(plan, cfg, unsloth_patched=patched) for patched in (False, True)}
    return replace(plan, steps_by_class=steps)
