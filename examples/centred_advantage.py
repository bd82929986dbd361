r"""An advantage estimator of your own: the group-centred reward, scaled, without GRPO's division by the std.

Name it in a config (a file path, relative to the working directory; no kit file edited):

    advantage_estimator: {name: examples/centred_advantage.py:centred_advantage, scale: 2.0}

Per sequence: A_i = scale * (r_i - mean_{j in group(i)} r_j), the Dr. GRPO advantage (Liu et al., arXiv
2503.20783) with a free scale. Per token: every completion token of i carries A_i (TRL broadcasts it).

The contract (docs/extending.md): ``fn(inputs, **arguments)`` (the node's other keys), the one call shape of every plug-in
kind. ``inputs`` is a sage_unsloth.plugins.advantages.GroupRewards: ``inputs.rewards`` the summed weighted rewards (N,)
of every process's rollouts, group by group -- under ``sage_kl_placement: reward`` the shaped r~ -- with NaN for a
completion no reward function could score, ``inputs.num_generations`` the group size. Return one advantage per
completion (N,). The kit checks the node's arguments against this signature before any model loads, and
slices this process's rows.
"""

import torch


def centred_advantage(inputs, *, scale: float = 1.0):
    grouped = torch.nan_to_num(inputs.rewards, nan=0.0).view(-1, inputs.num_generations)
    return (scale * (grouped - grouped.mean(1, keepdim=True))).view(-1)
