r"""The SAGE objective in pure torch: guide functions q and the KL estimators against q * pi_ref.

SAGE keeps GRPO's reverse-KL regulariser but moves its anchor from pi_ref to q(x, y) * pi_ref:

    J(theta) = E_{y ~ pi_theta}[ r(x, y) ] - beta * KL( pi_theta || q * pi_ref )                    (1)

whose maximiser over all policies is the tilted reference

    pi*(y | x)  ∝  q(x, y) * pi_ref(y | x) * exp( r(x, y) / beta ).                                (2)

Per token t of a completion, with m_t the *shaped* reference log-probability

    m_t = log pi_ref(y_t | ...) + log q_t,      q_t >= 0, no gradient through q,                   (3)

the kit offers three per-token estimators of the KL term, with d_t = m_t - log pi_theta(y_t | ...):

    k3 = exp(d_t) - d_t - 1        (the paper's and TRL's form; unbiased value, but its on-policy
                                     gradient is the *forward*-KL gradient, see README)
    k2 = 0.5 * d_t ** 2            (its on-policy gradient is exactly the reverse-KL gradient of (1))
    k1 = -d_t                      (unbiased value, high-variance gradient)

and, for the paper's forward-KL baseline, an estimator of KL(pi_ref || pi_theta) from samples of
pi_theta: with u_t = exp(log pi_ref - log pi_theta),  u_t * log(u_t) - u_t + 1.

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
    "log_q",
    "random_guide",
    "shaped_kl",
    "token_guide",
]

KL_ESTIMATORS = ("k1", "k2", "k3")
TOKEN_NORMS = ("minmax", "rank", "zscore")


def _check_bounds(q_min: float, q_max: float) -> None:
    if not (0.0 < q_min <= q_max):
        raise ValueError(f"q bounds must satisfy 0 < q_min <= q_max, got q_min={q_min}, q_max={q_max}")


def _finalise(q: torch.Tensor, mask: torch.Tensor, q_min: float, q_max: float) -> torch.Tensor:
    """Clamp to [q_min, q_max] (NaN -> 1) and set q = 1 exactly where mask is 0."""
    q = torch.nan_to_num(q, nan=1.0).clamp(q_min, q_max)
    return torch.where(mask.bool(), q, torch.ones_like(q))


@torch.no_grad()
def branch_guide(entropy: torch.Tensor, mask: torch.Tensor, *, gamma: float = 0.3, tau: float = 1.2,
                 q_min: float = 0.6, q_max: float = 1.4) -> torch.Tensor:
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
def token_guide(logps: torch.Tensor, mask: torch.Tensor, *, alpha: float, sigma: float, norm: str = "minmax",
                q_min: float = 0.6, q_max: float = 1.4,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Token guide: q rises with the token's normalised surprisal -log p, plus surprisal-scaled noise."""
    _check_bounds(q_min, q_max)
    logps = torch.nan_to_num(logps.detach().float(), nan=0.0, neginf=-1e4, posinf=0.0)
    w = _normalise_rows(-logps, mask, norm)
    noise = torch.randn(w.shape, generator=generator, dtype=w.dtype, device="cpu").to(w.device)
    q = 1.0 + alpha * w + sigma * w * noise
    return _finalise(q, mask, q_min, q_max)


@torch.no_grad()
def random_guide(mask: torch.Tensor, *, eps: float, sigma: float, q_min: float = 0.6, q_max: float = 1.4,
                 generator: torch.Generator | None = None) -> torch.Tensor:
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
            raise ValueError(f"CosineSchedule needs max_steps >= 1 and cycles >= 1, got {self.max_steps}, "
                             f"{self.cycles}")

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


def shaped_kl(logp: torch.Tensor, ref_logp: torch.Tensor, log_q: torch.Tensor | float = 0.0, *,
              estimator: str = "k3") -> torch.Tensor:
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
