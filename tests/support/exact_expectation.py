"""Helpers for exact-expectation tests: tabular policies whose expected on-policy update is computed by
enumeration, and a stationary-point solver for that update (gradient steps, then Newton on G(theta) = 0).

Nothing here imports the code under test; the tests pass the kit's estimators in as functions.
"""

from __future__ import annotations

import torch


def total_variation(p: torch.Tensor, r: torch.Tensor) -> float:
    return 0.5 * (p - r).abs().sum().item()


def finite_difference_jacobian(update, theta: torch.Tensor, h: float = 1e-6) -> torch.Tensor:
    """d update / d theta by central differences (float64), all 2P perturbations in one batched call:
    ``update`` maps (B, P) parameter vectors to (B, P) updates."""
    n = theta.numel()
    steps = h * torch.eye(n, dtype=theta.dtype)
    values = update(torch.cat([theta + steps, theta - steps]))
    return ((values[:n] - values[n:]) / (2 * h)).T


def stationary_point(
    update,
    theta0: torch.Tensor,
    *,
    precondition=None,
    lr: float = 0.3,
    descent_steps: int = 3000,
    newton_steps: int = 30,
    tol: float = 1e-12,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A zero of ``update`` (the expected gradient of the surrogate loss, batched (B, P) -> (B, P)) reached from
    ``theta0``: preconditioned gradient descent (``precondition(theta)`` -> per-parameter step scale, e.g. the
    inverse probability of reaching a logit's token, so that rare branches move as fast as common ones), then
    minimum-norm Newton steps to polish (softmax logits have a null direction per node, hence the
    pseudo-inverse). Returns (theta, J), J the Jacobian at the solution, so that a test can also check that
    the point attracts plain gradient descent."""

    def g_at(t):
        return update(t[None])[0]

    theta = theta0.clone()
    for _ in range(descent_steps):
        g = g_at(theta)
        if g.abs().max().item() < 1e-7:
            break
        theta = theta - lr * g * (1.0 if precondition is None else precondition(theta))
    for _ in range(newton_steps):
        g = g_at(theta)
        if g.abs().max().item() < tol:
            break
        candidate = theta - torch.linalg.pinv(finite_difference_jacobian(update, theta), rtol=1e-10) @ g
        if g_at(candidate).norm() >= g.norm():
            break  # at the rounding floor of G
        theta = candidate
    g = g_at(theta)
    assert g.abs().max().item() < 1e-9, f"no stationary point found: |G| = {g.abs().max().item():.3g}"
    return theta, finite_difference_jacobian(update, theta)


def attracts_gradient_descent(jac: torch.Tensor, null_dims: int) -> bool:
    """Near a zero of G, theta <- theta - lr G converges for a small lr iff the eigenvalues of J (outside the
    softmax null directions, which have eigenvalue 0) have positive real parts."""
    eig = torch.linalg.eigvals(jac)
    real = eig.real.sort().values
    return bool((real[null_dims:] > 1e-9).all()) and bool((real[:null_dims].abs() < 1e-6).all())


class TwoLevelTree:
    """A tabular policy over completions (y1, y2): softmax logits at the root (V) and at each child (V, V).

    ``theta`` is (..., P) with P = V + V * V: the root logits, then the child logits (row y1 = the node after y1)."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    @property
    def size(self) -> int:
        return self.vocab + self.vocab * self.vocab

    def split(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = self.vocab
        return theta[..., :v], theta[..., v:].reshape(*theta.shape[:-1], v, v)

    def log_policies(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(y1) (..., V) and log pi(y2 | y1) (..., V, V)."""
        root, child = self.split(theta)
        return torch.log_softmax(root, -1), torch.log_softmax(child, -1)

    def sequence_log_probs(self, theta: torch.Tensor) -> torch.Tensor:
        """log pi(y1, y2) as a (..., V, V) table."""
        log_root, log_child = self.log_policies(theta)
        return log_root[..., :, None] + log_child


def entropy(log_probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return -(log_probs.exp() * log_probs).sum(dim)
