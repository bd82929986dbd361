"""Every qualitative sentence of the lab is a claim the CSVs check (issue 50): tests/support/lab_claims.py's
predicates, named in ``<!-- claim ... -->`` tags before the words.

- every claim tag in README.md and docs/lab.md holds on the committed CSVs;
- every sentence of README's lab section and of every section of docs/lab.md (but those UNCHECKED names, with
  why) that makes a qualitative claim (an ordering, inside / outside an interval, a sign in every draw, "moves",
  "replicates", "rejects", ...: the words of QUALITATIVE, outside quotes and code) carries a claim tag, or names
  the test that asserts it (``<!-- tested FILE::TEST -->``, a claim about a simulation or the kit's maths);
- every ``tested`` tag names a test function that exists;
- every claim tag can fail: for each, an edit of its CSV that makes the claim false (lab_claims.falsify) makes the
  tag fail, so a CSV that stops supporting a sentence fails the suite;
- the committed MDEs and seed projections of a multi-draw lab are recomputed from its seeds.csv (the power by a
  bisection on the noncentral t written here, the projection by brute force).
"""

import math
import re
from pathlib import Path

import lab_claims as C
import numpy as np
import pandas as pd
import pytest
from power_oracle import exact_mde
from test_lab_numbers import section

from sage_unsloth.demo import frontier, outcome

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/lab.md")
# the words that make a sentence a claim about the data (a sentence holding one needs a claim tag)
QUALITATIVE = re.compile(
    r"\b(within|inside|outside|exclud\w*|includ\w*|same (?:way|direction|sign)|every draw|both draws|"
    r"all (?:two|three) draws|mov(?:e|es|ed|ing)|replicat\w*|reject\w*|heard|rules? out|ruled out|surviv\w*|"
    r"rises?|falls?|higher|lower|fewer|above 0|below 0|positive|negative|collapse[sd]?|ceiling|meets|reached|"
    r"keeps? more|loses?|gains?)\b",
    re.IGNORECASE,
)
BOUNDARY = re.compile(r"(?<=[.;:])\s+(?=[A-Z*(\[])|\n\s*\n|\n- |\n  - ")
GENERATED = (outcome.BLOCK, frontier.BLOCK)
TAG_LINE = re.compile(r"<!-- (?:claim|n|tested) .*? -->\n?[ \t]*")  # a tag with its line break: no blank line
# quoted words (a console line, a reading's name) and code are not the page's claims
QUOTED = re.compile(r'"(?:[^"\n]|\n(?!\s*\n)){1,200}"|`[^`\n]+`')  # a quote may wrap, not cross a paragraph
# docs/lab.md sections whose sentences are not claims this suite can check, and why (each must exist)
UNCHECKED = {
    "## Running it": "how-to: its commands run in tests/demo/test_demo.py; no result is stated",
    "## The regime and the pilot that chose it": (
        "the one-seed regime pilot of 2026-12-01, whose runs were not committed (the section says so): its "
        "figures are its console output's, not a CSV's"
    ),
}


def checked_sections() -> list[tuple[str, str]]:
    """(page, text): README's lab section and every section of docs/lab.md but UNCHECKED's, generated blocks out."""
    readme = (ROOT / "README.md").read_text()
    found = [("README.md", section(readme, "## The offline demo"))]
    lab = (ROOT / "docs/lab.md").read_text()
    for match in re.finditer(r"^## .*$", lab, re.MULTILINE):
        if not any(match.group(0).startswith(heading) for heading in UNCHECKED):
            found.append(("docs/lab.md", section(lab[match.start() :], "## ")))
    out = []
    for page, text in found:
        for block in GENERATED:
            text = block.sub("", text)
        out.append((page, text))
    return out


def sentences(text: str):
    """(the sentence with its tags, its visible words): tags are read as part of the sentence they precede."""
    blank = TAG_LINE.sub(lambda m: " " * len(m.group(0)), text)
    blank = QUOTED.sub(lambda m: " " * len(m.group(0)), blank)
    cuts = [m.start() for m in BOUNDARY.finditer(blank)]
    for lo, hi in zip([0, *cuts], [*cuts, len(text)]):
        yield text[lo:hi], blank[lo:hi]


def all_tags():
    return [(page, m) for page in PAGES for m in C.TAG.finditer((ROOT / page).read_text())]


def test_every_claim_in_the_lab_pages_holds_on_the_committed_csvs():
    tags = all_tags()
    assert len(tags) >= 20, "README.md / docs/lab.md: the lab's claims are not tagged"
    problems = [f"{page}: {p}" for page in PAGES for p in C.check((ROOT / page).read_text(), ROOT)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("page", "text"), checked_sections(), ids=lambda x: x if len(x) < 40 else "")
def test_every_qualitative_sentence_carries_a_claim(page, text):
    untagged = [
        " ".join(words.split())[:200]
        for raw, words in sentences(text)
        if QUALITATIVE.search(words)
        and "<!-- claim" not in raw
        and "<!-- tested" not in raw
        and not words.lstrip().startswith("#")
    ]
    assert not untagged, f"{page}: qualitative sentences with no claim tag:\n" + "\n".join(untagged)


def test_the_unchecked_sections_exist_and_every_tested_tag_names_a_test():
    lab = (ROOT / "docs/lab.md").read_text()
    headings = re.findall(r"^## .*$", lab, re.MULTILINE)
    assert all(any(h.startswith(u) for h in headings) for u in UNCHECKED), "UNCHECKED names a section gone"
    tags = [m for page in PAGES for m in C.TESTED.finditer((ROOT / page).read_text())]
    assert tags, "docs/lab.md: no claim names its test"
    problems = [p for page in PAGES for p in C.tested_problems((ROOT / page).read_text(), ROOT)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("index", range(len(all_tags())))
def test_a_csv_edit_that_makes_a_claim_false_fails_it(index, tmp_path):
    page, tag = all_tags()[index]
    frame, a, b = C.rows_of(tag, ROOT)
    args = [x.strip() for x in tag["args"].split(",") if x.strip()]
    edited = C.falsify(tag["name"], frame, a, b, args)
    target = tmp_path / tag["path"]
    target.parent.mkdir(parents=True)
    edited.to_csv(target, index=False)
    assert C.evaluate(tag, ROOT) is None, f"{page}: {tag.group(0)} does not hold on the committed CSV"
    assert C.evaluate(tag, tmp_path) is not None, f"{page}: {tag.group(0)} still holds after the edit"


def test_the_checker_reads_a_sentence_as_its_claim_says(tmp_path):
    """The checker's own cases on a small table: each predicate true, then false, on rows it selects."""
    (tmp_path / "r").mkdir()
    pd.DataFrame(
        {
            "arm": ["GRPO", "GRPO", "GRPO", "Branch"],
            "draw": ["0", "1", "pooled", "pooled"],
            "beta": [2, 2, 2, 2],
            "share": [0.02, 0.03, 0.025, 0.029],
            "share_ci_low": [0.01, 0.02, 0.022, 0.023],
            "share_ci_high": [0.03, 0.04, 0.028, 0.035],
        }
    ).to_csv(tmp_path / "r" / "t.csv", index=False)

    def holds(tag):
        return C.evaluate(next(C.TAG.finditer(tag)), tmp_path) is None

    assert holds("<!-- claim outside(share) r/t.csv arm=Branch draw=pooled | arm=GRPO -->")
    assert not holds("<!-- claim inside(share) r/t.csv arm=Branch draw=pooled | arm=GRPO -->")
    assert holds("<!-- claim positive(share) r/t.csv arm=GRPO draw!=pooled -->")
    assert holds("<!-- claim increasing(share, draw) r/t.csv arm=GRPO draw!=pooled -->")
    assert not holds("<!-- claim below(share, 0.025) r/t.csv arm=GRPO -->")
    assert holds("<!-- claim count(arm, GRPO, 3) r/t.csv beta=2 -->")
    assert "no row matches" in C.evaluate(next(C.TAG.finditer("<!-- claim positive(share) r/t.csv arm=SFT -->")),
                                          tmp_path)  # fmt: skip
    text = (
        "At beta 2 GRPO keeps more pair plans. <!-- claim positive(share) r/t.csv arm=GRPO --> Branch rises."
    )
    assert [QUALITATIVE.search(w) is not None and "<!-- claim" not in r for r, w in sentences(text)] == [
        True,
        False,
    ]


# ------------------------------------------------------------------ power recomputed from seeds.csv


FRONTIERS = sorted(p.parent for p in (ROOT / "results").glob("*/frontier/paired.csv"))


@pytest.mark.parametrize("folder", FRONTIERS, ids=lambda p: p.parent.name)
def test_the_committed_mdes_and_projections_are_recomputed_from_seeds_csv(folder):
    seeds = pd.read_csv(folder / "seeds.csv", keep_default_na=False, na_values=[""])
    paired = pd.read_csv(folder / "paired.csv", keep_default_na=False, na_values=[""])
    columns = {"pair-plan share": "pair_share", "pass@1": "pass_at_1"}
    checked = 0
    for _, row in paired[paired["draw"] == "pooled"].iterrows():
        column = columns.get(row["metric"], row["metric"].replace("pass@", "pass_at_"))
        a = seeds[seeds["arm"] == row["a"]].set_index(["draw", "seed"])[column]
        b = seeds[seeds["arm"] == row["b"]].set_index(["draw", "seed"])[column]
        d = (a - b).dropna()
        groups = [g.to_numpy() for _, g in d.groupby(level="draw")]
        dfs = sum(len(g) - 1 for g in groups)
        sd = math.sqrt(sum((len(g) - 1) * np.var(g, ddof=1) for g in groups) / dfs)
        se = math.sqrt(sum(np.var(g, ddof=1) / len(g) for g in groups)) / len(groups)
        assert row["sd_seed"] == pytest.approx(sd, rel=1e-9)
        assert row["mde"] == pytest.approx(exact_mde(se, dfs), rel=1e-6), (row["a"], row["metric"])
        draws = len(groups)
        wanted = next(
            (s for s in range(2, 100_000) if exact_mde(sd / math.sqrt(draws * s), draws * (s - 1)) <= 0.015),
            math.inf,
        )
        assert row["seeds_per_draw_for_0.015"] == wanted, (row["a"], row["metric"])
        checked += 1
    assert checked >= 3


def seeds_for(sd: float, effect: float = 0.015) -> float:
    """The fewest seeds S >= 2 whose exact MDE at sd / sqrt(S), df S - 1, reaches ``effect`` (bisection on S:
    the MDE falls with S); inf past 100,000."""
    if exact_mde(sd / math.sqrt(100_000), 100_000 - 1) > effect:
        return math.inf
    low, high = 1, 100_000  # MDE(low) > effect (or low = 1, not a design), MDE(high) <= effect
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if exact_mde(sd / math.sqrt(mid), mid - 1) <= effect else (mid, high)
    return high


LAB_PAIRS = sorted(
    p for p in (ROOT / "results").glob("**/lab/pairs.csv") if "sd_seed" in pd.read_csv(p, nrows=0).columns
)


@pytest.mark.parametrize("path", LAB_PAIRS, ids=lambda p: str(p.parent.parent.relative_to(ROOT / "results")))
def test_the_committed_lab_mdes_are_the_exact_power_of_their_rows(path):
    """Every t(seed) row of a lab's pairs.csv: mde is the exact-power MDE at se = sd_seed / sqrt(seeds), df = seeds
    - 1, and seeds_for_0.015 the fewest seeds whose MDE at that sd reaches 0.015 (computed here from the noncentral
    t, not by sage_unsloth.report.power)."""
    pairs = pd.read_csv(path)
    rows = pairs[pairs["interval"].astype(str).str.startswith("t(seed)") & pairs["sd_seed"].notna()]
    assert len(rows), path
    for _, row in rows.iterrows():
        sd, seeds = float(row["sd_seed"]), int(row["seeds"])
        assert row["mde"] == pytest.approx(exact_mde(sd / math.sqrt(seeds), seeds - 1), rel=1e-6), dict(row)
        assert float(row["seeds_for_0.015"]) == seeds_for(sd), dict(row)
