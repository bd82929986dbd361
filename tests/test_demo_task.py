"""The demo task: answers, strategy labelling by rule, seeded data files, disjoint splits."""

import json
from pathlib import Path

import pytest

from sage_unsloth.demo import task as T
from sage_unsloth.demo.data import DemoDataSpec, eval_rows, rl_rows, sft_rows, write_demo_data
from sage_unsloth.prompts import EVAL_USER_TEMPLATE, format_completion

SMALL = DemoDataSpec(seed=3, n_eval=50, n_rl=100, n_sft=500, rare_fraction=0.1)


def test_both_strategies_write_the_expected_working_and_the_right_sum():
    assert T.working_running_total((3, 8, 5, 6)) == "3+8=11\n11+5=16\n16+6=22"
    assert T.working_pairing((3, 8, 5, 6)) == "(3+8)+(5+6)\n=11+11\n=22"
    assert T.working_pairing((1, 2, 3)) == "(1+2)+3\n=3+3\n=6"
    assert T.solution((3, 8, 5, 6), "A").endswith("<SOLUTION>22</SOLUTION>")
    for numbers in [(1, 1, 1, 1), (9, 9, 9, 9), (2, 7, 4, 9)]:
        for strategy in T.STRATEGIES:
            working = T.WORKING[strategy](numbers)
            assert int(working.rsplit("=", 1)[1]) == sum(numbers)
            # every line is right: a step ``x+y=z``, or a regrouping/partial sum of the whole list
            for line in working.replace("(", "").replace(")", "").splitlines():
                terms = lambda side: sum(int(x) for x in side.split("+"))
                if "=" in line.lstrip("="):
                    lhs, rhs = line.split("=")
                    assert terms(lhs) == int(rhs)
                else:
                    assert terms(line.lstrip("=")) == sum(numbers)


def test_problem_text_round_trips_also_inside_the_eval_template():
    text = T.problem_text((4, 0, 9, 2))
    assert text == "What is 4+0+9+2?"
    assert T.parse_problem(EVAL_USER_TEMPLATE.format(problem=text)) == (4, 0, 9, 2)
    with pytest.raises(ValueError, match="not a demo problem"):
        T.parse_problem("What is love?")


@pytest.mark.parametrize("completion, label", [
    # the kit's own format, with and without the leading marker (sampling starts after it)
    (format_completion("3+8=11\n11+5=16\n16+6=22", "22"), "A"),
    ("3+8=11\n11+5=16\n16+6=22<end_working_out><SOLUTION>22</SOLUTION>", "A"),
    (format_completion("(3+8)+(5+6)\n=11+11\n=22", "22"), "B"),
    ("(1+2)+3\n=3+3\n=6<end_working_out><SOLUTION>6</SOLUTION>", "B"),
    # wrong arithmetic keeps the strategy label (correctness is graded separately)
    ("3+8=12\n12+5=16\n16+6=23<end_working_out><SOLUTION>23</SOLUTION>", "A"),
    ("(3+8)+(5+6)\n=11+12\n=24<end_working_out><SOLUTION>24</SOLUTION>", "B"),
    # a chain that does not continue from the previous result is not a running total
    ("3+8=11\n5+6=11\n11+11=22<end_working_out><SOLUTION>22</SOLUTION>", "other"),
    # malformed: unclosed block, nothing, one step, garbage, pairing without its sum line, repeated marker
    ("3+8=11\n11+5=16\n16+6=22<SOLUTION>22</SOLUTION>", "other"),
    ("", "other"),
    ("<end_working_out><SOLUTION>22</SOLUTION>", "other"),
    ("3+8=11<end_working_out><SOLUTION>11</SOLUTION>", "other"),
    ("60+></=2working<end_working_out>", "other"),
    ("(3+8)+(5+6)\n=11+11<end_working_out><SOLUTION>22</SOLUTION>", "other"),
    ("3+8+5+6\n=22\n=22<end_working_out><SOLUTION>22</SOLUTION>", "other"),
    ("<start_working_out>3+8=11\n11+5=16<start_working_out>16+6=22<end_working_out>", "other"),
])
def test_label_strategy_by_rule(completion, label):
    assert T.label_strategy(completion) == label


def test_is_correct_reads_the_solution_block_only():
    assert T.is_correct(T.solution((3, 8, 5, 6), "B"), "22")
    assert not T.is_correct("3+8=11<end_working_out><SOLUTION>21</SOLUTION>", "22")
    assert not T.is_correct("22<end_working_out>", "22")
    assert T.is_correct("3+8=11<end_working_out><SOLUTION>22", "22")  # stop string dropped by the sampler
    assert not T.is_correct("<SOLUTION>twenty-two</SOLUTION>", "22")


def test_generators_are_deterministic_and_seed_dependent(tmp_path):
    a = write_demo_data(tmp_path / "a", SMALL)
    b = write_demo_data(tmp_path / "b", SMALL)
    c = write_demo_data(tmp_path / "c", DemoDataSpec(**{**SMALL.__dict__, "seed": 4}))
    for key in ("sft", "rl", "eval"):
        assert a[key].read_bytes() == b[key].read_bytes()
        assert a[key].read_bytes() != c[key].read_bytes()
    spec = json.loads((tmp_path / "a" / "demo_data.json").read_text())
    assert spec["spec"]["seed"] == 3 and spec["files"]["sft.jsonl"]["rows"] == 500


def test_files_have_the_stage_layouts_and_correct_golds(tmp_path):
    paths = write_demo_data(tmp_path, SMALL)
    read = lambda key: [json.loads(line) for line in paths[key].read_text().splitlines()]
    sft, rl, ev = read("sft"), read("rl"), read("eval")
    assert paths["eval"].name == "demo.jsonl"
    assert len(sft) == 500 and len(rl) == 100 and len(ev) == 50
    for row in sft:
        assert set(row) == {"problem", "generated_solution", "expected_answer", "strategy"}
        numbers = T.parse_problem(row["problem"])
        assert row["expected_answer"] == str(sum(numbers))
        completion = format_completion(row["generated_solution"], row["expected_answer"])
        assert T.label_strategy(completion) == row["strategy"]
        assert T.is_correct(completion, row["expected_answer"])
    for row in rl:
        assert set(row) == {"prompt", "solution"}
        assert row["solution"] == str(sum(T.parse_problem(row["prompt"])))
    for row in ev:
        assert set(row) == {"problem", "solution", "answer", "unique_id"}
        assert row["answer"] == str(sum(T.parse_problem(row["problem"])))
        assert row["solution"].endswith(f"\\boxed{{{row['answer']}}}$.")
    assert len({row["unique_id"] for row in ev}) == len(ev)


def test_rare_strategy_share_is_exact_and_both_pools_are_used():
    rows = sft_rows(DemoDataSpec(seed=0, n_sft=1000, rare_fraction=0.1))
    strategies = [row["strategy"] for row in rows]
    assert strategies.count("B") == 100 and strategies.count("A") == 900
    # B rows are spread through the file, not bunched at one end
    positions = [i for i, s in enumerate(strategies) if s == "B"]
    assert positions[0] < 200 and positions[-1] > 800
    assert {row["strategy"] for row in sft_rows(DemoDataSpec(n_sft=10, rare_fraction=0.0))} == {"A"}


def test_eval_rl_and_sft_problems_are_disjoint():
    spec = DemoDataSpec(seed=1, n_eval=200, n_rl=800, n_sft=3000)
    ev = {row["problem"] for row in eval_rows(spec)}
    rl = {row["prompt"] for row in rl_rows(spec)}
    sft = {row["problem"] for row in sft_rows(spec)}
    assert len(ev) == 200 and len(rl) == 800
    assert not ev & rl and not ev & sft and not rl & sft


def test_bad_task_settings_fail_clearly():
    with pytest.raises(ValueError, match="n_terms"):
        T.SumTask(n_terms=2)
    with pytest.raises(ValueError, match="below 100"):
        T.SumTask(n_terms=12, high=9)
    with pytest.raises(ValueError, match="leaves no SFT problems"):
        T.split_problems(T.SumTask(n_terms=3, low=1, high=2), seed=0, n_eval=4, n_rl=4)
    with pytest.raises(ValueError, match="rare_fraction"):
        sft_rows(DemoDataSpec(rare_fraction=1.5))


def test_strategy_rows_count_shares_accuracy_and_coverage():
    from sage_unsloth.demo.strategies import markdown_section, strategy_rows

    a_ok = {"text": T.solution((1, 2, 3, 4), "A")[len("<start_working_out>"):], "correct": True}
    a_bad = {"text": "1+2=3\n3+3=7\n7+4=11<end_working_out><SOLUTION>11", "correct": False}
    b_ok = {"text": T.solution((1, 2, 3, 4), "B"), "correct": True}
    junk = {"text": "1+1", "correct": False}
    records = [{"problem_id": "p0", "completions": [a_ok, a_bad, b_ok, junk]},
               {"problem_id": "p1", "completions": [a_bad, a_bad, junk, junk]}]
    rows = {r["strategy"]: r for r in strategy_rows("grpo", records)}
    assert [rows[s]["completions"] for s in ("A", "B", "other")] == [4, 1, 3]
    assert rows["A"]["fraction"] == 0.5 and rows["B"]["fraction"] == 0.125
    assert rows["A"]["accuracy"] == 0.25 and rows["B"]["accuracy"] == 1.0 and rows["other"]["accuracy"] == 0.0
    assert rows["A"]["problems_solved_fraction"] == 0.5 and rows["other"]["problems_solved_fraction"] == 0.0
    section = markdown_section(list(rows.values()), None, Path("."))
    assert "| grpo | 0.500 | 0.125 | 0.375 | 0.250 | 1.000 | 0.500 | 0.500 |" in section
