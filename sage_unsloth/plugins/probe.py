"""The trial call: each plug-in of a config's method plan called once on a small synthetic batch before any model
loads, through the same call and the same output checks as in training (sage_unsloth/plugins/calls.py).

``SageGRPOConfig.__post_init__`` runs it after the plan is built, so a stage, the lab's preflight and anything
else that builds the config refuse a plug-in that raises, exits, or returns the wrong type, shape or length, a
non-finite or an absurd value: one :class:`ConfigError` line naming the field and the plug-in, exit 2, before
loading. A plug-in with side effects (a log file) sees this one extra call.

The batch: two prompt groups of ``num_generations`` completions, :data:`TOKENS` tokens each, the last completion
shorter (a padded tail); entropies, log-probs of the policy, the sampling policy and the reference, token ids and
rewards drawn from a fixed seed, in the ranges real ones take. The global torch RNG is left as it was.

What the trial call checks beyond the run-time checks:

- a guide gets only the signals its ``needs`` declares: each other one is an :class:`Undeclared` stand-in (a
  logit signal it did not declare is missing from ``signals.logits`` the same way), so a guide that reads a signal
  it did not declare fails here, in one line naming the signal and the ``needs`` line to write, not at step 1
  after the model loaded (where the signal is None);
- a KL term whose term is added to the loss (beta > 0, any term but TRL's own k3) and a policy term's added loss
  must carry a gradient that reaches the policy's log-probs (a detached term would train with no KL, silently).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from sage_unsloth.config.args import ConfigError
from sage_unsloth.plugins import calls as plugin_calls
from sage_unsloth.plugins import guides
from sage_unsloth.plugins.advantages import GroupRewards
from sage_unsloth.plugins.kl_terms import KLTokens
from sage_unsloth.plugins.policy_terms import TokenBatch

GROUPS, TOKENS, VOCAB = 2, 6, 32
TRIAL = "on a synthetic batch before loading"


def synthetic_batch(num_generations: int, seed: int = 0) -> dict:
    """The trial batch (see the module docstring), TRL's (B, T) layout."""
    g = torch.Generator().manual_seed(seed)
    rows = GROUPS * num_generations
    mask = torch.ones(rows, TOKENS)
    mask[-1, TOKENS // 2 :] = 0.0  # a completion that ended early
    logps = -torch.rand(rows, TOKENS, generator=g) * 4.0 - 0.01
    return {
        "mask": mask,
        "entropies": torch.rand(rows, TOKENS, generator=g) * 2.5,
        "logps": logps,
        "old_logps": logps + 0.05 * torch.randn(rows, TOKENS, generator=g),
        "ref_logps": logps - 0.3 * torch.rand(rows, TOKENS, generator=g),
        "ref_entropies": torch.rand(rows, TOKENS, generator=g) * 2.5,
        "prompt_ids": torch.randint(0, VOCAB, (rows, 4), generator=g),
        "completion_ids": torch.randint(0, VOCAB, (rows, TOKENS), generator=g),
        "logits": torch.randn(rows * TOKENS, VOCAB, generator=g),  # per position, for the logit signals
        "rewards": torch.randint(0, 3, (rows,), generator=g).float() / 2.0,
        "advantages": torch.randn(rows, generator=g),
    }


@contextmanager
def _trial(field: str, rows: int):
    """A plug-in fault inside becomes one ConfigError line naming ``field`` and the plug-in."""
    try:
        yield
    except plugin_calls.PluginFault as fault:
        raise ConfigError(
            f"{field}={fault.name!r}: its trial call {TRIAL} ({rows} rows x {TOKENS} tokens) {fault.problem}"
        ) from None


def _call(field: str, rows: int, kind: str, name: str, fn, *inputs, check):
    """One trial call through the run-time call and check (plugin_calls.call), a fault as one ConfigError line."""
    with _trial(field, rows):
        return plugin_calls.call(kind, name, fn, *inputs, step=None, check=check)


def probe_plan(cfg, plan) -> None:
    """Call each plug-in of ``plan`` once on :func:`synthetic_batch` (one ConfigError line on a fault)."""
    with torch.random.fork_rng(devices=[]):  # a plug-in drawing from the global RNG leaves no trace
        batch = synthetic_batch(cfg.num_generations)
        rows = batch["mask"].size(0)
        _probe_guide(cfg, plan, batch, rows)
        _probe_estimator(cfg, plan, batch, rows)
        _probe_policy_term(cfg, plan, batch, rows)
        _probe_kl_term(cfg, plan, batch, rows)


class UndeclaredSignal(Exception):
    """A guide read a signal its ``needs`` does not declare (on the trial call); ``problem`` is the fault's phrase."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


def needs_line(guide: str, needs: tuple[str, ...], missing: str) -> str:
    """The line that declares ``missing`` beside ``needs``: 'g.needs = ("entropies", "logps")' for a plug-in, the
    registration's ``needs=(...)`` for a registered guide."""
    names = ", ".join(f'"{n}"' for n in (*needs, missing))
    attr = guide.rpartition(":")[2]
    return f"{attr}.needs = ({names}{',' if len(needs) == 0 else ''})" if ":" in guide else f"needs=({names})"


def _undeclared(guide: str, needs: tuple[str, ...], signal: str, where: str) -> UndeclaredSignal:
    return UndeclaredSignal(
        f"reads {where}, a signal its needs do not declare (in training it would be None): declare it, "
        f"{needs_line(guide, needs, signal)}"
    )


class Undeclared:
    """A signal the guide did not declare, on the trial call: reading it (an attribute, arithmetic, indexing, a
    torch function) raises :class:`UndeclaredSignal`. Its truth and ``is None`` are not readable (a guide testing
    ``signals.x is None`` would get None in training: declare ``x`` or leave it)."""

    def __init__(self, guide: str, needs: tuple[str, ...], signal: str):
        object.__setattr__(self, "_error", lambda: _undeclared(guide, needs, signal, f"signals.{signal}"))

    def __getattr__(self, name):
        raise self._error()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for value in (*args, *(kwargs or {}).values()):
            if isinstance(value, Undeclared):
                raise value._error()
        return NotImplemented

    def __repr__(self) -> str:
        return "<undeclared signal>"


def _raise_undeclared(self, *args, **kwargs):
    raise self._error()


# What reading a value does: its attributes (__getattr__), arithmetic, comparison, indexing, iteration, conversion.
_READS = "add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv pow rpow matmul rmatmul neg pos abs lt le gt ge"
_READS += " getitem setitem len iter bool float int index array contains"
for _dunder in _READS.split():
    setattr(Undeclared, f"__{_dunder}__", _raise_undeclared)


class DeclaredLogits(dict):
    """The logit signals a guide declared; a name it did not declare raises :class:`UndeclaredSignal`."""

    def __init__(self, values: dict, guide: str, needs: tuple[str, ...]):
        super().__init__(values)
        self.guide, self.needs = guide, needs

    def __missing__(self, name):
        raise _undeclared(self.guide, self.needs, name, f"signals.logits[{name!r}]")


def _declared_signals(batch: dict, guide: str, needs: tuple[str, ...]) -> dict:
    """The trial batch's guide signals: those ``needs`` declares, an :class:`Undeclared` stand-in for the others."""
    signals = {}
    for name in guides.POLICY_SIGNALS + guides.BATCH_SIGNALS:
        signals[name] = batch[name] if name in needs else Undeclared(guide, needs, name)
    return signals


def _probe_guide(cfg, plan, batch: dict, rows: int) -> None:
    needs = plan.guide_needs
    logits = {}
    targets = batch["completion_ids"].reshape(-1)
    signal_fns = guides.logit_signal_functions(needs, plan.guide)
    log_probs = torch.log_softmax(batch["logits"], dim=-1) if signal_fns else None
    for name, fn in signal_fns.items():
        flat = _call(
            "guide's logit signal",
            rows,
            "logit signal",
            name,
            fn,
            log_probs,
            targets,
            check=lambda out: plugin_calls.tensor_problem(out, "values", (targets.numel(),)),
        )
        logits[name] = flat.reshape(rows, TOKENS)
    signals = guides.Signals(
        mask=batch["mask"],
        step=0,
        max_steps=guides.default_max_steps(cfg.max_steps),
        generator=torch.Generator().manual_seed(cfg.guide_seed),
        logits=DeclaredLogits(logits, plan.guide.name, needs),
        **_declared_signals(batch, plan.guide.name, needs),
    )
    with _trial("guide", rows):
        guides.run_guide(plan.guide, plan.guide_fn, signals, step=None, q_min=plan.q_min, q_max=plan.q_max)


def _probe_estimator(cfg, plan, batch: dict, rows: int) -> None:
    _call(
        "advantage_estimator",
        rows,
        "advantage estimator",
        plan.estimator.name,
        plan.estimator_call,
        GroupRewards(batch["rewards"], cfg.num_generations),
        check=lambda out: plugin_calls.advantages_problem(out, rows),
    )


def _probe_policy_term(cfg, plan, batch: dict, rows: int) -> None:
    if plan.policy_term_fn is None:
        return
    logps = batch["logps"].clone().requires_grad_(True)
    tokens = TokenBatch(
        logps=logps,
        old_logps=batch["old_logps"],
        entropies=batch["entropies"],
        advantages=batch["advantages"][:, None].expand_as(logps),
        mask=batch["mask"],
        epsilon_low=cfg.epsilon,
        epsilon_high=cfg.epsilon_high if cfg.epsilon_high is not None else cfg.epsilon,
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    shape, mask = tuple(logps.shape), batch["mask"]
    check = lambda out: (
        plugin_calls.term_output_problem(out, shape, mask) or _gradient_problem(out.loss, logps, "loss")
    )
    _call(
        "policy_term",
        rows,
        "policy term",
        plan.policy_term.name,
        plan.policy_term_fn,
        tokens,
        check=check,
    )


def _probe_kl_term(cfg, plan, batch: dict, rows: int) -> None:
    # The term is added to the loss (so needs a gradient) with a KL coefficient, in the loss, unless it is TRL's own
    # k3 (which TRL's loss computes itself); elsewhere its log-probs come without one and it is only read.
    added = cfg.beta != 0.0 and cfg.sage_kl_placement == "loss" and not plan.kl_in_trl_loss
    logps = batch["logps"].clone().requires_grad_(added)
    tokens = KLTokens(
        logps=logps,
        ref_logps=batch["ref_logps"],
        old_logps=batch["old_logps"],
        ratio=cfg.use_bias_correction_kl,
    )
    shape, mask = tuple(logps.shape), batch["mask"]
    check = lambda out: (
        plugin_calls.kl_output_problem(out, shape, mask)
        or _gradient_problem(out.term, logps, f"KL term (beta={cfg.beta:g})")
    )
    _call("kl_term", rows, "KL term", plan.kl_term.name, plan.kl_term_fn, tokens, check=check)


def _gradient_problem(value, logps: torch.Tensor, what: str) -> str | None:
    """Why ``value`` (a term added to the loss, or None) has no gradient reaching ``logps``, or None. The run-time
    check sees only that the term has a graph (plugin_calls.placement_problem); here the graph is followed."""
    if value is None or not logps.requires_grad or value.grad_fn is None:
        return None  # none to check, or no graph at all: placement_problem's one line
    (grad,) = torch.autograd.grad(value.sum(), logps, allow_unused=True)
    if grad is None:
        return (
            f"returned a {what} whose gradient does not reach inputs.logps (computed from other tensors only): "
            "added to the loss, it would train nothing; compute it from inputs.logps"
        )
    return None
