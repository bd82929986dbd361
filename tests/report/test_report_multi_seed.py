"""Stage 4's multi-seed mode (sage_unsloth/report/multi_seed.py): on a results folder with several training seeds
per method, its intervals are the t-intervals written out here from the formulas (scipy's t distribution, the
unbiased pass@k from binomial coefficients, Holm by hand), and on a committed lab's runs it gives the lab's own
numbers."""

from math import comb
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from sage_unsloth.report import multi_seed, tables
from sage_unsloth.report.loading import discover_runs
from sage_unsloth.report.stage import build_report, parse_args

ROOT = Path(__file__).resolve().parents[2]
SAMPLES, PROBLEMS, SEEDS = 16, 12, (0, 1, 2)
SOLVE = {"sft": 0.35, "grpo": 0.55, "grpo_branch": 0.6}  # mean solve rate per method


def write_run(folder: Path, run: str, correct: np.ndarray, samples: int = SAMPLES) -> None:
    folder = folder / "tiny" / run
    folder.mkdir(parents=True)
    ids = [f"p{i:02d}" for i in range(PROBLEMS)]
    pd.DataFrame({"dataset": "toy", "problem_id": ids, "n": samples, "c": correct}).to_csv(
        folder / "per_problem.csv", index=False
    )
    ks = [k for k in (1, 2, 4, 8, 16) if k <= samples]
    values = [np.mean([passk(samples, c, k) for c in correct]) for k in ks]
    pd.DataFrame({"dataset": "toy", "k": ks, "pass_at_k": values}).to_csv(folder / "passk.csv", index=False)


def passk(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., arXiv 2107.03374): 1 - C(n - c, k) / C(n, k)."""
    return 1.0 - comb(n - c, k) / comb(n, k)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep's results: three methods x three seeds, binomial counts per problem."""
    folder = tmp_path_factory.mktemp("sweep")
    rng = np.random.default_rng(40)
    difficulty = rng.uniform(-0.25, 0.25, PROBLEMS)
    counts = {}
    for method, rate in SOLVE.items():
        for seed in SEEDS:
            p = np.clip(rate + difficulty + rng.normal(0, 0.05), 0.02, 0.98)
            counts[method, seed] = rng.binomial(SAMPLES, p)
            write_run(folder, f"{method}_seed{seed}", counts[method, seed])
    return folder, counts


def t_interval(per_seed: np.ndarray) -> tuple[float, float, float]:
    mean = float(np.mean(per_seed))
    low, high = stats.t.interval(0.95, len(per_seed) - 1, loc=mean, scale=stats.sem(per_seed))
    return mean, max(low, -1.0), min(high, 1.0)


def seed_means(counts, method: str, k: int) -> np.ndarray:
    return np.array([np.mean([passk(SAMPLES, c, k) for c in counts[method, s]]) for s in SEEDS])


def test_the_multi_seed_intervals_are_the_t_intervals_over_the_seed_means(sweep):
    folder, counts = sweep
    found = multi_seed.multi_seed_tables(discover_runs(folder), None, tables.BootstrapSettings())
    methods, pairs = found["multi_seed_methods"], found["multi_seed_pairs"]
    assert sorted(set(methods["k"])) == [1, 2, 4]  # kmax = 16 samples / 4
    for method in SOLVE:
        for k in (1, 2, 4):
            row = methods[(methods["method"] == method) & (methods["k"] == k)].iloc[0]
            mean, low, high = t_interval(seed_means(counts, method, k))
            assert (row["pass_at_k"], row["ci_low"], row["ci_high"]) == pytest.approx(
                (mean, low, high), abs=1e-12
            )
            assert row["interval"] == "t(seed)" and row["seeds"] == 3 and row["dataset"] == "toy"
    # default pairs: every method against SFT, and the paper's GRPO + Branch - GRPO
    assert list(dict.fromkeys(zip(pairs["a"], pairs["b"]))) == [
        ("grpo", "sft"),
        ("grpo_branch", "sft"),
        ("grpo_branch", "grpo"),
    ]
    p_values = []
    for _, row in pairs.iterrows():
        d = seed_means(counts, row["a"], row["k"]) - seed_means(counts, row["b"], row["k"])  # paired by seed
        assert (row["diff"], row["ci_low"], row["ci_high"]) == pytest.approx(t_interval(d), abs=1e-12)
        assert row["p"] == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue, rel=1e-9)
        p_values.append(row["p"])
    order = np.argsort(p_values)  # Holm by hand: max over the running (m - rank) p, capped at 1
    holm = np.empty(len(order))
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[i]))
        holm[i] = running
    assert pairs["p_holm"].to_numpy() == pytest.approx(holm)
    support = found["multi_seed_support"]
    assert set(support["method"]) == {"grpo", "grpo_branch"} and (support["seeds"] == 3).all()


def test_the_report_writes_the_mode_for_seeds_and_a_method_name_pairs_by_seed(sweep, tmp_path):
    folder, _ = sweep
    out = tmp_path / "r" / "report.md"
    result = build_report(
        parse_args(["--results", str(folder), "--out", str(out), "--pairs", "grpo_branch:grpo"]),
        console=False,
    )
    pairs = pd.read_csv(out.with_suffix("") / "multi_seed_pairs.csv")
    assert list(dict.fromkeys(zip(pairs["a"], pairs["b"]))) == [("grpo_branch", "grpo")]
    assert "## Across training seeds (multi-seed mode)" in result.markdown
    assert result.pairs.empty  # a method name pairs no single run: the bootstrap's pairs table has none


def test_one_seed_per_method_is_no_multi_seed_report_and_unpairable_methods_are_left_out(tmp_path):
    rng = np.random.default_rng(0)
    for run in ("sft", "grpo"):
        write_run(tmp_path, run, rng.binomial(SAMPLES, 0.5, PROBLEMS))
    assert multi_seed.multi_seed_tables(discover_runs(tmp_path), None, tables.BootstrapSettings()) == {}
    mixed = tmp_path / "mixed"  # GRPO's seeds beside seedless SFT and Branch: Branch - GRPO does not pair
    for run in ("sft", "grpo_seed0", "grpo_seed1", "grpo_branch"):
        write_run(mixed, run, rng.binomial(SAMPLES, 0.6, PROBLEMS))
    found = multi_seed.multi_seed_tables(discover_runs(mixed), None, tables.BootstrapSettings())
    pairs = found["multi_seed_pairs"]
    assert list(dict.fromkeys(zip(pairs["a"], pairs["b"]))) == [("grpo", "sft"), ("grpo_branch", "sft")]
    assert set(pairs.loc[pairs["a"] == "grpo", "interval"]) == {"t(seed), B shared"}


def test_too_few_samples_for_any_k_leave_the_mode_out_and_the_report_goes_on(tmp_path):
    """A tiny sweep's n = 2 samples per problem has no k with n >= 4k: no multi-seed tables, the report is written."""
    rng = np.random.default_rng(1)
    for run in ("sft", "grpo_seed0", "grpo_seed1", "grpo_branch_seed0", "grpo_branch_seed1"):
        write_run(tmp_path / "few", run, rng.binomial(2, 0.5, PROBLEMS), samples=2)
    found = multi_seed.multi_seed_tables(discover_runs(tmp_path / "few"), None, tables.BootstrapSettings())
    assert found == {}
    out = tmp_path / "r" / "report.md"
    result = build_report(parse_args(["--results", str(tmp_path / "few"), "--out", str(out)]), console=False)
    assert out.is_file() and "Across training seeds" not in result.markdown


def test_on_a_committed_lab_the_mode_gives_the_labs_own_numbers():
    lab = ROOT / "results" / "demo-confirm"
    committed = pd.read_csv(lab / "lab" / "methods.csv")
    committed_pairs = pd.read_csv(lab / "lab" / "pairs.csv").dropna(subset=["k"])
    spec = ",".join(f"{a}:{b}" for a, b in dict.fromkeys(zip(committed_pairs["a"], committed_pairs["b"])))
    found = multi_seed.multi_seed_tables(discover_runs(lab), spec, tables.BootstrapSettings())
    columns = ["method", "k", "pass_at_k", "ci_low", "ci_high", "interval", "seeds"]
    pd.testing.assert_frame_equal(found["multi_seed_methods"][columns], committed[columns], check_exact=True)
    columns = ["a", "b", "k", "diff", "ci_low", "ci_high", "p", "mde"]
    mine = found["multi_seed_pairs"][columns].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        mine, committed_pairs[columns].reset_index(drop=True), check_exact=True, check_dtype=False
    )
