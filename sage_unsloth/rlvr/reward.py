"""The RLVR reward: 1.0 when the answer in the completion's solution block equals the gold, else 0.0.

The answer is read from the last ``<SOLUTION>...</SOLUTION>`` block (fallback: the last ``\\boxed{}``)
and graded by :mod:`sage_unsloth.grading`, the same grader evaluation uses, so the reward and pass@k
agree on every completion. There is no format reward (as in the official code).

Deterministic: a reward depends on (gold, completion) alone. Grading runs under a CPU-time budget of the
grading thread (not wall time, so load cannot change it); a completion that runs out of it is graded
again at once with the larger retry budget, and only if that also runs out does it score 0 (counted in
``UNRESOLVED``, never silently mistaken for a wrong answer).

The function has TRL's reward signature ``(prompts, completions, **columns) -> list[float]`` and reads
the dataset's gold column ``answer``. A reward function that raises kills a multi-hour run, and a
policy under RL will find any input that makes the grader hang, so every completion is graded under a
time limit, oversized answers are refused before parsing, and any failure scores 0.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sage_unsloth import grading

logger = logging.getLogger(__name__)

# Gold answers of DAPO-Math are integers; MATH-style answers are short LaTeX. An answer may be a sentence
# ("Therefore, there are 12 sequences."): the grader reads its math, and refuses math longer than
# grading.MAX_ANSWER_CHARS before parsing it (where math-verify spends unbounded time).
MAX_ANSWER_CHARS = grading.MAX_PROSE_CHARS
VERIFY_TIMEOUT_S = grading.DEFAULT_TIMEOUT_S  # CPU seconds of the grading thread per completion
RETRY_TIMEOUT_S = grading.RETRY_TIMEOUT_S
UNRESOLVED = {"count": 0}  # completions that ran out of both budgets (scored 0)


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
    completion: Any,
    gold: Any,
    *,
    timeout_s: float = VERIFY_TIMEOUT_S,
    retry_timeout_s: float = RETRY_TIMEOUT_S,
) -> float:
    """1.0 if the completion's final answer matches ``gold``, else 0.0; never raises."""
    try:
        if gold is None or isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
            return 0.0
        answer = grading.extract_answer(completion_text(completion))
        if not answer or len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        status = grading.judge(answer, gold, timeout_s=timeout_s)
        if status == grading.TIMEOUT:
            status = grading.judge(answer, gold, timeout_s=max(retry_timeout_s, timeout_s))
            if status == grading.TIMEOUT:
                UNRESOLVED["count"] += 1
                logger.warning(
                    "reward: grading ran out of %.1f CPU s twice; scoring 0 (%d so far)",
                    retry_timeout_s,
                    UNRESOLVED["count"],
                )
        return 1.0 if status == grading.CORRECT else 0.0
    except (Exception, grading.GradingTimeout) as exc:  # noqa: BLE001 - a reward must never end the run
        logger.debug("reward: grading failed (%s: %s); scoring 0", type(exc).__name__, exc)
        return 0.0


def correctness_reward(
    prompts: list[Any], completions: list[Any], answer: list[Any] | None = None, **kwargs: Any
) -> list[float]:
    """TRL reward function: math-verify correctness of each completion against the ``answer`` column."""
    if answer is None:
        raise ValueError(
            "correctness_reward needs the dataset's gold column 'answer' (see sage_unsloth.rlvr.data)"
        )
    return [score_completion(c, g) for c, g in zip(completions, answer, strict=True)]


# TRL logs a reward function by its __name__: rewards/correctness/mean.
correctness_reward.__name__ = "correctness"
