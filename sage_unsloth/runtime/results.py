"""The results contract between the eval stage (writes) and the report (reads): files, columns, pooled sets,
and the one unbiased pass@k both compute with.

``results/<model>/<run>/``:
  per_problem.csv: dataset, problem_id, n, c, mean_completion_tokens   (n samples, c of them correct)
  passk.csv:       dataset, k, pass_at_k, n_problems, n_samples        (pooled sets included)
  manifest.json:   stage "eval", ``checkpoint`` = the evaluated stage folder
  training_run/:   only in a folder the report's W&B reader wrote (sage_unsloth/report/wandb_read.py): the
                   stage manifest and log_history.jsonl of the checkpoint's training run, rebuilt from W&B

Pooled sets: the paper scores AIME as one 60-problem set, aime24 + aime25 pooled ("aime"), and averages
pooled AIME, AMC23 and MATH-500 ("avg_paper", the mean of the three set means).

pass@k for one problem (Chen et al. 2021) = 1 - C(n-c, k) / C(n, k). The ratio is evaluated as the product
prod_{j=n-c+1}^{n} (1 - k/j), which never forms a huge binomial (C(256, 128) ~ 1e75) and is exact enough in
float64 for any n we sample. Undefined (NaN) where k > n, so a k the evaluation did not sample stays
"missing", never 0.
"""

from __future__ import annotations

import numpy as np

PER_PROBLEM_FILE = "per_problem.csv"
PASSK_FILE = "passk.csv"
TRAINING_RUN_DIR = "training_run"
PER_PROBLEM_COLUMNS = ("dataset", "problem_id", "n", "c", "mean_completion_tokens")  # as written
PASSK_COLUMNS = ("dataset", "k", "pass_at_k", "n_problems", "n_samples")  # as written
# What a reader needs (older or hand-made files may lack the rest).
PER_PROBLEM_REQUIRED = ("dataset", "problem_id", "n", "c")
PASSK_REQUIRED = ("dataset", "k", "pass_at_k")

AIME_PARTS = ("aime24", "aime25")
POOLED_AIME = "aime"
PAPER_AVERAGE_SETS = (POOLED_AIME, "amc23", "math500")
PAPER_AVERAGE = "avg_paper"


def stored_parts(dataset: str) -> tuple[str, ...]:
    """The datasets of per_problem.csv that make up ``dataset`` (a pooled set, or itself)."""
    return AIME_PARTS if dataset == POOLED_AIME else (dataset,)


def pass_at_k_matrix(n, c, ks) -> np.ndarray:
    """(problems, len(ks)) array of unbiased pass@k; NaN where k > n."""
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    c = np.asarray(c, dtype=np.int64).reshape(-1)
    ks = np.asarray(ks, dtype=np.int64).reshape(-1)
    if n.shape != c.shape:
        raise ValueError(f"n and c must have the same length, got {n.shape} and {c.shape}")
    if np.any(c < 0) or np.any(c > n):
        raise ValueError(f"{PER_PROBLEM_FILE}: every row needs 0 <= c <= n")
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


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct."""
    if not (0 <= c <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"pass@{k} needs 1 <= k <= n = {n} samples per problem: lower k or raise n")
    return float(pass_at_k_matrix([n], [c], [k])[0, 0])
