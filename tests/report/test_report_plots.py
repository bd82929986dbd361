"""The report's plots stay readable with many runs: a method's seeds are one line with a band, each method has
its own colour (no repeats up to 20 methods), an all-non-negative panel does not dip below 0, and the
reasoning-pattern table is replaced by one line when every frequency is 0."""

import gzip
import json
import shutil
from pathlib import Path

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest
from test_report_palette import support_rows

from sage_unsloth.report import grouping, plots, support

FIXTURE = Path(__file__).parents[1] / "fixtures" / "report" / "results"
PAPER_DIR = Path(__file__).resolve().parents[2] / "results" / "paper"
METHODS = ("grpo", "grpo_branch", "grpo_nokl", "grpo_branch_reward")


def labelled_lines(ax):
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def many_runs_curves() -> pd.DataFrame:
    """13 runs like the demo's: 4 methods x 3 seeds + sft, pass@k at k = 1, 2, 4 with per-run CIs."""
    rng = np.random.default_rng(0)
    rows = []
    runs = ["sft"] + [f"{m}_seed{s}" for m in METHODS for s in range(3)]
    for run in runs:
        for k in (1, 2, 4):
            value = float(rng.uniform(0.3, 0.9))
            rows.append(
                {
                    "model": "tiny",
                    "run": run,
                    "dataset": "demo",
                    "k": k,
                    "value": value,
                    "ci_low": value - 0.05,
                    "ci_high": value + 0.05,
                }
            )
    return pd.DataFrame(rows)


def test_method_of_strips_seed_suffixes_only():
    assert grouping.method_of("grpo_seed0") == "grpo"
    assert grouping.method_of("grpo_branch_s12") == "grpo_branch"
    assert grouping.method_of("dapo_full-seed3") == "dapo_full"
    for name in ("grpo", "sft", "grpo_seed", "grpo_branch_reward", "s1"):
        assert grouping.method_of(name) == name


@pytest.mark.parametrize("n", [5, 13, 20, 21, 30])
def test_palette_gives_unknown_names_distinct_colours(n):
    colours = grouping.palette(f"method_{i}" for i in range(n))
    rgb = {matplotlib.colors.to_hex(c) for c in colours.values()}
    assert len(colours) == n and len(rgb) == n


def test_passk_curves_draw_one_line_per_method_at_the_seed_mean(figures):
    curves = many_runs_curves()
    comparison = pd.DataFrame(columns=["model", "run", "dataset", "k", "paper", "method"])
    plots.passk_curves(curves, comparison, "unused")
    (fig,) = figures
    lines = labelled_lines(fig.axes[0])
    assert sorted(line.get_label() for line in lines) == sorted(
        ["tiny/sft"] + [f"tiny/{m} (3 seeds)" for m in METHODS]
    )
    assert len({matplotlib.colors.to_hex(line.get_color()) for line in lines}) == len(lines)
    for method in METHODS:  # the line is the mean over the method's three seeds, k by k
        line = next(x for x in lines if x.get_label() == f"tiny/{method} (3 seeds)")
        seeds = curves[curves["run"].str.startswith(f"{method}_seed")]
        expected = [seeds[seeds["k"] == k]["value"].sum() / 3 for k in (1, 2, 4)]
        np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-12)
        np.testing.assert_array_equal(line.get_xdata(), [1, 2, 4])


def test_one_colour_per_method_across_the_report(figures):
    colours = grouping.palette(["tiny/sft"] + [f"tiny/{m}" for m in METHODS])
    curves = many_runs_curves()
    comparison = pd.DataFrame(columns=["model", "run", "dataset", "k", "paper", "method"])
    plots.passk_curves(curves[curves["run"] != "sft"], comparison, "unused", colours=colours)
    (fig,) = figures
    for line in labelled_lines(fig.axes[0]):
        method = line.get_label().split(" (")[0]
        assert matplotlib.colors.to_hex(line.get_color()) == matplotlib.colors.to_hex(colours[method])


def test_training_curves_fold_seeds_and_keep_an_all_zero_metric_above_zero(figures):
    histories = {}
    for method in ("grpo", "grpo_branch"):
        for seed in range(3):
            histories[f"tiny/{method}_seed{seed}"] = pd.DataFrame(
                {
                    "step": [1, 2, 3],
                    "reward": [seed, seed + 1.0, seed + 2.0],
                    "sage/frac_boosted": [0.0] * 3,
                    "sage/seq_log_q": [-0.5, -0.2, 0.1],
                }
            )
    plots.training_curves(histories, ["reward", "sage/frac_boosted", "sage/seq_log_q"], "unused")
    (fig,) = figures
    reward, zeros, log_q = fig.axes[:3]
    assert len(labelled_lines(reward)) == 2
    np.testing.assert_allclose(
        labelled_lines(reward)[0].get_ydata(), [1.0, 2.0, 3.0]
    )  # mean of seeds 0, 1, 2
    assert zeros.get_ylim()[0] == 0 and zeros.get_ylim()[1] > 0
    assert log_q.get_ylim()[0] < 0  # a metric that is negative keeps its negative axis


def test_support_plot_has_one_line_per_method_in_each_panel(figures):
    runs = [f"{m}_seed{s}" for m in METHODS for s in range(3)]
    support.plot_support(support_rows(dict.fromkeys(support.SHARES, 0.0), runs), "unused")
    (fig,) = figures
    bars, expanded, shrunk = fig.axes[:3]
    for panel in (expanded, shrunk):
        assert len(labelled_lines(panel)) == len(METHODS)
        assert panel.get_ylim()[0] == 0  # all-zero shares: no negative axis
    assert len(bars.get_xticklabels()) == len(METHODS)


def write_completions(root: Path, text: str) -> str:
    """One completion file per fixture run, every completion ``text``; returns the report's glob."""
    for run_dir in FIXTURE.glob("*/*"):
        folder = root / "completions" / run_dir.parent.name / run_dir.name
        folder.mkdir(parents=True)
        record = {
            "dataset": "math500",
            "problem_id": "1",
            "sample_idx": 0,
            "completion": text,
            "correct": True,
        }
        with gzip.open(folder / "math500.jsonl.gz", "wt") as fh:
            fh.write(json.dumps(record) + "\n")
    return str(root / "completions" / "{model}" / "{run}" / "*.jsonl.gz")


@pytest.mark.parametrize(
    "text, table", [("The answer is 4.", False), ("Suppose not. Then we reach a contradiction.", True)]
)
def test_an_all_zero_pattern_table_is_one_line(tmp_path, text, table):
    from sage_unsloth.report.stage import ReportArguments, build_report

    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    args = ReportArguments(
        results=str(results),
        paper_dir=str(PAPER_DIR),
        resamples=100,
        completions=write_completions(tmp_path, text),
    )
    markdown = build_report(args, console=False).markdown
    section = markdown.split("## Reasoning patterns", 1)[1].split("\n## ", 1)[0]
    assert ("| run | completions |" in section) is table
    assert ("No completion of the 3 read matches any pattern's rule" in section) is not table
