"""The RLVR reward: 1.0 when the answer in the completion's solution block equals the gold, else 0.0.

The answer is read from the last ``<SOLUTION>...</SOLUTION>`` block (fallback: the last ``\\boxed{}``)
and compared with math-verify through :mod:`sage_unsloth.grading`, which wraps the gold before parsing.
There is no format reward (as in the official code).

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

# Gold answers of DAPO-Math are integers; MATH-style answers are short LaTeX. Anything longer is not a
# final answer, and parsing it is where math-verify spends unbounded time.
MAX_ANSWER_CHARS = 512
# Per-completion grading budget (math-verify's own timeout; only enforced in the main thread).
VERIFY_TIMEOUT_S = 2.0


def completion_text(completion: Any) -> str:
    """The assistant text of a completion: a plain string, or TRL's conversational list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        content = completion.get("content", "")
        return content if isinstance(content, str) else ""
    if isinstance(completion, Sequence):  # [{"role": "assistant", "content": ...}, ...]
        return "".join(completion_text(m) for m in completion
                       if isinstance(m, dict) and m.get("role", "assistant") == "assistant")
    return ""


def score_completion(completion: Any, gold: Any, *, timeout_s: float = VERIFY_TIMEOUT_S) -> float:
    """1.0 if the completion's final answer matches ``gold``, else 0.0; never raises."""
    try:
        if gold is None:
            return 0.0
        answer = grading.extract_answer(completion_text(completion))
        if not answer or len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        return 1.0 if grading.verify_answer(answer, str(gold), timeout_s=timeout_s) else 0.0
    except (Exception, grading.GradingTimeout) as exc:  # noqa: BLE001 - a reward must never end the run
        logger.debug("reward: grading failed (%s: %s); scoring 0", type(exc).__name__, exc)
        return 0.0


def correctness_reward(prompts: list[Any], completions: list[Any], answer: list[Any] | None = None,
                       **kwargs: Any) -> list[float]:
    """TRL reward function: math-verify correctness of each completion against the ``answer`` column."""
    if answer is None:
        raise ValueError("correctness_reward needs the dataset's gold column 'answer' (see sage_unsloth.rlvr.data)")
    return [score_completion(c, g) for c, g in zip(completions, answer, strict=True)]


# TRL logs a reward function by its __name__: rewards/correctness/mean.
correctness_reward.__name__ = "correctness"
