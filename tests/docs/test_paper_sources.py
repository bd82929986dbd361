"""The paper's numbers in results/paper/ can be checked by a reader: no file of the kit points at a path outside
the repository, every row has a public source, a row traced to a primary source (the paper or the authors'
README) says where in it, and an untraced row is marked as such, in the CSV and beside the number in the report.

Checked by breaking on purpose: a row with primary True and no citation, a row with primary False whose note
does not say "untraced", a source that is a local path, and the report's mark dropped (paper_number without
the †) each fail a test here.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
PAPER_DIR = REPO / "results" / "paper"
FIXTURE = REPO / "tests" / "fixtures" / "report" / "results"
# Spelled in pieces so that this file does not match itself.
OUTSIDE = ("shared" + "/notes", ".." + "/shared", "/work" + "/shared")
PRIMARY_SOURCES = ("https://arxiv.org/abs/2605.18864", "https://github.com/tally0818/SAGE/")
PLACES = ("table", "figure", "section", "page", "appendix")


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in out.decode().split("\0") if name]


def test_no_file_of_the_kit_points_outside_the_repository():
    offenders = []
    for path in tracked_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        offenders += [f"{path.relative_to(REPO)}: {s}" for s in OUTSIDE if s in text]
    assert not offenders, offenders


@pytest.mark.parametrize("name", ["published_passk.csv", "published_reasoning_patterns.csv"])
def test_every_paper_row_has_a_primary_citation_or_the_untraced_mark(name):
    frame = pd.read_csv(PAPER_DIR / name, keep_default_na=False)
    assert len(frame) and {"source", "citation", "primary", "note"} <= set(frame.columns)
    for _, row in frame.iterrows():
        where = f"{name}: {row['model']} / {row['method']} / {row.get('dataset', row.get('pattern'))}"
        assert row["source"].startswith("https://"), where  # a public address, never a local file
        assert str(row["primary"]) in ("True", "False"), where
        if str(row["primary"]) == "True":
            assert row["source"].startswith(PRIMARY_SOURCES), where
            assert any(place in row["citation"].lower() for place in PLACES), where  # where in the source
            assert not row["note"].startswith("untraced"), where
        else:
            assert row["note"].startswith("untraced: "), where  # the explicit mark, with the reason


def test_the_readme_rows_match_the_authors_tables_as_read():
    """The 20 averages of tally0818/SAGE's README 'Paper Results' (read at c9b3b69 for this test)."""
    passk = pd.read_csv(PAPER_DIR / "published_passk.csv")
    avg = passk[passk["dataset"] == "avg_paper"]
    assert avg["primary"].all() and len(avg) == 20
    got = {(r.model, r.method, r.k): r.value for r in avg.itertuples()}
    readme = {
        "Qwen2.5-Math-7B": (
            256,
            {
                "Base": (0.227, 0.708),
                "GRPO": (0.266, 0.714),
                "GRPO + Branch": (0.284, 0.729),
                "BNPO": (0.243, 0.699),
                "BNPO + Branch": (0.271, 0.715),
                "DAPO": (0.264, 0.696),
                "DAPO + Branch": (0.267, 0.712),
            },
        ),
        "DeepSeek-R1-Distill-Qwen-7B": (
            64,
            {"Base": (0.429, 0.778), "GRPO": (0.449, 0.771), "GRPO + Branch": (0.452, 0.774)},
        ),
    }
    want = {}
    for model, (k, rows) in readme.items():
        for method, (one, many) in rows.items():
            want[(model, method, 1)], want[(model, method, k)] = one, many
    assert got == want


def write_completions(root: Path, runs: list[tuple[str, str]], text: str) -> str:
    for model, run in runs:
        folder = root / "completions" / model / run
        folder.mkdir(parents=True)
        record = {"dataset": "aime", "problem_id": "1", "sample_idx": 0, "completion": text, "correct": True}
        with gzip.open(folder / "aime.jsonl.gz", "wt") as fh:
            fh.write(json.dumps(record) + "\n")
    return str(root / "completions" / "{model}" / "{run}" / "*.jsonl.gz")


def test_the_report_marks_untraced_paper_numbers_beside_them(tmp_path):
    from sage_unsloth.report.paper import UNTRACED_MARK
    from sage_unsloth.report.stage import ReportArguments, build_report

    results = tmp_path / "results"
    runs = [("qwen2.5-math-7b", "bnpo"), ("qwen2.5-math-7b", "grpo_branch")]
    for model, run in runs:
        shutil.copytree(FIXTURE / "qwen2.5-math-7b" / "grpo_branch", results / model / run)
    args = ReportArguments(
        results=str(results),
        paper_dir=str(PAPER_DIR),
        resamples=100,
        completions=write_completions(tmp_path, runs, "Suppose not. Then we reach a contradiction."),
    )
    markdown = build_report(args, console=False).markdown
    assert "not traced to a primary source" in markdown
    bnpo = [line for line in markdown.splitlines() if line.startswith("| qwen2.5-math-7b/bnpo |")]
    cells = [cell.strip() for line in bnpo for cell in line.split("|")]
    assert f"0.043 {UNTRACED_MARK}" in cells  # AIME pass@1: the partial quote, marked
    assert "0.243" in cells and f"0.243 {UNTRACED_MARK}" not in cells  # the README's average: primary
    patterns = markdown.split("## Reasoning patterns", 1)[1]
    assert f"(paper 0.033 {UNTRACED_MARK})" in patterns
