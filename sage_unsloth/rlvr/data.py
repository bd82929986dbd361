"""RLVR training prompts: DAPO-Math-17k as ``{"prompt": [system, user], "answer": gold}`` rows.

Source: ``open-r1/DAPO-Math-17k-Processed`` (config ``en``; fields ``prompt`` = problem text and
``solution`` = gold answer) through ``datasets``, as in the official code. A local JSONL / parquet file
overrides it; it may use that layout, the verl layout (``prompt[0].content`` and
``reward_model.ground_truth``, e.g. sage_unsloth/data/rlvr/dapo_math_sample.jsonl), or a plain ``answer`` column.

Prompts whose chat-rendered length leaves no room for ``max_completion_length`` inside the model's
context are dropped, so a rollout is never truncated by the context rather than by its own budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sage_unsloth.data.prompts import prompt_messages

DEFAULT_DATASET = "open-r1/DAPO-Math-17k-Processed"
DEFAULT_CONFIG = "en"
GOLD_FIELDS = ("solution", "answer")  # flat layouts; the verl layout is handled separately


def _problem_text(row: dict[str, Any]) -> str | None:
    prompt = row.get("prompt", row.get("problem"))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:  # verl: [{"role": "user", "content": ...}]
        users = [m for m in prompt if isinstance(m, dict) and m.get("role", "user") == "user"]
        if users and isinstance(users[0].get("content"), str):
            return users[0]["content"]
    return None


def _gold(row: dict[str, Any]) -> Any:
    for key in GOLD_FIELDS:
        if row.get(key) not in (None, ""):
            return row[key]
    reward_model = row.get("reward_model")
    if isinstance(reward_model, dict) and reward_model.get("ground_truth") not in (None, ""):
        return reward_model["ground_truth"]
    return None


def row_problem(row: dict[str, Any]) -> str | None:
    """What a local RLVR row lacks (its problem text or its gold answer, in any accepted layout), or None."""
    if _problem_text(row) is None:
        return "has no problem text (a string 'prompt' or 'problem', or a verl 'prompt' message list)"
    if _gold(row) is None:
        return f"has no gold answer (one of {', '.join(GOLD_FIELDS)}, or 'reward_model.ground_truth')"
    return None


def to_rlvr_row(row: dict[str, Any]) -> dict[str, Any]:
    """One source row in any accepted layout -> ``{"prompt": messages, "answer": gold string}``."""
    problem, gold = _problem_text(row), _gold(row)
    if problem is None:
        raise ValueError(
            f"dataset row has no problem text: expected a string 'prompt' (or 'problem') or a verl "
            f"'prompt' message list; got fields {sorted(row)}"
        )
    if gold is None:
        raise ValueError(
            f"dataset row has no gold answer: expected one of {GOLD_FIELDS} or "
            f"'reward_model.ground_truth'; got fields {sorted(row)}"
        )
    return {"prompt": prompt_messages(problem), "answer": str(gold).strip()}


def load_source(
    dataset_name: str = DEFAULT_DATASET,
    dataset_config: str | None = DEFAULT_CONFIG,
    dataset_path: str | None = None,
    split: str = "train",
):
    """The raw ``datasets.Dataset``: a local file when ``dataset_path`` is set, else the hub dataset."""
    import datasets

    if dataset_path:
        path = Path(dataset_path)
        if not path.is_file():
            raise FileNotFoundError(
                f"dataset_path={dataset_path} does not exist: point it to a .jsonl or "
                f".parquet file, or unset it to use {DEFAULT_DATASET}"
            )
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(path.suffix.lower())
        if kind is None:
            raise ValueError(
                f"dataset_path={dataset_path}: unsupported file type {path.suffix!r}; use .jsonl or .parquet"
            )
        if path.stat().st_size == 0:
            raise ValueError(f"dataset_path={dataset_path} is empty: the RLVR dataset needs rows")
        try:
            return datasets.load_dataset(kind, data_files=str(path), split="train")
        except Exception as exc:  # datasets' messages for malformed files can be empty
            raise ValueError(
                f"dataset_path={dataset_path} could not be read as {kind} "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from exc
    return datasets.load_dataset(dataset_name, dataset_config, split=split)


def prompt_token_lengths(prompts: list[list[dict[str, str]]], tokenizer) -> list[int]:
    """Token count of each prompt as the trainer renders it (chat template + generation prompt)."""
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def build_rlvr_dataset(
    source, tokenizer=None, *, max_prompt_length: int | None = None, max_rows: int | None = None
):
    """Map ``source`` to RLVR rows and drop prompts longer than ``max_prompt_length`` tokens."""
    if len(source) == 0:
        raise ValueError("the RLVR dataset is empty: check dataset_name / dataset_path")
    if max_rows is not None:
        source = source.select(range(min(max_rows, len(source))))
    to_rlvr_row(source[0])  # one clear error on a wrong layout before mapping the whole set
    dataset = source.map(to_rlvr_row, remove_columns=source.column_names)
    if max_prompt_length is not None:
        if tokenizer is None:
            raise ValueError("max_prompt_length filtering needs the tokenizer")
        dataset = dataset.map(
            lambda batch: {"_n_tokens": prompt_token_lengths(batch["prompt"], tokenizer)},
            batched=True,
            batch_size=256,
        )
        dataset = dataset.filter(lambda n: n <= max_prompt_length, input_columns="_n_tokens")
        dataset = dataset.remove_columns("_n_tokens")
        if len(dataset) == 0:
            raise ValueError(
                f"no prompt fits max_prompt_length={max_prompt_length} tokens: raise it, or lower "
                "max_completion_length so that prompt + completion fit the model's context"
            )
    return dataset
