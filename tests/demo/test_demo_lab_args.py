"""The lab's mechanics without a model: --seeds lists and ranges, --eval-n / --kmax, SFT evaluated per seed,
methods from config files anywhere (base: demo:..., a guide file next to the YAML), --grid cells, the
dose-response table and its knob columns."""

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sage_unsloth.demo import dose_response as D
from sage_unsloth.demo import run as R
from sage_unsloth.report import compare as C


def budget(*argv):
    return R.budget_from_args(R.parse_args(list(argv)))


def test_seeds_take_counts_lists_and_ranges():
    assert R.parse_seeds("3") == (0, 1, 2)  # the old count form
    assert R.parse_seeds("0,1,2") == (0, 1, 2) and R.parse_seeds("10-19") == tuple(range(10, 20))
    assert (
        R.parse_seeds("7,0-2") == (0, 1, 2, 7)
        and R.parse_seeds("5,") == (5,)
        and R.parse_seeds("4-4") == (4,)
    )
    for bad, says in (
        ("a", "write a count"),
        ("3-1", "first seed <= its last"),
        ("1,0-2", "[1] listed twice"),
    ):
        with pytest.raises(ValueError, match=r"--seeds"):
            R.parse_seeds(bad)
        assert says in str(pytest.raises(ValueError, R.parse_seeds, bad).value)


def test_sft_is_evaluated_once_per_seed_with_that_seed_and_rl_runs_with_theirs(tmp_path):
    b = budget("--quick", "--methods", "grpo,grpo_branch", "--seeds", "3,10")
    assert R.run_names(b) == [
        "sft_seed3",
        "sft_seed10",
        "grpo_seed3",
        "grpo_seed10",
        "grpo_branch_seed3",
        "grpo_branch_seed10",
    ]
    steps = {s.name: s for s in R.build_steps(b, tmp_path / "w", tmp_path / "r", None)}
    for run in R.run_names(b):
        argv = steps[f"eval_{run}"].argv
        method, seed = C.split_run(run)
        assert argv[argv.index("--seed") + 1] == str(seed) and argv[argv.index("--run_name") + 1] == run
        checkpoint = Path(argv[argv.index("--checkpoints") + 1]).name
        assert checkpoint == ("sft" if method == "sft" else run)  # SFT's evaluations read stage 1's adapter
        assert steps[f"eval_{run}"].after == (("sft",) if method == "sft" else (run,))
    assert "sft_seed3" in steps["report"].argv[steps["report"].argv.index("--pairs") + 1].split(",")[0]
    assert sum(name == "sft" for name in steps) == 1  # one SFT training


def test_eval_n_sets_kmax_to_a_quarter_and_n_below_4_kmax_is_refused():
    assert (R.FULL.eval_n, R.FULL.kmax) == (64, 16) and R.QUICK.eval_n >= 4 * R.QUICK.kmax
    assert budget("--eval-n", "256").kmax == 64 and budget("--eval-n", "100").kmax == 25
    assert budget("--eval-n", "256", "--kmax", "32").kmax == 32
    assert budget("--eval-n", "64", "--kmax", "16").kmax == 16  # n = 4k exactly is enough
    for argv in (["--eval-n", "64", "--kmax", "17"], ["--kmax", "64"], ["--eval-n", "3"]):
        with pytest.raises(ValueError, match="n >= 4 x kmax"):
            budget(*argv)


def write_user_method(folder: Path, *, base="demo:_grpo_base.yaml", guide="guide.py:fn") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "guide.py").write_text("def fn(signals, *, gamma=0.5):\n    return 1.0 + 0 * signals.mask\n")
    path = folder / "mine.yaml"
    path.write_text(f"base: {base}\nguide: {{name: {guide}, gamma: 0.7, q_max: 2.0}}\n")
    return path


def test_a_method_from_a_yaml_anywhere_is_resolved_with_a_kit_base_and_its_guide_file(tmp_path):
    path = write_user_method(tmp_path / "elsewhere")
    names, files = R.parse_methods(f"{path},grpo")
    assert names == ("grpo", "mine") and files[0].source == str(path.resolve())
    config, deps = R.materialise(files[0], tmp_path / "work")
    assert config == tmp_path / "work" / "methods" / "mine.yaml"
    resolved = R.yaml.safe_load(config.read_text())
    from sage_unsloth.config.args import load_config

    base = load_config(R.CONFIG_DIR / "_grpo_base.yaml")
    # the kit base's keys, the file's own keys on top, the guide made absolute, the variant = the stem
    assert resolved == {
        **base,
        "guide": {
            "name": f"{(tmp_path / 'elsewhere' / 'guide.py').resolve()}:fn",
            "gamma": 0.7,
            "q_max": 2.0,
        },
        "variant": "mine",
    }
    assert (
        tmp_path / "elsewhere" / "guide.py"
    ).resolve() in deps and path in deps  # both enter the fingerprint
    assert (R.CONFIG_DIR / "_grpo_base.yaml").resolve() in deps
    # a base given relative to the file's folder, or as an absolute path, reads the same file
    kit_base = R.CONFIG_DIR / "_grpo_base.yaml"
    for given in (os.path.relpath(kit_base, tmp_path / "a" / "b"), str(kit_base)):
        again = write_user_method(tmp_path / "a" / "b", base=given)
        assert R.resolve_method_config(again)[0]["max_steps"] == base["max_steps"]


def test_bad_method_files_fail_with_one_line_naming_the_fix(tmp_path, capsys):
    cases = (
        (write_user_method(tmp_path / "b1", base="demo:nope.yaml"), "base: demo:nope.yaml not found"),
        (write_user_method(tmp_path / "b2", guide="missing.py:fn"), "no file 'missing.py' next to the YAML"),
        (tmp_path / "absent.yaml", "--methods: no config file"),
    )
    for path, says in cases:
        assert R.main(["--quick", "--methods", f"grpo,{path}", "--work-dir", str(tmp_path / "w")]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    (tmp_path / "b3").mkdir()
    (tmp_path / "b3" / "grpo.yaml").write_text("base: demo:_grpo_base.yaml\n")
    assert R.main(["--quick", "--methods", str(tmp_path / "b3" / "grpo.yaml")]) == 2
    assert "taken by a built-in method" in capsys.readouterr().err


@pytest.mark.slow
def test_a_bad_key_in_a_method_file_is_refused_by_stage_2s_parser_before_anything_trains(tmp_path, capsys):
    path = write_user_method(tmp_path / "u")
    path.write_text(path.read_text() + "sage_q_sorce: loss\n")
    assert R.main(["--quick", "--methods", str(path), "--work-dir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "sage_q_sorce" in err and "did you mean 'sage_q_source'" in err and err.count("\n") == 1, err
    assert not (tmp_path / "w" / "steps").exists()  # nothing ran


def test_grid_cells_are_methods_with_the_knobs_set_on_their_config(tmp_path):
    cells = R.parse_grid("grpo_branch:tau=0.3,1.2;q_max=2")
    assert [c.name for c in cells] == ["grpo_branch-tau0.3-q_max2", "grpo_branch-tau1.2-q_max2"]
    resolved = R.yaml.safe_load(R.materialise(cells[1], tmp_path)[0].read_text())
    # the grid's keys set the guide node's arguments; the method's others (gamma 0.8) stay
    assert resolved["guide"] == {"name": "branch", "gamma": 0.8, "tau": 1.2, "q_max": 2}
    assert resolved["variant"] == "grpo_branch-tau1.2-q_max2"
    cell = R.parse_grid("grpo_clip_cov:policy_term.ratio=0.01")[0]  # any node's argument, dotted
    assert R.yaml.safe_load(R.materialise(cell, tmp_path)[0].read_text())["policy_term"] == {
        "name": "clip_cov",
        "ratio": 0.01,
    }
    b = budget("--quick", "--methods", "grpo", "--grid", "grpo:beta=0.2,1", "--grid", "grpo_branch:tau=0.3")
    assert b.methods == ("grpo", "grpo-beta0.2", "grpo-beta1", "grpo_branch-tau0.3")
    assert ("grpo-beta1", "sft") in R.lab_pairs(b) and ("grpo-beta1", "grpo") in R.lab_pairs(b)
    for bad in ("grpo", "nope:beta=1", "grpo:beta", "grpo:beta=0.2;beta=0.2"):
        with pytest.raises(ValueError, match="--grid|--methods"):
            budget("--quick", "--grid", bad)


# ------------------------------------------------------------------------------------- the dose-response
def lab(**c_by_run):
    problems = [f"p{i}" for i in range(len(next(iter(c_by_run.values()))))]
    n = {r: np.full(len(problems), 8) for r in c_by_run}
    return C.RunCounts(problems, n, {r: np.array(c) for r, c in c_by_run.items()})


def test_sft_per_seed_pairs_by_seed_and_an_old_seedless_sft_pairs_with_every_seed():
    new = lab(sft_seed0=[8, 0], sft_seed1=[0, 0], grpo_seed0=[8, 8], grpo_seed1=[8, 0])
    assert C.paired_runs(new, "grpo", "sft") == [("grpo_seed0", "sft_seed0"), ("grpo_seed1", "sft_seed1")]
    # support at k = 8 (pass@8 is 1 when c > 0): seed 0 gains p1, seed 1 gains p0 against its own SFT
    row = C.support_method_table(new, 8, resamples=50, seed=0, level=0.95).iloc[0]
    assert (row["expanded"], row["shrunk"], row["net"]) == pytest.approx((0.5, 0.0, 0.5))
    old = lab(sft=[8, 0], grpo_seed0=[8, 8], grpo_seed1=[8, 0])
    assert C.paired_runs(old, "grpo", "sft") == [("grpo_seed0", "sft"), ("grpo_seed1", "sft")]
    row = C.support_method_table(old, 8, resamples=50, seed=0, level=0.95).iloc[0]
    assert (row["expanded"], row["net"]) == pytest.approx((0.25, 0.25))


def test_knobs_come_from_the_resolved_training_config():
    node = {
        "name": "branch",
        "tau": 0.5,
        "gamma": 0.8,
        "q_min": 0.6,
        "q_max": 1.4,
    }  # as the manifest records it
    branch = {"beta": 0.2, "guide": node, "kl_term": {"name": "k3"}}
    assert {k: D.knobs_from_config(branch)[k] for k in D.KNOBS} == {
        "beta": 0.2,
        "tau": 0.5,
        "gamma": 0.8,
        "q_max": 1.4,
        "guide": "branch",
    }
    assert (
        D.knobs_from_config(branch)["guide_args"] == ""
        and D.knobs_from_config(branch)["kl_estimator"] == "k3"
    )
    plain = D.knobs_from_config({**branch, "guide": {"name": "none", "q_min": 0.6, "q_max": 1.4}})
    assert plain["beta"] == 0.2 and all(np.isnan(plain[k]) for k in ("tau", "gamma", "q_max"))
    plugin = D.knobs_from_config({**branch, "guide": {"name": "/some/where/g.py:fn", "a": 1, "q_max": 1.4}})
    assert plugin["guide"] == "g.py:fn" and np.isnan(plugin["tau"]) and plugin["q_max"] == 1.4
    assert json.loads(plugin["guide_args"]) == {"a": 1}
    with pytest.raises(ValueError, match="predates plug-in nodes"):  # a manifest of the flat spelling
        D.knobs_from_config({"beta": 0.2, "sage_guide": "branch", "sage_tau": 0.5})


def test_dose_response_rows_pair_net_support_with_sft_by_seed_and_read_knobs_not_names(tmp_path):
    runs = lab(
        sft_seed0=[8, 0, 1, 0],
        sft_seed1=[8, 1, 0, 0],
        x_seed0=[8, 8, 0, 0],  # pass@1 (8 + 8) / 32 = 0.5; pass@2: p2 of c=1 of 8 = 1 - 7*6/(8*7) = 0.25
        x_seed1=[0, 8, 8, 8],
    )
    knobs = pd.DataFrame(
        [
            {"run": r, "beta": b, "tau": np.nan, "gamma": np.nan, "q_max": np.nan, "guide": g}
            for r, b, g in (("sft_seed0", np.nan, ""), ("sft_seed1", np.nan, ""))
        ]
        + [
            {"run": r, "beta": 0.5, "tau": np.nan, "gamma": np.nan, "q_max": np.nan, "guide": "none"}
            for r in ("x_seed0", "x_seed1")
        ]
    ).assign(kl_estimator="", kl_placement="", guide_args="")
    table = D.dose_response_table(runs, knobs, 2, resamples=100, seed=0, level=0.95).set_index("method")
    assert (
        list(table.index) == ["sft", "x"] and table.loc["x", "beta"] == 0.5 and table.loc["x", "seeds"] == 2
    )

    def p2(c):  # pass@2 from n = 8 samples, written out: 1 - C(8 - c, 2) / C(8, 2)
        return 1 - (8 - c) * (7 - c) / 56

    sft = {0: [8, 0, 1, 0], 1: [8, 1, 0, 0]}
    x = {0: [8, 8, 0, 0], 1: [0, 8, 8, 8]}
    net = np.mean([[p2(a) - p2(b) for a, b in zip(x[s], sft[s])] for s in (0, 1)])
    assert table.loc["x", "net_support_at_2"] == pytest.approx(net)
    assert table.loc["x", "pass_at_1"] == pytest.approx(np.mean([x[0], x[1]]) / 8)
    assert table.loc["sft", "net_support_at_2"] == 0.0
    lines = D.write(tmp_path, runs, knobs, 2, {"x": "X"}, resamples=100, seed=0, level=0.95)
    assert (tmp_path / "dose_response.png").stat().st_size > 0 and any("| X | beta 0.5 |" in l for l in lines)
    assert list(pd.read_csv(tmp_path / "dose_response.csv").columns[:6]) == ["method", *D.KNOBS]


# ------------------------------------------------------------------------------------- the branch analysis
def test_the_branch_analysis_reads_the_guide_node_as_training_resolves_it(tmp_path):
    """A branch config whose knobs are in its node, on a base whose own guide differs: the lab's analysis uses the
    node's gamma 0.8 / tau 0.5 (what training uses), never the base's or the paper's 0.3 / 1.2, and its q is
    clip(1 + gamma * relu(H - tau), q_min, q_max) at those values."""
    import torch

    from sage_unsloth.demo import analysis as A

    base = tmp_path / "base.yaml"
    base.write_text(
        f"base: {R.CONFIG_DIR / '_grpo_base.yaml'}\nguide: {{name: branch, gamma: 0.3, tau: 1.2}}\n"
    )
    child = tmp_path / "branch.yaml"
    child.write_text("base: base.yaml\ntemperature: 0.9\nguide: {name: branch, gamma: 0.8, tau: 0.5}\n")
    for path in (child, R.CONFIG_DIR / "grpo_branch.yaml"):  # the lab's own branch config too
        settings = A.branch_settings(path)
        assert (settings["gamma"], settings["tau"], settings["q_min"], settings["q_max"]) == (
            0.8,
            0.5,
            0.6,
            1.4,
        )
    assert A.branch_settings(child)["temperature"] == 0.9
    entropy = torch.tensor([0.0, 0.5, 0.75, 0.95, 1.0, 3.0])
    want = [min(1.4, max(0.6, 1 + 0.8 * max(0.0, h - 0.5))) for h in entropy.tolist()]
    torch.testing.assert_close(A._lab_q(entropy, A.branch_settings(child)), torch.tensor(want))
    token = tmp_path / "token.yaml"
    token.write_text(f"base: {R.CONFIG_DIR / '_grpo_base.yaml'}\nguide: token\n")
    with pytest.raises(
        ValueError, match="reads logps; the branch-point analysis scores the policy's entropy"
    ):
        A.branch_settings(token)


@pytest.mark.parametrize(
    "seeds, words",
    [
        ([1, 1], "problem bootstrap, one seed"),
        ([3, 3], "t over 3 seeds"),
        ([2, 5], "t over 2-5 seeds"),
        ([1, 3], "t over seeds; a problem bootstrap for a method with one seed"),
    ],
)
def test_the_dose_response_title_names_the_intervals_its_data_have(seeds, words, figures):
    """A 1-seed lab's intervals are a problem bootstrap: its plot says so (main 0298207: "t over seeds")."""
    rows = []
    for method, n in zip(("sft", "grpo"), seeds):
        row = {"method": method, "seeds": n, "beta": 0.05, "tau": np.nan, "gamma": np.nan, "q_max": np.nan}
        row["guide"] = "none"
        for name in ("pass_at_1", "net_support_at_8"):
            row.update({name: 0.5, f"{name}_ci_low": 0.4, f"{name}_ci_high": 0.6})
        rows.append(row)
    D.plot(pd.DataFrame(rows), {}, 8, Path("unused.png"))
    (fig,) = figures
    assert fig.axes[0].get_title() == f"pass@1 against net support per method (bars: 95% CI, {words})"
