"""The exploration baselines against oracles written from their papers' equations (not from the code under test),
and their one-line config errors. No model: the quick tier.

Checked by breaking the code on purpose (each made a test here fail, then restored): Pass@k's C(j-2, k-2)
weight shifted to C(j-1, k-2); the entropy bonus's clip |A|/kappa as |A|*kappa and its .detach() dropped;
Clip-Cov's covariance with a + instead of - in (log pi - mean), its ratio count int(r*N) as int(r*N)+1, its
PPO-clipped exclusion dropped; KL-Cov's topk(largest) as smallest, its ratio, and |d| as d.
"""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

from sage_unsloth.config.args import ConfigError
from sage_unsloth.plugins.advantages import passk_group_advantages
from sage_unsloth.plugins.policy_terms import TokenBatch, clip_cov, entropy_advantage, kl_cov


# ------------------------------------------------------------------------------------------- Pass@k Training
def _passk_by_enumeration(rewards: list[float], k: int) -> list[float]:
    """Chen et al.'s Pass@k Training by brute force: every k-subset's reward is its best member's; subsets are
    normalised by the mean and (population) std over all subsets; a response's advantage is the mean over the
    subsets that contain it."""
    n = len(rewards)
    subsets = list(itertools.combinations(range(n), k))
    values = [max(rewards[i] for i in s) for s in subsets]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    if std < 1e-12:
        return [0.0] * n
    out = []
    for i in range(n):
        mine = [(v - mean) / std for v, s in zip(values, subsets) if i in s]
        out.append(sum(mine) / len(mine))
    return out


def _passk_binary_closed_form(correct: list[int], k: int) -> list[float]:
    """The paper's analytic solution for 0/1 rewards (positive / negative response advantages)."""
    n, n_neg = len(correct), correct.count(0)
    mean = 1 - math.comb(n_neg, k) / math.comb(n, k)
    std = math.sqrt(mean * (1 - mean))
    if std == 0:
        return [0.0] * n
    a_pos = (1 - mean) / std
    a_neg = (1 - mean - math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1)) / std
    return [a_pos if c else a_neg for c in correct]


@pytest.mark.parametrize("n,k", [(4, 2), (6, 3), (5, 1), (8, 4), (8, 7), (3, 3)])
def test_passk_advantage_equals_enumerating_every_k_subset(n, k):
    generator = torch.Generator().manual_seed(n * 10 + k)
    groups = torch.randint(0, 3, (3, n), generator=generator).float() / 2  # graded rewards, with ties
    groups[1] = (groups[1] > 0.4).float()  # one 0/1 group
    got = passk_group_advantages(groups.view(-1), n, k).view(3, n)
    for g in range(3):
        expected = torch.tensor(_passk_by_enumeration(groups[g].tolist(), k), dtype=torch.float32)
        torch.testing.assert_close(got[g], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("correct", [[1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 0, 1, 0, 0, 0, 0], [1] * 8, [0] * 8])
def test_passk_advantage_is_the_papers_closed_form_for_binary_rewards(correct):
    got = passk_group_advantages(torch.tensor(correct, dtype=torch.float32), 8, 4)
    torch.testing.assert_close(got, torch.tensor(_passk_binary_closed_form(correct, 4)), atol=1e-5, rtol=1e-5)


def test_passk_with_k_one_is_grpo_with_the_population_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    expected = (rewards - rewards.mean()) / rewards.std(unbiased=False)
    torch.testing.assert_close(passk_group_advantages(rewards, 6, 1), expected)


# ------------------------------------------------------------------------------------------- token batches
def _batch(seed: int = 0, rows: int = 4, width: int = 12, spread: float = 3.0) -> TokenBatch:
    generator = torch.Generator().manual_seed(seed)
    logps = (-spread * torch.rand(rows, width, generator=generator)).requires_grad_()
    old = logps.detach() + 0.4 * torch.randn(rows, width, generator=generator)  # some ratios outside the clip
    lengths = torch.tensor([width, width - 3, width - 5, 4][:rows])
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    advantages = torch.tensor([2.0, -1.5, 0.7, -0.2][:rows])[:, None].expand(rows, width)
    entropies = 2.5 * torch.rand(rows, width, generator=generator)
    settings = {"epsilon_low": 0.2, "epsilon_high": 0.2, "generator": torch.Generator().manual_seed(7)}
    return TokenBatch(
        logps=logps, old_logps=old, entropies=entropies, advantages=advantages, mask=mask, **settings
    )


# The built-in terms' knobs at their defaults (the node's arguments left out: entropy_adv alpha, ..., kl_cov coef).
ENTROPY_ADV = {"alpha": 0.4, "kappa": 2.0}
CLIP_COV = {"ratio": 2e-4, "lb": 1.0, "ub": 5.0}


def _cov_oracle(batch: TokenBatch) -> dict[tuple[int, int], float]:
    """Cui et al.'s per-token covariance, centred over the valid tokens, as plain Python."""
    valid = [
        (i, t) for i in range(batch.mask.size(0)) for t in range(batch.mask.size(1)) if batch.mask[i, t] > 0
    ]
    a = {p: batch.advantages[p].item() for p in valid}
    lp = {p: batch.logps[p].item() for p in valid}
    mean_a, mean_lp = sum(a.values()) / len(valid), sum(lp.values()) / len(valid)
    return {p: (a[p] - mean_a) * (lp[p] - mean_lp) for p in valid}


# ------------------------------------------------------------------------------------------- entropy advantage
def test_entropy_advantage_is_the_clipped_detached_bonus_of_the_paper():
    batch = _batch()
    entropies = batch.entropies.clone().requires_grad_()  # a term must not carry an entropy gradient
    batch = TokenBatch(**{**batch.__dict__, "entropies": entropies})
    out = entropy_advantage(batch, **ENTROPY_ADV)
    for i in range(4):
        for t in range(12):
            a, h = batch.advantages[i, t].item(), entropies[i, t].item()
            expected = a + min(0.4 * h, abs(a) / 2.0)
            assert out.advantages[i, t].item() == pytest.approx(expected, abs=1e-6)
    assert not out.advantages.requires_grad
    assert out.loss is None
    # the clip binds on some tokens and not on others in this batch (else the test would not see a wrong clip)
    bonus = out.advantages - batch.advantages
    assert (bonus < 0.4 * entropies.detach() - 1e-6).any() and (
        bonus > batch.advantages.abs() / 2 - 1e-6
    ).any()


def test_entropy_advantage_never_flips_the_sign_of_the_advantage():
    out = entropy_advantage(_batch(seed=3), **ENTROPY_ADV)
    base = _batch(seed=3).advantages
    assert (torch.sign(out.advantages) == torch.sign(base)).all()


# ------------------------------------------------------------------------------------------- Clip-Cov
def _clip_cov_window(batch: TokenBatch) -> tuple[set, set]:
    """(tokens with 1 < Cov < 5 that PPO's clip leaves alone, tokens PPO's clip already clips)."""
    cov = _cov_oracle(batch)
    ratio = {p: math.exp(batch.logps[p].item() - batch.old_logps[p].item()) for p in cov}
    ppo_clipped = {
        p
        for p in cov
        if -batch.advantages[p].item() * min(max(ratio[p], 0.8), 1.2) > -batch.advantages[p].item() * ratio[p]
    }
    return {p for p, c in cov.items() if 1.0 < c < 5.0 and p not in ppo_clipped}, ppo_clipped


def test_clip_cov_detaches_exactly_the_covariance_window_outside_ppos_clip():
    batch = _batch(spread=8.0)
    cov = _cov_oracle(batch)
    ratio = {p: math.exp(batch.logps[p].item() - batch.old_logps[p].item()) for p in cov}
    window, ppo_clipped = _clip_cov_window(batch)
    assert window and ppo_clipped & {p for p, c in cov.items() if 1.0 < c < 5.0}  # both cases occur
    out = clip_cov(batch, **{**CLIP_COV, "ratio": 1.0})  # ratio 1: every candidate is detached
    zeroed = {p for p in cov if out.advantages[p].item() == 0.0 and batch.advantages[p].item() != 0.0}
    assert zeroed == window
    # Detached means no gradient through the policy term there, the plain one elsewhere.
    surrogate = -(out.advantages * torch.exp(batch.logps - batch.old_logps) * batch.mask).sum()
    (grad,) = torch.autograd.grad(surrogate, batch.logps)
    for p in cov:
        expected = 0.0 if p in window else -batch.advantages[p].item() * ratio[p]
        assert grad[p].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("ratio,expected_count", [(2e-4, 1), (0.1, 3), (0.2, 6), (0.5, 8)])
def test_clip_cov_detaches_ratio_times_the_valid_tokens(ratio, expected_count):
    batch = _batch(spread=8.0)
    n_valid = int(batch.mask.sum())
    window, _ = _clip_cov_window(batch)
    assert n_valid == 32 and len(window) == 8
    out = clip_cov(batch, **{**CLIP_COV, "ratio": ratio})
    zeroed = {p for p in _cov_oracle(batch) if out.advantages[p].item() == 0.0}
    assert len(zeroed) == min(max(int(ratio * n_valid), 1), len(window)) == expected_count
    assert zeroed <= window


# ------------------------------------------------------------------------------------------- KL-Cov
@pytest.mark.parametrize("ratio,count", [(2e-3, 1), (0.1, 3), (0.3, 9)])
def test_kl_cov_penalises_the_top_covariance_tokens_by_the_absolute_log_ratio(ratio, count):
    batch = _batch()
    cov = _cov_oracle(batch)
    top = set(sorted(cov, key=cov.get, reverse=True)[:count])
    out = kl_cov(batch, ratio=ratio, coef=0.5)
    assert out.advantages is None
    for p in cov:
        d = batch.logps[p].item() - batch.old_logps[p].item()
        assert out.loss[p].item() == pytest.approx(0.5 * abs(d) if p in top else 0.0, abs=1e-6)
    (grad,) = torch.autograd.grad((out.loss * batch.mask).sum(), batch.logps)
    for p in cov:
        d = batch.logps[p].item() - batch.old_logps[p].item()
        assert grad[p].item() == pytest.approx(0.5 * math.copysign(1.0, d) if p in top else 0.0)


# ------------------------------------------------------------------------------------------- config errors
def _config(**overrides):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    values = {
        "output_dir": "/tmp/unused",
        "max_steps": 2,
        "bf16": False,
        "backend": "trl",
        "report_to": "none",
    }
    values.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SageGRPOConfig(**values)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"policy_term": "entropy_adv", "backend": "unsloth"}, "policy_term='entropy_adv' needs TRL's loss"),
        ({"policy_term": "clip_cov", "loss_type": "cispo"}, "policy_term='clip_cov' supports loss_type"),
        ({"policy_term": "kl_cov"}, "policy_term=kl_cov penalises |log pi - log pi_old|"),
        ({"policy_term": "klcov"}, "did you mean 'kl_cov'?"),
        (
            {"policy_term": "nowhere.mod:fn"},
            "policy_term='nowhere.mod:fn': cannot import module 'nowhere.mod'",
        ),
        ({"advantage_estimator": "pask"}, "did you mean 'passk'?"),
        (
            {"advantage_estimator": {"name": "passk", "k": 9}},
            "advantage_estimator.k=9 must be in [1, num_generations=8]",
        ),
        ({"policy_term": {"name": "entropy_adv", "kappa": 1.0}}, "policy_term.kappa=1.0 must be > 1"),
        ({"policy_term": {"name": "clip_cov", "lb": 5.0}}, "policy_term: lb=5.0 must be < ub=5.0"),
        ({"ref_reset_steps": 10, "beta": 0.0}, "ref_reset_steps resets the KL anchor"),
    ],
)
def test_bad_exploration_settings_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError) as error:
        _config(**overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "overrides",
    [
        {"policy_term": "kl_cov", "num_iterations": 2, "guide": "branch"},
        {"policy_term": "entropy_adv", "guide": "token", "kl_term": "k2"},
        {"advantage_estimator": "passk", "guide": "branch", "backend": "unsloth"},
        {"ref_reset_steps": 5, "guide": "branch", "sage_kl_placement": "reward"},
        {"advantage_estimator": "passk", "sage_kl_placement": "reward", "guide": "branch"},
        {"top_entropy_quantile": 0.2, "guide": "branch", "backend": "unsloth"},
        {"policy_term": "sage_unsloth.plugins.policy_terms:clip_cov"},
    ],
)
def test_combinations_that_compose_are_accepted(overrides):
    _config(**overrides)


def test_the_subset_size_and_reuse_checks_read_the_metadata_not_the_names(tmp_path):
    """Pass@k's 1 <= k <= G and KL-Cov's "needs a reused batch" come from what an entry declares
    (``group_subset_arg``, ``needs_reuse``), so a plug-in that declares them is held to them too."""
    plugin = tmp_path / "declared.py"
    plugin.write_text(
        "def best_of(inputs, *, k: int = 2):\n    return inputs.rewards - inputs.rewards.mean()\n"
        "best_of.group_subset_arg = 'k'\n"
        "from sage_unsloth.plugins.policy_terms import TermOutput\n"
        "def stale(batch):\n    return TermOutput()\n"
        "stale.needs_reuse = 'reads log pi_old'\n"
    )
    match = r"advantage_estimator.k=9 must be in \[1, num_generations=8\]"
    with pytest.raises(ConfigError, match=match):
        _config(advantage_estimator={"name": f"{plugin}:best_of", "k": 9})
    _config(advantage_estimator={"name": f"{plugin}:best_of", "k": 8})
    _config(advantage_estimator=f"{plugin}:best_of")  # its default k = 2
    with pytest.raises(
        ConfigError, match="reads log pi_old, 0 with zero gradient when every batch is used once"
    ):
        _config(policy_term=f"{plugin}:stale")
    _config(policy_term=f"{plugin}:stale", num_iterations=2)


def test_plugin_estimators_and_terms_are_registry_entries_with_their_metadata(tmp_path):
    """A file plug-in is resolved like a guide; what it declares (backends, recomputed) drives the checks."""
    plugin = tmp_path / "my_baselines.py"
    plugin.write_text(
        "def mean_adv(inputs):\n    return inputs.rewards - inputs.rewards.mean()\n"
        "mean_adv.backends = ('trl',)\n"
        "def trl_own(inputs):\n    return inputs.rewards\n"
        "trl_own.recomputed = False\n"
        "from sage_unsloth.plugins.policy_terms import TermOutput\n"
        "def no_term(batch):\n    return TermOutput()\n"
    )
    _config(advantage_estimator=f"{plugin}:mean_adv", policy_term=f"{plugin}:no_term")
    with pytest.raises(ConfigError, match=r"supports backend in \('trl',\), got backend='unsloth'"):
        _config(advantage_estimator=f"{plugin}:mean_adv", backend="unsloth")
    # the reward placement feeds its shaped reward to any estimator (tests/rlvr/test_placement_passk.py)
    _config(advantage_estimator=f"{plugin}:mean_adv", sage_kl_placement="reward", guide="branch")
    _config(advantage_estimator=f"{plugin}:trl_own", sage_kl_placement="reward", guide="branch")
    with pytest.raises(ConfigError, match=r"policy_term='.*:no_term' needs TRL's loss"):
        _config(policy_term=f"{plugin}:no_term", backend="unsloth")
    with pytest.raises(
        ConfigError, match=r"module 'sage_unsloth.plugins.policy_terms' has no 'clipcov'.*'clip_cov'"
    ):
        _config(policy_term="sage_unsloth.plugins.policy_terms:clipcov")
