"""Property-based tests of the grader (Hypothesis, derandomized: a fixed seed and a fixed example budget, so
a run is reproducible and CI-sized). Strings random and adversarial: deep nesting, repeated unit and operator
tails, huge numbers and power towers, unicode digits and control characters, many boxes. Properties:

- every ``grade`` returns within its budget (CPU of this thread: budget + one tick + slack) and never raises;
- a hedge of the gold (other values beside it, in any order, with a dangling operator or punctuation) is
  never correct;
- the pool gives the serial verdict (on a small sample: a pool is slow to start).

A slow or wrong input found here goes into tests/data/grader_regressions.jsonl (test_grading_regressions.py).
"""

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sage_unsloth import grading
from sage_unsloth.eval.gradepool import GradingPool

BUDGET_S = 1.0
SLACK_S = BUDGET_S / 20 + 0.25  # one deadline tick, and the clean-up after it
FUZZ = settings(
    derandomize=True,  # a fixed seed: every run draws the same examples
    max_examples=150,
    deadline=None,  # the property checks the time itself, on the grading thread's CPU clock
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ATOMS = [
    "5",
    "7",
    "0",
    "-",
    "+",
    "*",
    "**",
    "/",
    "^",
    "!",
    "=",
    ",",
    ";",
    ".",
    " ",
    "  ",
    "\t",
    "\n",
    "m",
    "x",
    "cm",
    "kg",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "$",
    "\\",
    "\\frac",
    "\\sqrt",
    "\\text{ m}",
    "\\mathrm{",
    "\\boxed{",
    "\\left(",
    "\\right)",
    "\\cdot",
    "\\times",
    "10^{",
    "^ 1 ",
    "\\,",
    "\\!",
    "\\Gamma(",
    "\\binom{",
    "e^{",
    " or ",
    " and ",
    "is",
    "not",
    "<SOLUTION>",
    "</SOLUTION>",
    "５",
    "٥",
    "𝟓",
    "\u200b",
    "\u202e",
    "\ufeff",
    "\x00",
    "\x0b",
    "\r",
    "\u0301",
    "½",
    "∞",
    "√",
]
TAILS = [
    "^ 1 ",
    " m",
    "m^2 ",
    "+",
    "\\,",
    "{",
    "(",
    "\\frac{",
    "\\boxed{",
    "10^{",
    "!",
    ",",
    " or ",
    "**",
    "\\text{ cm}",
    "^{-1}",
    "/",
    " ",
    "\\cdot 10^",
    "$",
    "\\left(",
    "_1",
]

atom_text = st.lists(st.sampled_from(ATOMS), max_size=60).map("".join)
unicode_text = st.text(max_size=200)
repeated_tail = st.builds(
    lambda head, tail, n, end: head + tail * n + end,
    st.sampled_from(["5", "5 m", "3.2\\times 10^", "x = 5", "\\frac{1}{2}", "10"]),
    st.sampled_from(TAILS),
    st.integers(1, 400),
    st.sampled_from(["", "+", "}", ")", "!", "x", "\\"]),
)
tower = st.builds(
    lambda base, depth, open_, close: (base + "^" + open_) * depth + base + close * depth,
    st.sampled_from(["9", "10", "2", "e", "x", "99999"]),
    st.integers(1, 12),
    st.sampled_from(["(", "{", "\\left("]),
    st.sampled_from([")", "}", "\\right)"]),
)
huge = st.builds(
    lambda n, op: op.format(n),
    st.integers(10**5, 10**400).map(str),
    st.sampled_from(
        ["{0}", "{0}!", "\\Gamma({0})", "\\binom{{{0}}}{{3}}", "10^{{{0}}}", "({0})!", "{0}^{{{0}}}"]
    ),
)
nested = st.builds(
    lambda opener, closer, n, inner: opener * n + inner + closer * n,
    st.sampled_from(["(", "{", "\\frac{", "\\sqrt{", "[", "\\boxed{"]),
    st.sampled_from([")", "}", "]", ""]),
    st.integers(1, 3000),
    st.sampled_from(["1", "5", "x", ""]),
)
boxes = st.builds(
    lambda k, v, sep: sep.join(f"\\boxed{{{v}}}" for _ in range(k)),
    st.integers(1, 300),
    st.sampled_from(["5", "7", "", "{", "5, 7"]),
    st.sampled_from(["", " and ", ", ", " so "]),
)
answers = st.one_of(atom_text, unicode_text, repeated_tail, tower, huge, nested, boxes)
wrappers = st.sampled_from(
    ["<SOLUTION>{}</SOLUTION>", "\\boxed{{{}}}", "{}", "Working. <SOLUTION>{}", "The answer is ${}$."]
)
completions = st.builds(
    lambda w, a: w.replace("{}", a, 1) if w != "\\boxed{{{}}}" else "\\boxed{" + a + "}", wrappers, answers
)
golds = st.sampled_from(["5", "7", "\\frac{1}{2}", "x^2+1", "10^{10}", "\\text{(C)}", "3\\sqrt{2}", "(1,2)"])


@FUZZ
@given(completions, golds)
def test_every_grade_returns_within_its_budget_and_never_raises(completion, gold):
    grading.warm_up()  # once per process (seconds, cold) and outside every budget by design
    start = time.thread_time()
    result = grading.grade(completion, gold, timeout_s=BUDGET_S)  # raising fails the property too
    spent = time.thread_time() - start
    assert result.status in grading.STATUSES
    assert spent <= BUDGET_S + SLACK_S, f"{spent:.2f} CPU s for {completion[:120]!r} against {gold!r}"


others = st.lists(st.integers(0, 999), min_size=1, max_size=4)
separators = st.sampled_from([", ", " or ", ",", "; ", " and ", " \\text{ or } ", ", x = "])
danglers = st.sampled_from(["", " +", " -", ".", ",", " =", " \\cdot", " *", ";", " ,"])


@FUZZ
@given(st.integers(0, 999), others, st.integers(0, 4), separators, danglers, st.booleans(), wrappers)
def test_a_hedge_of_the_gold_is_never_correct(gold, values, position, sep, dangle, named, wrapper):
    values = [v for v in values if v != gold]
    if not values:
        values = [gold + 1]
    values.insert(min(position, len(values)), gold)
    items = [f"x = {v}" if named else str(v) for v in values]
    hedge = sep.join(items) + dangle
    completion = wrapper.replace("{}", hedge, 1) if wrapper != "\\boxed{{{}}}" else "\\boxed{" + hedge + "}"
    assert not grading.grade(completion, str(gold)).correct, completion


def test_the_pool_gives_the_serial_verdicts_on_a_sample():
    sample = []

    @settings(
        derandomize=True,
        max_examples=40,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(completions, golds)
    def collect(completion, gold):
        sample.append((completion, gold))

    collect()
    sample += [
        ("<SOLUTION>5 m" + "^ 1 " * 24 + "+</SOLUTION>", "5"),
        ("\\boxed{2**10}", "1024"),
        ("<SOLUTION>5, 7 +</SOLUTION>", "7"),
        ("<SOLUTION>9^(9^(9^9))</SOLUTION>", "5"),
    ]
    serial = [grading.grade(c, g, timeout_s=BUDGET_S).status for c, g in sample]
    with GradingPool(workers=1, inline_threshold=0, chunk=8, timeout_s=BUDGET_S) as pool:
        pooled = [g.status for g in pool.grade(sample)]
    differ = [
        (s, p, c[:80], g)
        for s, p, (c, g) in zip(serial, pooled, sample)
        if s != p and grading.TIMEOUT not in (s, p)
    ]
    assert not differ
    assert serial == pooled
