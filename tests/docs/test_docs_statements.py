"""The docs say one thing, the same way everywhere (issue 41 item 5).

- What the branch guide does to the pull toward pi_ref: README's method table said "a weaker pull where the
  policy branches", docs/theory.md "anchors harder where the policy is uncertain". The derivation and its
  check are in tests/rlvr/test_branch_pull.py; every place that says it uses the same words: under k3 the guide
  "multiplies the pull toward pi_ref by q_t", under a reverse-KL gradient it "leaves the pull toward pi_ref
  unchanged in expectation", in the reward it "keeps the pull toward pi_ref at full strength".
- "Paper shape" is defined where it is first used, in README and in each page that uses it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
K3 = "multiplies the pull toward pi_ref by q_t"
REVERSE = "pull toward pi_ref unchanged in expectation"
REWARD = "keeps the pull toward pi_ref at full strength"
CONTRADICTED = re.compile(r"weaker pull|anchors harder|weaker anchor", re.IGNORECASE)


def _table_row(text: str, first_cell: str) -> str:
    rows = [line for line in text.splitlines() if line.startswith(f"| {first_cell}")]
    assert len(rows) == 1, (first_cell, rows)
    return rows[0]


def test_readme_methods_table_says_what_the_branch_guide_does():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert K3 in _table_row(readme, "`grpo_branch` (SAGE)")
    assert REWARD in _table_row(readme, "`grpo_branch_reward`")


def test_methods_theory_and_the_guide_page_say_it_the_same_way():
    methods = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    assert K3 in _table_row(methods, "SAGE branch / token / random")
    assert REWARD in _table_row(methods, "SAGE, reward placement")
    theory = (ROOT / "docs" / "theory.md").read_text(encoding="utf-8")
    guide = (ROOT / "docs" / "writing-a-guide.md").read_text(encoding="utf-8")
    for page in (theory, guide):
        assert K3 in page and REVERSE in page and REWARD in page


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "configs").rglob("*branch*.yaml")),
    ids=lambda p: str(p.relative_to(ROOT / "configs")),
)
def test_every_branch_config_says_it_in_its_comment(path):
    comments = " ".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
    comments = " ".join(comments.split())
    reward = "reward" in path.stem
    assert (REWARD if reward else K3) in comments, path.name


def test_nothing_says_the_contradicted_thing():
    pages = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "configs").rglob("*.yaml")),
    ]
    said = [p.name for p in pages if CONTRADICTED.search(p.read_text(encoding="utf-8"))]
    assert not said, said


# The pre-registered plan is a record of what was written before the pilots; it is not edited.
FROZEN = {"lab-plan.md"}
PAPER_SHAPE = re.compile(r"paper[- ]shape", re.IGNORECASE)


@pytest.mark.parametrize(
    "page",
    [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if p.name not in FROZEN],
    ids=lambda p: p.name,
)
def test_paper_shape_is_defined_where_it_is_first_used(page):
    text = page.read_text(encoding="utf-8")
    first = PAPER_SHAPE.search(text)
    if first is None:
        return  # the page does not use the term
    paragraph = text[text.rfind("\n\n", 0, first.start()) + 2 : text.find("\n\n", first.end())]
    assert "gamma 0.3" in paragraph and "tau" in paragraph, (page.name, paragraph[:300])
