"""Unbiased pass@k per problem, vectorised over problems and k.

pass@k for one problem with n samples of which c are correct is 1 - C(n-c, k) / C(n, k) (Chen et al. 2021).
The ratio is evaluated as the product prod_{j=n-c+1}^{n} (1 - k/j), which never forms a large binomial.
Undefined (NaN) where k > n, so that a k the evaluation did not sample stays "missing", never 0.

The eval stage's ``sage_unsloth.eval.passk.pass_at_k`` is the scalar form; this module adds the
(problems x k) matrix form that the bootstrap needs.
"""

from __future__ import annotations

import numpy as np


def pass_at_k_matrix(n, c, ks) -> np.ndarray:
    """(problems, len(ks)) array of unbiased pass@k; NaN where k > n."""
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    c = np.asarray(c, dtype=np.int64).reshape(-1)
    ks = np.asarray(ks, dtype=np.int64).reshape(-1)
    if n.shape != c.shape:
        raise ValueError(f"n and c must have the same length, got {n.shape} and {c.shape}")
    if np.any(c < 0) or np.any(c > n):
        raise ValueError("per_problem.csv: every row needs 0 <= c <= n")
    if np.any(ks < 1):
        raise ValueError("k must be >= 1")
    out = np.full((n.size, ks.size), np.nan)
    if n.size == 0:
        return out
    # j runs over n-c+1 .. n for each problem; pad to the longest run of terms with factor 1.
    max_c = int(c.max())
    offsets = np.arange(max_c)  # 0..max_c-1
    j = (n - c)[:, None] + 1 + offsets[None, :]  # (P, max_c)
    active = offsets[None, :] < c[:, None]  # only c terms per problem
    for col, k in enumerate(ks):
        with np.errstate(divide="ignore", invalid="ignore"):
            factors = np.where(active, 1.0 - k / np.maximum(j, 1), 1.0)
        # a factor <= 0 means n - c < k: some correct sample is always drawn
        fail_prob = np.where(
            np.any(active & (j <= k), axis=1), 0.0, np.prod(np.clip(factors, 0.0, 1.0), axis=1)
        )
        out[:, col] = np.where(k <= n, 1.0 - fail_prob, np.nan)
    return out

