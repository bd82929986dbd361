r"""The SAGE objective in pure torch: guide functions q, the KL estimators against q * pi_ref, and what
each estimator's gradient is.

SAGE keeps GRPO's KL regulariser but moves its anchor from pi_ref to q(x, y) * pi_ref. As an objective
over whole completions y (the paper's equation),

    J(theta) = E_{y ~ pi_theta}[ r(x, y) ] - beta * KL( pi_theta || q * pi_ref ),   q(x, y) = prod_t q_t    (1)

whose maximiser over all policies is the tilted anchor

    pi*(y | x)  ∝  prod_t q_t(y) * pi_ref(y | x) * exp( r(x, y) / beta ).                               (2)

The kit has two placements of the pseudo-KL (``sage_kl_placement``):

- ``loss`` (the paper's and official code's): per completion token t a KL estimate against the shaped
  reference log-probability

      m_t = log pi_ref(y_t | ...) + log q_t,      q_t >= 0, no gradient through q,                        (3)

  is added to the per-token loss. That loss never sees the sequence-level q(y) = prod_t q_t: each
  position is regularised on its own (see "gradient identities" below), so (2) is *not* its fixed point.
- ``reward``: the sequence-level estimate sum_t [log pi - m_t] moves into the reward before the group
  advantage, r~ = r - beta * sequence_pseudo_kl(...), without gradient. REINFORCE on r~ is the gradient
  of (1), so (2) is its fixed point.

Per-token estimators, d_t = m_t - log pi_theta(y_t | ...), a = q * pi_ref at one position:

    k1 = -d_t                      k2 = 0.5 * d_t ** 2            k3 = exp(d_t) - d_t - 1
    forward = u log u - u + 1,  u = pi_ref / pi_theta      (an estimate of KL(pi_ref || pi_theta))

Gradient identities. Used as a loss on samples of pi (no gradient through the sampling), at one
position with pi = pi_theta(. | prefix), the expected gradient of each term is (exact; checked by
exact expectation in tests/rlvr/test_estimators.py):

    k1                      0                                     (a value estimator only)
    k2                      grad sum_v pi log(pi / a)             reverse KL to the anchor
    k3                      -sum_v a grad log pi                  forward KL, grad sum_v a log(a / pi)
    k3 * rho                grad sum_v pi log(pi / a)             (TRL's use_bias_correction_kl)
    k1 * rho                grad sum_v pi log(pi / a)
    forward                 sum_v pi_ref log(pi / pi_ref) grad log pi       (no KL's gradient)
    forward * rho           grad KL(pi_ref || pi)

with rho = pi / sg(pi) (= 1 in value). Off-policy, rho = pi / pi_old keeps the "* rho" rows exact per
position; k2 needs the stop-gradient weight sg(pi / pi_old) instead (k2 * rho has the gradient of
E_pi[d^2 / 2], no KL's). :func:`kl_loss_term` is the kit's term for each estimator.

What the guide does. If q is the same for every candidate token at a position (the branch guide: q_t
depends on the position's entropy; the random guide: noise independent of the token), the reverse-KL
rows give grad KL(pi || pi_ref) whatever q is, and k3 gives q * grad KL(pi_ref || pi): the guide only
scales the forward-KL pull at that position. For the random guide with bounds symmetric about 1,
E[q] = 1, so it has no effect in expectation under k3 either. A q that varies with the token (the token
guide) moves each position's target to pi ∝ q * pi_ref. :func:`guide_effect` states this per config.

Guides compute q from signals available at generation time (paper Sec. "guides"):

    branch:  q_t = clip( 1 + gamma * relu(H_t - tau), q_min, q_max ),  H_t = policy token entropy
    token:   q_t = clip( 1 + alpha * w_t + sigma * w_t * N(0, 1), q_min, q_max ),
             w_t = per-sequence normalised surprisal -log pi_theta(y_t) in [0, 1]
    random:  q_t = clip( 1 + sigma * N(0, 1), q_min, q_max ) with probability eps, else 1

alpha/sigma (token) and eps/sigma (random) follow :class:`CosineSchedule`. Every guide returns q = 1
exactly on masked (non-completion) tokens, so padding never moves the anchor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "CosineSchedule",
    "branch_guide",
    "forward_kl",
    "guide_effect",
    "kl_loss_term",
    "log_q",
    "random_guide",
    "sequence_pseudo_kl",
    "shaped_kl",
    "token_guide",
]

KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_TERM_ESTIMATORS = ("k3", "k2", "forward")
TOKEN_NORMS = ("minmax", "rank", "zscore")


def _check_bounds(q_min: float, q_max: float) -> None:
    if not (0.0 < q_min <= q_max):
        raise ValueError(f"q bounds must satisfy 0 < q_min <= q_max, got q_min={q_min}, q_max={q_max}")


def _finalise(q: torch.Tensor, mask: torch.Tensor, q_min: float, q_max: float) -> torch.Tensor:
    """Clamp to [q_min, q_max] (NaN -> 1) and set q = 1 exactly where mask is 0."""
    q = torch.nan_to_num(q, nan=1.0).clamp(q_min, q_max)
    return torch.where(mask.bool(), q, torch.ones_like(q))


@torch.no_grad()
def branch_guide(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 0.3,
    tau: float = 1.2,
    q_min: float = 0.6,
    q_max: float = 1.4,
) -> torch.Tensor:
    """Branch guide: raise the anchor where the policy is uncertain (entropy above tau)."""
    _check_bounds(q_min, q_max)
    entropy = entropy.detach().float()
    q = 1.0 + gamma * torch.relu(entropy - tau)
    return _finalise(q, mask, q_min, q_max)


def _normalise_rows(values: torch.Tensor, mask: torch.Tensor, norm: str) -> torch.Tensor:
    """Per-row normalisation of ``values`` over the masked positions into [0, 1] (0 elsewhere)."""
    if norm not in TOKEN_NORMS:
        raise ValueError(f"token norm must be one of {TOKEN_NORMS}, got {norm!r}")
    mask = mask.bool()
    weights = torch.zeros_like(values, dtype=torch.float32)
    for row in range(values.shape[0]):
        valid = mask[row]
        n = int(valid.sum())
        if n == 0:
            continue
        vals = values[row, valid].float()
        if norm == "minmax":
            # Clip to the 5th-95th percentiles first so one outlier token cannot squash the rest.
            lo, hi = torch.quantile(vals, 0.05), torch.quantile(vals, 0.95)
            vals = vals.clamp(lo, hi)
            w = (vals - lo) / (hi - lo).clamp_min(1e-6)
        elif norm == "rank":
            w = torch.argsort(torch.argsort(vals)).float() / max(1, n - 1)
        else:  # zscore, squashed into (0, 1) by a sigmoid
            w = torch.sigmoid((vals - vals.mean()) / vals.std(unbiased=False).clamp_min(1e-6))
        weights[row, valid] = w
    return weights.clamp(0.0, 1.0)


@torch.no_grad()
def token_guide(
    logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    alpha: float,
    sigma: float,
    norm: str = "minmax",
    q_min: float = 0.6,
    q_max: float = 1.4,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Token guide: q rises with the token's normalised surprisal -log p, plus surprisal-scaled noise."""
    _check_bounds(q_min, q_max)
    logps = torch.nan_to_num(logps.detach().float(), nan=0.0, neginf=-1e4, posinf=0.0)
    w = _normalise_rows(-logps, mask, norm)
    noise = torch.randn(w.shape, generator=generator, dtype=w.dtype, device="cpu").to(w.device)
    q = 1.0 + alpha * w + sigma * w * noise
    return _finalise(q, mask, q_min, q_max)


@torch.no_grad()
def random_guide(
    mask: torch.Tensor,
    *,
    eps: float,
    sigma: float,
    q_min: float = 0.6,
    q_max: float = 1.4,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Random guide: a fraction eps of tokens get q = 1 + sigma * N(0, 1); the rest keep q = 1."""
    _check_bounds(q_min, q_max)
    shape = mask.shape
    chosen = torch.rand(shape, generator=generator, device="cpu") < eps
    noise = torch.randn(shape, generator=generator, device="cpu")
    q = torch.where(chosen, 1.0 + sigma * noise, torch.ones(shape)).to(mask.device)
    return _finalise(q, mask, q_min, q_max)


@dataclass(frozen=True)
class CosineSchedule:
    """Cosine annealing with warm restarts for the token and random guides.

    ``max_steps`` is split into ``cycles`` equal cycles of ``max_steps // cycles`` steps. Within cycle c
    the value anneals from ``upper * decay**c`` down to ``lower`` (and sigma from
    ``sigma_upper * decay**c`` to ``sigma_lower``) along half a cosine. Steps past the last full cycle
    restart the cosine without further decay, as the official code does. The schedule is a pure
    function of the step, so a resumed run picks it up exactly.
    """

    max_steps: int
    upper: float
    lower: float
    sigma_upper: float
    sigma_lower: float
    cycles: int = 8
    decay: float = 0.9

    def __post_init__(self):
        if self.max_steps < 1 or self.cycles < 1:
            raise ValueError(
                f"CosineSchedule needs max_steps >= 1 and cycles >= 1, got {self.max_steps}, {self.cycles}"
            )

    @property
    def cycle_length(self) -> int:
        return max(1, self.max_steps // self.cycles)

    def cycle(self, step: int) -> int:
        return min(step // self.cycle_length, self.cycles - 1)

    def __call__(self, step: int) -> tuple[float, float]:
        """(value, sigma) at ``step`` (0-based)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        shrink = self.decay ** self.cycle(step)
        anneal = 0.5 * (1.0 + math.cos(math.pi * (step % self.cycle_length) / self.cycle_length))
        value = self.lower + (self.upper * shrink - self.lower) * anneal
        sigma = self.sigma_lower + (self.sigma_upper * shrink - self.sigma_lower) * anneal
        return value, sigma


def log_q(q: torch.Tensor) -> torch.Tensor:
    """log q with the official floor at 1e-8, so q = 0 stays finite."""
    return torch.log(q.clamp_min(1e-8))


def shaped_kl(
    logp: torch.Tensor, ref_logp: torch.Tensor, log_q: torch.Tensor | float = 0.0, *, estimator: str = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || q * pi_ref) at sampled tokens (gradient flows through logp)."""
    delta = ref_logp + log_q - logp  # m_t - log pi_theta
    if estimator == "k3":
        return torch.exp(delta) - delta - 1.0
    if estimator == "k2":
        return 0.5 * delta.pow(2)
    if estimator == "k1":
        return -delta
    raise ValueError(f"estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def forward_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(pi_ref || pi_theta) from samples of pi_theta: u log u - u + 1, u = pi_ref/pi."""
    log_u = ref_logp - logp
    return torch.exp(log_u) * log_u - torch.exp(log_u) + 1.0


def kl_loss_term(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    log_q: torch.Tensor | float = 0.0,
    *,
    estimator: str,
    old_logp: torch.Tensor | None = None,
    ratio: bool = False,
) -> torch.Tensor:
    """The kit's per-token KL loss term (loss placement) for ``estimator``, weighted so that its expected
    gradient is a KL's gradient (module docstring):

    - ``k3``: k3 against the shaped reference, times rho = pi / pi_old (with gradient) if ``ratio``
      (TRL's use_bias_correction_kl): forward-KL gradient without, reverse-KL gradient with;
    - ``k2``: k2 times sg(pi / pi_old): the reverse-KL gradient on- and off-policy (``ratio`` does not apply);
    - ``forward``: (u log u - u + 1) times rho, always: the gradient of KL(pi_ref || pi) (``log_q`` must be 0).

    ``old_logp`` is the sampling policy's log-prob (None: on-policy, sg(logp)).
    """
    old = logp.detach() if old_logp is None else old_logp
    rho = torch.exp(logp - old)
    if estimator == "k3":
        value = shaped_kl(logp, ref_logp, log_q, estimator="k3")
        return value * rho if ratio else value
    if estimator == "k2":
        return shaped_kl(logp, ref_logp, log_q, estimator="k2") * rho.detach()
    if estimator == "forward":
        if not (isinstance(log_q, float) and log_q == 0.0):
            raise ValueError("the forward-KL term has no guide: pass log_q=0.0")
        return forward_kl(logp, ref_logp) * rho
    raise ValueError(f"estimator must be one of {LOSS_TERM_ESTIMATORS}, got {estimator!r}")


def sequence_pseudo_kl(
    logp: torch.Tensor, ref_logp: torch.Tensor, log_q: torch.Tensor | float, mask: torch.Tensor
) -> torch.Tensor:
    """sum_t [log pi(y_t) - log pi_ref(y_t) - log q_t] over the masked tokens of each row (B,), no gradient.

    Its expectation under pi is KL(pi || q * pi_ref) over whole completions; the reward placement uses
    r~ = r - beta * this, before the group advantage.
    """
    per_token = (logp.detach() - ref_logp.detach() - log_q) * mask
    return per_token.sum(-1)


def guide_effect(
    guide: str, estimator: str, *, ratio: bool, placement: str, q_min: float, q_max: float
) -> str | None:
    """None if ``guide`` changes the expected gradient under this estimator / placement, else why it does not.

    ``ratio``: the k3 term is weighted by pi / pi_old (use_bias_correction_kl). Reward placement sums log q_t
    into the sequence's reward, so every guide acts there (the random guide as E[log q] < 0 per token).
    """
    if guide in ("none", "token") or placement == "reward":
        return None
    reverse = estimator == "k2" or (estimator == "k3" and ratio)
    if reverse:
        return (
            f"its q is the same for every candidate token at a position, and kl_term={estimator}"
            f"{' with use_bias_correction_kl' if estimator == 'k3' else ''} has the reverse-KL gradient, "
            "which a position-constant q does not change"
        )
    if guide == "random" and math.isclose(q_min + q_max, 2.0):
        return (
            "its q is independent of the token with E[q] = 1 (bounds symmetric about 1), so under k3 the "
            "expected KL pull E[q] * grad KL(pi_ref || pi) is unchanged"
        )
    return None
