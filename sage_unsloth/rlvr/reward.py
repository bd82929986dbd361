"""The RLVR reward: 1.0 when the answer in the completion's solution block equals the gold, else 0.0.

The answer is read from the last ``<SOLUTION>...</SOLUTION>`` block (fallback: the last ``\\boxed{}``)
and graded by :mod:`sage_unsloth.grading`, the same grader evaluation uses, so the reward and pass@k
agree on every completion. There is no format reward (as in the official code).

Deterministic: a reward depends on (gold, completion) alone. Each pair is graded under one budget
(extraction, normalisation and comparison together): ``VERIFY_TIMEOUT_S`` CPU seconds of the grading thread
(not wall time, so load cannot change it), and a batch has ``BATCH_WALL_S`` wall seconds in all: a pair gets
what is left of it, and once it is spent the remaining pairs are not graded. A pair over budget scores 0 and
is counted (``take_timeouts``; the trainer logs ``reward/grading_timeouts`` per batch). There is no retry
inside training: a policy that learned to emit a shape that stalls the grader would stall training with it.

The function has TRL's reward signature ``(prompts, completions, **columns) -> list[float]`` and reads
the dataset's gold column ``answer``. A reward function that raises kills a multi-hour run, and a
policy under RL will find any input that makes the grader hang, so every completion is graded under a
time limit, oversized answers are refused before parsing, and any failure scores 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from sage_unsloth import grading
from sage_unsloth.grading import deadline

logger = logging.getLogger(__name__)

# Gold answers of DAPO-Math are integers; MATH-style answers are short LaTeX. An answer may be a sentence
# ("Therefore, there are 12 sequences."): the grader reads its math, and refuses math longer than
# grading.MAX_ANSWER_CHARS before parsing it (where math-verify spends unbounded time).
MAX_ANSWER_CHARS = grading.MAX_PROSE_CHARS
VERIFY_TIMEOUT_S = grading.DEFAULT_TIMEOUT_S  # CPU seconds of the grading thread per completion
BATCH_WALL_S = 120.0  # wall seconds for grading one reward batch, all its pairs together
_TIMEOUTS = {"count": 0, "total": 0}  # pairs over budget (scored 0): since the last take_timeouts, and ever


def take_timeouts() -> int:
    """Pairs over budget since the last call (the trainer logs it per batch)."""
    count, _TIMEOUTS["count"] = _TIMEOUTS["count"], 0
    return count


def _timed_out() -> None:
    _TIMEOUTS["count"] += 1
    _TIMEOUTS["total"] += 1
    logger.warning(
        "reward: a completion ran out of its grading budget; scoring 0 (%d so far)", _TIMEOUTS["total"]
    )


def completion_text(completion: Any) -> str:
    """The assistant text of a completion: a plain string, or TRL's conversational list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        content = completion.get("content", "")
        return content if isinstance(content, str) else ""
    if isinstance(completion, Sequence):  # [{"role": "assistant", "content": ...}, ...]
        return "".join(
            completion_text(m)
            for m in completion
            if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
        )
    return ""


def score_completion(
    completion: Any, gold: Any, *, timeout_s: float = VERIFY_TIMEOUT_S, wall_s: float | None = None
) -> float:
    """1.0 if the completion's final answer matches ``gold``, else 0.0 (also over budget); never raises."""
    try:
        if gold is None or isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
            return 0.0
        grade = grading.grade(completion_text(completion), gold, timeout_s=timeout_s, wall_s=wall_s)
        if grade.status == grading.TIMEOUT:
            _timed_out()
        return 1.0 if grade.status == grading.CORRECT else 0.0
    except (Exception, grading.GradingTimeout) as exc:  # noqa: BLE001 - a reward must never end the run
        logger.debug("reward: grading failed (%s: %s); scoring 0", type(exc).__name__, exc)
        return 0.0


def correctness_reward(
    prompts: list[Any], completions: list[Any], answer: list[Any] | None = None, **kwargs: Any
) -> list[float]:
    """TRL reward function: math-verify correctness of each completion against the ``answer`` column,
    the whole batch within ``BATCH_WALL_S`` seconds."""
    if answer is None:
        raise ValueError(
            "correctness_reward needs the dataset's gold column 'answer' (see sage_unsloth.rlvr.data)"
        )
    return score_batch(completions, answer)


def score_batch(
    completions: list[Any],
    golds: list[Any],
    *,
    timeout_s: float = VERIFY_TIMEOUT_S,
    batch_wall_s: float = BATCH_WALL_S,
) -> list[float]:
    """``score_completion`` of each pair, each within ``timeout_s`` CPU seconds and all within
    ``batch_wall_s`` wall seconds; a pair the batch budget does not reach scores 0 as a timeout."""
    end = time.monotonic() + batch_wall_s
    scores = []
    with deadline.armed(timeout_s):  # the timers are armed once for the batch, not per pair
        for completion, gold in zip(completions, golds, strict=True):
            left = end - time.monotonic()
            if left <= 0:
                _timed_out()
                scores.append(0.0)
                continue
            wall = min(left, deadline.wall_limit_s(timeout_s))
            scores.append(score_completion(completion, gold, timeout_s=timeout_s, wall_s=wall))
    return scores


# TRL logs a reward function by its __name__: rewards/correctness/mean.
correctness_reward.__name__ = "correctness"
