"""Bootstrap confidence intervals over problems.

A benchmark score is the mean over problems of a per-problem value (pass@k from (n, c)). Its sampling
uncertainty is dominated by which problems happen to be in the benchmark, so we resample problems with
replacement and recompute the score (percentile interval). Resampling is expressed as a (B, N) matrix of
multiplicities, so all k are handled by one matrix product.

* Paired difference: both runs are scored with the SAME resampled problem multiplicities. The
  multiplicities depend only on (seed, set name, problem count), so two runs over the same problems
  always see the same draws, also across separate calls.
* Paper average (avg_paper): the mean of per-set scores; each set is resampled within itself (a
  stratified bootstrap), then the per-set means are averaged.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000


def resample_counts(
    n_problems: int, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0, stream: str = ""
) -> np.ndarray:
    """(resamples, n_problems) multiplicities of a with-replacement resample; deterministic per stream."""
    rng = np.random.default_rng([seed, zlib.crc32(stream.encode()), n_problems])
    idx = rng.integers(0, n_problems, size=(resamples, n_problems))
    counts = np.zeros((resamples, n_problems), dtype=np.float64)
    np.add.at(counts, (np.repeat(np.arange(resamples), n_problems), idx.reshape(-1)), 1.0)
    return counts


def resampled_means(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Means of the (N,) or (N, K) per-problem ``values`` under each resample: (B,) or (B, K)."""
    return counts @ values / counts.shape[1]


def percentile_ci(samples: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    alpha = (1.0 - level) / 2.0
    return np.quantile(samples, alpha, axis=0), np.quantile(samples, 1.0 - alpha, axis=0)


def bootstrap_mean_ci(
    values: np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    stream: str = "",
    level: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile CI of the mean of per-problem ``values`` ((N,) or (N, K)) over problems."""
    values = np.asarray(values, dtype=np.float64)
    counts = resample_counts(values.shape[0], resamples=resamples, seed=seed, stream=stream)
    return percentile_ci(resampled_means(values, counts), level)


def stratified_average_samples(
    sets: Sequence[tuple[str, np.ndarray]], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> np.ndarray:
    """Resampled values of mean_s(mean_i values_s[i]), each set resampled within itself."""
    per_set = []
    for name, values in sets:
        counts = resample_counts(np.asarray(values).shape[0], resamples=resamples, seed=seed, stream=name)
        per_set.append(resampled_means(np.asarray(values, dtype=np.float64), counts))
    return np.mean(per_set, axis=0)


def paired_difference_samples(
    sets_a: Mapping[str, np.ndarray],
    sets_b: Mapping[str, np.ndarray],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> np.ndarray:
    """Resampled values of score(a) - score(b), the score being the average over the given sets.

    ``sets_a[name]`` and ``sets_b[name]`` must be aligned on the same problems (same order).
    """
    if set(sets_a) != set(sets_b):
        raise ValueError(
            f"paired bootstrap needs the same sets for both runs: {sorted(sets_a)} vs {sorted(sets_b)}"
        )
    diffs = {
        name: np.asarray(sets_a[name], dtype=np.float64) - np.asarray(sets_b[name], dtype=np.float64)
        for name in sets_a
    }
    return stratified_average_samples(sorted(diffs.items()), resamples=resamples, seed=seed)
