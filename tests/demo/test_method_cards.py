"""A lab method is one YAML file (sage_unsloth/config/method_cards.py): its lab: block carries its label, colour, place,
pairs and sets; no .py file of the kit names a lab method; adding a method is adding one file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sage_unsloth.config.args import load_config
from sage_unsloth.config.method_cards import CONFIGS_ENV, KIT_DEMO_CONFIGS, read_card, read_cards

REPO = Path(__file__).resolve().parents[2]
# The lab's own code: here no method file's stem may appear at all, not even in a docstring.
LAB_CODE = ("sage_unsloth/demo/", "sage_unsloth/report/palette.py", "sage_unsloth/config/method_cards.py")
# Lab method names that are also the names of other things of the kit, which the rest of the code may name:
# TRL's loss type and the kit's default advantage estimator; the presets' and the notebook's variant.
ALSO_KIT_NAMES = {"grpo", "grpo_branch"}


def stem_hits(stems, files) -> list[str]:
    """``file:line name`` for every whole-name occurrence of a stem in the files (a stem may hold a dot)."""
    hits = []
    for path in files:
        text = path.read_text()
        for stem in stems:
            for match in re.finditer(rf"(?<![\w.]){re.escape(stem)}(?!\w)", text):
                where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
                hits.append(f"{where}:{text.count(chr(10), 0, match.start()) + 1} {stem}")
    return hits


def kit_python_files() -> list[Path]:
    return sorted((REPO / "sage_unsloth").rglob("*.py"))


def test_no_python_file_of_the_kit_names_a_lab_method():
    from sage_unsloth.plugins.advantages import ADVANTAGE_ESTIMATORS
    from sage_unsloth.rlvr.config import LOSS_TYPES

    assert "grpo" in LOSS_TYPES and "grpo" in ADVANTAGE_ESTIMATORS.names()  # why ALSO_KIT_NAMES may appear
    assert (REPO / "configs" / "rlvr" / "qwen2.5-math-7b" / "grpo_branch.yaml").is_file()
    stems = [p.stem for p in KIT_DEMO_CONFIGS.glob("*.yaml") if read_card(p) is not None]
    stems += [p.stem for p in KIT_DEMO_CONFIGS.glob("_*.yaml")]  # the methods' shared base too
    assert len(stems) > 10 and ALSO_KIT_NAMES <= set(stems)
    lab_code = [p for p in kit_python_files() if p.relative_to(REPO).as_posix().startswith(LAB_CODE)]
    others = [p for p in kit_python_files() if p not in lab_code]
    assert len(lab_code) > 15
    hits = stem_hits(stems, lab_code) + stem_hits(set(stems) - ALSO_KIT_NAMES, others)
    assert not hits, f"lab method names in the kit's code (give the method file a lab: key instead): {hits}"


def test_the_grep_sees_a_name_put_back(tmp_path):
    """The check above finds a name in code, a docstring or a comment, dotted names included."""
    source = tmp_path / "x.py"
    source.write_text(
        'NAMES = ("grpo_nokl",)  # grpo_beta0.2\nfile = "grpo_fkl.yaml"\nother = "grpo_nokl_x" + "x.grpo_fkl"\n'
    )
    hits = stem_hits(["grpo_nokl", "grpo_beta0.2", "grpo_fkl"], [source])
    assert hits == ["x.py:1 grpo_nokl", "x.py:1 grpo_beta0.2", "x.py:2 grpo_fkl"]


NEW_METHOD = """\
# a method of one's own: one file
base: _grpo_base.yaml
variant: grpo_mine
beta: 0.1
lab:
  label: GRPO, my beta
  colour: "#123456"
  order: 4.5
  compare_with: [sft, grpo_branch]
  sets: [default, mine]
"""


@pytest.mark.slow  # a subprocess that imports the runner
def test_adding_a_method_is_adding_one_yaml_file(tmp_path):
    folder = tmp_path / "demo"
    shutil.copytree(KIT_DEMO_CONFIGS, folder)
    (folder / "grpo_mine.yaml").write_text(NEW_METHOD)
    (folder / "plain.yaml").write_text(
        "base: _grpo_base.yaml\nvariant: plain\nbeta: 0.3\nlab: {label: Plain}\n"
    )
    code = """if True:
        import json
        from pathlib import Path
        from sage_unsloth.demo.run import DEFAULT_METHODS, GROUPS, METHOD_BY_NAME, QUICK, build_steps, lab_pairs
        from sage_unsloth.report import palette
        steps = {s.name: s for s in build_steps(QUICK, Path("w"), Path("r"), None)}
        print(json.dumps({
            "methods": list(QUICK.methods),
            "labels": {n: m.label for n, m in METHOD_BY_NAME.items()},
            "colours": {n: palette.colour(n + "_seed3") for n in ("grpo_mine", "plain")},
            "hashed": palette.hashed_colour("plain"),
            "pairs": lab_pairs(QUICK),
            "default": list(DEFAULT_METHODS),
            "mine": list(GROUPS["mine"]),
            "config": [str(p) for p in steps["grpo_mine_seed0"].configs],
        }))
    """
    env = dict(os.environ, **{CONFIGS_ENV: str(folder)}, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=REPO
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    kit = [c.name for c in read_cards(KIT_DEMO_CONFIGS)]
    at = kit.index("grpo_branch") + 1  # order 4.5: after the fourth method, before the fifth
    assert seen["methods"] == [*kit[:at], "grpo_mine", *kit[at:], "plain"]  # files without an order go last
    assert seen["labels"]["grpo_mine"] == "GRPO, my beta" and seen["labels"]["plain"] == "Plain"
    assert seen["colours"] == {"grpo_mine": "#123456", "plain": seen["hashed"]}
    pairs = [tuple(p) for p in seen["pairs"]]
    assert ("grpo_mine", "sft") in pairs and ("grpo_mine", "grpo_branch") in pairs
    assert [p for p in pairs if p[0] == "plain"] == [
        ("plain", "sft"),
        ("plain", "grpo"),
    ]  # SFT and the control
    assert pairs[-2:] == [("plain", "sft"), ("plain", "grpo")]  # unplaced pairs come after the placed ones
    assert "grpo_mine" in seen["default"] and seen["mine"] == ["grpo_mine"]
    assert seen["config"][0] == str(folder / "grpo_mine.yaml")


def test_the_stages_never_see_the_lab_block():
    from sage_unsloth.demo.run import resolve_method_config

    path = KIT_DEMO_CONFIGS / "grpo_branch_reward.yaml"  # and its base grpo_branch.yaml: both have a card
    assert "lab" not in load_config(path)
    assert "lab" not in resolve_method_config(path)[0]


@pytest.mark.parametrize(
    ("block", "named"),
    [
        ("{colour: '#000000'}", "label"),
        ("{label: X, colour: red}", "colour"),
        ("{label: X, colur: '#000000'}", "colur"),
        ("{label: X, role: boss}", "role"),
        ("{label: X, compare_with: sft}", "compare_with"),
        ("{label: X, order: first}", "order"),
    ],
)
def test_a_bad_card_is_one_line_naming_the_key(tmp_path, block, named):
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: x.yaml\nlab: {block}\n")
    with pytest.raises(ValueError, match=rf"mine.yaml: lab: {named}: ") as caught:
        read_card(path)
    assert "\n" not in str(caught.value)


def test_a_role_belongs_to_one_method(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text("lab: {label: X, role: control}\n")
    with pytest.raises(ValueError, match="role control is held by a, b"):
        read_cards(tmp_path)


# The committed labs whose pairs the runner chose (demo-pilot-grid's grid cells were paired by hand).
RUNNER_PAIRED_LABS = (
    "demo-reference",
    "demo-baselines",
    "demo-pilot-beta",
    "demo-confirm",
    "demo-frontier-pilot",
)


@pytest.mark.parametrize("lab", RUNNER_PAIRED_LABS)
def test_the_method_files_pair_the_methods_as_the_committed_labs_did(lab):
    """The cards' compare_with places give each committed lab's comparisons in the order its pairs.csv has."""
    from dataclasses import replace

    import pandas as pd

    from sage_unsloth.demo.run import FULL, lab_pairs

    folder = REPO / "results" / lab
    methods = tuple(json.loads((folder / "demo_budget.json").read_text())["methods"])
    table = pd.read_csv(folder / "lab" / "pairs.csv")
    assert lab_pairs(replace(FULL, methods=methods)) == list(dict.fromkeys(zip(table["a"], table["b"])))
