"""Where runs write by default: inside outputs/, which git ignores, never beside the committed references
(results/paper, results/demo-reference)."""

import subprocess
from pathlib import Path

import pytest

from sage_unsloth.config.args import load_config
from sage_unsloth.runtime import layout

REPO_ROOT = Path(__file__).resolve().parents[2]


def ignored(path: str) -> bool:
    """``git check-ignore`` on a path relative to the checkout (the path need not exist)."""
    done = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO_ROOT, check=False)
    assert done.returncode in (0, 1), f"git check-ignore failed on {path}"
    return done.returncode == 0


def default_result_roots() -> dict[str, str]:
    from sage_unsloth.demo.run import default_dirs
    from sage_unsloth.eval.config import EvalConfig
    from sage_unsloth.jobs.sweep import SweepConfig
    from sage_unsloth.report.config import ReportArguments

    roots = {
        "eval results_dir": EvalConfig.__dataclass_fields__["results_dir"].default,
        "eval outputs_dir": EvalConfig.__dataclass_fields__["outputs_dir"].default,
        "report results": ReportArguments.__dataclass_fields__["results"].default,
        "sweep results_dir": SweepConfig.__dataclass_fields__["results_dir"].default,
        "sweep output_root": SweepConfig.__dataclass_fields__["output_root"].default,
    }
    for quick in (False, True):
        work, results = default_dirs(quick=quick)
        roots[f"demo work (quick={quick})"] = str(work.relative_to(REPO_ROOT))
        roots[f"demo results (quick={quick})"] = str(results.relative_to(REPO_ROOT))
    for config in ("configs/report/default.yaml", "configs/demo/report.yaml"):
        roots[config] = load_config(REPO_ROOT / config)["results"]
    for config in ("configs/sweep/tiny-cpu.yaml", "configs/sweep/qwen2.5-math-7b.yaml"):
        roots[config] = load_config(REPO_ROOT / config)["results_dir"]
    return roots


@pytest.mark.parametrize("name, root", sorted(default_result_roots().items()))
def test_every_default_result_root_is_git_ignored(name, root):
    assert Path(root).parts[0] == layout.OUTPUTS, f"{name}={root} is not under outputs/"
    assert ignored(f"{root}/tiny/sft/passk.csv"), f"{name}={root} would show up in git status"


def test_the_committed_references_are_not_ignored_and_anything_else_under_results_is():
    for tracked in ("results/paper/published_passk.csv", "results/demo-reference/report.md"):
        assert not ignored(tracked), tracked
    for stray in ("results/tiny/sft/passk.csv", "results/report.md", "results/demo/report.md"):
        assert ignored(stray), stray


def test_one_run_name_for_a_method_at_a_seed_and_its_inverse():
    """Every driver names a run <method>_seed<N> (sage_unsloth/runtime/layout.py run_name: the sweep, the demo lab) and
    reads it back with split_run; the names before the one convention are read only where asked (the report)."""
    assert layout.run_name("grpo_branch", 3) == "grpo_branch_seed3" and layout.run_name("sft", None) == "sft"
    for method, seed in [("grpo", 0), ("a_b-tau0.3", 12), ("x_seed1", 2), ("sft", None)]:
        assert layout.split_run(layout.run_name(method, seed)) == (method, seed)
    assert layout.split_run("grpo_s1") == ("grpo_s1", None)  # a method of its own, unless legacy is asked for
    assert layout.split_run("grpo_s1", legacy=True) == ("grpo", 1)
    assert layout.split_run("dapo_full-seed3", legacy=True) == ("dapo_full", 3)
    from sage_unsloth.demo.run import DemoBudget, run_names

    assert run_names(DemoBudget(seeds=(0, 2), methods=("grpo",))) == [
        "sft_seed0",
        "sft_seed2",
        "grpo_seed0",
        "grpo_seed2",
    ]
