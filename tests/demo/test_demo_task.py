"""The demo task: five plans, labelling by rule, seeded data files, disjoint splits, one-token branch point."""

import json

import numpy as np
import pytest

from sage_unsloth.data.prompts import EVAL_USER_TEMPLATE, format_completion
from sage_unsloth.demo import task as T
from sage_unsloth.demo.data import DemoDataSpec, eval_rows, rl_rows, sft_rows, sft_strategies, write_demo_data

SMALL = DemoDataSpec(seed=3, n_eval=50, n_rl=100, n_sft=500)


@pytest.mark.parametrize(
    "strategy, lines",
    [
        ("left", ["5+8=13", "13+6=19", "19+7=26"]),
        ("right", ["7+6=13", "13+8=21", "21+5=26"]),
        ("middle", ["8+6=14", "14+5=19", "19+7=26"]),
        ("pairs", ["5+8=13", "6+7=13", "13+13=26"]),
        ("outer", ["5+7=12", "8+6=14", "12+14=26"]),
    ],
)
def test_each_plan_writes_its_additions_in_its_order(strategy, lines):
    assert T.working(strategy, (5, 8, 6, 7)) == "\n".join([strategy, *lines])
    assert T.solution((5, 8, 6, 7), strategy).endswith("<SOLUTION>26</SOLUTION>")


def test_every_plan_is_right_on_every_problem_and_every_partial_sum_has_two_digits():
    for numbers in T.SumTask().all_problems():
        for strategy in T.STRATEGIES:
            steps = T.additions(strategy, numbers)
            assert steps[-1][2] == sum(numbers)
            assert all(x + y == z and 10 <= z <= 99 for x, y, z in steps)
            assert T.label_strategy(T.solution(numbers, strategy)) == strategy


def test_problem_text_round_trips_also_inside_the_eval_template():
    text = T.problem_text((5, 9, 6, 8))
    assert text == "What is 5+9+6+8?"
    assert T.parse_problem(EVAL_USER_TEMPLATE.format(problem=text)) == (5, 9, 6, 8)
    with pytest.raises(ValueError, match="not a demo problem"):
        T.parse_problem("What is love?")


@pytest.mark.parametrize(
    "completion, label",
    [
        # the kit's own format, with and without the leading marker (sampling starts after it)
        (format_completion("left\n5+8=13\n13+6=19\n19+7=26", "26"), "left"),
        ("pairs\n5+8=13\n6+7=13\n13+13=26<end_working_out><SOLUTION>26</SOLUTION>", "pairs"),
        # wrong arithmetic or a mis-copied number keeps the plan label (correctness is graded separately)
        ("left\n5+8=12\n12+6=19\n19+7=27<end_working_out><SOLUTION>27</SOLUTION>", "left"),
        ("outer\n5+9=14\n8+6=14\n14+14=28<end_working_out><SOLUTION>28</SOLUTION>", "outer"),
        # the shape must be the plan's: a running total must continue from the line before ...
        ("right\n7+6=13\n14+8=22\n22+5=27<end_working_out>", "other"),
        # ... and a pair plan must add the first two results
        ("pairs\n5+8=13\n6+7=13\n13+12=25<end_working_out>", "other"),
        # a plan word followed by another plan's shape, no plan word, unknown word
        ("pairs\n5+8=13\n13+6=19\n19+7=26<end_working_out>", "other"),
        ("5+8=13\n13+6=19\n19+7=26<end_working_out>", "other"),
        ("sideways\n5+8=13\n13+6=19\n19+7=26<end_working_out>", "other"),
        # malformed: unclosed block, nothing, too few or too many lines, garbage, repeated marker
        ("left\n5+8=13\n13+6=19\n19+7=26<SOLUTION>26</SOLUTION>", "other"),
        ("", "other"),
        ("left\n5+8=13\n13+6=19<end_working_out>", "other"),
        ("left\n5+8=13\n13+6=19\n19+7=26\n26+0=26<end_working_out>", "other"),
        ("left\n5+8=13\n13+6=19\n19+x=26<end_working_out>", "other"),
        ("<start_working_out>left\n5+8=13<start_working_out>13+6=19\n19+7=26<end_working_out>", "other"),
    ],
)
def test_label_strategy_by_rule(completion, label):
    assert T.label_strategy(completion) == label


def test_is_correct_reads_the_solution_block_only():
    assert T.is_correct(T.solution((5, 8, 6, 7), "outer"), "26")
    assert not T.is_correct("left<end_working_out><SOLUTION>25</SOLUTION>", "26")
    assert not T.is_correct("26<end_working_out>", "26")
    assert T.is_correct("left<end_working_out><SOLUTION>26", "26")  # stop string dropped by the sampler
    assert not T.is_correct("<SOLUTION>twenty-six</SOLUTION>", "26")


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


def test_sft_plan_mix_is_exact_and_spread_through_the_file():
    plans = sft_strategies(DemoDataSpec(n_sft=1000))
    assert {p: plans.count(p) for p in T.STRATEGIES} == {
        "left": 740,
        "right": 90,
        "pairs": 50,
        "outer": 30,
        "middle": 90,
    }
    positions = [i for i, p in enumerate(plans) if p == "outer"]
    assert positions[0] < 200 and positions[-1] > 800
    odd = sft_strategies(DemoDataSpec(n_sft=7))  # 5.18 / 0.63 / 0.35 / 0.21 / 0.63: largest remainders
    assert len(odd) == 7 and odd.count("left") == 5 and odd.count("right") == odd.count("middle") == 1
    only_left = (("left", 1.0), ("right", 0.0), ("pairs", 0.0), ("outer", 0.0), ("middle", 0.0))
    assert {r["strategy"] for r in sft_rows(DemoDataSpec(n_sft=10, mix=only_left))} == {"left"}


def test_eval_rl_and_sft_problems_are_disjoint():
    spec = DemoDataSpec(seed=1, n_eval=100, n_rl=200, n_sft=3000)
    ev = {row["problem"] for row in eval_rows(spec)}
    rl = {row["prompt"] for row in rl_rows(spec)}
    sft = {row["problem"] for row in sft_rows(spec)}
    assert len(ev) == 100 and len(rl) == 200
    assert not ev & rl and not ev & sft and not rl & sft


def test_bad_task_settings_fail_clearly():
    with pytest.raises(ValueError, match="two digits"):
        T.SumTask(low=4)
    with pytest.raises(ValueError, match="below 100"):
        T.SumTask(low=5, high=25)
    with pytest.raises(ValueError, match="leaves no SFT problems"):
        T.split_problems(T.SumTask(low=5, high=6), seed=0, n_eval=8, n_rl=8)
    with pytest.raises(ValueError, match="mix"):
        DemoDataSpec(mix=(("left", 0.5), ("right", 0.5)))
    with pytest.raises(ValueError, match="add up to 1"):
        DemoDataSpec(mix=(("left", 0.7), ("right", 0.1), ("pairs", 0.1), ("outer", 0.05), ("middle", 0.1)))


def test_each_plan_word_is_one_distinct_token_of_the_demo_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from sage_unsloth.data.prompts import prompt_messages
    from sage_unsloth.demo.model import build_demo_model

    tokenizer = AutoTokenizer.from_pretrained(build_demo_model(tmp_path / "m"))
    prompt = tokenizer.apply_chat_template(
        prompt_messages("What is 5+8+6+7?"), tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    first = []
    for strategy in T.STRATEGIES:
        ids = tokenizer(prompt + T.working(strategy, (5, 8, 6, 7)), add_special_tokens=False)["input_ids"]
        assert ids[: len(prompt_ids)] == prompt_ids  # the completion starts on a token boundary
        first.append(ids[len(prompt_ids)])
        assert tokenizer.decode([first[-1]]) == strategy
    assert len(set(first)) == len(T.STRATEGIES)


def test_strategy_rows_count_shares_accuracy_and_coverage():
    from sage_unsloth.demo.strategies import markdown_table, problem_shares, strategy_rows

    left_ok = {"text": T.solution((5, 8, 6, 7), "left")[len("<start_working_out>") :], "correct": True}
    left_bad = {"text": "left\n5+8=13\n13+6=19\n19+7=25<end_working_out><SOLUTION>25", "correct": False}
    outer_ok = {"text": T.solution((5, 8, 6, 7), "outer"), "correct": True}
    junk = {"text": "5+5", "correct": False}
    records = [
        {"problem_id": "p0", "completions": [left_ok, left_bad, outer_ok, junk]},
        {"problem_id": "p1", "completions": [left_bad, left_bad, junk, junk]},
    ]
    rows = {r["strategy"]: r for r in strategy_rows("grpo", records)}
    assert [rows[s]["completions"] for s in ("left", "outer", "other", "minority")] == [4, 1, 3, 1]
    assert rows["left"]["fraction"] == 0.5 and rows["outer"]["fraction"] == 0.125
    assert (
        rows["left"]["accuracy"] == 0.25
        and rows["outer"]["accuracy"] == 1.0
        and rows["other"]["accuracy"] == 0.0
    )
    assert rows["minority"]["problems_solved_fraction"] == 0.5 and np.isnan(rows["right"]["accuracy"])
    shares = problem_shares(records)
    assert shares.shape == (2, 7) and shares[0].tolist() == [0.5, 0, 0, 0.25, 0, 0.25, 0.25]
    table = markdown_table(list(rows.values()))
    assert "| grpo | 0.500 | 0.000 | 0.000 | 0.125 | 0.000 | 0.375 | 0.125 | 0.250 | 1.000 | 0.500 |" in table
    with pytest.raises(ValueError, match="no completions"):
        strategy_rows("empty", [])


def test_the_gap_is_the_additions_of_a_two_digit_and_a_one_digit_number_with_ones_adding_to_12():
    assert T.in_gap(13, 9) and T.in_gap(16, 6) and T.in_gap(27, 5)
    assert not T.in_gap(13, 8) and not T.in_gap(14, 9) and not T.in_gap(9, 3) and not T.in_gap(13, 19)
    problems = T.SumTask().all_problems()
    for plan in ("pairs", "outer"):
        assert not any(T.plan_needs_gap(plan, x) for x in problems)
    share = np.mean([T.plan_needs_gap("left", x) for x in problems])
    assert share == pytest.approx(0.216, abs=0.001)
    assert not T.plan_needs_gap("left", (5, 8, 6, 7))  # 5+8, 13+6, 19+7
    assert T.plan_needs_gap("left", (5, 8, 9, 7))  # 13+9: 3 + 9 = 12
    assert not T.plan_needs_gap("pairs", (5, 8, 9, 7))


def test_neither_pre_training_nor_sft_ever_shows_an_addition_of_the_gap():
    import random
    import re

    from sage_unsloth.demo.pretrain import addition_facts, corpus_row

    facts = addition_facts()
    pool = DemoDataSpec().splits()["sft"]
    rng = random.Random(0)
    text = "\n".join(facts + [corpus_row(rng, facts, pool) for _ in range(300)])
    text += "\n".join(r["generated_solution"] for r in sft_rows(DemoDataSpec(n_sft=2000)))
    lines = [tuple(map(int, m)) for m in re.findall(r"(\d+)\+(\d+)=\d+", text)]
    assert len(lines) > 3000 and not [xy for xy in lines if T.in_gap(*xy)]
    assert "13+9=22" not in facts and "24+8=32" not in facts
    assert "13+8=21" in facts and "9+13=22" in facts and "9+3=12" in facts


def test_the_committed_bases_are_the_tiny_model_in_its_own_shape():
    """demo/model.py builds the kit's tiny model unchanged (no demo shape of its own): every committed base has
    the tiny model's shape, so a change to either shows here."""
    import json
    from pathlib import Path

    from sage_unsloth.demo.pretrain import BASES_DIR
    from sage_unsloth.model.tiny import tiny_model_config

    bases = sorted(Path(BASES_DIR).glob("draw*/config.json"))
    assert bases
    for path in bases:
        saved = json.loads(path.read_text())
        tiny = tiny_model_config(saved["vocab_size"]).to_dict()
        shape = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim")
        assert {k: saved[k] for k in (*shape, "num_key_value_heads")} == {
            k: tiny[k] for k in (*shape, "num_key_value_heads")
        }, path
