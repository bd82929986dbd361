"""The reasoning-pattern tagger on hand-written positive and negative examples, and per-run frequencies."""

import gzip
import json

import pytest

from sage_unsloth.report import patterns as patterns_module
from sage_unsloth.report.loading import RunResults
from sage_unsloth.report.patterns import (
    PATTERN_RULES,
    PATTERNS,
    pattern_frequencies,
    pattern_table,
    tag,
    tag_by_rule,
)

EXAMPLES = {
    "constraint_setup": (
        [
            "Let x be the number of apples Tom has.",
            "Let $n$ denote the number of sides of the polygon.",
            "We are given that a + b = 10 and ab = 21.",
            "The conditions are: a > 0, b > 0 and a + b < 7.",
            "We need integers that must satisfy 3x + 5y = 47.",
            "Let's denote the common difference by d.",
        ],
        [
            "The answer is 42.",
            "Let me think about this problem.",
            "Adding the two numbers gives 17, so the sum is 17.",
            "Let's compute 3 * 7 = 21.",
        ],
    ),
    "structural_reasoning": (
        [
            "Step 1: find the roots. Step 2: add them.",
            "We can break the problem down into two smaller parts.",
            "The sequence satisfies the recurrence a_{n+1} = 2a_n + 1.",
            "By symmetry, the two triangles have equal area.",
            "We prove it by induction on n.",
            "Split the sum into even and odd terms.",
        ],
        [
            "Step 1: compute 2 + 2 = 4. So the answer is 4.",
            "The area is 12 square units.",
            "We multiply both sides by 3.",
        ],
    ),
    "proof_by_contradiction": (
        [
            "Suppose not; then there is a largest prime p.",
            "This contradicts the assumption that n is even.",
            "Assume for the sake of contradiction that sqrt(2) is rational.",
            "Then 0 > 1, which is impossible.",
        ],
        [
            "Suppose x = 3. Then y = 9.",
            "Assume the triangle is isosceles with AB = AC.",
            "This is possible only when x = 2.",
            "The contract is signed.",
        ],
    ),
    "case_analysis": (
        [
            "Case 1: n is even. Case 2: n is odd.",
            "We consider two cases depending on the sign of x.",
            "In this case the product is negative.",
            "There are several subcases to check.",
        ],
        [
            "In any event, the answer is 5.",
            "The uppercase letters are A and B.",
            "Put the book in the bookcase.",
        ],
    ),
    "verification": (
        [
            "Let's verify: 3 * 4 = 12, which matches.",
            "Substituting x = 2 back into the equation gives 0.",
            "To double-check, we plug it back in: 2^2 - 4 = 0.",
            "Verification: 7 + 5 = 12.",
        ],
        ["We substitute x = 2 into f.", "Check out the diagram.", "The answer is 12."],
    ),
    "enumeration": (
        [
            "Let's list all divisors of 12: 1, 2, 3, 4, 6, 12.",
            "We enumerate the possibilities one by one.",
            "The possible values are 1, 3 and 5.",
            "Listing them out gives 6 arrangements.",
        ],
        ["The list price is $20.", "There is one possible value.", "We count to ten."],
    ),
    "self_correction": (
        [
            "Wait, that's not right. Let me recompute.",
            "I made a mistake in the second line.",
            "Let me reconsider the constraint on y.",
            "Hmm, that is incorrect, since 7 is prime.",
        ],
        [
            "We wait for the train to arrive at 5.",
            "The reasoning above is correct.",
            "Let me consider the first case.",
        ],
    ),
}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_tagger_on_hand_written_examples(pattern):
    positives, negatives = EXAMPLES[pattern]
    for text in positives:
        assert pattern in tag(text), f"{pattern} should match: {text!r}"
    for text in negatives:
        assert pattern not in tag(text), f"{pattern} should not match: {text!r}"
    for text in positives + negatives:  # the fast form agrees with the documented rules
        assert tag(text) == tag_by_rule(text), text


def test_every_pattern_has_examples_and_every_rule_is_documented():
    assert set(EXAMPLES) == set(PATTERNS)
    for rules in PATTERN_RULES.values():
        for rule in rules:
            assert "`" + rule.pattern.replace("|", "\\|") + "`" in patterns_module.__doc__, rule.pattern


def test_frequencies_per_run_from_completion_files(tmp_path):
    comp_dir = tmp_path / "outputs" / "m" / "r" / "completions"
    comp_dir.mkdir(parents=True)
    records = [
        {
            "dataset": "aime24",
            "problem_id": "1",
            "sample_idx": 0,
            "completion": "Let x be 3. Case 1: x odd.",
            "correct": True,
        },
        {
            "dataset": "aime24",
            "problem_id": "1",
            "sample_idx": 1,
            "completion": "Suppose not. Contradiction.",
            "correct": False,
        },
        {
            "dataset": "amc23",
            "problem_id": "2",
            "sample_idx": 0,
            "completion": "The answer is 4.",
            "correct": True,
        },
        {
            "dataset": "amc23",
            "problem_id": "2",
            "sample_idx": 1,
            "completion": "Let y be 2.",
            "correct": False,
        },
    ]
    with gzip.open(comp_dir / "aime24.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records[:2])
    with gzip.open(comp_dir / "amc23.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records[2:])
    run = RunResults(model="m", run="r", path=tmp_path, passk=None, per_problem=None)
    template = str(tmp_path / "outputs" / "{model}" / "{run}" / "completions" / "*.jsonl.gz")
    table = pattern_table([run], template)
    row = table.iloc[0]
    assert row["n_completions"] == 4 and row["n_correct"] == 2
    assert row["constraint_setup"] == 0.5 and row["proof_by_contradiction"] == 0.25
    assert row["case_analysis"] == 0.25 and row["constraint_setup|correct"] == 0.5
    first_only = pattern_frequencies(({**r} for r in records), samples_per_problem=1)
    assert first_only["n_completions"] == 2 and first_only["proof_by_contradiction"] == 0.0


def test_eval_stage_chunk_layout_found_through_the_manifest(tmp_path):
    """The eval stage writes one problem per line with its samples in a list, under manifest completions_dir."""
    chunk_dir = tmp_path / "outputs" / "m" / "eval" / "r" / "amc23"
    chunk_dir.mkdir(parents=True)
    record = {
        "dataset": "amc23",
        "problem_id": "7",
        "n": 3,
        "c": 1,
        "mean_completion_tokens": 5.0,
        "completions": [
            {"text": "Case 1: x > 0.", "tokens": 5, "correct": True},
            {"text": "Wait, I made a mistake.", "tokens": 5, "correct": False},
            {"text": "It is 3.", "tokens": 3, "correct": False},
        ],
    }
    with gzip.open(chunk_dir / "chunk_00000.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(record) + "\n")
    run = RunResults(
        model="m",
        run="r",
        path=tmp_path,
        passk=None,
        per_problem=None,
        manifest={"stage": "eval", "completions_dir": str(tmp_path / "outputs" / "m" / "eval" / "r")},
    )
    row = pattern_table([run]).iloc[0]
    assert row["n_completions"] == 3 and row["n_correct"] == 1
    assert row["case_analysis"] == pytest.approx(1 / 3) and row["self_correction"] == pytest.approx(1 / 3)
    assert row["case_analysis|correct"] == 1.0
    assert pattern_table([run], samples_per_problem=1).iloc[0]["n_completions"] == 1
