"""Issue 41 item 4 and issue 42 item 8: only what a reader sees is graded, every Unicode minus is one minus,
and a Knights-and-Knaves answer gives each person one role.

Every expected verdict is a careful reader's of the rendered text. Each test failed on the grader before
this change (main 8e77a25): the hidden answer was paid, the full-width minus was not a minus, and "Alice is
a knight and a knave" was a knight.
"""

import pytest

from sage_unsloth.grading import grade, grade_kk, judge
from sage_unsloth.rlvr.reward import correctness_reward

HIDDEN_EIGHT = [
    "\\boxed{3} % the answer is 8",
    "\\boxed{3} %\\boxed{8}",
    "\\boxed{3}% the answer is 8",
    "\\boxed{3} \\\\% the answer is 8",  # a line break, then a comment
    "<SOLUTION>3 <!-- 8 --></SOLUTION>",
    "\\boxed{3} <!-- \\boxed{8} -->",
    "\\boxed{3} <!-- the answer is 8",  # unclosed: hides the rest
    "\\boxed{3}\\phantom{\\boxed{8}}",
    "\\boxed{3}\\hphantom{\\boxed{8}}",
    "\\boxed{3} \\vphantom{The final answer is 8}",
    "\\boxed{3}\\phantom{\\boxed{8}",  # unclosed: hides the rest
    "\\boxed{3}\\textcolor{white}{\\boxed{8}}",
    "\\boxed{3}\n\\iffalse\n\\boxed{8}\n\\fi",
    "\\boxed{3} \\begin{comment} \\boxed{8} \\end{comment}",
    "<SOLUTION>3\\phantom{\\{8\\}}</SOLUTION>",  # escaped braces inside the invisible box
]


@pytest.mark.parametrize("completion", HIDDEN_EIGHT)
def test_a_hidden_answer_is_not_graded(completion):
    assert grade(completion, "8").status == "wrong", completion
    assert grade(completion, "3").status == "correct", completion


def test_the_issue_examples_and_the_reward_on_them():
    assert grade("\\boxed{3} % the answer is 8", "8").status == "wrong"
    assert grade("<SOLUTION>2 <!-- 6 --></SOLUTION>", "6").status == "wrong"
    assert grade("<SOLUTION>2 <!-- 6 --></SOLUTION>", "2").status == "correct"
    completions = ["\\boxed{3} % the answer is 8", "\\boxed{3}\\phantom{\\boxed{8}}", "\\boxed{8}"]
    rewards = correctness_reward(prompts=["p"] * 3, completions=completions, answer=["8"] * 3)
    assert rewards == [0.0, 0.0, 1.0]


def test_an_answer_handed_to_the_judge_is_read_as_shown():
    assert judge("3 <!-- 8 -->", "8") == "wrong"
    assert judge("3 <!-- 8 -->", "3") == "correct"
    assert judge("3\\phantom{8}", "38") == "wrong"
    assert judge("x = 3 \\iffalse x = 8 \\fi", "3") == "correct"
    assert judge("<!-- 8 -->", "8") == "no_answer"


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("\\boxed{50\\%}", "50"),  # escaped: a percent sign
        ("\\boxed{50%}", "50"),  # after a number: a percent sign
        ("\\boxed{50 %}", "50"),
        ("\\boxed{$28$ %}", "28\\%"),
        ("<SOLUTION>20%</SOLUTION>", "20"),
        ("\\boxed{3\\phantom{8}}", "3"),
        ("The colour is white. \\boxed{7}", "7"),
        ("Let me comment on this. \\boxed{7}", "7"),
    ],
)
def test_percent_signs_and_plain_words_stay(completion, gold):
    assert grade(completion, gold).status == "correct", completion


def test_hiding_is_linear_in_the_text():
    from sage_unsloth.grading.visible import visible

    # Many unclosed openers: each kind hides the rest at the first, so the work does not grow with their number.
    for opener in ("\\phantom{", "<!--", "\\iffalse ", "\\begin{comment}", "% "):
        text = "\\boxed{3}" + (opener + "x") * 20_000
        assert visible(text).strip() == "\\boxed{3}", opener
    closed = "\\phantom{x}" * 20_000 + "\\boxed{3}"
    assert visible(closed) == "\\boxed{3}"


# ----------------------------------------------------------------------------------------------- minus
MINUS_SIGNS = {
    "\u2212": "minus sign",
    "\uff0d": "full-width hyphen-minus",
    "\ufe63": "small hyphen-minus",
    "\u2796": "heavy minus sign",
    "\u02d7": "modifier letter minus",
    "\u2010": "hyphen",
    "\u2011": "non-breaking hyphen",
    "\u2012": "figure dash",
    "\u2013": "en dash",
}


@pytest.mark.parametrize("sign", MINUS_SIGNS, ids=list(MINUS_SIGNS.values()))
def test_every_unicode_minus_is_one_minus(sign):
    assert grade(f"\\boxed{{{sign}5}}", "-5").status == "correct"  # in the answer
    assert grade(f"\\boxed{{{sign}5}}", "5").status == "wrong"
    assert grade("\\boxed{-5}", f"{sign}5").status == "correct"  # in the gold
    assert grade(f"\\boxed{{8 {sign} 3}}", "5").status == "correct"  # between operands, spaced
    assert grade(f"\\boxed{{x^2 {sign} 1}}", "x^2-1").status == "correct"
    assert grade(f"\\boxed{{\\frac{{{sign}1}}{{2}}}}", "-1/2").status == "correct"


def test_a_dash_between_two_numbers_is_a_range_and_the_em_dash_no_minus():
    assert grade("\\boxed{1\u20135}", "-4").status == "wrong"
    assert grade("\\boxed{\u20145}", "-5").status == "wrong"


def test_a_superscript_minus_is_the_same_minus():
    assert grade("\\boxed{10\u207b\u00b3}", "0.001").status == "correct"
    assert grade("\\boxed{10\u207b\u00b3}", "1000").status == "wrong"
    assert grade("\\boxed{x\u00b2 \u2212 1}", "x^2 - 1").status == "correct"


# ----------------------------------------------------------------------------------------------- K&K
NAMES = ["Alice", "Bob"]


@pytest.mark.parametrize(
    "answer",
    [
        "Alice is a knight and a knave, Bob is a knight and a knave",  # the issue's
        "Alice is a knight and a knave. Bob is a knight.",
        "Alice is both a knight and a knave, and Bob is a knight.",
        "Alice is either a knight or a knave; Bob is a knight.",
        "Alice is a knight/knave and Bob is a knight.",
        "Alice and Bob are knights and knaves.",
        "Knights: Alice, Bob. Knaves: Alice.",  # in one block, two statements that disagree
        "Alice is a knight. Bob is a knight. Alice is a knave.",
        "Alice is a knight, Bob is a knight <!-- Alice is a knave -->",  # hidden: does not count ...
    ],
)
def test_knights_and_knaves_one_role_per_person(answer):
    solution = [True, True]
    expected = answer.endswith("-->")  # ... so that one is right
    assert grade_kk(f"<SOLUTION>{answer}</SOLUTION>", solution, NAMES) is expected, answer
    record = grade(f"<SOLUTION>{answer}</SOLUTION>", (solution, NAMES))
    assert record.status == ("correct" if expected else "wrong"), answer


def test_knights_and_knaves_contradictions_outside_a_block():
    # Without an answer block the reasoning comes first: the last statement about a name counts, and a
    # last statement giving both roles gives none.
    assert not grade_kk("Alice is a knight and a knave, Bob is a knight and a knave", [True, True], NAMES)
    assert grade_kk("Alice is a knave. Wait, no: Alice is a knight. Bob is a knight.", [True, True], NAMES)
    assert grade_kk(
        "Is Alice a knight or a knave? Alice is a knight and Bob is a knight.", [True, True], NAMES
    )
    assert grade_kk(
        "<SOLUTION>Alice is a knight, not a knave; Bob is a knight.</SOLUTION>", [True, True], NAMES
    )
    record = grade(
        "<SOLUTION>Alice is a knight and a knave. Bob is a knight.</SOLUTION>", ([True, True], NAMES)
    )
    assert record.answer == "Alice=both, Bob=knight"


# ----------------------------------------------------------------------------------------------- products
@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        ("2\\left(5\\right)", "10", "correct"),  # read as 2 + 5 = 7 before (found by the throughput profile)
        ("2\\left(5\\right)", "7", "wrong"),
        ("2(5)", "10", "correct"),
        ("3(x+1)", "3x+3", "correct"),
        ("f(5)", "f(5)", "correct"),  # a function's value stays one
        ("x_{1}(t)", "x_1(t)", "correct"),
        ("(2, 3)", "(2,3)", "correct"),
    ],
)
def test_a_number_against_a_bracket_multiplies_it(answer, gold, expected):
    assert grade(f"\\boxed{{{answer}}}", gold).status == expected
