"""Stage-1 SFT data: OpenMathReasoning-style rows -> conversations in the paper's format.

Input rows need ``problem``, ``generated_solution`` and ``expected_answer`` (unsloth/OpenMathReasoning-mini,
split "cot", or a local JSONL/parquet file with those fields). The official recipe, step by step:

1. keep rows whose expected answer is numeric (:func:`is_numeric_answer`);
2. strip ``<think>``/``</think>`` tags from the solution, keeping the text between them;
3. render [system, user(problem), assistant(format_completion(solution, answer))];
4. drop rows whose rendered conversation (chat template, eos included) is longer than
   ``max_length_fraction * max_seq_length`` tokens (official: half).

Rows with an empty problem or solution are dropped too (reason "empty_text"). The result carries the
counts kept/dropped by reason and a fingerprint: sha256 over the rendered conversations, in order.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..data.prompts import SYSTEM_PROMPT, format_completion

REQUIRED_FIELDS = ("problem", "generated_solution", "expected_answer")
# The SFT rows the kit ships (48 rows of the demo's task, sage_unsloth/data/README.md), named in the offline error.
SHIPPED_SAMPLE = "sage_unsloth/data/sft/sample.jsonl"
_TRUE = ("1", "true", "yes", "on")
LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}

# Numeric answer: after stripping surrounding whitespace, an optionally signed integer or decimal with an
# optional exponent ("42", "-3", "0.5", ".5", "7.", "1e-3"). Fractions ("1/2", "\\frac{1}{2}"), LaTeX,
# thousands separators ("1,000"), units, "inf" and "nan" are not numeric. This is the official
# pandas.to_numeric(errors="coerce") filter minus its non-finite values. Python int/float values (from JSON)
# count when finite; booleans do not.
_NUMERIC = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_THINK_TAG = re.compile(r"</?think>")


def is_numeric_answer(value: Any) -> bool:
    """Whether an expected answer is numeric in the sense documented above."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    return isinstance(value, str) and _NUMERIC.fullmatch(value.strip()) is not None


def answer_text(value: Any) -> str:
    return str(value).strip()


def strip_think_tags(text: str) -> str:
    """Remove ``<think>`` and ``</think>`` tags, keep what is between them, strip the ends."""
    return _THINK_TAG.sub("", text).strip()


def render_messages(problem: str, solution: str, answer: Any) -> list[dict[str, str]]:
    """One SFT conversation: system prompt, the problem, the formatted working out + solution block."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": problem.strip()},
        {"role": "assistant", "content": format_completion(solution, answer_text(answer))},
    ]


@dataclass
class SFTData:
    """The prepared training set (a ``datasets.Dataset`` with one ``messages`` column) and its accounting."""

    dataset: Any
    source: str
    rows_in: int
    rows_kept: int
    rows_dropped: dict[str, int] = field(default_factory=dict)
    fingerprint: str = ""

    def summary(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "rows_in": self.rows_in,
            "rows_kept": self.rows_kept,
            "rows_dropped": dict(self.rows_dropped),
            "fingerprint": self.fingerprint,
        }


def load_raw_dataset(
    *,
    dataset_name: str | None,
    dataset_split: str,
    dataset_path: str | None = None,
    max_rows: int | None = None,
):
    """Rows from a local JSONL/parquet file (wins when set) or a hub dataset id + split, via ``datasets``."""
    import datasets

    if dataset_path:
        path = Path(dataset_path)
        kind = LOCAL_SUFFIXES.get(path.suffix.lower())
        if kind is None:
            raise ValueError(f"dataset_path {path}: unsupported file type; use .jsonl, .json or .parquet")
        if not path.is_file():
            raise FileNotFoundError(f"dataset_path {path} does not exist: fix the path or unset dataset_path")
        raw = datasets.load_dataset(kind, data_files=str(path), split="train")
    elif dataset_name:
        raw = _load_hub_dataset(datasets, dataset_name, dataset_split)
    else:
        raise ValueError("no dataset: set dataset_name (hub id) or dataset_path (local JSONL/parquet)")
    if max_rows is not None:
        raw = raw.select(range(min(max_rows, len(raw))))
    return raw


def hub_unreachable(dataset_name: str, why: str) -> ValueError:
    """The one-line error for a hub dataset that cannot be loaded: it names the field that avoids the hub."""
    return ValueError(
        f"dataset_name={dataset_name!r} cannot be loaded ({why}): set dataset_path to a local JSONL of "
        f"{', '.join(REQUIRED_FIELDS)} rows, e.g. --dataset_path {SHIPPED_SAMPLE} (48 rows shipped with the kit)"
    )


def hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to the hub's endpoint opens within ``timeout_s``. Asked before ``datasets``
    is, because without a network it retries for about 28 s and then raises a long traceback. Behind a
    proxy the direct connection says nothing, so the answer is then yes (``datasets`` finds out itself)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _load_hub_dataset(datasets, dataset_name: str, split: str):
    """``datasets.load_dataset`` for a hub id, with one line instead of a traceback when it cannot work:
    offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) without a cached copy, or no route to the hub."""
    offline = hub_offline()
    if not offline and not hub_reachable():
        raise hub_unreachable(
            dataset_name, "the hub is unreachable; with a cached copy, set HF_HUB_OFFLINE=1 to use it"
        )
    try:
        return datasets.load_dataset(dataset_name, split=split)
    except ConnectionError as exc:  # datasets' own ConnectionError subclasses the builtin
        why = "offline mode is on and no cached copy was found" if offline else type(exc).__name__
        raise hub_unreachable(dataset_name, why) from None


def row_problem(row: dict) -> str | None:
    """What a local SFT row lacks ("has no 'expected_answer'"), or None: each required field present and not null
    (a missing answer is bad input, named by its line, not a row dropped as "non-numeric")."""
    missing = [name for name in REQUIRED_FIELDS if row.get(name) is None]
    if not missing:
        return None
    return f"has no {', '.join(map(repr, missing))} (SFT rows need {', '.join(REQUIRED_FIELDS)})"


def check_fields(raw, source: str) -> None:
    missing = [f for f in REQUIRED_FIELDS if f not in raw.column_names]
    if missing:
        raise ValueError(
            f"dataset {source}: missing field(s) {missing} in {len(raw)} rows (has {raw.column_names}); "
            f"SFT rows need {list(REQUIRED_FIELDS)}"
        )


def prepare_sft_data(
    raw,
    tokenizer,
    *,
    max_seq_length: int,
    source: str,
    max_length_fraction: float = 0.5,
    numeric_answers_only: bool = True,
    strip_think: bool = True,
) -> SFTData:
    """Filter and render ``raw`` rows (see the module docstring); one clear ValueError when nothing is left."""
    import datasets

    check_fields(raw, source)
    dropped = {"empty_text": 0, "non_numeric_answer": 0, "too_long": 0}
    candidates: list[list[dict[str, str]]] = []
    for row in raw.select_columns(list(REQUIRED_FIELDS)):
        problem, solution, answer = row["problem"], row["generated_solution"], row["expected_answer"]
        if not isinstance(problem, str) or not isinstance(solution, str) or not problem.strip():
            dropped["empty_text"] += 1
            continue
        if numeric_answers_only and not is_numeric_answer(answer):
            dropped["non_numeric_answer"] += 1
            continue
        if answer is None or not answer_text(answer):
            dropped["empty_text"] += 1
            continue
        solution = strip_think_tags(solution) if strip_think else solution.strip()
        if not solution:
            dropped["empty_text"] += 1
            continue
        candidates.append(render_messages(problem, solution, answer))

    limit = max_length_fraction * max_seq_length
    kept = []
    for messages, n_tokens in zip(candidates, rendered_lengths(tokenizer, candidates)):
        if n_tokens > limit:
            dropped["too_long"] += 1
        else:
            kept.append(messages)
    if not kept:
        reasons = ", ".join(f"{k}={v}" for k, v in dropped.items())
        raise ValueError(
            f"dataset {source}: 0 of {len(raw)} rows left after filtering ({reasons}); need numeric "
            f"expected_answer values and rows of at most {int(limit)} tokens (raise max_seq_length)"
        )
    digest = hashlib.sha256()
    for messages in kept:
        digest.update(json.dumps(messages, ensure_ascii=False, sort_keys=True).encode())
        digest.update(b"\n")
    return SFTData(
        dataset=datasets.Dataset.from_dict({"messages": kept}),
        source=source,
        rows_in=len(raw),
        rows_kept=len(kept),
        rows_dropped=dropped,
        fingerprint=digest.hexdigest(),
    )


def rendered_lengths(
    tokenizer, conversations: list[list[dict[str, str]]], batch_size: int = 256
) -> list[int]:
    """Token count of each conversation rendered with the tokenizer's chat template (what SFT trains on)."""
    lengths: list[int] = []
    for start in range(0, len(conversations), batch_size):
        chunk = conversations[start : start + batch_size]
        texts = tokenizer.apply_chat_template(chunk, tokenize=False)
        # The template writes every special token itself (eos included), so none are added here.
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        lengths.extend(len(ids) for ids in encoded)
    return lengths


def math500_as_sft_rows(
    path: str | Path,
    *,
    limit: int | None = None,
    numeric_only: bool = False,
    max_solution_chars: int | None = None,
) -> list[dict[str, str]]:
    """MATH-500 rows in SFT shape (solution -> generated_solution, answer -> expected_answer), for tests/demos.

    ``numeric_only`` / ``max_solution_chars`` pre-select rows that survive the SFT filters on the tiny model
    (its byte-level tokenizer is verbose, so short solutions keep rows under the length limit).
    """
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if limit is not None and len(rows) >= limit:
                break
            row = json.loads(line)
            if numeric_only and not is_numeric_answer(row["answer"]):
                continue
            if max_solution_chars is not None and len(row["solution"]) >= max_solution_chars:
                continue
            rows.append(
                {
                    "problem": row["problem"],
                    "generated_solution": row["solution"],
                    "expected_answer": str(row["answer"]),
                }
            )
    return rows


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path
