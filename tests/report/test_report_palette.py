"""One colour per method everywhere: two reports over different sets of runs, and the demo lab's headline,
draw each method they share in the same colour (read back from the matplotlib artists); seeds and models share
their method's colour; unknown names get a colour from a stable hash (the same under any PYTHONHASHSEED); every
method of the kit has a fixed colour, the demo's visibly apart. A support bar of height 0 is drawn (a mark on
the axis) and a 2-step run gets integer step ticks.

Checked by breaking on purpose: the old palette over the sorted set of names (adding a run recolours the
others), the lab's ``C{i}`` colours, the palette keyed by the full label (model and seed kept), Python's
``hash()`` for unknown names, no zero marks, and MaxNLocator without integer=True each fail a test here.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer

from sage_unsloth.report import palette, plots, support

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "report" / "results"
PAPER_DIR = REPO / "results" / "paper"
NOT_METHODS = {"_base", "_grpo_base", "eval", "report"}  # config files in those folders that are no method


def hex_of(colour) -> str:
    return matplotlib.colors.to_hex(colour)


def config_methods(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml") if p.stem not in NOT_METHODS)


def method_colours_drawn(figs) -> dict[str, set[str]]:
    """{method: the colours its artists were drawn in} over every labelled line and every support bar."""
    drawn: dict[str, set[str]] = {}
    for fig in figs:
        for ax in fig.axes:
            for line in ax.get_lines():
                label = line.get_label()
                if label.startswith(("_", "paper")):
                    continue
                drawn.setdefault(palette.method_key(label.split(" (")[0]), set()).add(
                    hex_of(line.get_color())
                )
            ticks = [t.get_text() for t in ax.get_xticklabels()]
            for container in ax.containers:  # the support plot's bars: one per method in tick order
                if isinstance(container, BarContainer):
                    assert len(container.patches) == len(ticks)
                    for tick, bar in zip(ticks, container.patches):
                        drawn.setdefault(palette.method_key(tick), set()).add(hex_of(bar.get_edgecolor()))
    return drawn


def copy_run(results: Path, model: str, run: str, as_run: str) -> None:
    shutil.copytree(FIXTURE / model / run, results / model / as_run)


def report_colours(tmp_path: Path, name: str, runs: dict[str, list[tuple[str, str]]], figures) -> dict:
    from sage_unsloth.report.stage import ReportArguments, build_report

    results = tmp_path / name
    for model, pairs in runs.items():
        for source, target in pairs:
            copy_run(results, model, source, target)
    figures.clear()
    build_report(
        ReportArguments(results=str(results), paper_dir=str(PAPER_DIR), resamples=100), console=False
    )
    assert figures, "the report drew no figure"
    return method_colours_drawn(list(figures))


def test_two_reports_with_different_runs_keep_each_shared_methods_colour(tmp_path, figures):
    first = report_colours(
        tmp_path,
        "a",
        {"tiny": [("grpo", "grpo"), ("grpo_branch", "grpo_branch")]},
        figures,
    )
    # The second report adds runs on both sides of the shared ones in sorted order, seeds and a second model.
    second = report_colours(
        tmp_path,
        "b",
        {
            "tiny": [
                ("grpo", "bnpo"),
                ("grpo", "grpo_seed0"),
                ("grpo", "grpo_seed1"),
                ("grpo_branch", "grpo_branch"),
                ("grpo", "grpo_nokl"),
                ("grpo_branch", "a_method_of_my_own"),
            ],
            "qwen2.5-math-7b": [("grpo_branch", "grpo_branch")],
        },
        figures,
    )
    for drawn in (first, second):
        for method, colours in drawn.items():
            assert colours == {palette.colour(method)}, (method, colours)  # one colour in every plot
    shared = set(first) & set(second)
    assert shared == {"grpo", "grpo_branch"}
    for method in shared:
        assert first[method] == second[method]
    assert len({next(iter(c)) for c in second.values()}) == len(second)  # and the methods stay apart


def test_the_lab_headline_draws_each_method_in_the_reports_colour(tmp_path, figures):
    from sage_unsloth.demo import lab

    methods = ["sft", "grpo", "grpo_branch", "grpo_passk"]
    rows = [
        {"method": m, "k": k, "pass_at_k": 0.5, "ci_low": 0.4, "ci_high": 0.6}
        for m in methods
        for k in (1, 2)
    ]
    support_rows = [
        {
            "method": m,
            "k": 2,
            "shrunk": 0.1,
            "expanded": 0.0,
            "net": -0.1,
            "net_ci_low": -0.2,
            "net_ci_high": 0.0,
        }
        for m in methods[1:]
    ]
    lab.plot_headline(
        pd.DataFrame(rows), pd.DataFrame(support_rows), {m: m for m in methods}, 2, tmp_path / "h.png"
    )
    (fig,) = figures
    lines = [line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]
    assert {line.get_label(): hex_of(line.get_color()) for line in lines} == {
        m: palette.colour(m) for m in methods
    }


def test_seeds_and_models_share_their_methods_colour():
    grpo = palette.colour("grpo")
    for name in ("grpo_seed3", "tiny/grpo_seed0", "qwen2.5-math-7b/grpo", "grpo_s12", "grpo-seed1", "GRPO"):
        assert palette.colour(name) == grpo
    assert palette.colour("grpo_branch_seed0") == palette.colour("grpo_branch") != grpo
    assert palette.colour("grpo_server") == grpo  # the same method generated through vLLM's server


def test_every_method_of_the_kit_has_a_fixed_colour_and_the_demos_are_visibly_apart():
    kit = {"sft", "base"}
    for folder in [*sorted((REPO / "configs" / "rlvr").iterdir()), REPO / "configs" / "demo"]:
        kit |= set(config_methods(folder))
    fixed = palette.fixed_colours()
    unpinned = sorted(m for m in kit if palette.method_key(m) not in fixed)
    assert not unpinned, f"give these a lab: colour: or a line in palette.METHOD_COLOURS: {unpinned}"
    assert len(set(fixed.values())) == len(fixed)

    def lab(colour):  # CIE L*a*b* (D65), written from the sRGB and CIELAB definitions
        rgb = np.asarray(matplotlib.colors.to_rgb(colour))
        linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
        xyz = (
            np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
        )
        xyz /= np.array([0.9505, 1.0, 1.089])
        f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
        return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])

    def closest(names):
        return min(
            (float(np.linalg.norm(lab(palette.colour(a)) - lab(palette.colour(b)))), a, b)
            for a, b in itertools.combinations(sorted(names), 2)
        )

    demo = {"sft", *config_methods(REPO / "configs" / "demo")}
    assert closest(demo)[0] > 12, closest(demo)  # the full lab's methods in one plot (CIE76 delta E)
    lab_default = {"sft", "grpo", "grpo_nokl", "grpo_branch", "grpo_fkl", "grpo_reward", "grpo_branch_reward"}
    assert closest(lab_default)[0] > 25, closest(lab_default)
    for folder in sorted((REPO / "configs" / "rlvr").iterdir()):
        names = {palette.method_key(m) for m in {"sft", "base", *config_methods(folder)}}
        assert closest(names)[0] > 12, (folder.name, closest(names))


def test_unknown_names_get_the_same_colour_under_any_hash_seed():
    code = (
        "from sage_unsloth.report import palette; "
        "print(palette.colour('my_guide_run'), palette.colour('tiny/other_seed2'))"
    )
    out = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO))
        out.add(
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
    assert len(out) == 1
    first, second = out.pop().split()
    assert first == palette.colour("my_guide_run") and second == palette.colour("other")
    assert first not in palette.fixed_colours().values() or first == palette.hashed_colour("my_guide_run")


def support_rows(shares: dict[str, float], runs=("grpo", "grpo_branch")) -> pd.DataFrame:
    """A support table: each run at k = 1 and 4 on 10 problems, each share (and its CI) as given, else 0.5."""
    rows = []
    for run in runs:
        for k in (1, 4):
            row = {
                "model": "tiny",
                "run": run,
                "reference": "sft",
                "dataset": "demo",
                "k": k,
                "n_problems": 10,
            }
            for name in support.SHARES:
                value = shares.get(name, 0.5)
                row |= {name: value, f"{name}_ci_low": value, f"{name}_ci_high": value}
            rows.append(row)
    return pd.DataFrame(rows)


def test_a_support_bar_of_height_zero_is_drawn_in_its_methods_colour(figures):
    support.plot_support(support_rows({"preserved": 0.6, "shrunk": 0.0, "expanded": 0.0}), "unused")
    (fig,) = figures
    bars = fig.axes[0]
    marks = [line for line in bars.get_lines() if line.get_label() == "_zero"]
    # shrunk and expanded are 0 for both methods: four marks on the axis, each in its method's colour
    assert len(marks) == 4
    assert sorted(hex_of(m.get_color()) for m in marks) == sorted(
        [palette.colour("grpo")] * 2 + [palette.colour("grpo_branch")] * 2
    )
    for mark in marks:
        assert list(mark.get_ydata()) == [0, 0] and not mark.get_clip_on()
        assert mark.get_linewidth() >= 2
    support.plot_support(support_rows({"preserved": 0.6, "shrunk": 0.1, "expanded": 0.2}), "unused")
    assert not [line for line in figures[-1].axes[0].get_lines() if line.get_label() == "_zero"]


@pytest.mark.parametrize("steps", [[1, 2], [1, 2, 3], [5, 10, 15, 20]])
def test_training_steps_get_integer_ticks(figures, steps):
    history = pd.DataFrame({"step": steps, "reward": np.linspace(0, 1, len(steps))})
    plots.training_curves({"tiny/grpo": history}, ["reward"], "unused")
    (fig,) = figures
    ax = fig.axes[0]
    fig.canvas.draw()
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def _lch(colour) -> tuple[float, float, float]:
    """CIE L*, C*, h (degrees) of a colour, written from the sRGB and CIELAB definitions (D65)."""
    rgb = np.asarray(matplotlib.colors.to_rgb(colour))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    f = lambda t: np.where(t > 216 / 24389, np.cbrt(t), (24389 / 27 * t + 16) / 116)
    fx, fy, fz = f(xyz / np.array([0.9505, 1.0, 1.089]))
    lightness, a, b = 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)
    return float(lightness), float(np.hypot(a, b)), float(np.degrees(np.arctan2(b, a)) % 360)


def implied_pair(a: str, b: str) -> bool:
    """Two colours that read as shades of one hue (tab20's light/dark pairs): both coloured (chroma >= 15) and
    less than 12 degrees of hue apart."""
    (_, ca, ha), (_, cb, hb) = _lch(a), _lch(b)
    gap = abs(ha - hb) % 360
    return ca >= 15 and cb >= 15 and min(gap, 360 - gap) < 12


def test_no_two_unrelated_methods_that_share_a_plot_share_a_hue():
    """Issue 41 item 7: tab20's paired colours suggested links between unrelated arms (BNPO a light GRPO, DAPO a
    light no-KL, the token guide a light Pass@k, Branch-in-the-reward a dark Forward-KL). Among the methods that
    are plotted together (the lab's, each preset folder's), only the members of one family share a hue."""
    assert implied_pair("#1f77b4", "#aec7e8") and not implied_pair("#1f77b4", "#ff7f0e")  # tab20's first pair
    assert not implied_pair("#000000", "#7f7f7f")  # greys have no hue

    def related(a, b):
        return any(a in family and b in family for family in palette.families())

    groups = {"demo": {"sft", *config_methods(REPO / "configs" / "demo")}}
    for folder in sorted((REPO / "configs" / "rlvr").iterdir()):
        groups[folder.name] = {palette.method_key(m) for m in {"sft", "base", *config_methods(folder)}}
    for name, methods in groups.items():
        pairs = [
            (a, b)
            for a, b in itertools.combinations(sorted(methods), 2)
            if not related(a, b) and implied_pair(palette.colour(a), palette.colour(b))
        ]
        assert not pairs, (name, pairs)


def test_the_dose_response_legend_sits_under_the_plot_and_each_arm_has_its_colour(figures):
    """Issue 41 item 7: dose_response.png spent half its width on a legend beside the axes, in tab20 colours
    paired by position. Now the legend is under the axes (the plot keeps the width) and each arm is drawn in
    its palette colour: distinct arms, a --grid setting in its method's hue."""
    from sage_unsloth.demo import dose_response

    methods = [
        "sft",
        "grpo",
        "grpo_nokl",
        "grpo_branch_paper",
        "grpo_beta1",
        "grpo_ref_branch-tau0.3-gamma4-q_max3",
    ]
    rows = []
    for i, m in enumerate(methods):
        row = {"method": m, "beta": 0.05, "tau": np.nan, "gamma": np.nan, "q_max": np.nan, "guide": "none"}
        for name, value in (("pass_at_1", 0.6 + 0.02 * i), ("net_support_at_64", -0.01 * i)):
            row.update({name: value, f"{name}_ci_low": value - 0.02, f"{name}_ci_high": value + 0.02})
        rows.append(row)
    long = {
        m: f"{m} with a long descriptive label of the kind the lab writes for a grid cell" for m in methods
    }
    dose_response.plot(pd.DataFrame(rows), long, 64, Path("unused.png"))
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    ax, (legend,) = fig.axes[0], fig.legends
    whole, plot, key = (
        fig.get_tightbbox(renderer),
        ax.get_tightbbox(renderer),
        legend.get_window_extent(renderer),
    )
    assert ax.get_window_extent(renderer).width >= 0.8 * whole.width  # the axes keep the figure's width
    assert key.y1 <= plot.y0 + 1  # the legend is under the axes and their labels, not beside them
    drawn = {}
    for container in ax.containers:
        line = container.lines[0]
        drawn[container.get_label().split(" with ")[0]] = hex_of(line.get_color())
    assert drawn == {m: palette.colour(m) for m in methods}
    assert len(set(drawn.values())) == len(methods)
    cell, base = _lch(drawn["grpo_ref_branch-tau0.3-gamma4-q_max3"]), _lch(palette.colour("grpo_ref_branch"))
    assert abs(cell[2] - base[2]) < 12 and abs(cell[0] - base[0]) > 5  # its method's hue, another lightness
