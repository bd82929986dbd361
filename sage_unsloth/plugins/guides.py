"""Guides as plug-ins: what a guide receives (:class:`Signals`), what it declares (``needs``), the registry of
guides and of per-token logit signals, and everything the kit does around a guide's raw q.

A guide is one function ``guide(signals, **args) -> q`` (or a class built with ``**args`` whose instances are
called with ``signals``, for state such as a schedule), named in a config's node ``guide: {name: <registered
name>, <its arguments>}`` or ``guide: {name: package.module:function}`` / ``path/to/file.py:function``. The
node's ``q_min`` / ``q_max`` are the kit's clip range (every guide's; passed on to a guide that names them). It
declares the signals it reads, as registration metadata or an attribute ``guide.needs = ("entropies", ...)``:

- ``entropies``, ``logps``: the policy's token entropy / log-prob of the sampled token (B, T);
- ``ref_logps``, ``old_logps``: the reference's and (where TRL scored it) the sampling policy's log-prob;
- ``ref_entropies``: the reference model's token entropy (B, T), from the reference pass the KL already runs
  (TRL's, or the kit's own in the reward placement): no extra forward pass. A guide that reads it gets q at
  rollout (the reference does not change within a rollout); Unsloth's trainer refuses it before loading;
- ``prompt_ids``, ``completion_ids``: the token ids;
- any name of :data:`LOGIT_SIGNALS` (``top2_margin``) or an import path of a logit signal function
  ``fn(log_probs (n, V), targets (n,)) -> (n,)``: computed from the full next-token distribution in the same
  pass that produces the entropies (rlvr/trainer.py, compat.py's ``logit_signal_tap``).

``mask``, ``step``, ``max_steps``, ``generator`` (seeded per step, call and process), ``rank`` and ``layout``
are always there. The kit then (:func:`run_guide`, :func:`finalise_q`): runs the guide without gradient on a copy
of its signals (writing into them changes nothing the loss reads), checks q (shape, floating, finite on the mask;
any fault, an exception or ``sys.exit`` included, is one line naming the guide and the step:
sage_unsloth/plugins/calls.py), clips it to [q_min, q_max], sets q = 1 off the mask; and the trainer logs the
sage/q_* metrics, puts log q into the anchor (both placements, both backends' layouts) and decides where q is
computed from ``needs`` and the backend (:func:`q_source`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sage_unsloth.config.args import ConfigError
from sage_unsloth.config.field_rules import Limit, Names
from sage_unsloth.plugins import anchor
from sage_unsloth.plugins import calls as plugin_calls
from sage_unsloth.plugins.anchor import TOKEN_NORMS
from sage_unsloth.plugins.calls import PluginFault, q_problem
from sage_unsloth.plugins.registry import Entry, Registry

__all__ = [
    "GUIDES",
    "LOGIT_SIGNALS",
    "POLICY_SIGNALS",
    "GuideError",
    "Signals",
    "clipped_fraction_counts",
    "finalise_q",
    "guide_effect",
    "logit_signal_names",
    "q_source",
    "run_guide",
    "unsloth_cannot",
]

# Signals read from the policy / batch (beyond mask, step, generator, rank which every call gets).
POLICY_SIGNALS = ("entropies", "logps")
BATCH_SIGNALS = ("ref_logps", "ref_entropies", "old_logps", "prompt_ids", "completion_ids")
# Signals of the reference pass (scored where the KL scores its reference; q then comes at rollout).
REFERENCE_SIGNALS = ("ref_logps", "ref_entropies")
# Inside Unsloth's compiled loss the kit sees the entropies and the mask (the get_high_entropy_mask tap), nothing
# else; at rollout its own no-grad pass gives entropies, logps and logit signals, and the ids in TRL's layout.
UNSLOTH_IN_LOSS = ("entropies",)
UNSLOTH_NEVER = ("ref_logps", "old_logps")  # stored in Unsloth's left-packed layout only
UNSLOTH_NO_REF_ENTROPY = ("ref_entropies",)  # Unsloth's reference scorer returns no entropies

# ``gradient_rule``: which of anchor.guide_effect's rules says whether the guide changes the expected gradient
# ("none": q = 1; "random": token-independent noise, mean 1 under bounds symmetric about 1); None (most guides):
# read from ``needs`` (a q that can differ between candidate tokens follows the token rule, else the branch rule).
# The kit's clip of every guide's q, keys of every guide node (the paper's range): log q must stay finite.
Q_CLIP = {
    "q_min": (0.6, Limit(gt=0, note="log q must stay finite; e.g. 0.6")),
    "q_max": (1.4, Limit(ge=0, note="the paper's 1.4")),
}


def _clip_order(args: dict) -> str | None:
    if args["q_min"] > args["q_max"]:
        return f"q_min={args['q_min']} > q_max={args['q_max']}: make q_min <= q_max"
    return None


GUIDES = Registry(
    "guide",
    field="guide",
    meta={"needs": (), "gradient_rule": None},
    inputs="signals",
    kit_args=Q_CLIP,
    kit_check=_clip_order,
    example="branch",
)
LOGIT_SIGNALS = Registry(
    "logit signal", field="guide", meta={"uses_target": False}, inputs="log_probs, targets"
)


class GuideError(PluginFault):
    """A guide returned an unusable q: one line naming the guide."""

    def __init__(self, name: str, problem: str):
        self.kind, self.name, self.problem, self.step = "guide", name, problem, None
        RuntimeError.__init__(self, f"guide {name!r} {problem}")


@dataclass(frozen=True)
class Signals:
    """What a guide sees for one batch. Per-token tensors are (B, T) in ``layout`` (``trl``: completion tokens
    from column 0; ``unsloth``: its left-packed (B, C + max_left_pad) loss layout, only ``entropies`` and
    ``mask`` are given there). A signal the guide did not declare in ``needs`` may be None."""

    mask: torch.Tensor
    step: int
    max_steps: int
    generator: torch.Generator
    rank: int = 0
    layout: str = "trl"
    entropies: torch.Tensor | None = None
    logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None
    ref_entropies: torch.Tensor | None = None
    old_logps: torch.Tensor | None = None
    prompt_ids: torch.Tensor | None = None
    completion_ids: torch.Tensor | None = None
    logits: dict = field(default_factory=dict)  # logit signal name -> (B, T)

    @property
    def progress(self) -> float:
        """Position in the run, step / max_steps in [0, 1]."""
        return min(1.0, self.step / max(1, self.max_steps))


# --------------------------------------------------------------------------------------------- declarations
def logit_signal_names(needs) -> tuple[str, ...]:
    """The entries of ``needs`` that are logit signals (everything but the policy and batch signals)."""
    return tuple(n for n in needs if n not in POLICY_SIGNALS + BATCH_SIGNALS)


def check_needs(entry: Entry) -> tuple[str, ...]:
    """``needs`` of a guide, each a known signal or a resolvable logit signal; one line otherwise. A logit signal
    named by a relative file path (``signals.py:fn``) is looked for beside the guide's own file first (where it
    sits next to its YAML, in a lab method or a folder of one's own), then in the working directory
    (:func:`logit_signal`); the guide reads it under the name it declared."""
    needs = entry.meta.get("needs") or ()
    if isinstance(needs, str):
        needs = (needs,)
    for name in logit_signal_names(needs):
        try:
            logit_signal(name, entry)
        except ConfigError:
            known = ", ".join(POLICY_SIGNALS + BATCH_SIGNALS + LOGIT_SIGNALS.names())
            raise ConfigError(
                f"guide={entry.name!r} declares needs {name!r}, which is no signal (known: {known}, or a "
                "logit signal 'package.module:function', a file's path relative to the guide's file)"
            ) from None
    return tuple(needs)


def logit_signal(name: str, guide: Entry | None = None) -> Entry:
    """The logit signal ``name`` of ``guide``'s needs: a registered one, or the function at its import path, a
    relative file path taken beside the guide's own file when that file is there, else from the working directory."""
    return LOGIT_SIGNALS.resolve(_beside_the_guide(name, guide) if guide is not None else name)


def _beside_the_guide(name: str, entry: Entry) -> str:
    """``name`` with a relative ``file.py:fn`` path made absolute where that file lies beside the guide's own file."""
    import inspect
    from pathlib import Path

    module, colon, fn = name.partition(":")
    if not colon or not (module.endswith(".py") or "/" in module) or Path(module).expanduser().is_absolute():
        return name
    obj = entry.obj if inspect.isfunction(entry.obj) or inspect.isclass(entry.obj) else type(entry.obj)
    try:
        source = inspect.getsourcefile(obj)
    except TypeError:
        source = None
    candidate = Path(source).parent / module if source else None
    return f"{candidate.resolve()}:{fn}" if candidate is not None and candidate.is_file() else name


def reads_policy(needs) -> bool:
    """Does a guide with these ``needs`` read a signal of the policy (entropies, log-probs or a logit signal)?"""
    return any(n in POLICY_SIGNALS for n in needs) or bool(logit_signal_names(needs))


def q_source(needs, *, requested: str, unsloth_patched: bool) -> str:
    """Where q is computed: 'loss' (from the loss forward's own outputs, no extra pass, current policy) or
    'rollout' (once per rollout; a policy signal there costs one no-grad pass unless TRL scores old logps).

    A guide that reads no policy signal is drawn once per rollout. On TRL's trainer every signal exists in the
    loss; inside Unsloth's compiled loss only the entropies do."""
    if not reads_policy(needs) or requested == "rollout" or "ref_entropies" in needs:
        return "rollout"  # the reference's entropies exist only in the rollout's reference pass
    in_loss_ok = not unsloth_patched or set(needs) <= set(UNSLOTH_IN_LOSS)
    return "loss" if in_loss_ok else "rollout"


def unsloth_cannot(needs, *, requested: str, guide: str) -> str | None:
    """Why Unsloth's patched trainer cannot run this guide (None: it can), one line with the fix."""
    no_entropy = [n for n in needs if n in UNSLOTH_NO_REF_ENTROPY]
    if no_entropy:
        return (
            f"guide={guide!r} needs {', '.join(no_entropy)}, which Unsloth's reference scorer does not "
            "compute (its packed reference pass returns log-probs only): set backend=trl"
        )
    never = [n for n in needs if n in UNSLOTH_NEVER]
    if never:
        return (
            f"guide={guide!r} needs {', '.join(never)}, which Unsloth's trainer keeps only in its own packed "
            "layout: set backend=trl"
        )
    beyond = [n for n in needs if n not in UNSLOTH_IN_LOSS]
    if requested == "loss" and beyond:
        return (
            f"sage_q_source='loss' with guide={guide!r} needs {', '.join(beyond)} inside the loss; Unsloth's "
            "patched loss hands out entropies only: use sage_q_source=rollout or auto, or backend=trl"
        )
    return None


def token_dependent(needs, guide: Entry | None = None) -> bool:
    """Can q differ between candidate tokens at one position? Only through the sampled token's own signals."""
    if any(n in ("logps", "completion_ids", "ref_logps", "old_logps") for n in needs):
        return True
    return any(logit_signal(n, guide).meta["uses_target"] for n in logit_signal_names(needs))


def guide_effect(
    entry: Entry, estimator: str, *, ratio: bool, placement: str, q_min: float, q_max: float
) -> str | None:
    """None if the guide changes the expected gradient here, else why not: anchor.guide_effect under the guide's
    ``gradient_rule``, or where it declares none, the rule its ``needs`` imply (a q that can differ between
    candidate tokens at a position follows the token guide's rule, any other the branch guide's)."""
    rule = entry.meta.get("gradient_rule") or (
        "token" if token_dependent(entry.meta.get("needs") or (), entry) else "branch"
    )
    return anchor.guide_effect(rule, estimator, ratio=ratio, placement=placement, q_min=q_min, q_max=q_max)


# --------------------------------------------------------------------------------------------- the kit's part
def finalise_q(
    raw, signals: Signals, *, name: str, q_min: float, q_max: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The guide's raw q checked (plugin_calls.q_problem: shape, floating, finite on the mask), clipped to
    [q_min, q_max], float32, without gradient, and exactly 1 where the mask is 0. ``mask``: the kit's own mask
    (default the signals'); the guide saw a copy of it."""
    mask = signals.mask if mask is None else mask
    if (problem := q_problem(raw, mask)) is not None:
        raise GuideError(name, problem)
    q = raw.detach().float().to(mask.device)
    valid = mask.bool()
    q = q.clamp(q_min, q_max)
    return torch.where(valid, q, torch.ones_like(q))


def run_guide(entry: Entry, guide, signals: Signals, *, step: int | None, q_min: float, q_max: float):
    """(q, raw q) of ``guide`` on ``signals``: called without gradient on a copy of its signals through the one
    plug-in call (plugin_calls.call: a fault is one line naming the guide and ``step``), then :func:`finalise_q`
    on the kit's own mask. The trainer and the trial call before loading (plugins/probe.py) both run this."""
    mask = signals.mask
    with torch.no_grad():
        raw = plugin_calls.call(
            "guide", entry.name, guide, signals, step=step, check=lambda out: q_problem(out, mask)
        )
    return finalise_q(raw, signals, name=entry.name, q_min=q_min, q_max=q_max, mask=mask), raw


def clipped_fraction_counts(
    raw: torch.Tensor, mask: torch.Tensor, q_min: float, q_max: float
) -> torch.Tensor:
    """(clipped, masked) token counts, float32: how many completion tokens' raw q fell outside [q_min, q_max]
    (so that :func:`finalise_q` clipped them), out of how many completion tokens. Call after finalise_q
    accepted ``raw`` (its shape and finiteness are checked there)."""
    valid = mask.bool()
    values = raw.detach().float().to(mask.device)[valid]
    clipped = ((values < q_min) | (values > q_max)).float().sum()
    return torch.stack([clipped, valid.float().sum()])


# --------------------------------------------------------------------------------------------- built-ins
# The paper's guides, through the same interface: thin calls of anchor.py's formulas (the oracle tests' subject).
# Their knobs are keyword arguments with the paper's values as defaults (arXiv 2605.18864, Section 4 and the
# official code's defaults); the clip range q_min / q_max is the node's (GUIDES.kit_args).
_SCHEDULE_LIMITS = {
    "cycles": Limit(ge=1, note="cosine restarts over max_steps"),
    "decay": Limit(gt=0, le=1, note="default 0.9; 1 = no decay"),
}


def _schedule(signals: Signals, upper, lower, sigma_upper, sigma_lower, cycles, decay):
    return anchor.CosineSchedule(
        signals.max_steps, upper, lower, sigma_upper, sigma_lower, cycles=cycles, decay=decay
    )(signals.step)


@GUIDES.register("none", needs=(), gradient_rule="none")
def guide_none(signals: Signals) -> torch.Tensor:
    """q = 1: plain GRPO's anchor."""
    return torch.ones_like(signals.mask, dtype=torch.float32)


_BRANCH_LIMITS = {"gamma": Limit(ge=0), "tau": Limit(note="an entropy threshold in nats")}


@GUIDES.register("branch", needs=("entropies",), limits=_BRANCH_LIMITS)
def guide_branch(
    signals: Signals, *, gamma: float = 0.3, tau: float = 1.2, q_min: float, q_max: float
) -> torch.Tensor:
    """q = 1 + gamma * relu(H - tau)."""
    return anchor.branch_guide(
        signals.entropies, signals.mask, gamma=gamma, tau=tau, q_min=q_min, q_max=q_max
    )


@GUIDES.register("ref_branch", needs=("ref_entropies",), limits=_BRANCH_LIMITS)
def guide_ref_branch(
    signals: Signals, *, gamma: float = 0.3, tau: float = 1.2, q_min: float, q_max: float
) -> torch.Tensor:
    """q = 1 + gamma * relu(H_ref - tau), H_ref the reference (SFT anchor) model's token entropy: an extension
    beyond the paper (docs/methods.md). The anchor's entropy does not fall as the policy sharpens, so the guide
    keeps acting at the positions where the SFT model branched (the policy-entropy branch guide switches itself
    off once the policy is confident there)."""
    return anchor.branch_guide(
        signals.ref_entropies, signals.mask, gamma=gamma, tau=tau, q_min=q_min, q_max=q_max
    )


@GUIDES.register(
    "token",
    needs=("logps",),
    limits={
        **dict.fromkeys(("alpha_upper", "alpha_lower", "sigma_upper", "sigma_lower"), Limit(ge=0)),
        "norm": Names(TOKEN_NORMS),
        **_SCHEDULE_LIMITS,
    },
)
def guide_token(
    signals: Signals,
    *,
    alpha_upper: float = 0.3,
    alpha_lower: float = 0.1,
    sigma_upper: float = 0.25,
    sigma_lower: float = 0.1,
    norm: str = "minmax",
    cycles: int = 8,
    decay: float = 0.9,
    q_min: float,
    q_max: float,
):
    """q = 1 + alpha * w + sigma * w * N(0, 1), w the normalised surprisal, alpha / sigma on the cosine schedule."""
    alpha, sigma = _schedule(signals, alpha_upper, alpha_lower, sigma_upper, sigma_lower, cycles, decay)
    return anchor.token_guide(
        signals.logps,
        signals.mask,
        alpha=alpha,
        sigma=sigma,
        norm=norm,
        q_min=q_min,
        q_max=q_max,
        generator=signals.generator,
    )


@GUIDES.register(
    "random",
    needs=(),
    gradient_rule="random",
    limits={
        **dict.fromkeys(("eps_upper", "eps_lower"), Limit(ge=0, le=1, note="a token probability")),
        **dict.fromkeys(("sigma_upper", "sigma_lower"), Limit(ge=0)),
        **_SCHEDULE_LIMITS,
    },
)
def guide_random(
    signals: Signals,
    *,
    eps_upper: float = 0.1,
    eps_lower: float = 0.0,
    sigma_upper: float = 0.15,
    sigma_lower: float = 0.05,
    cycles: int = 8,
    decay: float = 0.9,
    q_min: float,
    q_max: float,
):
    """q = 1 + sigma * N(0, 1) on a fraction eps of tokens, eps / sigma on the cosine schedule."""
    eps, sigma = _schedule(signals, eps_upper, eps_lower, sigma_upper, sigma_lower, cycles, decay)
    return anchor.random_guide(
        signals.mask, eps=eps, sigma=sigma, q_min=q_min, q_max=q_max, generator=signals.generator
    )


# --------------------------------------------------------------------------------------------- logit signals
@LOGIT_SIGNALS.register("top2_margin")
def top2_margin(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """p(1st) - p(2nd) of the next-token distribution (at the sampling temperature): 0 = a two-way branch."""
    top = log_probs.topk(2, dim=-1).values.exp()
    return top[..., 0] - top[..., 1]


@LOGIT_SIGNALS.register("top1_prob")
def top1_prob(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """max_v p(v): the policy's confidence in its favourite token."""
    return log_probs.max(dim=-1).values.exp()


def logit_signal_functions(needs, guide: Entry | None = None) -> dict:
    """name -> fn for the logit signals in ``needs`` of ``guide`` (the functions the chunked pass evaluates), each
    under the name the guide declared (:func:`logit_signal` finds it)."""
    return {name: logit_signal(name, guide).obj for name in logit_signal_names(needs)}


def default_max_steps(max_steps: int) -> int:
    """The schedule's length: max_steps, or the paper's 1000 when training is set by epochs."""
    return max(1, int(max_steps if max_steps > 0 else 1000))


def resolve_guide(value):
    """The guide node ``value`` (a config's ``guide``) resolved once: (its Node, its checked ``needs``). One line on
    bad input, before any model loads."""
    node = GUIDES.node(value)
    return node, check_needs(node.entry)
