r"""A KL term of your own: k3 with its log-ratio clipped, so one token the reference finds very unlikely cannot
dominate the KL's gradient.

    kl_term: {name: examples/clipped_k3.py:clipped_k3, clip: 2.0}

Per token, with d_t = log(q_t pi_ref(y_t)) - log pi(y_t) (the anchor already shaped by the guide's q):
term_t = exp(c_t) - c_t - 1 with c_t = clamp(d_t, -clip, clip); its gradient is k3's where |d_t| <= clip and 0
outside. With ``use_bias_correction_kl`` (``tokens.ratio``) it is weighted by pi / pi_old as TRL weighs k3. Per
sequence it is aggregated as TRL aggregates its loss; beta weighs it as it weighs k3.

The contract (docs/extending.md): ``fn(tokens, **arguments) -> KLOutput``. ``tokens`` is a
sage_unsloth.plugins.kl_terms.KLTokens (logps with gradient, the shifted ref_logps, old_logps, TRL's
use_bias_correction_kl); return the per-token ``term`` carried by the loss and the plain ``value`` logged as
``kl``. Metadata as attributes: a term that is not TRL's own k3 is added to TRL's loss (TRL backend only), and
``gradient = None`` says the kit should make no claim about which KL's gradient it has.
"""

import torch

from sage_unsloth.plugins.kl_terms import KLOutput


def clipped_k3(tokens, *, clip=2.0):
    d = (tokens.ref_logps - tokens.logps).clamp(-clip, clip)
    value = torch.exp(d) - d - 1.0
    term = value
    if tokens.ratio:  # pi / pi_old, with the gradient of pi (on-policy: old = sg(pi), a ratio of 1)
        old = tokens.logps.detach() if tokens.old_logps is None else tokens.old_logps
        term = value * torch.exp(tokens.logps - old)
    return KLOutput(term=term, value=value.detach())


clipped_k3.backends = ("trl",)
clipped_k3.gradient = None
