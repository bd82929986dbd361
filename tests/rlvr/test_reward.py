"""The RLVR correctness reward: TRL's signature, both completion formats, gold from DAPO-Math, hostile inputs."""

import json
import time

import pytest

from sage_unsloth.data.prompts import format_completion
from sage_unsloth.rlvr.reward import completion_text, correctness_reward, score_completion


def _dapo_rows(dapo_sample, n=40):
    lines = dapo_sample.read_text().splitlines()[:n]
    return [json.loads(line) for line in lines]


def _conversational(text):
    return [{"role": "assistant", "content": text}]


def test_correct_and_incorrect_answers_on_dapo_golds(dapo_sample):
    rows = _dapo_rows(dapo_sample)
    golds = [r["reward_model"]["ground_truth"] for r in rows]
    right = [format_completion("working", g) for g in golds]
    wrong = [format_completion("working", str(int(g) + 1)) for g in golds]
    prompts = [None] * len(golds)
    assert correctness_reward(prompts, right, answer=golds) == [1.0] * len(golds)
    assert correctness_reward(prompts, wrong, answer=golds) == [0.0] * len(golds)


def test_conversational_and_plain_completions_score_alike():
    text = format_completion("2 + 2", "4")
    assert correctness_reward([None, None], [text, _conversational(text)], answer=["4", "4"]) == [1.0, 1.0]
    assert completion_text(_conversational("a") + [{"role": "tool", "content": "b"}]) == "a"


def test_answer_comes_from_the_last_solution_block_then_boxed():
    # An earlier correct block does not count: only the final answer is graded.
    assert score_completion("<SOLUTION>34</SOLUTION> wait <SOLUTION>35</SOLUTION>", "34") == 0.0
    assert score_completion("no tags, so \\boxed{12} then \\boxed{34}", "34") == 1.0
    # vLLM stops on </SOLUTION> and may drop it: an unclosed final block still counts.
    assert score_completion("<start_working_out>x<end_working_out><SOLUTION>34", "34") == 1.0
    # Equivalent forms pass (the gold is wrapped before parsing), a bare LaTeX gold included.
    assert score_completion("<SOLUTION>\\frac{1}{2}</SOLUTION>", "0.5") == 1.0
    assert score_completion("<SOLUTION>$\\sqrt{51}$</SOLUTION>", "\\sqrt{51}") == 1.0
    assert score_completion("the answer is 34", "34") == 0.0  # no solution block, no \boxed


HOSTILE = [
    "",
    None,
    12345,
    ["not", "messages"],
    {"content": None},
    "<SOLUTION></SOLUTION>",
    "<SOLUTION>" + "9" * 100_000 + "</SOLUTION>",
    "<SOLUTION>" + "{" * 5000 + "1" + "}" * 5000 + "</SOLUTION>",
    "<SOLUTION>" + "(" * 3000 + "</SOLUTION>",
    "\\boxed{" * 20_000,
    "<SOLUTION>2^{2^{2^{2^{2^{99999}}}}}</SOLUTION>",
    "<SOLUTION>99999999999!</SOLUTION>",
    "<SOLUTION>10^{10^{10^{10}}} - 10^{10^{10^{10}}} + 34</SOLUTION>",
    "<SOLUTION>\\int_0^\\infty e^{-x^{x^{x}}} dx</SOLUTION>",
    "<SOLUTION>\x00\x01\x02 34</SOLUTION>",
    "<SOLUTION>\\frac{\\frac{\\frac{\\frac{1}{0}}{0}}{0}}{0}</SOLUTION>",
    "x" * 5_000_000 + "<SOLUTION>" + "\\sqrt{" * 400 + "2" + "}" * 400 + "</SOLUTION>",
]


def test_hostile_completions_score_zero_and_never_raise():
    started = time.monotonic()
    scores = correctness_reward([None] * len(HOSTILE), HOSTILE, answer=["34"] * len(HOSTILE))
    elapsed = time.monotonic() - started
    assert scores == [0.0] * len(HOSTILE)
    # Liveness, not speed: an unbounded parse would hang here for minutes (per-item budget is ~2 s).
    assert elapsed < 2.5 * len(HOSTILE)


@pytest.mark.parametrize("gold", [None, "", "{" * 1000, object()])
def test_bad_gold_scores_zero(gold):
    assert score_completion(format_completion("w", "34"), gold) == 0.0


def test_missing_gold_column_is_a_clear_error():
    with pytest.raises(ValueError, match="gold column 'answer'"):
        correctness_reward(["p"], ["c"])
    assert correctness_reward.__name__ == "correctness"  # TRL logs rewards/correctness/*


def test_reward_is_the_eval_graders_verdict_and_settles_timeouts_deterministically(monkeypatch):
    from pathlib import Path

    from sage_unsloth import grading
    from sage_unsloth.eval.benchmarks import load_benchmark
    from sage_unsloth.rlvr import reward

    cases = [
        json.loads(line)
        for line in (Path(__file__).parents[1].joinpath("fixtures") / "grading_cases.jsonl")
        .read_text()
        .splitlines()
    ]
    golds = {(n, p.problem_id): p.gold for n in ("aime24", "amc23", "math500") for p in load_benchmark(n)}
    sample = [c for c in cases if c["benchmark"] in ("aime24", "amc23", "math500")][::6]
    assert len(sample) > 60
    for case in sample:
        gold = golds[(case["benchmark"], case["problem_id"])]
        assert score_completion(case["completion"], gold) == float(
            grading.grade(case["completion"], gold).correct
        )
    # Out of budget: 0 at once and counted, never graded again inside training (no retry).
    from sage_unsloth.grading import verify

    compare = verify._symbolic_equal
    calls = []

    def slow_compare(candidate, form):  # 5 ms of CPU more per comparison: over a 1 us budget, always
        calls.append(candidate)
        end = time.thread_time() + 0.005
        while time.thread_time() < end:
            pass
        return compare(candidate, form)

    monkeypatch.setattr(verify, "_symbolic_equal", slow_compare)
    text, gold = format_completion("w", "(x+1)^2"), "x^2 + 2x + 1"
    assert score_completion(text, gold) == 1.0
    reward.take_timeouts()
    calls.clear()
    assert score_completion(text, gold, timeout_s=1e-6) == 0.0
    assert len(calls) <= 1, "graded again after running out of budget"
    assert reward.take_timeouts() == 1
