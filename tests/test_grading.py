"""Answer extraction, gold normalisation, math-verify grading (incl. hostile inputs) and the K&K grader."""

import json
import random
import threading
import time

import pytest

from sage_unsloth.grading import (
    extract_answer,
    grade_completion,
    grade_kk,
    last_boxed,
    minerva_gold,
    normalise_gold,
    verify_answer,
)


def _rows(benchmark_dir, name):
    return [json.loads(line) for line in (benchmark_dir / name).read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------ extraction
def test_extract_takes_last_solution_block_and_tolerates_missing_close():
    text = "<start_working_out>x<end_working_out><SOLUTION>1</SOLUTION> again <SOLUTION> 42 "
    assert extract_answer(text) == "42"
    assert extract_answer("a <SOLUTION>\\frac{1}{2}</SOLUTION> trailing") == "\\frac{1}{2}"


def test_extract_falls_back_to_last_balanced_boxed():
    assert extract_answer("so \\boxed{1} then \\boxed{\\frac{a}{b^{2}}} done") == "\\frac{a}{b^{2}}"
    assert extract_answer("empty <SOLUTION></SOLUTION> but \\boxed{7}") == "7"
    assert extract_answer("unclosed \\boxed{\\frac{1}{2}") is None
    assert extract_answer("no answer here") is None
    assert extract_answer("") is None and extract_answer(None) is None
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"


def test_extract_examines_only_the_tail_of_huge_input():
    assert extract_answer("<SOLUTION>1</SOLUTION>" + "x" * 5_000_000) is None
    assert extract_answer("x" * 5_000_000 + "<SOLUTION>3</SOLUTION>") == "3"


# ------------------------------------------------------------------ golds
def test_normalise_gold_amc_floats_and_aime_zeros():
    assert normalise_gold(27.0) == "27" and normalise_gold("27.0") == "27"
    assert normalise_gold("073") == "73" and normalise_gold("000") == "0"
    assert normalise_gold(0.5) == "0.5" and normalise_gold(" \\frac{1}{2} ") == "\\frac{1}{2}"


def test_minerva_gold_is_last_boxed_of_solution(benchmark_dir):
    rows = _rows(benchmark_dir, "minerva.jsonl")
    assert minerva_gold(rows[0]["solution"]) == "1.6"
    with pytest.raises(ValueError):
        minerva_gold("no box")


# ------------------------------------------------------------------ verification
@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        ("0.5", "\\frac12", True),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True),
        ("x = 5", "5", True),
        ("\\boxed{25}", "025", True),
        ("27", 27.0, True),
        ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("6", "5", False),
        ("2^{2^{n}}", "2^{2^{n}}", True),
        ("2^{2^{2}}", "2^{2^{2}}", True),
        ("\\sqrt{50}", "\\sqrt{51}", False),
        (None, "5", False),
        ("", "5", False),
    ],
)
def test_verify_answer_cases(answer, gold, expected):
    assert verify_answer(answer, gold) is expected


def _graded_with_reference(rows, gold_of):
    # "\boxed{...}" around the reference answer keeps the exact-string shortcut out: math-verify runs.
    return [verify_answer("\\boxed{{{}}}".format(extract_answer(r["solution"])), gold_of(r)) for r in rows]


def test_math500_and_minerva_golds_match_their_solutions_and_shuffled_golds_do_not(benchmark_dir):
    from sage_unsloth.eval.gradepool import GradingPool

    math500 = _rows(benchmark_dir, "math500.jsonl")
    minerva = _rows(benchmark_dir, "minerva.jsonl")
    rng = random.Random(0)
    shuffled = [r["answer"] for r in math500]
    rng.shuffle(shuffled)

    def item(row, gold):  # graded through the eval's process pool, like a real run
        return (f"<SOLUTION>\\boxed{{{extract_answer(row['solution'])}}}</SOLUTION>", gold)

    items = ([item(r, r["answer"]) for r in math500] + [item(r, minerva_gold(r["solution"])) for r in minerva]
             + [item(r, g) for r, g in zip(math500, shuffled)])
    with GradingPool(workers=2) as pool:
        verdicts = pool.grade(items)
        assert pool.stats["verified"] > 1000  # math-verify ran on (nearly) every pair
    assert sum(verdicts[:500]) == 500
    assert sum(verdicts[500:772]) == 272
    assert sum(verdicts[772:]) < 25  # coincidences only (~2%)


def test_aime_and_amc_golds_grade(benchmark_dir):
    aime24 = _rows(benchmark_dir, "aime24.jsonl")
    with_box = [r for r in aime24 if extract_answer(r["solution"])]
    # The one known miss: a boxed "\textbf{(073)}" that parses to a symbol (see sage_unsloth/data/README.md).
    assert sum(_graded_with_reference(with_box, lambda r: r["answer"])) >= len(with_box) - 1
    for name in ("aime25.jsonl", "amc23.jsonl"):
        rows = _rows(benchmark_dir, name)
        assert all(verify_answer("\\boxed{{{}}}".format(normalise_gold(r["answer"])), r["answer"]) for r in rows)


def _hostile_completions():
    nested = [
        "$" + "(" * 5000 + "1" + ")" * 5000 + "$",
        "\\frac{" * 3000 + "1" + "}" * 3000,
        "{" * 100_000,
        "\\sqrt{" * 40 + "2" + "}" * 40,
        "[" * 33 + "]" * 33,
    ]
    powers = [
        "10^{10^{10^{10}}}", "9^{9^{9^{9^{9}}}}", "10**10**10**10", "2^{100000000}", "(10^{10})!",
        "100000!", "10^{10^{10}} - 10^{10^{10}} + 5", "\\binom{10^{12}}{10^{6}}", "e^{e^{e^{e^{10}}}}",
        "\\prod_{k=1}^{10^{9}} k", "\\sum_{n=1}^{10^{12}} n^{n}", "\\int_0^{10^{10}} x^{x} dx",
        "\\lim_{n\\to\\infty} n^{n^{n}}", "9" * 100_000, "1" + "0" * 400, "10^{-10^{10}}",
        "\\frac{10^{10^{10}}}{10^{10^{10}}-1}", "x^{x^{x^{x^{x^{x}}}}} = 5",
    ]
    broken = [
        "\\frac{1}{", "\\frac", "}{", "\\left( 1, 2", "\\begin{pmatrix} 1 & 2", "$$$", "\\boxed{",
        "\\\\\\\\\\\\", "^^^^^^", "_{_{_{}}}", "\\sqrt[", "1/0", "0/0", "\\infty - \\infty", "\\text{(",
        "\\mathrm{\\mathrm{\\mathrm{", "\\end{array}", "& & & \\\\",
    ]
    weird = [
        "5\x00", "\x00" * 1000, "\u202e5\u202c", "５", "٥", "\ud835\udfd3" if False else "𝟓", "5\u200b",
        "\ufeff5", "\U0001f600", "ℵ_0", "∞", "√2", "½", "5" + "\u0301" * 1000, "\r\n\t\x0b\x0c",
    ]
    huge = [
        "word " * 400_000,  # 2 MB of text
        "\\boxed{" + "1+" * 500_000 + "1}",
        "<SOLUTION>" + "x" * 3_000_000,
        "<SOLUTION>" * 200_000,
        "$" * 1_000_000,
        "\\boxed{\\boxed{\\boxed{" * 10_000,
    ]
    items = []
    for answer in nested + powers + broken + weird:
        items.append(f"<start_working_out>t<end_working_out><SOLUTION>{answer}</SOLUTION>")
        items.append(f"\\boxed{{{answer}}}")
    return items + huge


def test_hostile_completions_grade_fast_without_exception():
    items = _hostile_completions()
    assert len(items) >= 50
    assert verify_answer("0.5", "\\frac{1}{2}")  # the one-off cold import of math-verify is not per sample
    slowest = 0.0
    for completion in items:
        start = time.perf_counter()
        result = grade_completion(completion, "5")
        slowest = max(slowest, time.perf_counter() - start)
        assert isinstance(result, bool)
    assert slowest < 2.0, f"slowest hostile item took {slowest:.2f}s"


def test_verify_answer_is_bounded_off_the_main_thread():
    # Off the main thread no signal can interrupt math-verify; grading must still be bounded and correct.
    results = {}

    def work():
        results["tower"] = verify_answer("10^{10^{10^{10}}}", "5", timeout_s=1.0)
        results["half"] = verify_answer("0.5", "\\frac{1}{2}", timeout_s=1.0)

    start = time.perf_counter()
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert results == {"tower": False, "half": True}
    assert time.perf_counter() - start < 30


# ------------------------------------------------------------------ knights and knaves
def test_grade_kk_against_bundled_solutions(benchmark_dir):
    rows = _rows(benchmark_dir, "kk_test.jsonl")[::50]
    for row in rows:
        good = f"<SOLUTION>{row['solution_text_format']}</SOLUTION>"
        assert grade_kk(good, row["solution"], row["names"])
        flipped = [not row["solution"][0]] + list(row["solution"][1:])
        assert not grade_kk(good, flipped, row["names"])
        missing = "\n".join(row["solution_text_format"].splitlines()[:-1])
        assert not grade_kk(f"<SOLUTION>{missing}</SOLUTION>", row["solution"], row["names"])
    assert not grade_kk(None, [True], ["Ann"])
    assert grade_kk("Ann is a knave. Wait, no: Ann is a knight.", [True], ["Ann"])
