"""Numbers in the lab's prose come from its CSVs (issues 28 and 39).

- Every ``<!-- lab-outcome:begin results/<folder> -->`` ... ``<!-- lab-outcome:end -->`` block in README.md
  and docs/lab.md must equal the block sage_unsloth.demo.outcome writes from that folder's lab/pairs.csv
  (``python -m sage_unsloth.demo.outcome --update README.md docs/lab.md`` rewrites them); at least one
  such block must exist.
- Every decimal number and percentage elsewhere in README.md's lab section and docs/lab.md's outcome section is
  **tied to its row** (issue 39): a tag ``<!-- n results/<folder>/<file>.csv key=value ...: col col -->`` names
  the CSV, the row (every key=value must hold in exactly one row) and the columns, and the numbers that follow
  it (before the next tag) must be those cells in order, at the precision written (a percentage: the share x
  100; an unsigned number: either sign). The visible sentence around them must name the row: its beta
  ("beta 1"), its k ("pass@64" or "k = 64"), its draw ("draw 1") and its methods (the words GRPO, Branch, SFT,
  no KL of the row's labels). A number moved to another row, or a sentence moved to another beta, fails.
- Other sections of docs/lab.md (the earlier labs) keep the weaker check: a value of a CSV the page names.
"""

import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sage_unsloth.demo import frontier, outcome

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"README.md": "## The offline demo", "docs/lab.md": "## Outcome"}
NUMBER = re.compile(r"(?<![\w.^])(?P<sign>[-+\u2212]?)(?P<digits>\d+\.\d+)(?P<pct>%?)")
# what a tag's cells are read from: decimals and percentages (bare integers are counts and labels: not read)
CITED = re.compile(r"(?<![\w.^@=])(?P<sign>[-+\u2212]?)(?P<digits>\d+\.\d+|\d+(?=%))(?P<pct>%?)")
TAG = re.compile(r"<!-- n (?P<path>\S+\.csv)(?P<keys>[^:]*): (?P<cols>[^>]*?) -->")
CLAIM = re.compile(r"<!-- claim .*? -->")  # a sentence's claim (tests/demo/test_lab_claims.py): not prose
GENERATED = (outcome.BLOCK, frontier.BLOCK, CLAIM)
# the lab's own tables only: per-problem files hold thousands of values, so any number would match one
TABLE_DIRS = ("lab", "analysis", "frontier")
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


def test_every_frontier_block_equals_its_frontier_regenerated():
    """README.md / docs/lab.md embed the frontier's outcome.md between frontier-outcome markers; each must be what
    sage_unsloth.demo.frontier writes from that folder's CSVs today (frontier.update_text rewrites them)."""
    found = 0
    for name in SECTIONS:
        for match in frontier.BLOCK.finditer((ROOT / name).read_text()):
            found += 1
            assert match.group(0) == frontier.update_text(match.group(0), ROOT), (
                f"{name}: the frontier block of {match['folder']} differs from its CSVs"
            )
    assert found, "README.md / docs/lab.md: no <!-- frontier-outcome:begin results/<folder> --> block"


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


def _strip_generated(text: str) -> str:
    for block in GENERATED:
        text = block.sub("", text)
    return text


def matches(written: re.Match, value: float) -> bool:
    """Whether a number as written (sign, digits, percent) is ``value`` at the precision written."""
    digits, pct, sign = written["digits"], written["pct"], written["sign"]
    places = (len(digits.split(".")[1]) if "." in digits else 0) + (2 if pct else 0)
    x = float(digits) / (100 if pct else 1)
    tol = 0.5 * 10.0**-places + 1e-9
    signs = (1.0,) if sign == "+" else (-1.0,) if sign in "-\u2212" and sign else (-1.0, 1.0)
    return any(abs(value - s * x) <= tol for s in signs)


def _key_value(cell, wanted: str) -> bool:
    try:
        return abs(float(cell) - float(wanted)) <= 1e-9
    except (TypeError, ValueError):
        return str(cell) == wanted


LABEL_WORDS = (("no KL", ("no KL", "no-KL")), ("Branch", ("Branch",)), ("SFT", ("SFT",)))


def label_words(label: str) -> list[tuple[str, ...]]:
    """What a sentence must say to name a row's method: each of GRPO / Branch / SFT / no KL its label holds (GRPO
    only when it is not a Branch or no-KL arm, whose prose reads 'Branch' and 'no-KL'), and its beta."""
    need = [alts for word, alts in LABEL_WORDS if word in label]
    if "GRPO" in label and not need:
        need.append(("GRPO",))
    beta = re.search(r"beta (\d+(?:\.\d+)?)", label)
    if beta:
        need.append((f"beta {beta[1]}", f"β = {beta[1]}", f"β={beta[1]}"))
    return need


def required_mentions(keys: dict[str, str], row: pd.Series) -> list[tuple[str, ...]]:
    """Per tag key, the words the sentence must hold (any of each tuple)."""
    need = []
    for key, value in keys.items():
        if key == "beta":
            need.append((f"beta {float(value):g}", f"β = {float(value):g}"))
        elif key in ("k",):
            need.append((f"pass@{int(float(value))}", f"k = {int(float(value))}"))
        elif key == "metric":
            need.append((value, value.replace("pass@", "k = ")))
        elif key == "draw" and value != "pooled":
            need.append((f"draw {value}",))
    for side in ("a", "b", "arm"):  # the row's methods, by their labels (lab/pairs.csv: a_label; frontier: a)
        label = row.get(f"{side}_label", row.get(side))
        if isinstance(label, str):
            need += [w for w in label_words(label) if w not in need]
    return need


def sentence_at(text: str, start: int, end: int) -> str:
    """The sentence of ``text`` (tags removed) that holds [start, end): bounded by '. ', '; ', a blank line or a
    list item."""
    bounds = (
        [0]
        + [m.end() for m in re.finditer(r"(?<=[.;])\s+(?=[A-Z*(])|\n\s*\n|\n- |\n  - ", text)]
        + [len(text)]
    )
    lo = max(b for b in bounds if b <= start)
    hi = min((b for b in bounds if b >= end), default=len(text))
    return TAG.sub("", text[lo:hi])


def check_tags(text: str, root: Path = ROOT) -> list[str]:
    """Every decimal or percentage of ``text`` (generated blocks removed) must be read by a tag from the row and
    columns it names, in a sentence that names that row. Returns the problems found (empty: all tied)."""
    text = _strip_generated(text)
    problems, consumed = [], set()
    tags = list(TAG.finditer(text))
    for i, tag in enumerate(tags):
        path = root / tag["path"]
        if not path.is_file():
            problems.append(f"{tag.group(0)}: no file {tag['path']}")
            continue
        frame = pd.read_csv(path, comment="#", keep_default_na=False, na_values=[""])
        keys = dict(item.split("=", 1) for item in shlex.split(tag["keys"]))
        rows = frame[
            np.logical_and.reduce([frame[k].map(lambda c, v=v: _key_value(c, v)) for k, v in keys.items()])
        ]
        if len(rows) != 1:
            problems.append(f"{tag.group(0)}: {len(rows)} rows match, not 1")
            continue
        row = rows.iloc[0]
        columns = tag["cols"].split()
        stop = tags[i + 1].start() if i + 1 < len(tags) else len(text)
        numbers = list(CITED.finditer(text, tag.end(), stop))[: len(columns)]
        if len(numbers) < len(columns):
            problems.append(f"{tag.group(0)}: {len(columns)} columns but {len(numbers)} numbers follow")
        for number, column in zip(numbers, columns):
            consumed.add(number.start())
            if not matches(number, float(row[column])):
                problems.append(f"{tag.group(0)}: {number.group(0)} is not {column} = {row[column]}")
        if numbers:
            sentence = sentence_at(text, tag.start(), numbers[-1].end())
            for alternatives in required_mentions(keys, row):
                if not any(a in sentence for a in alternatives):
                    problems.append(
                        f"{tag.group(0)}: the sentence does not name {alternatives[0]!r}: {sentence.strip()[:160]!r}"
                    )
    visible = TAG.sub(lambda m: " " * len(m.group(0)), text)
    for number in CITED.finditer(visible):
        if number.start() not in consumed:
            problems.append(
                f"untied number {number.group(0)!r}: {visible[max(0, number.start() - 60) : number.end() + 20]!r}"
            )
    return problems


def tied_sections() -> list[tuple[str, str]]:
    """(page, section): README's lab section and every section of docs/lab.md whose heading starts '## Outcome'."""
    out = []
    for name, heading in SECTIONS.items():
        text = (ROOT / name).read_text()
        for match in re.finditer(f"^{re.escape(heading)}", text, re.MULTILINE):
            out.append((name, section(text[match.start() :], heading)))
    return out


@pytest.mark.parametrize(("name", "text"), tied_sections(), ids=lambda x: x if len(x) < 40 else "")
def test_every_number_in_the_lab_prose_is_tied_to_the_row_its_sentence_names(name, text):
    problems = check_tags(text)
    assert not problems, f"{name} ({text.splitlines()[0]}):\n" + "\n".join(problems)


def test_the_other_lab_sections_quote_values_of_the_csvs_they_name():
    """docs/lab.md outside its outcome: the earlier labs, checked the weaker way (a value of a CSV it names)."""
    text = (ROOT / "docs/lab.md").read_text()
    outcome_section = section(text, SECTIONS["docs/lab.md"])
    rest = _strip_generated(text.replace(outcome_section, ""))
    rest = TAG.sub("", rest)
    for heading in ("## The confirmatory lab", "## The earlier 3-seed lab"):
        part = section(rest, heading)
        folders = sorted(
            {m["name"] for m in FOLDER.finditer(part) if (ROOT / "results" / m["name"]).is_dir()}
        )
        assert folders, heading
        missing = unmatched(part, csv_values(folders))
        assert not missing, f"docs/lab.md ({heading}): numbers in no CSV of {folders}: {missing}"


def test_a_number_moved_to_another_row_or_sentence_fails_the_tie(tmp_path):
    """The checker's own mutation test on a small table: each way of quoting the wrong row is caught."""
    folder = tmp_path / "results" / "lab"
    folder.mkdir(parents=True)
    pd.DataFrame(
        {
            "a": ["Branch, beta 1", "Branch, beta 2"],
            "b": ["GRPO, beta 1", "GRPO, beta 2"],
            "beta": [1.0, 2.0],
            "metric": ["pass@64", "pass@64"],
            "diff": [0.004, -0.021],
            "share": [0.12, 0.30],
        }
    ).to_csv(folder / "paired.csv", index=False)
    tag = "<!-- n results/lab/paired.csv beta={b} metric=pass@64: diff share -->"
    good = f"At beta 1, Branch - GRPO at pass@64 is {tag.format(b=1)}+0.004, 12% of GRPO's loss."
    assert check_tags(good, tmp_path) == []
    moved_number = good.replace("+0.004", "-0.021")  # the beta-2 row's number under the beta-1 tag
    assert any("is not diff" in p for p in check_tags(moved_number, tmp_path))
    moved_tag = good.replace(
        tag.format(b=1), tag.format(b=2)
    )  # the tag points at beta 2, the sentence says 1
    problems = check_tags(moved_tag, tmp_path)
    assert any("is not diff" in p for p in problems) and any("'beta 2'" in p for p in problems)
    wrong_sentence = f"At beta 2, Branch - GRPO at pass@64 is {tag.format(b=1)}+0.004, 12% of GRPO's loss."
    assert any("'beta 1'" in p for p in check_tags(wrong_sentence, tmp_path))
    untied = good + " GRPO at beta 2 loses 0.021."
    assert any("untied number" in p for p in check_tags(untied, tmp_path))
    no_method = f"At beta 1 at pass@64 the difference is {tag.format(b=1)}+0.004, 12% of the loss."
    assert any("'Branch'" in p for p in check_tags(no_method, tmp_path))


def test_the_checker_catches_a_number_that_is_not_in_the_csvs():
    values = np.array([-0.043, 0.047, 0.6040625])
    assert unmatched("net \u22120.043, lost 4.7%, pass@1 0.60", values) == []
    assert unmatched("net +0.043, lost 4.4%, pass@1 0.61", values) == ["+0.043", "4.4%", "0.61"]
