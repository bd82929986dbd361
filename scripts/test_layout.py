#!/usr/bin/env python
"""Lays tests/ out by the package's modules: the map below says where each test file lives, and this script
moves the files there (``git mv``, so history follows) and rewrites every path that names one.

    python scripts/test_layout.py            # move what is still flat, rewrite the paths; idempotent
    python scripts/test_layout.py --check    # exit 1 naming each test file the map does not place

A new test file goes in the folder of the module it tests (docs/contributing.md: where a test lives); a
branch that added or edited flat files before the move re-applies the move by running this script again.

What a move rewrites: in the moved file, paths relative to its own folder (``Path(__file__).parents[1]`` is
the repository from tests/, ``parents[2]`` from tests/<area>/; tests/fixtures and tests/data are one level
up); in every tracked text file, ``tests/<old>.py`` becomes ``tests/<new>.py``, and a renamed file's old
module name its new one. Test files import each other and tests/support/ by module name: tests/conftest.py
puts every folder of tests/ on sys.path, so basenames stay unique.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# area -> the test modules it holds (old flat name -> new name, when it changes)
AREAS: dict[str, dict[str, str]] = {
    # stage 2 (sage_unsloth/rlvr/), the SAGE math (plugins/anchor.py) and the plug-ins it runs (plugins/guides.py, plugins/registry.py)
    "rlvr": {
        name: name
        for name in (
            "test_anchor",
            "test_branch_pull",
            "test_dapo",
            "test_estimators",
            "test_exploration",
            "test_exploration_training",
            "test_guide_plugins",
            "test_guides_oracle",
            "test_placement",
            "test_placement_group_constant_q",
            "test_placement_passk",
            "test_plan",
            "test_plugin_args",
            "test_plugin_contract",
            "test_plugin_misbehaviour",
            "test_q_clipping",
            "test_ref_branch",
            "test_registry",
            "test_reward",
            "test_rlvr_data",
            "test_rlvr_multiprocess",
            "test_rlvr_pipeline",
            "test_rlvr_resume",
            "test_rlvr_trainer",
            "test_taps",
            "test_unsloth_path",
            "test_seq_packing",
            "test_examples",
        )
    },
    "sft": {name: name for name in ("test_sft", "test_sft_sample")},
    "eval": {
        name: name
        for name in (
            "test_eval",
            "test_eval_backend_choice",
            "test_eval_backends",
            "test_eval_gradepool_priority",
            "test_eval_prompt_length",
            "test_eval_progress",
            "test_eval_regrade",
            "test_eval_sampler",
            "test_eval_shard",
            "test_eval_wandb",
            "test_lora_serving",
            "test_passk",
        )
    },
    "grading": {
        **{
            name: name
            for name in (
                "test_grading",
                "test_grading_budget",
                "test_grading_cases",
                "test_grading_determinism",
                "test_grading_fuzz",
                "test_grading_hidden",
                "test_grading_hidden_content",
                "test_grading_public_suites",
                "test_grading_regressions",
                "test_grading_shortcut",
                "test_grading_verdicts",
            )
        },
        "test_grading_issue24": "test_grading_error_classes",  # issue 24's error classes, one test each
    },
    "report": {
        name: name
        for name in (
            "test_report",
            "test_report_bootstrap",
            "test_report_palette",
            "test_report_placement",
            "test_report_plots",
            "test_report_support",
            "test_report_wandb_log",
            "test_report_wandb_read",
            "test_report_multi_seed",
            "test_patterns",
            "test_power_plan",
            "test_power",
        )
    },
    # the offline lab (sage_unsloth/demo/), its method cards and the tiny model it trains
    "demo": {
        name: name
        for name in (
            "test_demo",
            "test_demo_compare",
            "test_demo_lab_args",
            "test_demo_steps",
            "test_demo_task",
            "test_lab_coverage",
            "test_lab_frontier",
            "test_lab_intervals",
            "test_lab_numbers",
            "test_lab_claims",
            "test_method_cards",
            "test_plan_metrics",
            "test_tiny_model",
        )
    },
    # `sage-unsloth sweep` and its executors (jobs/sweep.py, jobs/executors/), the recipe driver (jobs/recipe.py)
    "sweep": {name: name for name in ("test_sweep", "test_executors", "test_recipe", "test_jobs")},
    "doctor": {
        "test_doctor": "test_doctor",
        "test_memory_model": "test_memory_model",
        "test_driver": "test_driver",
    },
    # the command line: cli.py, config/args.py, config/schema.py, config/input_checks.py, the configs/ it reads
    "cli": {
        **{
            name: name
            for name in (
                "test_bad_input_before_loading",
                "test_config_args",
                "test_config_loading",
                "test_config_schema",
                "test_configs",
                "test_editor_schema",
                "test_export_checks",
                "test_hub_ids",
                "test_input_errors",
                "test_migrate_configs",
                "test_multi_gpu_configs",
            )
        },
        "test_cli_basics": "test_cli",  # cli.py: abbreviations, --version, env, dry runs, sample, export
    },
    # what every stage shares: checkpoints, manifests, records, logs, faults, lifeline, library contacts, GPU path
    "kit": {
        name: name
        for name in (
            "test_checkpoints",
            "test_compat",
            "test_dependencies",
            "test_finite_steps",
            "test_gpu_acceptance",
            "test_gpu_lock",
            "test_gpu_path",
            "test_interrupt",
            "test_layout",
            "test_lifeline",
            "test_manifest",
            "test_wandb_stages",
            "test_models",
            "test_optional_extras",
            "test_records",
            "test_training_faults",
            "test_training_log",
        )
    },
    # what the kit says: docs, notebooks, the paper's sources, the house rules
    "docs": {
        name: name
        for name in (
            "test_docs_links",
            "test_docs_statements",
            "test_house",
            "test_metric_docs",
            "test_notebooks",
            "test_paper_sources",
            "test_tests_layout",
        )
    },
}

# helpers the tests import (and scenarios they run in a fresh interpreter): tests/support/
SUPPORT = (
    "eval_scenario",
    "exact_expectation",
    "gpu_path_helpers",
    "guide_plugin_scenario",
    "lab_claims",
    "lab_runs",
    "lora_serving_scenario",
    "power_oracle",
    "rlvr_scenario",
    "subprocess_run",
    "unsloth_cpu",
    "unsloth_path_scenario",
    "seq_packing_scenario",
    "wandb_api_standin",
)


def moves() -> dict[str, str]:
    """Old path -> new path, relative to the repository."""
    out = {
        f"tests/{old}.py": f"tests/{area}/{new}.py"
        for area, names in AREAS.items()
        for old, new in names.items()
    }
    out.update({f"tests/{name}.py": f"tests/support/{name}.py" for name in SUPPORT})
    return out


def renamed_modules() -> dict[str, str]:
    return {old: new for names in AREAS.values() for old, new in names.items() if old != new}


# paths a moved file names relative to its own folder (one level deeper now)
OWN_PATHS = (
    (r"Path\(__file__\)\.resolve\(\)\.parents\[1\]", "Path(__file__).resolve().parents[2]"),
    (r"Path\(__file__\)\.parents\[1\]", "Path(__file__).parents[2]"),
    (r'Path\(__file__\)\.with_name\("(fixtures|data)"\)', r'Path(__file__).parents[1].joinpath("\1")'),
    (r'Path\(__file__\)\.parent / "(fixtures|data)"', r'Path(__file__).parents[1] / "\1"'),
)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def move_file(old: str, new: str) -> None:
    (REPO / new).parent.mkdir(parents=True, exist_ok=True)
    git("mv", old, new)
    path = REPO / new
    text = path.read_text()
    for pattern, repl in OWN_PATHS:
        text = re.sub(pattern, repl, text)
    path.write_text(text)


def rewrite_helper_paths(rel: str) -> None:
    """A scenario run by path, or tests/ on a child's PYTHONPATH, in a test file: now tests/support/."""
    path = REPO / rel
    text = path.read_text()
    for helper in SUPPORT:
        text = text.replace(
            f'Path(__file__).with_name("{helper}.py")',
            f'Path(__file__).parents[1].joinpath("support", "{helper}.py")',
        )
        text = text.replace(f'"tests" / "{helper}.py"', f'"tests" / "support" / "{helper}.py"')
    text = text.replace('str(REPO / "tests")]', 'str(REPO / "tests" / "support")]')
    names = (
        renamed_modules()
    )  # `from tests.test_x import` (tests/ as a package): by module name, as the others
    text = re.sub(
        r"\bfrom tests\.(\w+) import", lambda m: f"from {names.get(m.group(1), m.group(1))} import", text
    )
    path.write_text(text)


def rewrite_references(mapping: dict[str, str]) -> list[str]:
    """Every tracked text file: tests/<old>.py -> tests/<new>.py; a renamed module's name -> its new one."""
    paths = {re.escape(old): new for old, new in mapping.items()}
    path_re = re.compile(r"(?<![\w/])(" + "|".join(paths) + r")") if paths else None
    names = renamed_modules()
    name_re = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b") if names else None
    changed = []
    for rel in git("ls-files", "-z").split("\0"):
        path = REPO / rel
        if (
            not rel
            or not path.is_file()
            or path.is_symlink()
            or rel.startswith(("results/", "tests/fixtures/"))
            or rel == "scripts/test_layout.py"  # the map itself names the old files
        ):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        new = path_re.sub(lambda m: mapping[m.group(1)], text) if path_re else text
        new = name_re.sub(lambda m: names[m.group(1)], new) if name_re else new
        if new != text:
            path.write_text(new)
            changed.append(rel)
    return changed


def tidy(paths: list[str]) -> None:
    """Imports sorted and lines wrapped again where a rewrite moved them (the kit's ruff, when it is there)."""
    ruff = REPO / ".venv" / "bin" / "ruff"
    ruff_cmd = [str(ruff)] if ruff.exists() else [sys.executable, "-m", "ruff"]
    for args in (["check", "--select", "I", "--fix", "--quiet"], ["format", "--quiet"]):
        subprocess.run([*ruff_cmd, *args, *paths], cwd=REPO, check=False)


def unplaced() -> list[str]:
    placed = set(moves().values()) | {"tests/conftest.py"}
    return sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("*.py")
        if "fixtures" not in p.parts and "data" not in p.parts and str(p.relative_to(REPO)) not in placed
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--check", action="store_true", help="only list the test files the map does not place"
    )
    args = parser.parse_args(argv)
    if not args.check:
        mapping = {old: new for old, new in moves().items() if (REPO / old).is_file()}
        for old, new in mapping.items():
            move_file(old, new)
        for rel in moves().values():
            if (REPO / rel).is_file():
                rewrite_helper_paths(rel)
        for rel in rewrite_references(moves()):
            print(f"rewrote paths in {rel}")
        tidy([rel for rel in moves().values() if (REPO / rel).is_file()])
        print(f"moved {len(mapping)} files")
    missing = unplaced()
    for rel in missing:
        print(
            f"error: {rel} is in no area of scripts/test_layout.py: add it to AREAS (or SUPPORT)",
            file=sys.stderr,
        )
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
