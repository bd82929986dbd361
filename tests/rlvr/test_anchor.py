"""The SAGE math module against hand-computed values, and the objective's fixed points analytically."""

import math

import pytest
import torch

from sage_unsloth.plugins.anchor import (
    CosineSchedule,
    branch_guide,
    forward_kl,
    log_q,
    random_guide,
    shaped_kl,
    token_guide,
)

MASK = torch.tensor([[1, 1, 1, 1, 0]])


def test_branch_guide_hand_values_mask_and_clamp():
    entropy = torch.tensor([[0.5, 1.2, 2.2, 5.0, 9.0]])
    q = branch_guide(entropy, MASK, gamma=0.3, tau=1.2, q_min=0.6, q_max=1.4)
    # 1 + 0.3 * relu(H - 1.2): 1, 1, 1.3, 2.14 -> clamped to 1.4; masked position is exactly 1.
    torch.testing.assert_close(q, torch.tensor([[1.0, 1.0, 1.3, 1.4, 1.0]]))
    assert q.requires_grad is False


def test_branch_guide_never_below_one_with_paper_values():
    q = branch_guide(torch.rand(4, 50) * 10, torch.ones(4, 50))
    assert (q >= 1.0).all() and (q <= 1.4).all()


@pytest.mark.parametrize(
    "norm, expected_w",
    [
        # surprisal [1, 2, 3]: minmax clips to the 5th/95th percentiles 1.1/2.9 first -> w = 0, 0.5, 1
        ("minmax", [0.0, 0.5, 1.0]),
        ("rank", [0.0, 0.5, 1.0]),
        ("zscore", [1 / (1 + math.exp(math.sqrt(1.5))), 0.5, 1 / (1 + math.exp(-math.sqrt(1.5)))]),
    ],
)
def test_token_guide_normalisations_without_noise(norm, expected_w):
    logps = torch.tensor([[-1.0, -2.0, -3.0, -7.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    q = token_guide(logps, mask, alpha=0.3, sigma=0.0, norm=norm, q_min=0.6, q_max=1.4)
    expected = torch.tensor([[1 + 0.3 * w for w in expected_w] + [1.0]])
    torch.testing.assert_close(q, expected)


def test_token_guide_minmax_outlier_is_clipped():
    # One huge surprisal must not squash the others to 0: percentile clipping keeps their spread.
    surprisal = torch.cat([torch.arange(1.0, 100.0), torch.tensor([1e4])])
    q = token_guide(-surprisal[None], torch.ones(1, 100), alpha=0.4, sigma=0.0, q_min=0.1, q_max=10.0)
    w = (q - 1) / 0.4
    assert w[0, 49] == pytest.approx(0.5, abs=0.02)  # surprisal 50 sits mid-range, not near 0
    assert w[0, -1] == pytest.approx(1.0) and w[0, 0] == pytest.approx(0.0)


def test_token_guide_noise_is_reproducible_and_bounded():
    logps = -torch.rand(3, 40) * 5
    mask = torch.ones(3, 40)
    mask[:, 30:] = 0
    kw = {"alpha": 0.3, "sigma": 5.0, "q_min": 0.6, "q_max": 1.4}
    a = token_guide(logps, mask, generator=torch.Generator().manual_seed(7), **kw)
    b = token_guide(logps, mask, generator=torch.Generator().manual_seed(7), **kw)
    c = token_guide(logps, mask, generator=torch.Generator().manual_seed(8), **kw)
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, c)
    assert (a >= 0.6).all() and (a <= 1.4).all() and (a[:, 30:] == 1).all()


def test_random_guide_fraction_reproducible_and_masked():
    mask = torch.ones(64, 256)
    mask[:, 200:] = 0
    q = random_guide(mask, eps=0.1, sigma=0.15, generator=torch.Generator().manual_seed(0))
    again = random_guide(mask, eps=0.1, sigma=0.15, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(q, again)
    changed = (q[:, :200] != 1).float().mean().item()
    assert 0.08 < changed < 0.12
    assert (q[:, 200:] == 1).all() and (q >= 0.6).all() and (q <= 1.4).all()
    assert (random_guide(mask, eps=0.0, sigma=0.15) == 1).all()


def test_guides_finite_for_extreme_inputs():
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    x = torch.tensor([[0.0, 1e30, -1e30, float("nan"), float("inf")]])
    for q in (
        branch_guide(x, mask),
        token_guide(x, mask, alpha=0.3, sigma=0.25),
        random_guide(mask, eps=1.0, sigma=1e6),
    ):
        assert torch.isfinite(q).all() and (q >= 0.6).all() and (q <= 1.4).all()
        assert q[0, -1] == 1


def test_bad_bounds_raise():
    with pytest.raises(ValueError, match="q_min"):
        branch_guide(torch.zeros(1, 2), torch.ones(1, 2), q_min=1.5, q_max=1.4)


def test_cosine_schedule_values():
    s = CosineSchedule(
        max_steps=80, upper=0.3, lower=0.1, sigma_upper=0.25, sigma_lower=0.1, cycles=8, decay=0.9
    )
    assert s.cycle_length == 10
    assert s(0) == pytest.approx((0.3, 0.25))
    assert s(5) == pytest.approx((0.2, 0.175))  # half-way down the first cosine
    assert s(10) == pytest.approx((0.27, 0.225))  # restart: upper bounds decayed once
    v, sig = s(79)  # last cycle (c = 7), 90% through
    anneal = 0.5 * (1 + math.cos(math.pi * 0.9))
    assert v == pytest.approx(0.1 + (0.3 * 0.9**7 - 0.1) * anneal)
    assert sig == pytest.approx(0.1 + (0.25 * 0.9**7 - 0.1) * anneal)
    assert s(85) == pytest.approx((0.1 + (0.3 * 0.9**7 - 0.1) * 0.5, 0.1 + (0.25 * 0.9**7 - 0.1) * 0.5))
    with pytest.raises(ValueError):
        s(-1)


def test_kl_estimators_hand_values_and_gradients():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0])
    lq = torch.log(torch.tensor([1.2, 0.8]))
    d = ref + lq - logp.detach()
    torch.testing.assert_close(shaped_kl(logp, ref, lq, estimator="k3"), torch.exp(d) - d - 1)
    torch.testing.assert_close(shaped_kl(logp, ref, lq, estimator="k2"), 0.5 * d**2)
    torch.testing.assert_close(shaped_kl(logp, ref, lq, estimator="k1"), -d)
    assert shaped_kl(torch.tensor(-1.0), torch.tensor(-1.0), 0.0).item() == 0.0
    # d/dlogp k2 = logp - m (the reverse-KL score weight); d/dlogp k3 = 1 - exp(m - logp).
    shaped_kl(logp, ref, lq, estimator="k2").sum().backward()
    torch.testing.assert_close(logp.grad, -d)
    logp.grad = None
    shaped_kl(logp, ref, lq, estimator="k3").sum().backward()
    torch.testing.assert_close(logp.grad, 1 - torch.exp(d))
    with pytest.raises(ValueError, match="estimator"):
        shaped_kl(logp, ref, lq, estimator="k4")


def test_forward_kl_value_and_expectation():
    u = torch.tensor([2.0])
    assert forward_kl(
        torch.log(torch.tensor([0.25])), torch.log(torch.tensor([0.5]))
    ).item() == pytest.approx((u * torch.log(u) - u + 1).item())
    # E_{y~pi}[u log u - u + 1] = KL(pi_ref || pi) exactly for categorical distributions.
    pi = torch.tensor([0.5, 0.3, 0.2]).double()
    ref = torch.tensor([0.2, 0.3, 0.5]).double()
    expected = (ref * (ref / pi).log()).sum()
    assert (pi * forward_kl(pi.log(), ref.log())).sum().item() == pytest.approx(expected.item())


def test_log_q_floor():
    assert torch.isfinite(log_q(torch.tensor([0.0, 1.0]))).all()
    assert log_q(torch.tensor([1.0])).item() == 0.0


# ---- Analytic check of the objective on a categorical policy -------------------------------------------


def _categorical_update(r, ref, q, beta, estimator):
    """theta (B, K) -> the expected gradient of the paper's per-token loss on one position (exact expectation)."""

    def update(theta):
        theta = theta.clone().requires_grad_(True)
        logpi = torch.log_softmax(theta, -1)
        pi = logpi.exp().detach()
        baseline = (pi * r).sum(-1, keepdim=True)
        per_y = -(r - baseline) * logpi + beta * shaped_kl(logpi, ref.log(), q.log(), estimator=estimator)
        return torch.autograd.grad((pi * per_y).sum(), theta)[0].detach()

    return update


def _solve(r, ref, q, beta, estimator):
    from exact_expectation import stationary_point

    update = _categorical_update(r, ref, q, beta, estimator)
    theta, _ = stationary_point(update, ref.log(), precondition=lambda t: torch.softmax(t, -1).reciprocal())
    return torch.softmax(theta, 0)


def _k3_fixed_point(r, ref, q, beta):
    """Stationary point of the k3 surrogate: pi(y) = beta * a(y) / (beta + lam - r(y)), a = q * pi_ref.

    Setting the gradient to zero gives -(r - b) + beta * (1 - a / pi) = const, i.e. the solution of
    max E_pi[r] - beta * KL(a || pi) (a *forward* KL to the anchor). lam is found by bisection on
    sum(pi) = 1 over lam > max(r) - beta.
    """
    a = q * ref
    lo, hi = (r.max() - beta).item() + 1e-12, (r.max() + beta * a.sum() * 10).item() + 10
    for _ in range(200):
        lam = 0.5 * (lo + hi)
        total = (beta * a / (beta + lam - r)).sum().item()
        lo, hi = (lam, hi) if total > 1 else (lo, lam)
    return beta * a / (beta + 0.5 * (lo + hi) - r)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_objective_fixed_points(seed):
    """One position, q varying across the outcomes: k2 reaches the tilted anchor q * pi_ref * exp(r / beta);
    k3 reaches the forward-KL solution. (Over whole completions see tests/rlvr/test_estimators.py: there the
    per-token loss regularises each position on its own and only the reward placement reaches (2).)"""
    g = torch.Generator().manual_seed(seed)
    k = 6
    r = torch.rand(k, generator=g, dtype=torch.float64)
    ref = torch.softmax(torch.randn(k, generator=g, dtype=torch.float64), 0)
    q = 0.6 + 0.8 * torch.rand(k, generator=g, dtype=torch.float64)
    beta = [0.3, 0.5, 1.0, 2.0][seed]

    target = q * ref * torch.exp(r / beta)
    target = target / target.sum()
    pi_k2 = _solve(r, ref, q, beta, "k2")
    assert 0.5 * (pi_k2 - target).abs().sum().item() <= 1e-3

    # k3 converges elsewhere: to the forward-KL-regularised solution, not the tilted anchor.
    pi_k3 = _solve(r, ref, q, beta, "k3")
    k3_target = _k3_fixed_point(r, ref, q, beta)
    assert k3_target.sum().item() == pytest.approx(1.0, abs=1e-9)
    assert 0.5 * (pi_k3 - k3_target).abs().sum().item() <= 1e-3
    assert 0.5 * (pi_k3 - target).abs().sum().item() > 1e-3
