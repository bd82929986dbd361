"""The error classes of issue 24, one test each, at the level where each was fixed (extraction,
normalisation, comparison); and the reward safety of hedged answers, through the RLVR reward function.

Every expected verdict here is a careful human's, written from the problem statement, not from the grader.
Each test failed on the grader before the fix (checked by running this file against the previous package).
"""

import pytest

from sage_unsloth.grading import extract_answer, grade, judge, math_candidate, normalise_math
from sage_unsloth.rlvr.reward import correctness_reward


def solution(answer: str) -> str:
    return f"<start_working_out>Working.<end_working_out><SOLUTION>{answer}</SOLUTION>"


def status(completion: str, gold) -> str:
    return grade(completion, gold).status


def cases(table: str) -> list[tuple[str, ...]]:
    """The rows of a case table: ``answer | gold | expected`` per line, as written (a raw string: one
    backslash is one backslash); a line starting with # is a note."""
    return [tuple(line.split(" | ")) for line in table.strip().splitlines() if not line.startswith("#")]


# ----------------------------------------------------------------------------------------------- extraction
SEVERAL_BOXES_OF = r"""
\boxed{1}, \boxed{2}, \boxed{3} | \{1,2,3\} | correct
\boxed{1} and \boxed{2} and \boxed{3} | 1, 2, 3 | correct
$$\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}$$ | (2, 2), (6, 2) | correct
$$\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}$$ | (6, 2) | wrong
\boxed{1} papers and \boxed{2} bins | 1, 2 | correct
\( y_1 = \boxed{x + 1} \) and \( y_2 = \boxed{2x} \) | y_1 = x + 1, y_2 = 2x | correct
# a sentence between two boxes: the model corrected itself, the last box is its answer
First \boxed{4}. Checking again, the count is \boxed{5}. | 5 | correct
"""


@pytest.mark.parametrize("completion, gold, expected", cases(SEVERAL_BOXES_OF))
def test_several_boxes_of_one_answer_are_graded_together(completion, gold, expected):
    assert status(completion, gold) == expected


def test_a_final_answer_statement_after_the_last_box_is_the_answer():
    text = "so the interest is $\\boxed{255}$. In all, $10,455. Final Answer: The final answer is $10,455$."
    assert extract_answer(text) == "$10,455$"
    assert status(text, "10455") == "correct"


def test_text_after_the_end_of_the_turn_is_not_the_answer():
    text = "Therefore, the probability is 2/3. <|im_end|><|im_start|>user Now the answer is 5"
    assert status(f"\\boxed{{{text}}}", "\\frac{2}{3}") == "correct"
    assert status(text + " \\boxed{5}", "5") == "no_answer"  # the box lies in the next (user's) turn


# ----------------------------------------------------------------------------------------------- prose
AN_ANSWER_READ = r"""
Final Answer: The largest $n$ is 34. | 34 | correct
The largest $n$ is 34. | n | wrong
the number is not 10 which is 1,000.99 | 1000.99 | correct
the number is not 10 which is 1,000.99 | 10 | wrong
not it's not 10 it's 12 | 12 | correct
Therefore, there are 12 sequences. | 12 | correct
Hence, we get $x = 5$. | 5 | correct
We find $y = 2$. Therefore, the answer is $x = 5$. | 2 | wrong
When multiplying by identity: $\begin{pmatrix}1 & 0 \\ 0 & 1\end{pmatrix}$ | 1 | wrong
Here is a zero matrix: $\begin{pmatrix}0 & 0 \\ 0 & 0\end{pmatrix}$ | 0 | wrong
Here is a zero matrix: $\begin{pmatrix}0 & 0 \\ 0 & 0\end{pmatrix}$ | \begin{pmatrix}0 & 0 \\ 0 & 0\end{pmatrix} | correct
"""


@pytest.mark.parametrize("answer, gold, expected", cases(AN_ANSWER_READ))
def test_an_answer_read_out_of_a_sentence(answer, gold, expected):
    assert status(solution(answer), gold) == expected


# ----------------------------------------------------------------------------------------------- normalisation
def test_a_list_joined_by_words_is_the_list():
    assert math_candidate("The numbers are 19, 46, and 82.") == "19, 46, 82"
    assert normalise_math("19, 46, and 82") == "19, 46, 82"
    assert judge("19, 46, and 82", "19, 46, 82") == "correct"
    assert judge("p=-1,p=\\frac{15}{8}", "p = -1 \\text{ and } p = \\dfrac{15}{8}") == "correct"
    assert judge("p=-1,p=\\frac{16}{8}", "p = -1 \\text{ and } p = \\dfrac{15}{8}") == "wrong"


AN_EXACT_VALUE = r"""
\frac{14}{3} \approx 4.67 | \frac{14}{3} | correct
\frac{14}{3} \approx 4.67 | 4.67 | correct
\frac{13}{3} \approx 4.67 | \frac{14}{3} | wrong
x = 5+5+1 = 1/3 \approx 11 | x = 1/3 | correct
x=1/3\approx1.3 | \frac{1}{3} | correct
L \approx 4.5 \times 10^{33} | 4.5e33 | correct
# a name before the sign: the value after
"""


@pytest.mark.parametrize("answer, gold, expected", cases(AN_EXACT_VALUE))
def test_an_exact_value_before_its_approximation_is_the_value(answer, gold, expected):
    assert judge(answer, gold) == expected


A_PRIME_IS = r"""
E' | E | wrong
E | E' | wrong
f'(x) | f(x) | wrong
f'(x) | f^{\prime}(x) | correct
E' | E' | correct
"""


@pytest.mark.parametrize("answer, gold, expected", cases(A_PRIME_IS))
def test_a_prime_is_part_of_the_name(answer, gold, expected):
    assert judge(answer, gold) == expected


UNITS_MIXED_NUMBERS = r"""
125\textnormal{ miles} | 125 | correct
10 | 10 square units | correct
11 | 10 square units | wrong
10 | 10 weeks | correct
$125$ | $125$ miles | correct
1 1/2 | \frac{3}{2} | correct
1 1/3 | \frac{3}{2} | wrong
\cos 60^\circ | \frac{1}{2} | correct
\sin(30^\circ) | \frac{1}{2} | correct
\cos 30^\circ | \frac{1}{2} | wrong
1,000.99m^2 | 1000.99 | correct
# a lone letter after a gold's number is a variable, not a unit
\frac{37}{4} | \frac{37}{4} m | wrong
"""


@pytest.mark.parametrize("answer, gold, expected", cases(UNITS_MIXED_NUMBERS))
def test_units_mixed_numbers_and_degrees(answer, gold, expected):
    assert judge(answer, gold) == expected


# ----------------------------------------------------------------------------------------------- text golds
TEXT_AND_BARE = r"""
The circle | \text{The circle} | correct
circle | \text{The circle} | correct
The parabola | \text{The circle} | wrong
The answer is (C). | C | correct
\text{(C)} | C | correct
C) 12 | C | correct
# an option and its content, not the product C*12
C. | C | correct
C and D | C | wrong
(B) | C | wrong
"""


@pytest.mark.parametrize("answer, gold, expected", cases(TEXT_AND_BARE))
def test_text_and_bare_letter_golds(answer, gold, expected):
    assert judge(answer, gold) == expected


# ----------------------------------------------------------------------------------------------- comparison
def test_assignments_name_distinct_quantities_or_list_one_unknowns_values():
    assert judge("m = 100, n = 13, m + n = 113", "113") == "correct"  # the last one is the one asked for
    assert judge("x = 1, x = 5", "5") == "wrong"  # an extraneous root kept
    assert judge("x = 1, x = 2, x = 3, x = 4, x = 5", "5") == "wrong"
    assert judge("x = 1, x = 5", "1, 5") == "correct"


# ----------------------------------------------------------------------------------------------- reward safety
GOLDS = ["5", "113", "-3", "\\frac{1}{2}", "2\\sqrt{3}", "0.25", "\\pi"]
DECOY = {
    "5": "7",
    "113": "112",
    "-3": "3",
    "\\frac{1}{2}": "\\frac{1}{3}",
    "2\\sqrt{3}": "3\\sqrt{2}",
    "0.25": "0.5",
    "\\pi": "2\\pi",
}


def hedges(gold: str, other: str) -> list[str]:
    """Completions that name the gold among other candidates: each must score 0 whatever the gold."""
    return [
        solution(f"{other}, {gold}"),
        solution(f"{gold}, {other}"),
        solution(f"${other}$ or ${gold}$"),
        solution(f"It is {other} or {gold}."),
        solution(f"x = {other}, x = {gold}"),
        solution(f"x = {other} \\text{{ or }} x = {gold}"),
        f"So the answer is \\boxed{{{other}}} or \\boxed{{{gold}}}.",
        f"$$\\boxed{{{other}}}, \\boxed{{{gold}}}$$",
        f"\\boxed{{{other}}} \\quad \\text{{and}} \\quad \\boxed{{{gold}}}",
        solution(f"\\{{{other}, {gold}\\}}"),
        solution(f"[{gold} - 1, {gold} + 1]"),
        solution(f"({gold} - 1, {gold} + 1)"),
        solution(f"{gold} - 1 < x < {gold} + 1"),
        solution(f"{gold} \\pm 1"),
    ]


@pytest.mark.parametrize("gold", GOLDS)
def test_hedged_answers_earn_no_reward_whatever_the_gold(gold):
    completions = hedges(gold, DECOY[gold])
    rewards = correctness_reward([None] * len(completions), completions, answer=[gold] * len(completions))
    paid = [c for c, r in zip(completions, rewards) if r]
    assert not paid, f"gold {gold}: hedges rewarded: {paid}"
    # The same reward pays the answer itself, boxed or in a solution block: the test can fail.
    honest = [solution(gold), f"So the answer is \\boxed{{{gold}}}.", solution(f"x = {gold}")]
    assert correctness_reward([None] * 3, honest, answer=[gold] * 3) == [1.0, 1.0, 1.0]
