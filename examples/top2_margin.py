r"""Top-2 margin guide: raise the anchor where the policy is torn between its two favourite tokens.

A guide that lives outside the kit (no kit file edited, no kit import): name it in a config as

    guide: {name: examples/top2_margin.py:top2_margin_guide, gamma: 0.3, threshold: 0.2}  # a path, relative to the
                                                                                          # working directory

With m_t = p_t(1st) - p_t(2nd), the gap between the two most likely next tokens at position t (at the sampling
temperature, over the full vocabulary),

    q_t = clip( 1 + gamma * relu(threshold - m_t) / threshold, q_min, q_max )

so q_t = 1 where the policy has a clear favourite (m_t >= threshold) and rises to 1 + gamma at an exact tie.
Like the branch guide it marks forks, but it reads how close the top two candidates are rather than how spread
out the whole distribution is (a flat tail raises the entropy without creating a fork).

Signals: ``top2_margin`` is a logit signal (sage_unsloth/plugins/guides.py, LOGIT_SIGNALS): the kit computes it from the
next-token distribution in the same chunked pass that produces the entropies. On TRL's trainer that is the
loss's own forward, so q comes from the current policy with no extra pass; inside Unsloth's compiled loss only
the entropies are available, so there q is computed at rollout from one extra no-grad pass (the kit says so at
config time: expected_q_source, and the off-policy warning when steps_per_generation > accumulation).

What it does to the gradient (as anchor.guide_effect states the paper's guides): q_t depends on the position's
distribution, not on the sampled token, so it is the same for every candidate token at a position. Then

- k3 (the paper's estimator, no use_bias_correction_kl): the expected gradient at position t is
  q_t * grad KL(pi_ref || pi): near-ties get a stronger pull toward the reference (q_t > 1), clear choices the
  plain one;
- k2, or k3 with use_bias_correction_kl (reverse-KL gradients): no effect in expectation (a position-constant q
  shifts log q_t * pi_ref by a constant, which the reverse KL's gradient does not see);
- sage_kl_placement=reward: sum_t log q_t enters the sequence's reward, so completions that pass through
  near-ties are rewarded by beta * sum_t log q_t (the tilted anchor prod_t q_t * pi_ref of the paper's eq. 2).
"""

import torch


def top2_margin_guide(signals, *, gamma: float = 0.3, threshold: float = 0.2):
    """q per token (B, T) from the top-2 margin; the kit clips it to [q_min, q_max] and sets 1 off the mask."""
    margin = signals.logits["top2_margin"]
    return 1.0 + gamma * torch.relu(threshold - margin) / threshold


top2_margin_guide.needs = ("top2_margin",)
