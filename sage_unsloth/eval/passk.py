"""The pass@k tables evaluation writes (passk.csv), from per-problem (n, c) counts.

The formula, the pooled sets and the column names are the results contract in sage_unsloth/runtime/results.py,
shared with the report; this module adds the eval stage's choice of k and the per-set aggregation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sage_unsloth.runtime.results import (
    AIME_PARTS,
    PAPER_AVERAGE,
    PAPER_AVERAGE_SETS,
    POOLED_AIME,
    pass_at_k_matrix,
)


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, plus n itself when it is not a power of two."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def check_ks(ks: Iterable[int], n: int) -> list[int]:
    ks = sorted({int(k) for k in ks})
    bad = [k for k in ks if k < 1 or k > n]
    if bad:
        raise ValueError(
            f"k={bad} out of range: every k must satisfy 1 <= k <= n (n={n} samples per problem)"
        )
    return ks


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean over problems of pass@k; every problem needs k <= n."""
    n, c = zip(*counts)
    if k > min(n):
        raise ValueError(f"pass@{k} needs 1 <= k <= n = {min(n)} samples per problem: lower k or raise n")
    return sum(float(v) for v in pass_at_k_matrix(n, c, [k])[:, 0]) / len(counts)


def passk_rows(per_problem: Sequence[dict], ks: Sequence[int]) -> list[dict]:
    """Rows (dataset, k, pass_at_k, n_problems, n_samples) per dataset, for pooled AIME and the paper average.

    ``per_problem`` rows carry ``dataset, n, c``. A k larger than some problem's n is skipped for that set.
    """
    by_set: dict[str, list[tuple[int, int]]] = {}
    for row in per_problem:
        by_set.setdefault(row["dataset"], []).append((int(row["n"]), int(row["c"])))
    if all(part in by_set for part in AIME_PARTS):
        by_set[POOLED_AIME] = by_set[AIME_PARTS[0]] + by_set[AIME_PARTS[1]]
    rows, table = [], {}
    for name in sorted(by_set):
        counts = by_set[name]
        for k in ks:
            if k > min(n for n, _ in counts):
                continue
            value = mean_pass_at_k(counts, k)
            table[(name, k)] = value
            rows.append(
                {
                    "dataset": name,
                    "k": k,
                    "pass_at_k": value,
                    "n_problems": len(counts),
                    "n_samples": sum(n for n, _ in counts),
                }
            )
    if all(name in by_set for name in PAPER_AVERAGE_SETS):
        for k in ks:
            if all((name, k) in table for name in PAPER_AVERAGE_SETS):
                rows.append(
                    {
                        "dataset": PAPER_AVERAGE,
                        "k": k,
                        "pass_at_k": sum(table[(name, k)] for name in PAPER_AVERAGE_SETS) / 3,
                        "n_problems": sum(len(by_set[name]) for name in PAPER_AVERAGE_SETS),
                        "n_samples": sum(sum(n for n, _ in by_set[name]) for name in PAPER_AVERAGE_SETS),
                    }
                )
    return rows
