"""The lab's statistics (report/compare.py): runs by seed, the two-level bootstrap, paired differences."""

import numpy as np
import pytest
from lab_runs import lab

from sage_unsloth.report import compare as C


def test_run_names_split_into_method_and_seed():
    assert C.split_run("grpo_branch_seed12") == ("grpo_branch", 12) and C.split_run("sft") == ("sft", None)
    assert C.run_name("grpo", 3) == "grpo_seed3" and C.run_name("sft", None) == "sft"
    runs = lab(sft=[1], grpo_seed1=[2], grpo_seed0=[3], grpo_nokl_seed0=[4])
    assert runs.methods == {
        "grpo": ["grpo_seed0", "grpo_seed1"],
        "grpo_nokl": ["grpo_nokl_seed0"],
        "sft": ["sft"],
    }


def test_the_lab_interval_of_one_seed_is_a_problem_bootstrap_around_the_mean():
    one = np.array([[0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]])
    mean, low, high = C.ci(one, resamples=2000, seed=0, level=0.95)
    assert low < mean < high and mean == pytest.approx(0.625)
    assert C.ci(np.full((2, 4), 0.5), resamples=100, seed=0, level=0.95) == (0.5, 0.5, 0.5)


def test_paired_differences_pair_runs_by_seed_and_every_seed_with_the_one_sft():
    runs = lab(
        sft=[0, 4], grpo_seed0=[4, 4], grpo_seed1=[2, 4], grpo_branch_seed0=[4, 0], grpo_branch_seed1=[4, 2]
    )
    first = lambda run: runs.c[run] / 4.0  # pass@1 per problem
    against_sft = C.paired_values(runs, "grpo", "sft", first)
    assert against_sft.tolist() == [[1.0, 0.0], [0.5, 0.0]]
    branch = C.paired_values(runs, "grpo_branch", "grpo", first)
    assert branch.tolist() == [[0.0, -1.0], [0.5, -0.5]]
    table = C.pair_table(runs, [("grpo_branch", "grpo")], [1], resamples=500, seed=0, level=0.95)
    assert table.iloc[0]["diff"] == pytest.approx(-0.25) and table.iloc[0]["seeds"] == 2
    with pytest.raises(ValueError, match="do not share seeds"):
        C.paired_values(lab(a_seed0=[1], b_seed1=[1]), "a", "b", first)


def test_method_table_averages_seeds_and_problems_at_each_k():
    runs = lab(sft=[0, 4], grpo_seed0=[4, 2], grpo_seed1=[2, 0])
    table = C.method_table(runs, [1, 2, 4], resamples=300, seed=0, level=0.95).set_index(["method", "k"])
    # pass@1 = c/4; pass@2 of c=2 of 4 is 1 - C(2,2)/C(4,2) = 5/6
    assert table.loc[("grpo", 1), "pass_at_k"] == pytest.approx((1 + 0.5 + 0.5 + 0) / 4)
    assert table.loc[("grpo", 2), "pass_at_k"] == pytest.approx((1 + 5 / 6 + 5 / 6 + 0) / 4)
    assert table.loc[("sft", 4), "pass_at_k"] == 0.5 and table.loc[("grpo", 1), "seeds"] == 2
    support = C.support_method_table(runs, 4, resamples=300, seed=0, level=0.95).iloc[0]
    # grpo solves p0 in both seeds (SFT does not), p1 in seed 0 only (SFT does)
    assert (support["expanded"], support["shrunk"], support["preserved"]) == pytest.approx((0.5, 0.25, 0.25))


def test_training_log_stats_average_the_first_token_q_over_training(tmp_path):
    """The analysis reads TRL's logged dicts from an RL step's console log: means over the logged steps of
    q at the first completion token and of the boosted shares, and the last logged q there."""
    from sage_unsloth.demo.analysis import training_log_stats

    log = tmp_path / "grpo_branch_seed0.log"
    log.write_text(
        "  3%|#  | 5/150 {'loss': '0.01', 'reward': '0.6', 'sage/frac_boosted': '0.04', "
        "'sage/q_first_mean': '1.3', 'sage/first_boosted': '1', 'sage/later_boosted': '0.02'}\n"
        "noise {'not': 'a log dict'}\n"
        " 7%|##  | 10/150 {'loss': '-3.7e-09', 'reward': '0.9', 'sage/frac_boosted': '0.01', "
        "'sage/q_first_mean': '1', 'sage/first_boosted': '0', 'sage/later_boosted': '0.004'}\n"
    )
    stats = training_log_stats(log)
    assert stats["train_q_first_mean"] == pytest.approx(1.15) and stats["train_q_first_last"] == 1.0
    assert stats["train_first_boosted_mean"] == pytest.approx(0.5)
    assert stats["train_later_boosted_mean"] == pytest.approx(0.012)
    assert stats["train_frac_boosted_mean"] == pytest.approx(0.025)
    assert (stats["train_reward_first"], stats["train_reward_last"]) == (0.6, 0.9)
    assert np.isnan(training_log_stats(tmp_path / "missing.log")["train_q_first_mean"])
