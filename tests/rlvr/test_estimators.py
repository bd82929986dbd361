"""Which KL's gradient each estimator gives, by exact expectation (tabular policies, every outcome enumerated).

The kit's estimators (sage_unsloth.plugins.anchor) are used as losses on samples of the policy, exactly as the trainer
uses them; the expected gradients are compared with closed-form divergences differentiated by autograd. Covers
k1, k2, k3, k3 x ratio, k1 x ratio, k2 x ratio, forward, forward x ratio; q constant across the vocabulary at a
position (branch / random guide) and q varying by token (token guide); on- and off-policy; a two-level token tree
whose second-position entropies depend on the first choice; and the fixed points of both placements on a tree.
"""

from __future__ import annotations

import math

import pytest
import torch
from exact_expectation import (
    TwoLevelTree,
    attracts_gradient_descent,
    entropy,
    stationary_point,
    total_variation,
)

from sage_unsloth.plugins.anchor import branch_guide, forward_kl, kl_loss_term, sequence_pseudo_kl, shaped_kl

F64 = torch.float64
V = 7


def _categorical(seed):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(V, generator=g, dtype=F64)
    ref = torch.softmax(torch.randn(V, generator=g, dtype=F64), 0)
    q_token = 0.6 + 0.8 * torch.rand(V, generator=g, dtype=F64)
    old_theta = theta + 0.4 * torch.randn(V, generator=g, dtype=F64)
    return theta, ref, q_token, old_theta


def _expected_gradient(theta, term, old_theta=None):
    """E_{v ~ pi_old}[grad_theta term(log pi_theta(v), log pi_old(v))]; pi_old = sg(pi_theta) on-policy."""
    theta = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, 0)
    old = logp.detach() if old_theta is None else torch.log_softmax(old_theta, 0)
    loss = (old.exp() * term(logp, old)).sum()
    return torch.autograd.grad(loss, theta)[0]


def _gradient_of(theta, divergence):
    """grad_theta divergence(pi_theta), the divergence written in closed form."""
    theta = theta.clone().requires_grad_(True)
    return torch.autograd.grad(divergence(torch.softmax(theta, 0)), theta)[0]


def _reverse(a):  # sum pi log(pi / a): KL(pi || a) for an unnormalised anchor a = q * pi_ref
    return lambda pi: (pi * (pi / a).log()).sum()


def _forward(a):  # sum a log(a / pi): KL(a || pi), same convention
    return lambda pi: (a * (a / pi).log()).sum()


def _mean_half_square(a):  # E_pi[d^2 / 2], d = log(a / pi): what k2 x ratio differentiates
    return lambda pi: (pi * 0.5 * (a / pi).log() ** 2).sum()


def _kit_terms(ref, lq):
    """Per-outcome loss terms, from the kit's estimator functions (old = the sampling policy's log-probs)."""
    log_ref = ref.log()
    return {
        "k1": lambda logp, old: shaped_kl(logp, log_ref, lq, estimator="k1"),
        "k1*ratio": lambda logp, old: shaped_kl(logp, log_ref, lq, estimator="k1") * torch.exp(logp - old),
        "k2": lambda logp, old: shaped_kl(logp, log_ref, lq, estimator="k2"),
        "k2*ratio": lambda logp, old: shaped_kl(logp, log_ref, lq, estimator="k2") * torch.exp(logp - old),
        "k3": lambda logp, old: kl_loss_term(logp, log_ref, lq, estimator="k3", old_logp=old),
        "k3*ratio": lambda logp, old: kl_loss_term(
            logp, log_ref, lq, estimator="k3", old_logp=old, ratio=True
        ),
        "kit k2": lambda logp, old: kl_loss_term(logp, log_ref, lq, estimator="k2", old_logp=old),
        "kit k2 ratio=True": lambda logp, old: kl_loss_term(
            logp, log_ref, lq, estimator="k2", old_logp=old, ratio=True
        ),
    }


GUIDES = {
    "none": lambda q_token: torch.ones(V, dtype=F64),
    "q=1.2 at the position": lambda q_token: torch.full((V,), 1.2, dtype=F64),
    "q=1.4 at the position": lambda q_token: torch.full((V,), 1.4, dtype=F64),
    "q=0.7 at the position": lambda q_token: torch.full((V,), 0.7, dtype=F64),
    "q varies by token": lambda q_token: q_token,
}


@pytest.mark.parametrize("guide", list(GUIDES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimator_gradient_identities_on_policy(seed, guide):
    theta, ref, q_token, _ = _categorical(seed)
    q = GUIDES[guide](q_token)
    a = q * ref
    terms = _kit_terms(ref, q.log())
    grad = {name: _expected_gradient(theta, term) for name, term in terms.items()}
    reverse, forward = _gradient_of(theta, _reverse(a)), _gradient_of(theta, _forward(a))
    close = lambda x, y: torch.testing.assert_close(x, y, atol=1e-12, rtol=1e-10)

    close(grad["k1"], torch.zeros(V, dtype=F64))  # a value estimator only
    close(grad["k1*ratio"], reverse)
    close(grad["k2"], reverse)
    close(grad["k3*ratio"], reverse)
    close(grad["kit k2"], reverse)
    close(grad["kit k2 ratio=True"], reverse)  # the kit's k2 ignores use_bias_correction_kl
    close(grad["k3"], forward)  # -sum a grad log pi: forward KL from the anchor
    close(grad["k2*ratio"], _gradient_of(theta, _mean_half_square(a)))
    assert (grad["k2*ratio"] - reverse).abs().max() > 1e-3  # so the kit's k2 must not take the ratio

    if guide != "q varies by token":  # q is the same for every candidate token at this position
        c = q[0].item()
        plain_reverse = _gradient_of(theta, _reverse(ref))
        close(grad["k2"], plain_reverse)  # the guide does nothing in expectation ...
        close(grad["k3*ratio"], plain_reverse)
        close(grad["k3"], c * _gradient_of(theta, _forward(ref)))  # ... or scales the forward-KL pull by q
    else:  # a token-varying q moves the target: the gradient differs from the unguided one
        assert (grad["k2"] - _gradient_of(theta, _reverse(ref))).abs().max() > 1e-3
        assert (grad["k3"] - _gradient_of(theta, _forward(ref))).abs().max() > 1e-3


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_forward_estimator_needs_the_ratio(seed):
    """u log u - u + 1 as a loss has the expected gradient sum pi_ref log(pi / pi_ref) grad log pi, no KL's;
    times the ratio pi / sg(pi) it is grad KL(pi_ref || pi) (what the kit's forward term is)."""
    theta, ref, _, _ = _categorical(seed)
    target = _gradient_of(theta, lambda pi: (ref * (ref / pi).log()).sum())
    plain = _expected_gradient(theta, lambda logp, old: forward_kl(logp, ref.log()))
    kit = _expected_gradient(
        theta, lambda logp, old: kl_loss_term(logp, ref.log(), estimator="forward", old_logp=old)
    )
    torch.testing.assert_close(kit, target, atol=1e-12, rtol=1e-10)
    # The plain estimator's gradient, written from its formula: sum_v pi_ref(v) log(pi(v)/pi_ref(v)) grad log pi(v).
    theta_ = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(theta_, 0)
    weight = (ref * (logp.exp() / ref).log()).detach()
    formula = torch.autograd.grad((weight * logp).sum(), theta_)[0]
    torch.testing.assert_close(plain, formula, atol=1e-12, rtol=1e-10)
    assert (plain - target).norm() > 0.05 * target.norm()
    # Per sample the fixed term's gradient is that of plain k3 against pi_ref: (1 - pi_ref / pi) grad log pi.
    k3 = _expected_gradient(theta, lambda logp, old: shaped_kl(logp, ref.log(), 0.0, estimator="k3"))
    torch.testing.assert_close(kit, k3, atol=1e-12, rtol=1e-10)
    with pytest.raises(ValueError, match="log_q"):
        kl_loss_term(torch.zeros(2), torch.zeros(2), torch.ones(2), estimator="forward")


@pytest.mark.parametrize("seed", [0, 1])
def test_kit_terms_are_exact_off_policy(seed):
    """Samples from pi_old: the kit's k2 (stop-gradient ratio), k3 x ratio and forward x ratio still give the
    current policy's KL gradient; plain k2 without any weight does not."""
    theta, ref, q_token, old_theta = _categorical(seed)
    a = q_token * ref
    lq = q_token.log()
    reverse = _gradient_of(theta, _reverse(a))

    def off(term):
        return _expected_gradient(theta, term, old_theta)

    torch.testing.assert_close(
        off(lambda lp, old: kl_loss_term(lp, ref.log(), lq, estimator="k2", old_logp=old)),
        reverse,
        atol=1e-12,
        rtol=1e-10,
    )
    torch.testing.assert_close(
        off(lambda lp, old: kl_loss_term(lp, ref.log(), lq, estimator="k3", old_logp=old, ratio=True)),
        reverse,
        atol=1e-12,
        rtol=1e-10,
    )
    torch.testing.assert_close(
        off(lambda lp, old: kl_loss_term(lp, ref.log(), estimator="forward", old_logp=old)),
        _gradient_of(theta, _forward(ref)),
        atol=1e-12,
        rtol=1e-10,
    )
    plain_k2 = off(lambda lp, old: shaped_kl(lp, ref.log(), lq, estimator="k2"))
    assert (plain_k2 - reverse).abs().max() > 1e-3


# ----------------------------------------------------------------------------- two-level token tree

TREE_V = 4


def _tree_problem(seed):
    g = torch.Generator().manual_seed(100 + seed)
    tree = TwoLevelTree(TREE_V)
    theta = torch.randn(tree.size, generator=g, dtype=F64)
    ref_root = torch.softmax(torch.randn(TREE_V, generator=g, dtype=F64), 0)
    ref_child = torch.softmax(torch.randn(TREE_V, TREE_V, generator=g, dtype=F64), 1)
    return tree, theta, ref_root, ref_child


def _branch_q(log_root, log_child):
    """The branch guide at each position from the current policy's entropies: one q at the root, one per
    first choice at the second position (its entropy depends on y1)."""
    entropies = torch.cat([entropy(log_root).reshape(1), entropy(log_child, 1)]).detach()[None]
    q = branch_guide(entropies, torch.ones_like(entropies), gamma=0.8, tau=0.7, q_min=0.6, q_max=1.4)[
        0
    ].double()
    return q[0], q[1:]


def _tree_kit_gradient(tree, theta, ref_root, ref_child, estimator, ratio=False):
    """E over (y1, y2) of grad [term at position 1 + term at position 2], the kit's per-token loss."""
    theta = theta.clone().requires_grad_(True)
    log_root, log_child = tree.log_policies(theta)
    q_root, q_child = _branch_q(log_root, log_child)
    weight = tree.sequence_log_probs(theta).exp().detach()  # P(y1, y2), the sampling distribution
    term_root = kl_loss_term(log_root, ref_root.log(), q_root.log(), estimator=estimator, ratio=ratio)
    term_child = kl_loss_term(
        log_child, ref_child.log(), q_child.log()[:, None], estimator=estimator, ratio=ratio
    )
    loss = (weight * (term_root[:, None] + term_child)).sum()
    return torch.autograd.grad(loss, theta)[0], (q_root.item(), q_child)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_per_token_terms_regularise_each_position_on_its_own(seed):
    tree, theta, ref_root, ref_child = _tree_problem(seed)
    log_root, log_child = tree.log_policies(theta)
    _, q_child = _branch_q(log_root, log_child)
    assert q_child.max() - q_child.min() > 0.05, "the test needs second-position q that depend on y1"
    reach = log_root.exp().detach()

    def local(divergence_root, divergence_child):
        def total(th):
            lr, lc = tree.log_policies(th)
            return divergence_root(lr.exp()) + sum(
                reach[y] * divergence_child(y, lc[y].exp()) for y in range(TREE_V)
            )

        return total

    def grad(fn):
        th = theta.clone().requires_grad_(True)
        return torch.autograd.grad(fn(th), th)[0]

    k3, (q_root, q_child) = _tree_kit_gradient(tree, theta, ref_root, ref_child, "k3")
    fkl = lambda p, pi: (p * (p / pi).log()).sum()
    rkl = lambda pi, p: (pi * (pi / p).log()).sum()
    # k3: q_1 * grad KL(pi_ref || pi) at the root + sum_y1 pi(y1) q_2(y1) grad KL(pi_ref(.|y1) || pi(.|y1)).
    want_k3 = grad(
        local(lambda pi: q_root * fkl(ref_root, pi), lambda y, pi: q_child[y] * fkl(ref_child[y], pi))
    )
    torch.testing.assert_close(k3, want_k3, atol=1e-12, rtol=1e-10)
    # k2 and k3 x ratio: the sum of the positions' own reverse-KL gradients, whatever q is ...
    local_reverse = grad(local(lambda pi: rkl(pi, ref_root), lambda y, pi: rkl(pi, ref_child[y])))
    for estimator, ratio in (("k2", False), ("k3", True)):
        got, _ = _tree_kit_gradient(tree, theta, ref_root, ref_child, estimator, ratio)
        torch.testing.assert_close(got, local_reverse, atol=1e-12, rtol=1e-10)
    # ... which is not the gradient of the sequence-level KL(pi || pi_ref): that one also moves the first choice
    # towards children with a small KL (a score-function term the per-token loss never has).
    sequence_kl = grad(
        lambda th: (
            tree.sequence_log_probs(th).exp()
            * (tree.sequence_log_probs(th) - (ref_root[:, None] * ref_child).log())
        ).sum()
    )
    assert (sequence_kl - local_reverse)[:TREE_V].abs().max() > 1e-3
    torch.testing.assert_close(
        (sequence_kl - local_reverse)[TREE_V:], torch.zeros(TREE_V * TREE_V, dtype=F64), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_reward_placement_is_the_sequence_level_gradient(seed):
    """REINFORCE on r~ = -beta * sequence_pseudo_kl (no task reward) with q_1 * q_2(y1) from the branch guide is
    -beta * grad KL(pi || q(y) pi_ref) over whole completions, q(y) = prod_t q_t held fixed."""
    tree, theta, ref_root, ref_child = _tree_problem(seed)
    beta = 0.3
    th = theta.clone().requires_grad_(True)
    log_root, log_child = tree.log_policies(th)
    q_root, q_child = _branch_q(log_root, log_child)
    token_logp = torch.stack([log_root[:, None].expand(-1, TREE_V), log_child], -1).reshape(-1, 2)
    token_ref = torch.stack([ref_root.log()[:, None].expand(-1, TREE_V), ref_child.log()], -1).reshape(-1, 2)
    token_log_q = torch.stack(
        [q_root.log().expand(TREE_V, TREE_V), q_child.log()[:, None].expand(-1, TREE_V)], -1
    ).reshape(-1, 2)
    shaped_reward = -beta * sequence_pseudo_kl(token_logp, token_ref, token_log_q, torch.ones(TREE_V**2, 2))
    weight = tree.sequence_log_probs(th).exp().detach().reshape(-1)
    advantage = shaped_reward - (weight * shaped_reward).sum()
    surrogate = (weight * advantage * token_logp.sum(-1)).sum()
    got = torch.autograd.grad(surrogate, th)[0]

    anchor_seq = (q_root * q_child[:, None] * ref_root[:, None] * ref_child).detach()

    def objective(t):
        log_seq = tree.sequence_log_probs(t)
        return -beta * (log_seq.exp() * (log_seq - anchor_seq.log())).sum()

    th2 = theta.clone().requires_grad_(True)
    torch.testing.assert_close(got, torch.autograd.grad(objective(th2), th2)[0], atol=1e-12, rtol=1e-10)


# ----------------------------------------------------------------------------- fixed points of both placements


def _tree_rl_problem(seed):
    g = torch.Generator().manual_seed(200 + seed)
    v = 3
    tree = TwoLevelTree(v)
    reward = torch.rand(v, v, generator=g, dtype=F64)
    ref_root = torch.softmax(torch.randn(v, generator=g, dtype=F64), 0)
    ref_child = torch.softmax(torch.randn(v, v, generator=g, dtype=F64), 1)
    q_root = 0.6 + 0.8 * torch.rand(v, generator=g, dtype=F64)  # q per (position, token), held fixed
    q_child = 0.6 + 0.8 * torch.rand(v, v, generator=g, dtype=F64)
    beta = [0.2, 0.5, 1.0, 0.35][seed]
    theta0 = torch.cat([ref_root.log(), ref_child.log().reshape(-1)])  # start at the reference
    return tree, reward, ref_root, ref_child, q_root, q_child, beta, theta0


def _as_tokens(first, second):
    """(..., V) first-position and (..., V, V) second-position values -> (..., V * V leaves, 2 tokens)."""
    v = first.shape[-1]
    return torch.stack([first[..., :, None].expand(*second.shape), second], -1).reshape(
        *first.shape[:-1], v * v, 2
    )


def _tokens(tree, theta, ref_root, ref_child, q_root, q_child):
    log_root, log_child = tree.log_policies(theta)
    return (
        _as_tokens(log_root, log_child),
        _as_tokens(ref_root.log(), ref_child.log()),
        _as_tokens(q_root.log(), q_child.log()),
    )


def _update(problem, placement, estimator="k3", scale_by_std=False):
    """theta (B, P) -> expected gradient of the kit's surrogate loss (on-policy, exact expectation over the 9
    leaves), one problem per row of theta."""
    tree, reward, ref_root, ref_child, q_root, q_child, beta, _ = problem
    r = reward.reshape(-1)

    def update(theta):
        theta = theta.clone().requires_grad_(True)
        logp, ref, lq = _tokens(tree, theta, ref_root, ref_child, q_root, q_child)
        weight = logp.sum(-1).exp().detach()
        if placement == "reward":
            shaped = r - beta * sequence_pseudo_kl(logp, ref, lq, torch.ones_like(logp))
            advantage = shaped - (weight * shaped).sum(-1, keepdim=True)
            if scale_by_std:  # GRPO's group std (exact here) with TRL's 1e-4: a positive factor per prompt
                advantage = advantage / ((weight * advantage**2).sum(-1, keepdim=True).sqrt() + 1e-4)
            loss = -(weight * advantage * logp.sum(-1)).sum()
        else:
            advantage = r - (weight * r).sum(-1, keepdim=True)
            kl = kl_loss_term(logp, ref, lq, estimator=estimator)
            loss = (weight * (-advantage * logp.sum(-1) + beta * kl.sum(-1))).sum()
        return torch.autograd.grad(loss, theta)[0].detach()

    return update


def _bisect_k3(r, a, beta):
    """pi = beta * a / (beta + lam - r), sum pi = 1: the stationary point of k3 at one node (reward-to-go r)."""
    lo, hi = (r.max() - beta).item() + 1e-15, (r.max() + beta * a.sum() * 10).item() + 10
    for _ in range(300):
        lam = 0.5 * (lo + hi)
        lo, hi = (lam, hi) if (beta * a / (beta + lam - r)).sum().item() > 1 else (lo, lam)
    return beta * a / (beta + 0.5 * (lo + hi) - r)


def _leaf_distribution(tree, theta):
    return tree.sequence_log_probs(theta).exp().reshape(-1)


def _inverse_reach(tree):
    """Step scale per logit: 1 / P(reaching its token), a natural-gradient-like preconditioner for the solver."""

    def scale(theta):
        log_root, log_child = tree.log_policies(theta)
        return torch.cat([-log_root, -(log_root[:, None] + log_child).reshape(-1)]).exp().clamp(max=1e6)

    return scale


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_tree_fixed_points_of_both_placements(seed):
    problem = _tree_rl_problem(seed)
    tree, reward, ref_root, ref_child, q_root, q_child, beta, theta0 = problem
    null = 1 + tree.vocab  # one softmax null direction per node

    # reward placement: the paper's equation, pi*(y) ∝ prod_t q_t * pi_ref(y) * exp(r(y) / beta) ...
    tilted = q_root[:, None] * q_child * ref_root[:, None] * ref_child * torch.exp(reward / beta)
    tilted = (tilted / tilted.sum()).reshape(-1)
    theta, jac = stationary_point(_update(problem, "reward"), theta0, precondition=_inverse_reach(tree))
    assert total_variation(_leaf_distribution(tree, theta), tilted) <= 1e-3
    assert attracts_gradient_descent(jac, null)
    # ... with or without GRPO's std scaling, which scales r and the pseudo-KL together: its update vanishes
    # there too (r~ is the same for every completion at the target, so the advantages are 0)
    assert _update(problem, "reward", scale_by_std=True)(theta[None]).abs().max().item() < 1e-6

    # loss placement, k3: each node solves its own forward-KL-regularised problem against a = q * pi_ref with
    # the expected *task* reward-to-go (no KL of later positions flows back), from the leaves up.
    child = torch.stack([_bisect_k3(reward[y], q_child[y] * ref_child[y], beta) for y in range(tree.vocab)])
    reward_to_go = (child * reward).sum(1)
    root = _bisect_k3(reward_to_go, q_root * ref_root, beta)
    k3_point = (root[:, None] * child).reshape(-1)
    assert k3_point.sum().item() == pytest.approx(1.0, abs=1e-9)
    theta, jac = stationary_point(_update(problem, "loss", "k3"), theta0, precondition=_inverse_reach(tree))
    assert total_variation(_leaf_distribution(tree, theta), k3_point) <= 1e-3
    assert attracts_gradient_descent(jac, null)
    assert total_variation(k3_point, tilted) > 1e-2

    # loss placement, k2: each node tilts its own anchor by the task reward-to-go, pi(.|s) ∝ a(.|s) exp(R/beta):
    # a local tilt, not the sequence-level one (the root would need the children's soft values).
    child = q_child * ref_child * torch.exp(reward / beta)
    child = child / child.sum(1, keepdim=True)
    root = q_root * ref_root * torch.exp((child * reward).sum(1) / beta)
    k2_point = ((root / root.sum())[:, None] * child).reshape(-1)
    theta, _ = stationary_point(_update(problem, "loss", "k2"), theta0, precondition=_inverse_reach(tree))
    assert total_variation(_leaf_distribution(tree, theta), k2_point) <= 1e-3
    assert total_variation(k2_point, tilted) > 1e-3


@pytest.mark.slow
def test_tree_reward_placement_target_holds_for_every_length_weighting():
    """Completions of different lengths (y1 = 0 ends the completion): the reward placement reaches the tilted
    target with a token-sum loss (dr_grpo / dapo / bnpo in expectation) and with GRPO's per-completion mean alike.
    At the target r~ = beta * log Z for every completion, so every advantage is 0 whatever the weighting."""
    problem = _tree_rl_problem(1)
    tree, reward, ref_root, ref_child, q_root, q_child, beta, theta0 = problem
    v = tree.vocab
    mask = torch.ones(v * v, 2, dtype=F64)
    mask[:v, 1] = 0  # after y1 = 0 the completion has ended: leaves (0, .) are one completion, (0, -)
    keep = torch.ones(v * v, dtype=torch.bool)
    keep[1:v] = False  # enumerate (0, -) once
    r = reward.reshape(-1)

    def update_for(per_completion_mean):
        def update(theta):
            theta = theta.clone().requires_grad_(True)
            logp, ref, lq = _tokens(tree, theta, ref_root, ref_child, q_root, q_child)
            weight = ((logp * mask).sum(-1).exp() * keep).detach()
            shaped = r - beta * sequence_pseudo_kl(logp, ref, lq, mask)
            advantage = shaped - (weight * shaped).sum(-1, keepdim=True)
            tokens = (logp * mask).sum(-1)
            if per_completion_mean:
                tokens = tokens / mask.sum(-1)
            return torch.autograd.grad(-(weight * advantage * tokens).sum(), theta)[0].detach()

        return update

    log_anchor = _as_tokens(q_root.log(), q_child.log()) + _as_tokens(ref_root.log(), ref_child.log())
    tilted = torch.exp((log_anchor * mask).sum(-1) + r / beta) * keep
    tilted = tilted / tilted.sum()

    def leaves(theta):
        logp, _, _ = _tokens(tree, theta, ref_root, ref_child, q_root, q_child)
        return (logp * mask).sum(-1).exp() * keep

    theta, _ = stationary_point(update_for(False), theta0, precondition=_inverse_reach(tree))
    assert total_variation(leaves(theta), tilted) <= 1e-3
    theta, _ = stationary_point(update_for(True), theta0, precondition=_inverse_reach(tree))
    assert total_variation(leaves(theta), tilted) <= 1e-3


def test_random_guide_has_unit_mean_with_symmetric_bounds():
    """The premise of guide_effect's random-guide rule: E[q] = 1 when [q_min, q_max] is symmetric about 1."""
    from sage_unsloth.plugins.anchor import random_guide

    mask = torch.ones(400, 500)
    q = random_guide(
        mask, eps=0.5, sigma=0.6, q_min=0.6, q_max=1.4, generator=torch.Generator().manual_seed(0)
    )
    assert q.mean().item() == pytest.approx(1.0, abs=2e-3)
    assert (q != 1).float().mean().item() == pytest.approx(0.5, abs=0.01)
    skewed = random_guide(
        mask, eps=0.5, sigma=0.6, q_min=0.6, q_max=2.0, generator=torch.Generator().manual_seed(0)
    )
    assert skewed.mean().item() > 1.02
    assert math.isfinite(q.sum().item())
