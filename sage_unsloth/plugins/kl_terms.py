"""Per-token KL terms of the loss (``sage_kl_placement: loss``), registered by name: k3, k2 and forward.

A KL term sees one loss call's tokens (:class:`KLTokens`: the current policy's log-probs with their gradient,
the anchor's log(q * pi_ref) -- the reference already shifted by log q --, the sampling policy's log-probs,
TRL's ``use_bias_correction_kl``) and returns the per-token term the loss carries (with its gradient) and the
plain per-token value logged as ``kl`` (:class:`KLOutput`). The config names it in its node ``kl_term: {name:
..., <its arguments>}``: a registered name, ``package.module:function`` or ``path/to/file.py:function`` with the
signature ``fn(tokens, **arguments) -> KLOutput``; its arguments are checked against the signature before any
model loads (sage_unsloth/plugins/registry.py).

What each term is (anchor.kl_loss_term has the formulas and why each has its KL's gradient):

- ``k3`` (paper, TRL): exp(d) - d - 1 against the shaped anchor, times pi / pi_old with use_bias_correction_kl.
  It is exactly what TRL's and Unsloth's own losses compute from ``ref_per_token_logps``, so the trainer
  leaves their loss alone (``shifted_reference``): the only term both backends run.
- ``k2``: 0.5 d^2 times sg(pi / pi_old): the reverse-KL gradient to q * pi_ref. TRL backend only.
- ``forward``: (u log u - u + 1) times pi / pi_old, u = pi_ref / pi: the gradient of KL(pi_ref || pi), the
  forward-KL baseline; it has no guide (``guided=False``). TRL backend only.

Metadata (an import-path term declares it as attributes, ``fn.backends = ("trl",)``):

- ``backends``: the trainer stacks whose loss can carry the term (a term that is not a shifted reference is
  added to TRL's loss, which Unsloth's compiled loss has no slot for);
- ``shifted_reference``: the term is TRL's own k3 against ``ref_per_token_logps`` (nothing to add to the loss;
  the reward placement, which moves the KL into the reward, keeps only such a term);
- ``guided``: the term can take a guide's q (the forward KL has no q * pi_ref anchor);
- ``loss_types``: the TRL loss types whose aggregation the added term follows (None: any);
- ``gradient``: 'reverse' (a position-constant q leaves the gradient alone), 'forward', 'ratio' (forward,
  reverse with use_bias_correction_kl) or None (unknown: the config makes no claim about the guide's effect).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sage_unsloth.compat import TOKEN_LEVEL_LOSS_TYPES
from sage_unsloth.plugins import anchor
from sage_unsloth.plugins.registry import Registry

KL_TERMS = Registry(
    "KL term",
    field="kl_term",
    meta={
        "backends": ("trl",),
        "shifted_reference": False,
        "guided": True,
        "loss_types": TOKEN_LEVEL_LOSS_TYPES,
        "gradient": None,
    },
    inputs="tokens",
    example="k2",
)


@dataclass(frozen=True)
class KLTokens:
    """One loss call's completion tokens, TRL's (B, T) layout."""

    logps: torch.Tensor  # current policy, with gradient
    ref_logps: torch.Tensor  # log(q * pi_ref): the reference shifted by log q (q = 1 without a guide)
    old_logps: torch.Tensor | None  # the sampling policy (None: on-policy, sg(logps))
    ratio: bool  # TRL's use_bias_correction_kl


@dataclass(frozen=True)
class KLOutput:
    term: torch.Tensor  # (B, T) per-token loss term, with gradient
    value: torch.Tensor  # (B, T) the KL estimate itself, no gradient: logged as ``kl``


@KL_TERMS.register(
    "k3", backends=("trl", "unsloth"), shifted_reference=True, loss_types=None, gradient="ratio"
)
def k3(tokens: KLTokens) -> KLOutput:
    term = anchor.kl_loss_term(
        tokens.logps, tokens.ref_logps, estimator="k3", old_logp=tokens.old_logps, ratio=tokens.ratio
    )
    value = anchor.shaped_kl(tokens.logps, tokens.ref_logps, 0.0, estimator="k3").detach()
    return KLOutput(term, value)


@KL_TERMS.register("k2", gradient="reverse")
def k2(tokens: KLTokens) -> KLOutput:
    term = anchor.kl_loss_term(tokens.logps, tokens.ref_logps, estimator="k2", old_logp=tokens.old_logps)
    value = anchor.shaped_kl(tokens.logps, tokens.ref_logps, 0.0, estimator="k2").detach()
    return KLOutput(term, value)


@KL_TERMS.register("forward", guided=False, gradient="forward")
def forward(tokens: KLTokens) -> KLOutput:
    term = anchor.kl_loss_term(tokens.logps, tokens.ref_logps, estimator="forward", old_logp=tokens.old_logps)
    return KLOutput(term, anchor.forward_kl(tokens.logps, tokens.ref_logps).detach())
