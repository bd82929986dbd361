"""Answer extraction and grading, shared by the RLVR reward and evaluation.

- ``extract``: completion -> final answer (last ``<SOLUTION>`` block, else the last ``\\boxed{}``), and the
  math inside an answer written as a sentence;
- ``normalise``: gold values as strings; one LaTeX normalisation for golds and answers alike;
- ``numbers``: plain numbers compared exactly, measured golds to their stated precision;
- ``words``: text and multiple-choice golds;
- ``kk``: Knights-and-Knaves role assignments;
- ``verify``: the verdict (``judge`` -> correct / wrong / no_answer / timeout) under a CPU-time budget
  (``deadline``) that does not depend on machine load.
"""

from sage_unsloth.grading.deadline import GradingTimeout
from sage_unsloth.grading.extract import (
    MAX_COMPLETION_CHARS,
    extract_answer,
    final_boxed,
    last_boxed,
    math_candidate,
    solution_block,
)
from sage_unsloth.grading.kk import grade_kk, kk_assignments
from sage_unsloth.grading.normalise import minerva_gold, normalise_gold, normalise_math
from sage_unsloth.grading.verify import (
    CORRECT,
    DEFAULT_TIMEOUT_S,
    MAX_ANSWER_CHARS,
    MAX_PROSE_CHARS,
    NO_ANSWER,
    RETRY_TIMEOUT_S,
    STATUSES,
    TIMEOUT,
    TIMEOUT_ANSWER,
    WRONG,
    Grade,
    extract_within,
    grade,
    grade_completion,
    grader_fingerprint,
    is_kk_gold,
    judge,
    judge_rest,
    verify_answer,
    warm_up,
)

__all__ = [
    "CORRECT",
    "DEFAULT_TIMEOUT_S",
    "MAX_ANSWER_CHARS",
    "MAX_COMPLETION_CHARS",
    "MAX_PROSE_CHARS",
    "NO_ANSWER",
    "RETRY_TIMEOUT_S",
    "STATUSES",
    "TIMEOUT",
    "TIMEOUT_ANSWER",
    "WRONG",
    "Grade",
    "GradingTimeout",
    "extract_answer",
    "extract_within",
    "final_boxed",
    "grade",
    "grade_completion",
    "grade_kk",
    "grader_fingerprint",
    "is_kk_gold",
    "judge",
    "judge_rest",
    "kk_assignments",
    "last_boxed",
    "math_candidate",
    "minerva_gold",
    "normalise_gold",
    "normalise_math",
    "solution_block",
    "verify_answer",
    "warm_up",
]
