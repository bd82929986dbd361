"""scripts/migrate_configs.py: configs in the flat spelling (sage_guide, sage_gamma, kl_estimator, passk_k, ...) are
rewritten to one node per plug-in, with what their base: chain set folded in (a node replaces its base's whole),
comments and other keys kept, idempotent; --check names what is still flat."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "migrate_configs.py"

OLD_BASE = """\
# the lab's base, in the flat spelling
backend: trl
sage_guide: none
sage_q_min: 0.6
sage_q_max: 1.4
sage_gamma: 0.3
sage_tau: 1.2
kl_estimator: k3
beta: 0.05
"""
OLD_BRANCH = """\
# GRPO + Branch
base: _base.yaml
variant: grpo_branch
sage_guide: branch          # the paper's guide
sage_gamma: 0.8
sage_tau: 0.5
lab:  # the card
  label: GRPO + Branch
"""


def _script():
    spec = importlib.util.spec_from_file_location("migrate_configs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _migrate(*files: Path, check: bool = False):
    """The script's main in this process: (exit status, what it printed)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = _script().main([*(["--check"] if check else []), *map(str, files)])
    return SimpleNamespace(returncode=code, stdout=out.getvalue())


def _parse(path: Path):
    from sage_unsloth.rlvr.run import parse_args

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_args([str(path), "--output_dir", str(path.parent / "out")])[0]


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("configs")
    (folder / "_base.yaml").write_text(OLD_BASE)
    (folder / "grpo_branch.yaml").write_text(OLD_BRANCH)
    (folder / "tau08.yaml").write_text("base: grpo_branch.yaml\nsage_tau: 0.8\n")  # a flat knob over a node
    (folder / "token.yaml").write_text("base: grpo_branch.yaml\nsage_guide: token\nsage_schedule_cycles: 3\n")
    (folder / "mine.py").write_text(
        "def g(signals, *, gamma: float = 0.1):\n    return 1 + 0 * signals.mask\n"
    )
    (folder / "mine.yaml").write_text(
        "base: _base.yaml\nsage_guide: mine.py:g\nsage_guide_args: {gamma: 0.7}\nsage_q_max: 2.0\n"
        "advantage_estimator: passk\npassk_k: 2\npolicy_term: clip_cov\nclip_cov_lb: 0.5\nkl_estimator: k2\n"
    )
    files = sorted(folder.glob("*.yaml"))
    first = _migrate(*files)
    texts = {p.name: p.read_text() for p in files}
    second = _migrate(*files)
    return folder, first, second, texts


def test_the_flat_spelling_becomes_one_node_per_plug_in(migrated):
    _, first, _, texts = migrated
    assert first.returncode == 0, first.stdout
    own = {name: yaml.safe_load(text) for name, text in texts.items()}
    assert (own["_base.yaml"]["guide"], own["_base.yaml"]["kl_term"]) == ("none", "k3")  # no guide: no knobs
    assert own["grpo_branch.yaml"]["guide"] == {"name": "branch", "gamma": 0.8, "tau": 0.5}
    # the child's node holds its base's knobs too (a node replaces the base's whole)
    assert own["tau08.yaml"]["guide"] == {"name": "branch", "gamma": 0.8, "tau": 0.8}
    assert own["token.yaml"]["guide"] == {"name": "token", "cycles": 3}  # the branch knobs do not apply
    assert own["mine.yaml"]["guide"] == {"name": "mine.py:g", "gamma": 0.7, "q_max": 2.0}
    assert own["mine.yaml"]["advantage_estimator"] == {"name": "passk", "k": 2}
    assert (own["mine.yaml"]["policy_term"], own["mine.yaml"]["kl_term"]) == (
        {"name": "clip_cov", "lb": 0.5},
        "k2",
    )
    # only the old keys' lines changed: comments, the lab card and the other keys stay where they were
    assert texts["grpo_branch.yaml"] == (
        "# GRPO + Branch\nbase: _base.yaml\nvariant: grpo_branch\n"
        "guide: {name: branch, gamma: 0.8, tau: 0.5}  # the paper's guide\n"
        "lab:  # the card\n  label: GRPO + Branch\n"
    )


def test_the_migrated_configs_parse_to_the_same_methods(migrated):
    folder, *_ = migrated
    branch = _parse(folder / "grpo_branch.yaml")
    assert branch.guide == {"name": "branch", "gamma": 0.8, "tau": 0.5, "q_min": 0.6, "q_max": 1.4}
    assert (
        _parse(folder / "tau08.yaml").guide["tau"] == 0.8
        and _parse(folder / "_base.yaml").guide["name"] == "none"
    )


def test_the_migration_is_idempotent_and_check_names_what_is_flat(migrated, tmp_path):
    folder, _, second, texts = migrated
    assert second.returncode == 0 and second.stdout == ""  # nothing left to rewrite
    assert {p.name: p.read_text() for p in folder.glob("*.yaml")} == texts
    assert _migrate(*folder.glob("*.yaml"), check=True).returncode == 0
    old = tmp_path / "old.yaml"
    old.write_text(OLD_BASE)
    result = _migrate(old, check=True)
    assert result.returncode == 1 and "sage_guide, sage_q_min" in result.stdout
    assert old.read_text() == OLD_BASE  # --check changes nothing


def test_a_sweep_s_executor_section_becomes_executor_settings(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "configs: [a.yaml]\nexecutor: slurm\nslurm:\n  partition: gpu  # ours\nray: {address: auto}\n"
    )
    assert _migrate(sweep, check=True).returncode == 1
    assert _migrate(sweep).returncode == 0
    assert sweep.read_text() == (
        "configs: [a.yaml]\nexecutor: slurm\nexecutor_settings:\n  partition: gpu  # ours\n"
        "# (executor ray) ray: {address: auto}\n"
    )
    assert _migrate(sweep, check=True).returncode == 0


def test_every_shipped_config_is_in_the_node_spelling():
    """configs/, examples/, the tests' YAML and the docs' inline configs: nothing left for the lead to migrate."""
    result = _migrate(check=True)
    assert result.returncode == 0, result.stdout
