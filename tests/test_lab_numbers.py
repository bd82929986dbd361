"""Numbers in the lab's prose come from its CSVs (issue 28).

- Every ``<!-- lab-outcome:begin results/<folder> -->`` ... ``<!-- lab-outcome:end -->`` block in README.md
  and docs/lab.md must equal the block sage_unsloth.demo.outcome writes from that folder's lab/pairs.csv
  (``python -m sage_unsloth.demo.outcome --update README.md docs/lab.md`` rewrites them); at least one
  such block must exist.
- Every decimal number elsewhere in README.md's lab section and docs/lab.md's outcome section must be a
  value of a CSV under a results folder that section names (``results/<folder>/``), at the precision written
  (a percentage: the share x 100; an unsigned number: either sign).
"""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sage_unsloth.demo import outcome

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {"README.md": "## The offline demo", "docs/lab.md": "## Outcome"}
NUMBER = re.compile(r"(?<![\w.^])(?P<sign>[-+\u2212]?)(?P<digits>\d+\.\d+)(?P<pct>%?)")
# the lab's own tables only: per-problem files hold thousands of values, so any number would match one
TABLE_DIRS = ("lab", "analysis")
PER_RUN = ("runs.csv", "strategies.csv")  # one row per run: prose quotes methods, not single runs
FOLDER = re.compile(r"results/(?P<name>[\w.-]+)/")


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def csv_values(folders) -> np.ndarray:
    values = []
    for folder in folders:
        for path in sorted(
            p
            for sub in TABLE_DIRS
            for p in (ROOT / "results" / folder / sub).glob("*.csv")
            if p.name not in PER_RUN
        ):
            frame = pd.read_csv(path, comment="#")
            values.append(frame.select_dtypes("number").to_numpy(dtype=float).ravel())
    values = np.concatenate(values) if values else np.array([])
    return np.sort(values[np.isfinite(values)])


def unmatched(text: str, values: np.ndarray) -> list[str]:
    """The numbers of ``text`` that no value of ``values`` rounds to."""
    missing = []
    for match in NUMBER.finditer(text):
        digits, pct = match["digits"], match["pct"]
        places = len(digits.split(".")[1]) + (2 if pct else 0)
        x = float(digits) / (100 if pct else 1)
        signs = (-1.0, 1.0) if not match["sign"] or pct else ((1.0,) if match["sign"] == "+" else (-1.0,))
        tol = 0.5 * 10.0**-places + 1e-9
        if not any(
            np.any(np.abs(values - s * x) <= tol) or (x == 0 and np.any(np.abs(values) <= tol)) for s in signs
        ):
            missing.append(match.group(0))
    return missing


def blocks():
    found = []
    for name in SECTIONS:
        for match in outcome.BLOCK.finditer((ROOT / name).read_text()):
            found.append((name, match["folder"], match["body"]))
    return found


def test_there_is_a_marked_outcome_block_and_each_equals_its_lab_regenerated():
    found = blocks()
    assert found, "README.md / docs/lab.md: no <!-- lab-outcome:begin results/<folder> --> block"
    for name, folder, body in found:
        assert body == outcome.outcome_block(ROOT / folder / "lab"), (
            f"{name}: the block of {folder} differs from its CSVs: run "
            "python -m sage_unsloth.demo.outcome --update README.md docs/lab.md"
        )


LABS = sorted(
    p.parent.parent.name
    for p in (ROOT / "results").glob("*/lab/pairs.csv")
    if "mde" in pd.read_csv(p, nrows=0).columns
)


@pytest.mark.parametrize("folder", LABS)
def test_every_number_of_a_generated_outcome_is_in_its_csvs(folder):
    text = outcome.outcome_block(ROOT / "results" / folder / "lab")
    assert not unmatched(text, csv_values([folder]))


def test_the_labs_with_the_new_columns_include_a_committed_one():
    assert LABS, "no results/*/lab/pairs.csv with an mde column"


@pytest.mark.parametrize("name", SECTIONS)
def test_every_number_in_the_lab_prose_is_in_the_csvs_it_names(name):
    text = section((ROOT / name).read_text(), SECTIONS[name])
    prose = outcome.BLOCK.sub("", text)  # the blocks are checked whole above
    folders = sorted({m["name"] for m in FOLDER.finditer(text) if (ROOT / "results" / m["name"]).is_dir()})
    assert folders, f"{name}: the section names no results/<folder>/"
    missing = unmatched(prose, csv_values(folders))
    assert not missing, f"{name} ({SECTIONS[name]}): numbers in no CSV of {folders}: {missing}"


def test_the_checker_catches_a_number_that_is_not_in_the_csvs():
    values = np.array([-0.043, 0.047, 0.6040625])
    assert unmatched("net \u22120.043, lost 4.7%, pass@1 0.60", values) == []
    assert unmatched("net +0.043, lost 4.4%, pass@1 0.61", values) == ["+0.043", "4.4%", "0.61"]
