"""RLVR data: both accepted layouts, local JSONL/parquet, clear errors, prompt-length filtering."""

import json

import pytest

from sage_unsloth.data.prompts import SYSTEM_PROMPT
from sage_unsloth.rlvr.data import build_rlvr_dataset, load_source, prompt_token_lengths, to_rlvr_row


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_verl_layout_of_the_bundled_sample(dapo_sample):
    source = load_source(dataset_path=str(dapo_sample))
    data = build_rlvr_dataset(source)
    assert len(data) == 300 and data.column_names == ["prompt", "answer"]
    first = data[0]
    assert first["answer"] == "34"
    assert first["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert first["prompt"][1]["role"] == "user" and first["prompt"][1]["content"].startswith(
        "In triangle $ABC$"
    )


def test_open_r1_layout_from_jsonl_and_parquet(tmp_path):
    rows = [
        {"prompt": "What is 1+1?", "solution": "2", "data_source": "x"},
        {"prompt": "What is 2+3?", "solution": 5, "data_source": "y"},
    ]
    jsonl = _write_jsonl(tmp_path / "flat.jsonl", rows)
    data = build_rlvr_dataset(load_source(dataset_path=str(jsonl)))
    assert [r["answer"] for r in data] == ["2", "5"]
    assert data[1]["prompt"][1]["content"] == "What is 2+3?"

    import pandas as pd

    parquet = tmp_path / "flat.parquet"
    pd.DataFrame([{"prompt": "What is 1+1?", "solution": "2"}]).to_parquet(parquet)
    assert build_rlvr_dataset(load_source(dataset_path=str(parquet)))[0]["answer"] == "2"


def test_missing_fields_and_empty_data_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="no gold answer") as err:
        to_rlvr_row({"prompt": "q"})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="no problem text"):
        to_rlvr_row({"solution": "3"})
    with pytest.raises(ValueError, match="no gold answer"):
        build_rlvr_dataset(
            load_source(
                dataset_path=str(_write_jsonl(tmp_path / "nogold.jsonl", [{"prompt": "q", "other": 1}]))
            )
        )
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        build_rlvr_dataset(load_source(dataset_path=str(tmp_path / "empty.jsonl")))
    with pytest.raises(FileNotFoundError, match="dataset_path"):
        load_source(dataset_path=str(tmp_path / "missing.jsonl"))
    (tmp_path / "rows.csv").write_text("a\n1\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        load_source(dataset_path=str(tmp_path / "rows.csv"))


def test_prompt_length_filter_keeps_only_prompts_that_fit(tmp_path, tiny_tokenizer):
    rows = [{"prompt": "Add 1 and 2.", "solution": "3"}, {"prompt": "sum " * 400, "solution": "1"}]
    source = load_source(dataset_path=str(_write_jsonl(tmp_path / "mixed.jsonl", rows)))
    full = build_rlvr_dataset(source)
    short_len, long_len = prompt_token_lengths(full["prompt"], tiny_tokenizer)
    assert short_len < long_len
    kept = build_rlvr_dataset(source, tiny_tokenizer, max_prompt_length=short_len)
    assert [r["answer"] for r in kept] == ["3"]
    # The count is of the prompt as the trainer renders it: chat template + generation prompt.
    rendered = tiny_tokenizer.apply_chat_template(
        full[0]["prompt"], tokenize=False, add_generation_prompt=True
    )
    assert short_len == len(tiny_tokenizer(rendered, add_special_tokens=False)["input_ids"])
    with pytest.raises(ValueError, match="no prompt fits max_prompt_length=3"):
        build_rlvr_dataset(source, tiny_tokenizer, max_prompt_length=3)


def test_max_rows_limits_before_mapping(dapo_sample):
    data = build_rlvr_dataset(load_source(dataset_path=str(dapo_sample)), max_rows=5)
    assert len(data) == 5
