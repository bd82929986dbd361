"""The method plan: what one SageGRPOConfig asks the trainer to run, resolved once.

A config names up to four plug-ins, one node each -- ``guide``, ``advantage_estimator``, ``policy_term`` and
``kl_term``, each ``{name: <registered name, package.module:function or file.py:function>, <its arguments>}``.
:func:`build_plan` resolves and binds all four once (sage_unsloth/plugins/registry.py checks each argument against the
function's signature and the entry's limits, and fills the defaults) and decides where q is computed and where the
KL goes. The trainer (rlvr/trainer.py), its steps (rlvr/taps.py) and everything else that needs a plug-in's
knob (the config's checks, the doctor, the manifest the lab's analysis reads) read the plan; none of them
resolves a name again.

The plan is frozen. ``SageGRPOConfig.method_plan`` builds it in ``__post_init__`` and builds a new one only when a
field it was built from changes (a test switching the guide on a live config); it is never pickled with the
config (it holds the bound plug-ins).

The plan also chooses the steps (rlvr/taps.py) that run at TRL's interception points for this configuration:
:func:`choose_steps` keeps, for each of the two trainer classes (TRL's, Unsloth's patched), only the steps that
have something to do, so no step tests a setting when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from sage_unsloth.config.args import ConfigError
from sage_unsloth.config.field_rules import PLUGIN_NODES
from sage_unsloth.plugins import guides
from sage_unsloth.plugins.advantages import ADVANTAGE_ESTIMATORS
from sage_unsloth.plugins.kl_terms import KL_TERMS
from sage_unsloth.plugins.policy_terms import POLICY_TERMS
from sage_unsloth.plugins.registry import NAME, Entry, Node
from sage_unsloth.rlvr import taps

# Every kind is called as fn(inputs, **arguments): one frozen record, then its node's keyword arguments
# (sage_unsloth/plugins/registry.py). The config field holding each kind's node, and its registry:
NODES = dict(zip(PLUGIN_NODES, (guides.GUIDES, ADVANTAGE_ESTIMATORS, POLICY_TERMS, KL_TERMS), strict=True))
NO_POLICY_TERM = "none"

# The config fields a plan is built from: a change to any of them builds a new plan.
PLAN_FIELDS = (
    *NODES,
    "sage_q_source",
    "sage_kl_placement",
    "backend",
    "scale_rewards",  # TRL's own field, the grpo estimator's argument
    # what chooses the steps besides the plug-ins (choose_steps)
    "beta",
    "loss_type",
    "dapo_normalizer",
    "use_vllm",
    "vllm_importance_sampling_correction",
)


@dataclass(frozen=True)
class MethodPlan:
    """One run's method: the four plug-ins (entry, resolved arguments, and the callable with its arguments bound)
    and the placement."""

    guide: Entry
    guide_args: dict  # every argument, defaults filled; q_min / q_max the kit's clip of q
    guide_needs: tuple[str, ...]
    guide_fn: Callable  # Signals -> raw q
    q_source_requested: str  # sage_q_source: auto, loss or rollout
    expected_q_source: (
        str  # where q goes for the backend the config names (the trainer checks the class it got)
    )
    placement: str  # sage_kl_placement: loss or reward
    estimator: Entry
    estimator_args: dict
    estimator_fn: Callable | None  # None: TRL's own group advantage stands (the grpo estimator)
    estimator_call: Callable  # the estimator with its arguments bound (the grpo one too: a shaped reward)
    policy_term: Entry | None
    policy_term_args: dict
    policy_term_fn: Callable | None
    kl_term: Entry
    kl_term_args: dict
    kl_term_fn: Callable
    steps_by_class: dict  # {unsloth_patched: taps.Steps}, chosen by choose_steps when the plan is built

    @property
    def q_min(self) -> float:
        return self.guide_args["q_min"]

    @property
    def q_max(self) -> float:
        return self.guide_args["q_max"]

    def nodes(self) -> dict[str, dict]:
        """Each kind's node as the config records it once resolved: ``{name: ..., <every argument>}``."""
        term = self.policy_term
        return {
            "guide": {NAME: self.guide.name, **self.guide_args},
            "advantage_estimator": {NAME: self.estimator.name, **self.estimator_args},
            "policy_term": {NAME: NO_POLICY_TERM if term is None else term.name, **self.policy_term_args},
            "kl_term": {NAME: self.kl_term.name, **self.kl_term_args},
        }

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

    Nothing of a guide runs without one (plain GRPO runs no step at all: its q is 1 by definition, neither computed
    nor logged), except that the reward placement's pseudo-KL reads q = 1 there; q at rollout whenever a guide's q
    is not computed in the loss; the reference is shifted by log q only for a guide with a KL anchor; the rewards
    are summed and the estimator runs when it replaces TRL's advantage or the reward was shaped; the policy term
    and a KL term other than TRL's own k3 exist on TRL's loss only (Unsloth's compiled loss has no slot for them,
    and the config refuses them there); DAPO's normaliser and the vLLM importance-sampling metric only when their
    settings ask."""
    guided = plan.guided
    q_at_rollout = plan.q_source(unsloth_patched=unsloth_patched) == "rollout"
    kl_anchor = cfg.beta != 0.0 and plan.placement == "loss"
    estimate = plan.estimator_fn is not None or plan.placement == "reward"
    if plan.placement == "reward":
        rollout = (taps.summed_rewards, taps.q_at_rollout, taps.reward_placement)
        rollout += (taps.estimate_advantages,) * estimate
    else:
        rollout = (taps.summed_rewards, taps.estimate_advantages) * estimate
        rollout += (taps.q_at_rollout,) * (guided and q_at_rollout)
        rollout += (taps.shift_reference_at_rollout,) * (q_at_rollout and guided and cfg.beta != 0.0)
    batch = (taps.log_importance_sampling,) * bool(cfg.use_vllm and cfg.vllm_importance_sampling_correction)
    batch += (taps.dapo_normaliser,) * (
        cfg.loss_type == "dapo" and getattr(cfg, "dapo_normalizer", "window") == "generation"
    )
    q_in_loss = guided and not q_at_rollout
    if unsloth_patched:  # Unsloth's layout: its loss hands over the entropies only (rlvr/unsloth_hooks.py)
        loss = (taps.q_in_the_unsloth_loss,) * q_in_loss
    else:
        loss = (taps.q_in_the_loss,) * q_in_loss
        loss += (taps.policy_term,) * (plan.policy_term_fn is not None)
        loss += (taps.kl_term,) * (kl_anchor and not plan.kl_in_trl_loss)
    return taps.Steps(after_each_rollout=rollout, after_the_batch=batch, in_the_loss=loss)


def plan_key(cfg) -> tuple:
    return tuple(repr(getattr(cfg, name, None)) for name in PLAN_FIELDS)


def policy_term_node(value) -> Node | None:
    """The policy term's node resolved, or None for ``none`` (which takes no arguments)."""
    name, args = POLICY_TERMS.read_node(value)
    if name != NO_POLICY_TERM:
        return POLICY_TERMS.node(value)
    if args:
        raise ConfigError(
            f"policy_term: none takes no arguments, got {sorted(args)}: name a policy term or drop them"
        )
    return None


def build_plan(cfg) -> MethodPlan:
    """Resolve and bind the config's four plug-in nodes, each once (one line naming the field on bad input)."""
    guide, needs = guides.resolve_guide(cfg.guide)
    estimator = ADVANTAGE_ESTIMATORS.node(cfg.advantage_estimator, trl={"scale_rewards": cfg.scale_rewards})
    estimator_call = ADVANTAGE_ESTIMATORS.bind(estimator)
    term = policy_term_node(cfg.policy_term)
    kl_term = KL_TERMS.node(cfg.kl_term)
    requested = cfg.sage_q_source
    expected = (
        requested
        if requested != "auto"
        else guides.q_source(needs, requested="loss", unsloth_patched=cfg.backend == "unsloth")
    )
    plan = MethodPlan(
        guide=guide.entry,
        guide_args=guide.args,
        guide_needs=needs,
        guide_fn=guides.GUIDES.bind(guide),
        q_source_requested=requested,
        expected_q_source=expected,
        placement=cfg.sage_kl_placement,
        estimator=estimator.entry,
        estimator_args=estimator.args,
        estimator_fn=estimator_call if estimator.entry.meta["recomputed"] else None,
        estimator_call=estimator_call,
        policy_term=None if term is None else term.entry,
        policy_term_args={} if term is None else term.args,
        policy_term_fn=None if term is None else POLICY_TERMS.bind(term),
        kl_term=kl_term.entry,
        kl_term_args=kl_term.args,
        kl_term_fn=KL_TERMS.bind(kl_term),
        steps_by_class={},
    )
    steps = {patched: choose_steps(plan, cfg, unsloth_patched=patched) for patched in (False, True)}
    return replace(plan, steps_by_class=steps)
