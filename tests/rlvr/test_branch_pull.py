"""What the branch guide does to the pull toward pi_ref, per KL estimator and placement (docs/theory.md,
"What the guide does to the gradient"), checked by exact expectation on small categorical policies.

The derivation. At one position, with q the same for every candidate token (the branch guide's q_t depends on
the position's entropy only), the per-token terms used as losses on samples of pi have the expected gradients

    k1                          0                                   (no pull, whatever q is)
    k2, k3 * rho                grad KL(pi || q pi_ref) = grad KL(pi || pi_ref)    (q only adds -log q * sum pi)
    k3 (the paper's)            -sum_v q pi_ref(v) grad log pi(v) = q * grad KL(pi_ref || pi)

so under k3 the branch guide multiplies the pull toward pi_ref by q_t >= 1 (up to q_max where the entropy
exceeds tau), and under k2 or k3 * rho it changes nothing in expectation. In the reward placement the sequence
reward gains beta * sum_t log q_t: the pull toward pi_ref at a position keeps its strength, and earlier choices
are tilted towards positions of high entropy.

"Pull" here is measured as the rate at which one small step along the expected gradient of the KL term alone
lowers a divergence to pi_ref (forward or reverse): <grad D, g>. The tests compute it from the kit's own terms
(sage_unsloth.plugins.anchor) and compare it with the derivation above; nothing here reimplements the kit's terms.
"""

from __future__ import annotations

import math

import pytest
import torch

from sage_unsloth.plugins.anchor import branch_guide, kl_loss_term, sequence_pseudo_kl, shaped_kl

F64 = torch.float64
V = 6
TAU, GAMMA, Q_MIN, Q_MAX = 1.2, 0.3, 0.6, 1.4  # the paper's branch guide


def _position(seed: int, temperature: float):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(V, generator=g, dtype=F64) / temperature
    ref = torch.softmax(torch.randn(V, generator=g, dtype=F64), 0)
    return theta, ref


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(logits, -1)
    return -(p * p.log()).sum(-1)


def _branch_q(theta: torch.Tensor) -> float:
    entropy = _entropy(theta).reshape(1, 1).float()
    q = branch_guide(entropy, torch.ones(1, 1), gamma=GAMMA, tau=TAU, q_min=Q_MIN, q_max=Q_MAX)
    return float(q)


def _expected_gradient(theta, ref, log_q: float, estimator: str, ratio: bool = False):
    """E_{v ~ sg(pi)}[grad term(v)] of the kit's per-token KL term, by enumeration of v."""
    th = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(th, 0)
    if estimator == "k1":
        term = shaped_kl(logp, ref.log(), log_q, estimator="k1")
    else:
        term = kl_loss_term(logp, ref.log(), log_q, estimator=estimator, ratio=ratio)
    return torch.autograd.grad((logp.detach().exp() * term).sum(), th)[0]


def _pull(theta, ref, g):
    """How fast a small step -g lowers KL(pi_ref || pi) and KL(pi || pi_ref): (forward, reverse) rates."""
    th = theta.clone().requires_grad_(True)
    pi = torch.softmax(th, 0)
    forward = (ref * (ref / pi).log()).sum()
    reverse = (pi * (pi / ref).log()).sum()
    rates = []
    for divergence in (forward, reverse):
        grad = torch.autograd.grad(divergence, th, retain_graph=True)[0]
        rates.append(float(grad @ g))
    return rates


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_branch_guide_multiplies_the_k3_pull_by_q_and_leaves_the_reverse_kl_pull(seed):
    theta, ref = _position(seed, temperature=2.5)  # a flat policy: entropy above tau
    q = _branch_q(theta)
    assert 1.0 < q <= Q_MAX and _entropy(theta) > TAU
    log_q = math.log(q)
    for estimator, ratio, factor in (("k3", False, q), ("k3", True, 1.0), ("k2", False, 1.0)):
        plain = _pull(theta, ref, _expected_gradient(theta, ref, 0.0, estimator, ratio))
        guided = _pull(theta, ref, _expected_gradient(theta, ref, log_q, estimator, ratio))
        assert min(plain) > 0, "the KL term alone must pull toward pi_ref"
        for p, g in zip(plain, guided):
            assert g == pytest.approx(factor * p, rel=1e-9), (estimator, ratio)
    # k1 as a loss has no pull at all, with or without the guide.
    for log_q_value in (0.0, log_q):
        assert _expected_gradient(theta, ref, log_q_value, "k1").abs().max() < 1e-12


def test_where_the_entropy_is_below_tau_the_guide_does_nothing_and_it_never_weakens_the_pull():
    theta, _ = _position(7, temperature=0.2)  # a sharp policy: entropy below tau
    assert _entropy(theta) < TAU and _branch_q(theta) == 1.0
    entropies = torch.linspace(0.0, 6.0, 301, dtype=torch.float32).reshape(1, -1)
    q = branch_guide(entropies, torch.ones_like(entropies), gamma=GAMMA, tau=TAU, q_min=Q_MIN, q_max=Q_MAX)
    assert q.min() == 1.0 and q.max() == pytest.approx(Q_MAX)  # q in [1, q_max]: the k3 pull only grows


def test_in_the_reward_placement_the_pull_keeps_its_strength_and_high_entropy_prefixes_are_favoured():
    """A two-position tree: the first token y1 picks a child whose policy is flat (entropy above tau, q > 1)
    or sharp (q = 1). REINFORCE on r~ = -beta * sequence_pseudo_kl (the kit's), no task reward."""
    beta = 0.05
    g = torch.Generator().manual_seed(3)
    root = torch.randn(V, generator=g, dtype=F64)
    scale = torch.tensor([3.0 if y % 2 else 0.05 for y in range(V)], dtype=F64)[:, None]
    children = torch.randn(V, V, generator=g, dtype=F64) / scale  # odd y1: flat child, even y1: sharp child
    ref_root = torch.softmax(torch.randn(V, generator=g, dtype=F64), 0)
    ref_child = torch.softmax(torch.randn(V, V, generator=g, dtype=F64), -1)
    q_child = branch_guide(
        _entropy(children).float()[:, None], torch.ones(V, 1), gamma=GAMMA, tau=TAU, q_min=Q_MIN, q_max=Q_MAX
    ).double()[:, 0]
    assert (q_child[1::2] > 1).all() and (q_child[0::2] == 1).all()

    def gradient(guided: bool):
        r, c = root.clone().requires_grad_(True), children.clone().requires_grad_(True)
        log_root, log_child = torch.log_softmax(r, 0), torch.log_softmax(c, -1)
        token_logp = torch.stack([log_root[:, None].expand(V, V), log_child], -1).reshape(-1, 2)
        token_ref = torch.stack([ref_root.log()[:, None].expand(V, V), ref_child.log()], -1).reshape(-1, 2)
        log_q = torch.zeros(V, V, 2, dtype=F64)
        if guided:
            log_q[:, :, 1] = q_child.log()[:, None]
        reward = -beta * sequence_pseudo_kl(token_logp, token_ref, log_q.reshape(-1, 2), torch.ones(V * V, 2))
        weight = token_logp.sum(-1).exp().detach()
        advantage = reward - (weight * reward).sum()
        return torch.autograd.grad((weight * advantage * token_logp.sum(-1)).sum(), (r, c))

    (root_plain, child_plain), (root_guided, child_guided) = gradient(False), gradient(True)
    # The choice at the boosted position itself: the same expected gradient, the pull keeps its strength.
    torch.testing.assert_close(child_guided, child_plain, atol=1e-13, rtol=1e-10)
    # The choice before it: tilted by beta * grad E[log q_2(y1)] towards the prefixes that lead to high entropy.
    p_root = torch.softmax(root, 0)
    bonus = beta * p_root * (q_child.log() - (p_root * q_child.log()).sum())
    torch.testing.assert_close(root_guided - root_plain, bonus, atol=1e-13, rtol=1e-10)
    assert (bonus[1::2] > 0).all() and (bonus[0::2] < 0).all()
