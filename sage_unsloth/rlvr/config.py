"""SageGRPOConfig: TRL's GRPOConfig plus the SAGE fields, with the paper's values as defaults.

The method's four plug-ins are one node each (``guide``, ``advantage_estimator``, ``policy_term``, ``kl_term``:
``{name: ..., <its arguments>}``, sage_unsloth/plugins/registry.py); their knobs' defaults are the plug-ins' own (the
paper's for the built-ins), resolved once into the method plan (rlvr/plan.py).

It subclasses TRL's own ``GRPOConfig`` (imported from its defining module, so the class is the same
whether or not Unsloth has rebound ``trl.GRPOConfig``), which keeps YAML configs parseable by
``trl.TrlParser``. Every default that TRL 1.15 or Unsloth 2026.10.9 set differently from the paper is
pinned here explicitly, so a run never depends on which stack happens to be imported.
Validation happens in ``__post_init__``, i.e. before any model is loaded.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trl.trainer.grpo_config import GRPOConfig

from sage_unsloth.compat import TOKEN_LEVEL_LOSS_TYPES
from sage_unsloth.config.args import ConfigError, check_training_fields, suggestion
from sage_unsloth.config.field_rules import TRAINING_RULES, Limit, Names
from sage_unsloth.plugins.guides import GUIDES
from sage_unsloth.plugins.kl_terms import KL_TERMS
from sage_unsloth.plugins.probe import probe_plan
from sage_unsloth.rlvr.exploration import ExplorationArgs
from sage_unsloth.rlvr.plan import MethodPlan, build_plan, plan_key

BACKENDS = ("unsloth", "trl")
Q_SOURCES = ("auto", "loss", "rollout")
PLACEMENTS = ("loss", "reward")
DAPO_NORMALIZERS = ("generation", "window")
# The spellings before one node per plug-in, refused in one line naming the new one (issue 51): old key ->
# (the node's field, the key it became in the node: "name" for the entry, None for a whole argument mapping,
# the entry that takes it).
RETIRED_KEYS = {
    "sage_guide": ("guide", "name", None),
    "sage_guide_args": ("guide", None, None),
    **{f"sage_{k}": ("guide", k, "branch") for k in ("q_min", "q_max", "gamma", "tau")},
    **{
        f"sage_{k}": ("guide", k, "token")
        for k in ("alpha_upper", "alpha_lower", "sigma_upper", "sigma_lower")
    },
    "sage_token_norm": ("guide", "norm", "token"),
    "sage_eps_upper": ("guide", "eps_upper", "random"),
    "sage_eps_lower": ("guide", "eps_lower", "random"),
    "sage_random_sigma_upper": ("guide", "sigma_upper", "random"),
    "sage_random_sigma_lower": ("guide", "sigma_lower", "random"),
    "sage_schedule_cycles": ("guide", "cycles", "token"),
    "sage_schedule_decay": ("guide", "decay", "token"),
    "kl_estimator": ("kl_term", "name", None),
    "kl_term_args": ("kl_term", None, None),
    "advantage_estimator_args": ("advantage_estimator", None, None),
    "passk_k": ("advantage_estimator", "k", "passk"),
    "policy_term_args": ("policy_term", None, None),
    "entropy_adv_alpha": ("policy_term", "alpha", "entropy_adv"),
    "entropy_adv_kappa": ("policy_term", "kappa", "entropy_adv"),
    **{f"clip_cov_{k}": ("policy_term", k, "clip_cov") for k in ("ratio", "lb", "ub")},
    **{f"kl_cov_{k}": ("policy_term", k, "kl_cov") for k in ("ratio", "coef")},
}
MIGRATE = "scripts/migrate_configs.py FILE rewrites a config"


def retired_hint(old: str) -> str:
    """The one line for a retired key: what it became, as the new node spells it."""
    node, key, entry = RETIRED_KEYS[old]
    if key == "name":
        what = f"name the {node.replace('_', ' ').replace('kl ', 'KL ')} in its node, {node}: {{name: <name>, <its arguments>}}"
    elif key is None:
        what = f"its arguments go into the {node} node, {node}: {{name: <name>, <argument>: <value>}}"
    else:
        what = f"it is the argument {key} of the {node} node, {node}: {{name: {entry}, {key}: <value>}}"
    return f"{old} is retired: {what} ({MIGRATE}; docs/extending.md)"


# TRL 1.15's loss types. SAGE only shifts the KL anchor, so any of them works with k3; a KL term added to the
# loss (k2, forward: plugins/kl_terms.py) re-aggregates the KL and knows only the token-level ones.
LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo", "cispo", "sapo", "luspo", "vespo")
LOSS_LEVEL_KL_LOSS_TYPES = TOKEN_LEVEL_LOSS_TYPES


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def unsloth_conflict(plan: MethodPlan, cfg, unsloth_patched: bool) -> str | None:
    """What ``plan`` (the config's method) and ``cfg`` ask that Unsloth's patched GRPOTrainer cannot do (None:
    nothing), as one line with the fix.

    The one definition of these checks: the config makes them in __post_init__ (patched = backend unsloth, on
    any machine, before any model loads), the trainer again only for the class it really subclasses when that
    differs (a patched base built by hand)."""
    if not unsloth_patched:
        return None
    if "unsloth" not in plan.kl_term.meta["backends"]:
        return (
            f"kl_term={plan.kl_term.name!r} is not expressible as a shifted reference, which is all "
            "Unsloth's patched loss reads: set backend=trl or kl_term=k3"
        )
    if cfg.dynamic_sampling:
        return (
            "dynamic_sampling merges rollouts in TRL's layout, not Unsloth's: set backend=trl or "
            "dynamic_sampling=false"
        )
    term = plan.policy_term
    if term is not None and "unsloth" not in term.meta["backends"]:
        return (
            f"policy_term={term.name!r} needs TRL's loss (Unsloth's compiled loss has no slot for "
            "it): set backend=trl"
        )
    from sage_unsloth.plugins import guides

    return guides.unsloth_cannot(plan.guide_needs, requested=cfg.sage_q_source, guide=plan.guide.name)


def off_policy_q_warning(cfg, q_source: str) -> str | None:
    """The one off-policy warning (None: nothing to say) when q is computed at ``q_source``: q from the rollout
    policy while the loss reads a later one (num_iterations > 1, or steps_per_generation > gradient accumulation).
    The config says it for the source it expects, the trainer only when the class it got moved q."""
    plan = cfg.method_plan
    if (
        q_source == "loss"  # the official code's own order
        or not plan.reads_policy
        or "ref_entropies" in plan.guide_needs  # q at rollout by definition (the reference pass)
        or cfg.sage_kl_placement == "reward"  # q with the reward, at rollout, by definition
        or (cfg.num_iterations == 1 and cfg.steps_per_generation == cfg.gradient_accumulation_steps)
    ):
        return None
    return (
        f"guide={plan.guide.name!r} with num_iterations={cfg.num_iterations}, steps_per_generation="
        f"{cfg.steps_per_generation}, gradient_accumulation_steps={cfg.gradient_accumulation_steps}: q is "
        "computed from the rollout policy (sage_q_source rollout, or a guide Unsloth's loss cannot feed), not the "
        "in-loss policy as in the official code"
    )


def _fail(message: str):
    """Refuse the config: one line naming the field and the fix."""
    raise ConfigError(message)


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class SageGRPOConfig(GRPOConfig, ExplorationArgs):
    """GRPO arguments for SAGE (q * pi_ref anchor). See sage_unsloth/plugins/anchor.py for the guide formulas; the
    exploration baselines' fields (Pass@k, entropy advantage, Clip-Cov, KL-Cov, reference reset) come from
    ExplorationArgs (rlvr/exploration.py)."""

    # A key of the spellings before one node per plug-in: refused in one line naming the new spelling (the
    # pre-import check and the stage parser read it).
    RETIRED_FIELDS: ClassVar[dict[str, str]] = {old: retired_hint(old) for old in RETIRED_KEYS}
    # One field's own bounds and names, read by the pre-import check too (sage_unsloth/config/field_rules.py); the checks
    # below keep their own wording and add those that need several fields.
    FIELD_RULES: ClassVar[dict] = {
        **TRAINING_RULES,
        "guide": Names(GUIDES.names(), plugins=True, node=True),
        "kl_term": Names(KL_TERMS.names(), plugins=True, node=True),
        "sage_q_source": Names(Q_SOURCES),
        "backend": Names(BACKENDS),
        "loss_type": Names(LOSS_TYPES),
        "sage_kl_placement": Names(PLACEMENTS),
        "dapo_normalizer": Names(DAPO_NORMALIZERS),
        "beta": Limit(ge=0, note="the KL coefficient; paper: 0.05; 0 = no KL"),
        "dynamic_sampling_max_rounds": Limit(ge=1),
        "soft_overlong_punish_cache": Limit(ge=0, note="0 = off"),
        "num_generations": Limit(
            ge=2, note="GRPO scores each rollout against the others of its prompt; paper: 8"
        ),
        "steps_per_generation": Limit(ge=1),
        "generation_batch_size": Limit(ge=1),
        "num_iterations": Limit(ge=1, note="paper: 1"),
        "temperature": Limit(gt=0, note="GRPO samples its rollouts; paper: 1.0"),
        "top_p": Limit(gt=0, le=1, note="paper: 1.0; 1 = off"),
        "min_p": Limit(ge=0, lt=1, note="paper: 0.01; 0 = off"),
        "top_k": Limit(ge=0, note="0 = off"),
        "epsilon": Limit(gt=0, note="the PPO clip range; paper: 0.2"),
        "max_completion_length": Limit(ge=1, note="new tokens per rollout; paper: 3072"),
    }

    # --- SAGE guide ---------------------------------------------------------------------------------
    # str for the command line (a bare name, or the node's JSON); a YAML mapping is kept as it is.
    guide: dict[str, Any] | str | None = field(
        default="none",
        metadata=GUIDES.node_help(
            "Anchor guide q and its arguments, e.g. {name: branch, gamma: 0.3, tau: 1.2}; q_min / q_max (default "
            "0.6 / 1.4, the paper's) clip every guide's q (docs/writing-a-guide.md)"
        ),
    )
    sage_seed: int | None = field(
        default=None, metadata=_help("Seed of the token/random guide noise generator; None uses `seed`.")
    )
    sage_q_source: str = field(
        default="auto",
        metadata=_help(
            "Where branch/token q is computed: 'loss' (inside the loss, from the entropies/logps its own forward "
            "computes: no extra pass, the official code's semantics; on Unsloth's patched trainer the branch guide "
            "only), 'rollout' (after generation, one extra no-grad pass unless TRL scores old logps anyway), "
            "'auto' (loss, except the token guide under Unsloth: rollout). The random guide is always drawn at "
            "rollout."
        ),
    )
    kl_term: dict[str, Any] | str | None = field(
        default="k3",
        metadata=KL_TERMS.node_help(
            "Per-token KL term (sage_kl_placement=loss): 'k3' (paper/TRL, exp(d)-d-1 against the shaped anchor; "
            "its gradient is the forward-KL gradient, the reverse-KL one with use_bias_correction_kl), 'k2' "
            "(0.5 d^2 times the stop-gradient ratio pi/pi_old: the reverse-KL gradient to q*pi_ref; "
            "use_bias_correction_kl does not apply; TRL backend only), 'forward' ((u log u - u + 1) times the "
            "ratio pi/pi_old, u = pi_ref/pi: the gradient of KL(pi_ref||pi) whatever use_bias_correction_kl "
            "says; the forward-KL baseline; needs guide none; TRL backend only), or your own (plugins/kl_terms.py)"
        ),
    )
    sage_kl_placement: str = field(
        default="loss",
        metadata=_help(
            "Where the pseudo-KL to q*pi_ref goes: 'loss' (per token in the loss, the paper's and official code's) "
            "or 'reward' (r - beta * sum_t [log pi - log pi_ref - log q_t] before the group advantage, no KL in "
            "the loss; its fixed point is prod_t q_t * pi_ref * exp(r/beta), the paper's equation)."
        ),
    )
    dapo_normalizer: str = field(
        default="generation",
        metadata=_help(
            "loss_type=dapo only: 'generation' divides by every completion token of the generation batch (TRL "
            "0.23, the official SAGE code); 'window' by the tokens of one accumulation window (TRL >= 1.10, the "
            "DAPO paper's per-batch token mean). They differ by steps_per_generation / gradient_accumulation_steps."
        ),
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata=_help(
            "DAPO's dynamic sampling: drop groups whose first reward function gives every completion the same value "
            "(all correct / all wrong) and refill with fresh prompts; TRL backend, one process."
        ),
    )
    dynamic_sampling_max_rounds: int = field(
        default=8,
        metadata=_help(
            "Most rollouts per generation batch under dynamic_sampling (then fill with "
            "degenerate groups, logged as dynamic_sampling/degenerate_frac)."
        ),
    )
    soft_overlong_punish_cache: int = field(
        default=0,
        metadata=_help(
            "DAPO's soft overlong punishment (trl.rewards.get_soft_overlong_punishment) added as a reward with "
            "L_max = max_completion_length and this L_cache (tokens); 0 = off."
        ),
    )
    backend: str = field(default="unsloth", metadata=_help(f"Trainer stack: one of {BACKENDS}."))

    # --- defaults pinned to the paper / official code (TRL and Unsloth differ among themselves) --------
    loss_type: str = field(default="grpo", metadata=_help(f"GRPO loss aggregation: one of {LOSS_TYPES}."))
    beta: float = field(default=0.05, metadata=_help("KL coefficient; SAGE guides need beta > 0."))
    learning_rate: float = field(default=5e-6, metadata=_help("Learning rate (paper: 5e-6)."))
    lr_scheduler_type: str = field(default="constant", metadata=_help("LR schedule (paper: constant)."))
    gradient_accumulation_steps: int = field(default=1, metadata=_help("Paper: 1 (Unsloth defaults to 2)."))
    per_device_train_batch_size: int = field(default=8, metadata=_help("Paper: 8."))
    optim: str = field(
        default="adamw_torch",
        metadata=_help(
            "Optimizer; the paper used adamw_8bit on GPU (needs bitsandbytes), set it per config."
        ),
    )
    weight_decay: float = field(default=0.01, metadata=_help("Paper: 0.01."))
    num_generations: int | None = field(default=8, metadata=_help("Rollouts per prompt (paper: 8)."))
    temperature: float = field(default=1.0, metadata=_help("Sampling temperature (paper: 1.0)."))
    top_p: float = field(default=1.0, metadata=_help("Paper: 1.0."))
    min_p: float | None = field(default=0.01, metadata=_help("Paper: 0.01."))
    epsilon: float = field(default=0.2, metadata=_help("PPO clip epsilon (paper: 0.2)."))
    use_bias_correction_kl: bool = field(
        default=False,
        metadata=_help("TRL 1.15 defaults True; the paper ran TRL 0.23, which had no such factor."),
    )
    # vLLM importance sampling: the paper's TRL 0.23 truncated each token's ratio at 2.0; TRL 1.15 defaults to a
    # sequence-level mask at 3.0 (and Unsloth's config to no correction). Read by TRL's and by Unsloth's loss.
    vllm_importance_sampling_correction: bool = field(
        default=True, metadata=_help("Correct for vLLM / trainer mismatch (paper's TRL 0.23: on).")
    )
    vllm_importance_sampling_mode: str = field(
        default="token_truncate", metadata=_help("Paper's TRL 0.23: per-token ratio truncated at the cap.")
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=2.0, metadata=_help("Importance-ratio cap (paper's TRL 0.23: 2.0).")
    )
    seed: int = field(default=3407, metadata=_help("Paper: 3407."))

    def __post_init__(self):
        # transformers fills a missing output_dir with "trainer_output"; stage 2 then uses its own layout
        self.output_dir_given = self.output_dir is not None
        self._validate_names()
        self._validate_knobs()
        self._validate_dapo_extras()
        self._validate_rollouts()
        if self.bf16 is None and not self.fp16 and not _cuda_available():
            self.bf16 = False  # TRL turns None into True, which transformers rejects on a CPU-only machine
        super().__post_init__()
        # Resolved once, here (after TRL settled scale_rewards and the batch fields): everything else reads the
        # plan (rlvr/plan.py); each plug-in is then called once on a synthetic batch through the run-time checks
        # (plugins/probe.py), still before any model loads.
        plan = self._settle_plan()
        self._validate_method(plan)
        self.validate_exploration(plan)  # the exploration baselines (rlvr/exploration.py)
        probe_plan(self, plan)
        self._warn_off_policy_q()
        self._warn_guide_without_effect()

    def _settle_plan(self) -> MethodPlan:
        """Build the method plan (each plug-in node resolved and checked once) and write each node back as it
        resolved, every argument with its value (what the manifest records and the lab's analysis reads)."""
        plan = build_plan(self)
        for name, node in plan.nodes().items():
            setattr(self, name, node)
        self.__dict__["_method_plan"] = (plan_key(self), plan)
        return plan

    # One-line errors naming the field and the fix; nothing here touches a model. The checks depend on the
    # config alone, never on the machine: a config refused on a GPU is refused on CPU too.
    def _validate_method(self, plan: MethodPlan) -> None:
        """What the plug-ins' metadata allows together with the rest of the config."""
        if plan.guided and self.beta == 0.0:
            _fail(f"guide={plan.guide.name!r} needs a KL anchor: set beta > 0 (paper: 0.05) or guide: none")
        self._validate_kl_term(plan)
        # Refused on CPU too (where Unsloth would leave TRL's trainer in place): a config means one thing.
        if (conflict := unsloth_conflict(plan, self, self.backend == "unsloth")) is not None:
            raise ConfigError(conflict)

    def _validate_names(self) -> None:
        """Each field that takes one of a fixed set of names."""
        for name, choices in (
            ("sage_q_source", Q_SOURCES),
            ("backend", BACKENDS),
            ("loss_type", LOSS_TYPES),
            ("sage_kl_placement", PLACEMENTS),
            ("dapo_normalizer", DAPO_NORMALIZERS),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(
                    f"{name}={value!r} is unknown{suggestion(str(value), choices)} (use one of {', '.join(choices)})"
                )

    def _validate_knobs(self) -> None:
        """The KL coefficient, the training fields and the run's length."""
        if self.beta < 0.0:
            _fail(f"beta={self.beta} is negative: the KL coefficient must be >= 0 (paper: 0.05; 0 = no KL)")
        check_training_fields(self, learning_rate_hint="paper: 5e-6")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            _fail(
                f"max_steps={self.max_steps}, num_train_epochs={self.num_train_epochs}: nothing to train; "
                "set max_steps > 0 (paper: 1000) or num_train_epochs > 0"
            )

    def _validate_kl_term(self, plan: MethodPlan) -> None:
        """What the KL term's registry metadata allows (a guided anchor, beta, loss types), and the reward
        placement's needs."""
        kl_term, name = plan.kl_term, plan.kl_term.name
        if not kl_term.meta["guided"] and plan.guided:
            _fail(
                f"kl_term={name!r} has no q * pi_ref anchor (the plain forward-KL baseline): set guide: none or "
                "kl_term: k3"
            )
        if not kl_term.meta["shifted_reference"] and self.beta == 0.0:
            _fail(f"kl_term={name!r} has no effect with beta=0: set beta > 0 or kl_term: k3")
        loss_types = kl_term.meta["loss_types"]
        if loss_types is not None and self.loss_type not in loss_types:
            _fail(
                f"kl_term={name!r} supports loss_type in {tuple(loss_types)}, got loss_type={self.loss_type!r}: "
                "change one of them"
            )
        if self.sage_kl_placement != "reward":
            return
        if self.beta == 0.0:
            _fail("sage_kl_placement=reward puts beta * pseudo-KL in the reward: set beta > 0 (paper: 0.05)")
        if not kl_term.meta["shifted_reference"]:
            _fail(
                f"kl_term={name!r} is a per-token loss term; sage_kl_placement=reward uses the sequence log-ratio "
                "instead: set kl_term: k3 or sage_kl_placement=loss"
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            _fail(
                "sage_kl_placement=reward adds the pseudo-KL to the summed reward: set "
                "multi_objective_aggregation=sum_then_normalize"
            )

    def _validate_dapo_extras(self) -> None:
        """DAPO's dynamic sampling and soft overlong punishment."""
        if self.dynamic_sampling_max_rounds < 1:
            _fail(f"dynamic_sampling_max_rounds={self.dynamic_sampling_max_rounds} must be >= 1")
        if self.soft_overlong_punish_cache < 0 or (
            self.soft_overlong_punish_cache
            and self.max_completion_length is not None
            and self.soft_overlong_punish_cache >= self.max_completion_length
        ):
            _fail(
                f"soft_overlong_punish_cache={self.soft_overlong_punish_cache} must be 0 (off) or in "
                f"[1, max_completion_length={self.max_completion_length})"
            )

    def _validate_rollouts(self) -> None:
        """The sampling, clipping and batch fields TRL checks late or not at all (a ZeroDivisionError for
        num_generations 0, a traceback from the sampler for temperature -1, a negative epsilon trains)."""
        n = self.num_generations
        if n is None or n < 2:
            raise ConfigError(
                f"num_generations={n} must be >= 2: GRPO scores each rollout against the others of its "
                "prompt (paper: 8)"
            )
        world = int(os.environ.get("WORLD_SIZE", "1"))  # TRL's world_size, before the processes exist
        global_batch = self.per_device_train_batch_size * world
        whole_groups = math.lcm(global_batch, n)
        generation, steps = self.generation_batch_size, self.steps_per_generation
        if generation is not None and steps is not None:
            raise ConfigError(
                f"generation_batch_size={generation} and steps_per_generation={steps} are both set: set one"
            )
        if steps is not None and steps < 1:
            raise ConfigError(f"steps_per_generation={steps} must be >= 1, or leave it unset")
        if generation is not None and (generation < 1 or generation % global_batch):
            raise ConfigError(
                f"generation_batch_size={generation} must be a multiple of per_device_train_batch_size x "
                f"processes = {global_batch}: e.g. generation_batch_size: {whole_groups}"
            )
        generation = generation or global_batch * (steps or self.gradient_accumulation_steps)
        if generation % n:
            raise ConfigError(
                f"the generation batch of {generation} rollouts (generation_batch_size, or "
                "per_device_train_batch_size x processes x steps_per_generation) is not a multiple of "
                f"num_generations={n} (whole prompt groups): e.g. generation_batch_size: {whole_groups}"
            )
        if self.num_iterations < 1:
            raise ConfigError(f"num_iterations={self.num_iterations} must be >= 1 (paper: 1)")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError(
                f"temperature={self.temperature} must be > 0: GRPO samples its rollouts (paper: 1.0)"
            )
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p} must be in (0, 1] (paper: 1.0; 1 = off)")
        if self.min_p is not None and not 0 <= self.min_p < 1:
            raise ConfigError(f"min_p={self.min_p} must be in [0, 1) (paper: 0.01; 0 = off)")
        if self.top_k is not None and self.top_k < 0:
            raise ConfigError(f"top_k={self.top_k} must be >= 0 (0 = off)")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigError(f"epsilon={self.epsilon} must be > 0 (the PPO clip range; paper: 0.2)")
        if self.epsilon_high is not None and not self.epsilon_high >= self.epsilon:
            raise ConfigError(
                f"epsilon_high={self.epsilon_high} must be >= epsilon={self.epsilon} (DAPO: 0.28), or leave it "
                "unset (= epsilon)"
            )
        if self.max_completion_length is None or self.max_completion_length < 1:
            raise ConfigError(
                f"max_completion_length={self.max_completion_length} must be >= 1 (new tokens per rollout; "
                "paper: 3072)"
            )
        if not math.isfinite(self.beta):
            raise ConfigError(f"beta={self.beta} must be finite (paper: 0.05)")

    @property
    def method_plan(self) -> MethodPlan:
        """The frozen method plan (rlvr/plan.py), built in __post_init__; rebuilt only when a field it was built
        from changes."""
        key = plan_key(self)
        cached = self.__dict__.get("_method_plan")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_method_plan"] = (key, build_plan(self))
        return cached[1]

    def __getstate__(self):
        # The plan holds callables (a built-in guide is a closure over this config): rebuilt after unpickling.
        state = dict(self.__dict__)
        state.pop("_method_plan", None)
        return state

    @property
    def expected_q_source(self) -> str:
        """Where q will be computed (guides.q_source, from the guide's ``needs``): 'loss' on TRL's trainer for a
        guide that reads the policy; on Unsloth's patched one (backend unsloth) 'loss' for an entropies-only guide
        (the branch guide) and 'rollout' for the rest (the token guide, logit signals); 'rollout' for a guide that
        reads no policy signal (the random guide). A function of the config alone, never of the machine: the
        trainer re-checks it against the class it subclasses (on a CPU Unsloth leaves TRL's trainer in place)."""
        return self.method_plan.expected_q_source

    def _warn_off_policy_q(self) -> None:
        if (message := off_policy_q_warning(self, self.expected_q_source)) is not None:
            warnings.warn(message, stacklevel=3)

    def _warn_guide_without_effect(self) -> None:
        from sage_unsloth.plugins import guides

        if self.method_plan.kl_term.meta["gradient"] is None:
            return  # a plug-in KL term that does not say which KL's gradient it has: no claim either way
        plan = self.method_plan
        reason = guides.guide_effect(
            plan.guide,
            plan.kl_term.name,
            ratio=self.use_bias_correction_kl,
            placement=self.sage_kl_placement,
            q_min=plan.q_min,
            q_max=plan.q_max,
        )
        if reason is not None and self.beta != 0.0:
            warnings.warn(
                f"guide={plan.guide.name!r} has no effect on the expected gradient here: {reason} "
                "(docs/theory.md: what the guide does to the gradient)",
                stacklevel=3,
            )

    @property
    def guide_seed(self) -> int:
        return self.seed if self.sage_seed is None else self.sage_seed
