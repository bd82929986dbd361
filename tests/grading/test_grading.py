"""Answer extraction, the normalisation rules, plain numbers, text golds, K&K, math-verify grading of every
bundled gold (incl. hostile inputs), and the CPU-time deadline. The accuracy on real answer formats is
measured on the labelled set in tests/grading/test_grading_cases.py."""

import json
import random
import threading
import time
from fractions import Fraction

import pytest

from sage_unsloth import grading
from sage_unsloth.grading import (
    extract_answer,
    grade_completion,
    grade_kk,
    judge,
    last_boxed,
    math_candidate,
    minerva_gold,
    normalise_gold,
    normalise_math,
    verify_answer,
)
from sage_unsloth.grading.numbers import numbers_equal, parse_number


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


def test_extract_cleans_what_wraps_the_answer():
    assert extract_answer("<SOLUTION>**902**</SOLUTION>") == "902"  # bold, not a power tower
    assert extract_answer("<SOLUTION>**Answer:** 902</SOLUTION>") == "902"
    assert extract_answer("<SOLUTION>The final answer is $3$. I hope it is correct.</SOLUTION>") == "$3$"
    assert extract_answer("<SOLUTION>So the answer is $\\boxed{7}$.</SOLUTION>") == "7"
    assert extract_answer("<SOLUTION>\\text{The answer is } 721</SOLUTION>") == "721"
    assert extract_answer("<SOLUTION>2*3*4</SOLUTION>") == "2*3*4"  # products keep their stars


def test_extract_examines_only_the_tail_of_huge_input():
    assert extract_answer("<SOLUTION>1</SOLUTION>" + "x" * 5_000_000) is None
    assert extract_answer("x" * 5_000_000 + "<SOLUTION>3</SOLUTION>") == "3"


@pytest.mark.parametrize(
    ("answer", "candidate"),
    [
        ("The answer is not 5, it is 4", "4"),
        ("$204$ minutes, including $t = 24$", "204"),
        ("Since $t = 24$, the walk takes $204$ minutes", "204"),
        ("t = 24, so the walk takes 204 minutes", "204"),
        ("2000 calories", "2000"),
        ("It is not 4", None),
        ("204 or 228", "204, 228"),  # a hedge stays a list, which a single gold does not equal
        ("\\frac{1}{LCs^2 + RCs + 1}", "\\frac{1}{LCs^2 + RCs + 1}"),  # juxtaposed variables are not words
        ("m\\frac{dv}{dt} + bv = f", "m\\frac{dv}{dt} + bv = f"),
        ("$x = 1$, $y = 2$", "x = 1, y = 2"),
    ],
)
def test_math_candidate_reads_the_affirmed_value_of_a_sentence(answer, candidate):
    assert math_candidate(answer) == candidate


# ------------------------------------------------------------------ golds and normalisation
def test_normalise_gold_keeps_stated_precision():
    assert normalise_gold(27.0) == "27" and normalise_gold(0.5) == "0.5"  # AMC's JSON floats
    assert normalise_gold("073") == "73" and normalise_gold("000") == "0"  # AIME's three digits
    assert normalise_gold("56.0") == "56.0" and normalise_gold("0.10") == "0.10"  # Minerva's precision
    assert normalise_gold(" \\frac{1}{2} ") == "\\frac{1}{2}"


def test_minerva_gold_is_last_boxed_of_solution(benchmark_dir):
    rows = _rows(benchmark_dir, "minerva.jsonl")
    assert minerva_gold(rows[0]["solution"]) == "1.6"
    with pytest.raises(ValueError):
        minerva_gold("no box")


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("4.5e33", "4.5\\times 10^{33}"),
        ("1e-5", "1\\times 10^{-5}"),
        ("2.7778e-6", "2.7778\\times 10^{-6}"),
        ("3e^{-2t}", "3e^{-2t}"),  # Euler's e stays
        ("\\$32,\\!348", "32348"),
        ("10\\,080", "10080"),
        ("10{,}080", "10080"),
        ("58,500", "58500"),
        ("(2,100)", "(2,100)"),  # a pair, not a thousands separator
        ("90^\\circ", "90"),
        ("\\frac{270^\\circ}{7}", "\\frac{270}{7}"),
        ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"),
        ("864 \\mbox{ inches}^2", "864"),
        ("\\dfrac43", "\\frac{4}{3}"),
        ("4.5 \\times 10^33", "4.5\\times 10^{33}"),
        ("\\lambda_{\\text {red}} / \\sqrt{2}", "\\lambda_{red} / \\sqrt{2}"),
        ("E_1", "\\mathrm{E}_{1}"),
        ("-1./3", "-1/3"),
        ("np.arcsin(10/13)", "\\arcsin(10/13)"),
        ("L \\approx 4.5", "4.5"),
        (
            "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
            "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
        ),  # rows survive
    ],
)
def test_normalise_math_rules(text, normalised):
    assert normalise_math(text) == normalised


# ------------------------------------------------------------------ plain numbers (exact, from the definition)
def _num(text):
    number = parse_number(text)
    assert number is not None, text
    return number


def test_plain_numbers_parse_to_exact_values():
    assert _num("4.5\\times 10^{33}").value == Fraction(45, 10) * 10**33
    assert _num("1\\frac{4}{5}").value == Fraction(9, 5)  # a mixed number, not 1 x 4/5
    assert _num("-\\frac{1}{3}").value == Fraction(-1, 3) and _num("\\frac{-35}{9}").value == Fraction(-35, 9)
    assert _num(".0000672").value == Fraction(672, 10**7) and _num("10^{-5}").value == Fraction(1, 10**5)
    assert parse_number("2\\frac{5}{3}") is None and parse_number("x") is None and parse_number("1/0") is None


def test_measured_golds_equal_answers_that_round_to_them_within_one_percent():
    gold = _num(
        "4.5\\times 10^{33}"
    )  # half a unit of the last digit is 0.05e33 (1.1%), 1% caps it at 0.045e33
    assert numbers_equal(gold, _num("4.54\\times 10^{33}")) and not numbers_equal(
        gold, _num("4.549\\times10^{33}")
    )
    assert numbers_equal(gold, _num("4.46\\times 10^{33}")) and not numbers_equal(
        gold, _num("4.6\\times10^{33}")
    )
    small = _num(".0000672")  # math-verify's 6-decimal rounding called 0.0000671 equal
    assert not numbers_equal(small, _num("0.0000671")) and numbers_equal(small, _num("6.72\\times 10^{-5}"))
    one_digit = _num("1\\times 10^{-5}")  # one digit is not a 50% band: 1% caps it
    assert numbers_equal(one_digit, _num("1.009\\times 10^{-5}")) and not numbers_equal(
        one_digit, _num("1.4\\times 10^{-5}")
    )
    assert not numbers_equal(one_digit, _num("1.02\\times 10^{-5}"))
    exact = _num("204")
    assert numbers_equal(exact, _num("204.0")) and not numbers_equal(exact, _num("204.4"))
    assert numbers_equal(_num("\\frac{1}{3}"), _num("0.333333")) and not numbers_equal(
        _num("\\frac{1}{3}"), _num("0.33")
    )


# ------------------------------------------------------------------ verdicts
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
        ("\\sqrt{50}", "\\sqrt{51}", False),
        ("4.5 \\times 10^{33}", "4.5e33", True),  # e-notation gold
        ("\\frac{37}{4} m", "\\frac{37}{4} m", True),
        ("\\frac{37}{4}", "\\frac{37}{4} m", False),  # m: a variable
        ("-\\frac{1}{3}", "-1./3", True),
        ("\\sin^{-1}(10/13)", "np.arcsin(10/13)", True),  # Python golds
        ("E_2, E_1", "E_{1},E_{2}", True),
        ("E_1", "E_{1},E_{2}", False),
        ("2 r_0 \\sqrt{\\pi G \\rho_0}", "\\sqrt{4 \\pi G \\rho_{0} r_{0}^{2}}", True),  # positive quantities
        ("\\frac{dM}{dt} = M^5", "\\frac{dM}{dt} = M^6", False),  # dM/dt is not the derivative of a constant
        (
            "LC\\frac{d^2 v_o}{dt^2} + v_o = v_i",
            "\\frac{d^{2} v_{o}}{d t^{2}}+\\frac{v_{o}}{L C}=\\frac{v_{i}}{L C}",
            True,
        ),
        (
            "2\\frac{d^2 v_o}{dt^2} + v_o = v_i",
            "\\frac{d^{2} v_{o}}{d t^{2}}+\\frac{v_{o}}{L C}=\\frac{v_{i}}{L C}",
            False,
        ),
        ("2e^{i\\pi/3}", "1+\\sqrt{3} i", True),  # i is the imaginary unit when the gold says so
        (None, "5", False),
        ("", "5", False),
    ],
)
def test_verify_answer_cases(answer, gold, expected):
    assert verify_answer(answer, gold) is expected


def test_text_and_letter_golds_are_compared_as_text():
    assert verify_answer("Evelyn has the greatest average speed", "\\text{Evelyn}")
    assert verify_answer("The student with the greatest average speed is Evelyn", "\\text{Evelyn}")
    assert not verify_answer("Not Evelyn; it is Briana", "\\text{Evelyn}")
    assert verify_answer("(C) Plane", "\\text{(C)}") and verify_answer("\\textbf{(C)}", "\\text{(C)}")
    assert not verify_answer("C and D", "\\text{(C)}") and not verify_answer("(A) or (B)", "\\text{(B)}")


def test_statuses_say_why(monkeypatch):
    from sage_unsloth.grading import verify

    assert judge(None, "5") == grading.NO_ANSWER and judge("  ", "5") == grading.NO_ANSWER
    assert judge("5", "5") == grading.CORRECT and judge("6", "5") == grading.WRONG
    # Out of budget is not a verdict: its own status, which callers retry. The comparison is made to take 5 ms of
    # CPU so that the budget runs out whatever is cached (a cached gold parse can otherwise finish inside the
    # deadline's first 1 ms tick, and the verdict depended on which tests ran before).
    compare = verify._symbolic_equal

    def slow_compare(candidate, form):
        end = time.thread_time() + 0.005
        while time.thread_time() < end:
            pass
        return compare(candidate, form)

    monkeypatch.setattr(verify, "_symbolic_equal", slow_compare)
    assert judge("x^2 + 2x + 1", "(x+1)^2", timeout_s=1e-6) == grading.TIMEOUT
    assert judge("x^2 + 2x + 1", "(x+1)^2") == grading.CORRECT


@pytest.mark.slow
def test_every_bundled_gold_parses_and_equals_itself_through_the_parser(benchmark_dir):
    from sage_unsloth.grading import verify as v

    v.warm_up()
    for name in ("math500.jsonl", "minerva.jsonl", "aime24.jsonl", "aime25.jsonl", "amc23.jsonl"):
        for row in _rows(benchmark_dir, name):
            raw = row.get("answer") if row.get("answer") not in (None, "") else minerva_gold(row["solution"])
            form = v.gold_form(normalise_gold(raw))
            if form.words:
                continue
            assert v._parse_gold(form.text), (name, raw)  # a gold the parser cannot read grades nothing right
            assert v._symbolic_equal(form.text, form), (name, raw)


@pytest.mark.slow
def test_reference_solutions_grade_against_their_golds_and_shuffled_golds_do_not(benchmark_dir):
    from sage_unsloth.eval.gradepool import GradingPool

    math500 = _rows(benchmark_dir, "math500.jsonl")
    minerva = _rows(benchmark_dir, "minerva.jsonl")
    shuffled = [r["answer"] for r in math500]
    random.Random(0).shuffle(shuffled)
    shuffled = shuffled[:150]  # mismatched pairs cost a parse each: a sample shows they stay wrong

    def item(row, gold):  # graded through the eval's process pool, like a real run
        return f"<SOLUTION>\\boxed{{{last_boxed(row['solution'])}}}</SOLUTION>", gold

    items = (
        [item(r, r["answer"]) for r in math500]
        + [item(r, minerva_gold(r["solution"])) for r in minerva]
        + [item(r, g) for r, g in zip(math500, shuffled)]
    )  # zip stops at the 150
    with GradingPool(workers=2) as pool:
        verdicts = [g.correct for g in pool.grade(items)]
        assert pool.stats["timeouts"] == 0
    assert sum(verdicts[:500]) >= 499  # test/number_theory/...: the reference boxes "\text{(E)}"-like text
    assert sum(verdicts[500:772]) == 272
    assert sum(verdicts[772:]) <= 6  # coincidences only (~2%: 3 when shuffled golds are equal)


def test_aime_and_amc_golds_grade(benchmark_dir):
    aime24 = _rows(benchmark_dir, "aime24.jsonl")
    with_box = [r for r in aime24 if extract_answer(r["solution"])]
    graded = [verify_answer(f"\\boxed{{{extract_answer(r['solution'])}}}", r["answer"]) for r in with_box]
    assert sum(graded) >= len(with_box) - 1  # the reference solutions box their answers in their own ways
    for name in ("aime25.jsonl", "amc23.jsonl"):
        rows = _rows(benchmark_dir, name)
        assert all(verify_answer(f"\\boxed{{{normalise_gold(r['answer'])}}}", r["answer"]) for r in rows)


# ------------------------------------------------------------------ hostile input and the deadline
def _hostile_completions():
    nested = [
        "$" + "(" * 5000 + "1" + ")" * 5000 + "$",
        "\\frac{" * 3000 + "1" + "}" * 3000,
        "{" * 100_000,
        "\\sqrt{" * 40 + "2" + "}" * 40,
        "[" * 33 + "]" * 33,
    ]
    powers = [
        "10^{10^{10^{10}}}",
        "9^{9^{9^{9^{9}}}}",
        "10**10**10**10",
        "2^{100000000}",
        "(10^{10})!",
        "100000!",
        "10^{10^{10}} - 10^{10^{10}} + 5",
        "\\binom{10^{12}}{10^{6}}",
        "e^{e^{e^{e^{10}}}}",
        "\\prod_{k=1}^{10^{9}} k",
        "\\sum_{n=1}^{10^{12}} n^{n}",
        "\\int_0^{10^{10}} x^{x} dx",
        "\\lim_{n\\to\\infty} n^{n^{n}}",
        "9" * 100_000,
        "1" + "0" * 400,
        "10^{-10^{10}}",
        "\\frac{10^{10^{10}}}{10^{10^{10}}-1}",
        "x^{x^{x^{x^{x^{x}}}}} = 5",
    ]
    broken = [
        "\\frac{1}{",
        "\\frac",
        "}{",
        "\\left( 1, 2",
        "\\begin{pmatrix} 1 & 2",
        "$$$",
        "\\boxed{",
        "\\\\\\\\\\\\",
        "^^^^^^",
        "_{_{_{}}}",
        "\\sqrt[",
        "1/0",
        "0/0",
        "\\infty - \\infty",
        "\\text{(",
        "\\mathrm{\\mathrm{\\mathrm{",
        "\\end{array}",
        "& & & \\\\",
    ]
    weird = [
        "5\x00",
        "\x00" * 1000,
        "\u202e5\u202c",
        "５",
        "٥",
        "𝟓",
        "5\u200b",
        "\ufeff5",
        "\U0001f600",
        "ℵ_0",
        "∞",
        "√2",
        "½",
        "5" + "\u0301" * 1000,
        "\r\n\t\x0b\x0c",
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


@pytest.mark.slow
def test_hostile_completions_grade_within_the_budget_without_exception():
    items = _hostile_completions()
    assert len(items) >= 50
    assert verify_answer("0.5", "\\frac{1}{2}")  # the one-off cold import of math-verify is not per sample
    slowest, fives = 0.0, {"５", "٥", "𝟓", "5\u200b", "\ufeff5", "\u202e5\u202c"}  # other spellings of 5
    for completion in items:
        start = time.thread_time()
        result = grading.grade(completion, "5", timeout_s=1.0)
        slowest = max(slowest, time.thread_time() - start)
        assert result.status in grading.STATUSES
        assert not result.correct or result.answer in fives, result
    # The budget is CPU time of this thread (wall time on a loaded machine is longer): 1 s + one tick + slack.
    assert slowest < 1.5, f"slowest hostile item took {slowest:.2f} CPU s"


@pytest.mark.slow
def test_verify_answer_is_bounded_off_the_main_thread():
    # Off the main thread no signal can interrupt math-verify; grading must still be bounded and correct.
    results = {}

    def work():
        results["tower"] = judge("10^{10^{10^{10}}}", "5", timeout_s=1.0)
        results["half"] = judge("\\frac{\\sqrt{4}}{4}", "\\frac{1}{2}", timeout_s=5.0)
        results["slow"] = judge("x^2 + 2x + 1", "(x+1)^2", timeout_s=1e-6)

    start = time.perf_counter()
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(120)
    assert results == {"tower": grading.WRONG, "half": grading.CORRECT, "slow": grading.TIMEOUT}
    assert time.perf_counter() - start < 90


def test_the_budget_is_the_grading_threads_cpu_time_not_the_process_or_the_wall():
    from sage_unsloth.grading.deadline import GradingTimeout, cpu_deadline

    def burn(seconds):  # CPU work of this thread
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    stop = threading.Event()

    def spin():  # another thread of the same process, competing for the CPU and the GIL
        while not stop.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        t0 = time.perf_counter()
        with cpu_deadline(0.6):
            burn(0.3)  # process CPU and wall time both pass 0.6 s here: neither may end the grading
        assert time.perf_counter() - t0 > 0.45, "the spinner did not compete; the test proves nothing"
        with pytest.raises(GradingTimeout), cpu_deadline(0.2):
            burn(1.0)
    finally:
        stop.set()
        spinner.join()


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
        assert grade_kk(f"<SOLUTION>{row['solution_text']}</SOLUTION>", row["solution"], row["names"])
    assert not grade_kk(None, [True], ["Ann"])
    assert grade_kk("Ann is a knave. Wait, no: Ann is a knight.", [True], ["Ann"])


def test_grade_kk_reads_markdown_groups_negations_and_skips_quotes_and_hypotheses():
    names, solution = ["Amelia", "Penelope", "Evelyn"], [True, True, False]
    for text in (
        "**Amelia** is a **knight**, **Penelope** is a **knight**, and **Evelyn** is a **knave**.",
        "Amelia and Penelope are knights, and Evelyn is a knave.",
        "Knights: Amelia, Penelope. Knaves: Evelyn.",
        "Amelia is a knight. Penelope is a knight, so Evelyn must be a knave.",
        "Amelia is a knight, Penelope is a knight, and Evelyn is not a knight.",
        "| Amelia | Knight |\n| Penelope | Knight |\n| Evelyn | Knave |",
    ):
        assert grade_kk(f"<SOLUTION>{text}</SOLUTION>", solution, names), text
    quoted = "Amelia is a knight. Penelope is a knight. Amelia said that Evelyn is a knave. Evelyn said Amelia is a knave."
    assert not grade_kk(f"<SOLUTION>{quoted}</SOLUTION>", solution, names)  # Evelyn's own role never stated
    hypothesis = (
        "Assume Evelyn is a knight; contradiction. Amelia is a knight, Penelope is a knight, "
        "Evelyn is a knave."
    )
    assert grade_kk(hypothesis, solution, names)
    assert not grade_kk(
        "If Evelyn is a knave then Amelia is a knight and Penelope is a knight.", solution, names
    )
    assert grade_completion("Amelia is a knight", "5") is False  # a K&K sentence against a math gold
