"""The trial call: each plug-in of a config's method plan called once on a small synthetic batch before any model
loads, through the same call and the same output checks as in training (sage_unsloth/plugin_calls.py).

``SageGRPOConfig.__post_init__`` runs it after the plan is built, so a stage, the lab's preflight and anything
else that builds the config refuse a plug-in that raises, exits, or returns the wrong type, shape or length, a
non-finite or an absurd value: one :class:`ConfigError` line naming the field and the plug-in, exit 2, before
loading. A plug-in with side effects (a log file) sees this one extra call.

The batch: two prompt groups of ``num_generations`` completions, :data:`TOKENS` tokens each, the last completion
shorter (a padded tail); entropies, log-probs of the policy, the sampling policy and the reference, token ids and
rewards drawn from a fixed seed, in the ranges real ones take. The global torch RNG is left as it was.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from sage_unsloth import guides, plugin_calls
from sage_unsloth.config_args import ConfigError
from sage_unsloth.rlvr.advantages import GroupRewards
from sage_unsloth.rlvr.kl_terms import KLTokens
from sage_unsloth.rlvr.policy_terms import TokenBatch

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


def _probe_guide(cfg, plan, batch: dict, rows: int) -> None:
    needs = plan.guide_needs
    logits = {}
    targets = batch["completion_ids"].reshape(-1)
    signal_fns = guides.logit_signal_functions(needs)
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
        entropies=batch["entropies"],
        logps=batch["logps"],
        ref_logps=batch["ref_logps"],
        ref_entropies=batch["ref_entropies"],
        old_logps=batch["old_logps"],
        prompt_ids=batch["prompt_ids"],
        completion_ids=batch["completion_ids"],
        logits=logits,
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
    check = lambda out: plugin_calls.term_output_problem(out, shape, mask)
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
    logps = batch["logps"].clone().requires_grad_(True)
    tokens = KLTokens(
        logps=logps,
        ref_logps=batch["ref_logps"],
        old_logps=batch["old_logps"],
        ratio=cfg.use_bias_correction_kl,
    )
    shape, mask = tuple(logps.shape), batch["mask"]
    check = lambda out: plugin_calls.kl_output_problem(out, shape, mask)
    _call("kl_term", rows, "KL term", plan.kl_term.name, plan.kl_term_fn, tokens, check=check)
