"""Answer extraction and grading, shared by the RLVR reward and evaluation.

``extract_answer`` pulls the final answer out of a completion (last ``<SOLUTION>`` block, else the last
``\\boxed{}``); ``verify_answer`` compares it with a gold answer through math-verify; ``grade_kk`` checks
a Knights-and-Knaves assignment.

Time bound. math-verify's own timeouts use ``signal.alarm`` with whole seconds and reset each other's
timer, so we switch them off and put our own ``setitimer`` deadlines (CPU time, plus a wall-clock
backstop) around parse+verify.
The deadline raises a ``BaseException`` subclass so math-verify's ``except Exception`` cannot swallow it.
Signals only reach the main thread; from any other thread the grading is delegated to a helper process
(whose main thread holds the timer). Inputs are capped before parsing (length, nesting depth) because a
signal cannot interrupt long-running C code such as a regex over megabytes.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import re
import signal
import threading
from collections.abc import Sequence

from .prompts import SOLUTION_END, SOLUTION_START

MAX_COMPLETION_CHARS = 32_768  # only the tail is examined: the answer comes last
MAX_ANSWER_CHARS = 512  # longer "answers" are rambling, not a final answer
MAX_NESTING_DEPTH = 32  # brackets deeper than this never occur in a real final answer
DEFAULT_TIMEOUT_S = 1.0  # CPU seconds per sample
WALL_FACTOR = 1.8  # wall-clock backstop = 1.8 x that

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns once when its own timeouts are off


class GradingTimeout(BaseException):
    """Raised by the deadline timer; BaseException so that library ``except Exception`` blocks let it through."""


# ----------------------------------------------------------------------------------------------- extraction
def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), or None when there is none or it is unclosed."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts[-8:]):  # only the last few: keeps unclosed-box spam linear
        depth, i = 1, start
        while i < len(text):
            ch = text[i]
            if ch == "\\" and i + 1 < len(text):  # skip escaped braces such as \{
                i += 2
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
            i += 1
    return None


def extract_answer(completion: str | None) -> str | None:
    """The text inside the last ``<SOLUTION>...</SOLUTION>`` (the closing tag may be missing at the end,
    as vLLM drops stop strings), else the last ``\\boxed{...}``, else None."""
    if not completion:
        return None
    text = completion[-MAX_COMPLETION_CHARS:]
    block = solution_block(text)
    if block is not None and _tidy(block):
        return _tidy(block)
    boxed = last_boxed(text)
    return _tidy(boxed) or None if boxed is not None else None


def solution_block(text: str) -> str | None:
    """The text after the last ``<SOLUTION>``, up to ``</SOLUTION>`` when present; None without one."""
    start = text.rfind(SOLUTION_START)
    if start < 0:
        return None
    body = text[start + len(SOLUTION_START):]
    end = body.find(SOLUTION_END)
    return body if end < 0 else body[:end]


def _tidy(answer: str) -> str:
    # A sentence-final full stop ("104.") is punctuation, not part of the number.
    answer = answer.strip()
    return answer[:-1].rstrip() if answer.endswith(".") and not answer.endswith("..") else answer


# ----------------------------------------------------------------------------------------------- golds
def normalise_gold(gold) -> str:
    """A gold answer as a clean string: AMC floats ``27.0`` -> ``27``, AIME ``073`` -> ``73``."""
    if isinstance(gold, bool):
        return str(gold)
    if isinstance(gold, float):
        return str(int(gold)) if math.isfinite(gold) and gold.is_integer() else repr(gold)
    text = str(gold).strip()
    if re.fullmatch(r"[+-]?\d+\.0+", text):
        text = text.split(".")[0]
    if re.fullmatch(r"0\d+", text):
        text = text.lstrip("0") or "0"
    return text


def minerva_gold(solution: str) -> str:
    """Minerva has no answer field: the gold is the last ``\\boxed{}`` of the reference solution."""
    boxed = last_boxed(solution)
    if boxed is None:
        raise ValueError("Minerva solution has no \\boxed{} answer")
    return boxed.strip()


# ----------------------------------------------------------------------------------------------- verification
def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "})]":
            depth = max(depth - 1, 0)
    return deepest


def _acceptable(text: str) -> bool:
    return len(text) <= MAX_ANSWER_CHARS and "\x00" not in text and _nesting_depth(text) <= MAX_NESTING_DEPTH


# Shapes whose evaluation explodes (power towers, huge exponents or factorials). Real golds rarely have them;
# when the gold has none, such an answer cannot equal it, so we skip the 1 s deadline it would burn.
_EXPLOSIVE = re.compile(r"\^\s*\{[^{}]*\^|\*\*[^*]*\*\*|\^\s*\{?\s*-?\d{5,}|\d{4,}\s*\)?\s*!|\)\s*!")


def _explosive(text: str) -> bool:
    return _EXPLOSIVE.search(text) is not None


def _wrap(text: str) -> str:
    # Bare LaTeX (\sqrt{51}, p - q) extracts to nothing unless delimited (measured on the bundled golds).
    return text if ("$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text) else f"${text}$"


def _parse(text: str):
    from math_verify import parse

    return parse(text, parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    # Cached: every sample of a problem shares its gold. Only called under the deadline.
    return _parse(f"\\boxed{{{gold}}}")


def _verify_unbounded(answer: str, gold: str) -> bool:
    from math_verify import verify

    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return False
    parsed = _parse(_wrap(answer))
    if not parsed or all(isinstance(p, str) for p in parsed):
        parsed = parsed + _parse(answer)  # e.g. "x = 5" style text that is not LaTeX
    return bool(parsed) and verify(gold_parsed, parsed, timeout_seconds=None)


def _raise_timeout(signum, frame):
    raise GradingTimeout()


@functools.lru_cache(maxsize=1)
def _warm_up() -> bool:
    """Import math-verify and build its parsers once per process, outside any deadline (seconds, cold)."""
    from math_verify import parse, verify

    return verify(parse("$\\frac{1}{2}$", parsing_timeout=None), parse("$0.5$", parsing_timeout=None),
                  timeout_seconds=None)


def _verify_main_thread(answer: str, gold: str, timeout_s: float) -> bool:
    _warm_up()
    # Two deadlines: CPU time (SIGPROF) makes a verdict independent of machine load, so reruns grade alike;
    # wall time (SIGALRM, WALL_FACTOR x longer) is the backstop when the process is starved of CPU.
    previous = {sig: signal.signal(sig, _raise_timeout) for sig in (signal.SIGPROF, signal.SIGALRM)}
    previous_timers = {timer: signal.setitimer(timer, seconds)
                       for timer, seconds in ((signal.ITIMER_PROF, timeout_s),
                                              (signal.ITIMER_REAL, timeout_s * WALL_FACTOR))}
    try:
        return _verify_unbounded(answer, gold)
    except GradingTimeout:
        return False
    except Exception:  # noqa: BLE001 - a grader never raises; a broken answer is a wrong answer
        return False
    finally:
        for timer in previous_timers:
            signal.setitimer(timer, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for timer, (remaining, interval) in previous_timers.items():
            if remaining > 0:  # give the caller's own timers back (approximately)
                signal.setitimer(timer, remaining, interval)


_helper_pool = None
_helper_lock = threading.Lock()


def _verify_in_helper_process(answer: str, gold: str, timeout_s: float) -> bool:
    """Off the main thread no signal can reach us: a helper process (its own main thread) grades."""
    global _helper_pool
    import concurrent.futures as cf
    import multiprocessing as mp

    with _helper_lock:
        if _helper_pool is None:
            _helper_pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("forkserver"))
            # Shut it down before interpreter teardown, when its manager thread would find modules gone.
            atexit.register(_helper_pool.shutdown, wait=False, cancel_futures=True)
        pool = _helper_pool
    try:
        return pool.submit(verify_answer, answer, gold, timeout_s=timeout_s).result(timeout=timeout_s + 30)
    except Exception:  # noqa: BLE001
        return False


def verify_answer(answer: str | None, gold, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """True when ``answer`` equals ``gold`` under math-verify. Never raises; bounded by ``timeout_s``."""
    try:
        if answer is None:
            return False
        answer = str(answer).strip()
        gold = normalise_gold(gold)
        if not answer or not gold or not _acceptable(answer) or not _acceptable(gold):
            return False
        if answer == gold:
            return True
        if _explosive(answer) and not _explosive(gold):
            return False
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            return _verify_in_helper_process(answer, gold, timeout_s)
        return _verify_main_thread(answer, gold, timeout_s)
    except Exception:  # noqa: BLE001
        return False


def grade_completion(completion: str | None, gold, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Extract the final answer of a completion and verify it against ``gold``."""
    return verify_answer(extract_answer(completion), gold, timeout_s=timeout_s)


# ----------------------------------------------------------------------------------------------- knights & knaves
def grade_kk(completion: str | None, solution_booleans: Sequence[bool], names: Sequence[str]) -> bool:
    """True when the completion's answer names every inhabitant with the right role (True = knight).

    The answer block (``<SOLUTION>``, else the completion's tail) is searched for "<name> is a knight/knave";
    the last statement about each name counts, and every name must be assigned.
    """
    try:
        if not completion or len(solution_booleans) != len(names):
            return False
        text = completion[-MAX_COMPLETION_CHARS:]
        block = solution_block(text)
        text = (text if block is None else block)[-8192:]
        for name, is_knight in zip(names, solution_booleans):
            pattern = re.compile(rf"\b{re.escape(name)}\b\W{{0,4}}\s*(?:is|was|:)?\s*(?:an?\s+)?(knight|knave)",
                                 re.IGNORECASE)
            found = pattern.findall(text)
            if not found or (found[-1].lower() == "knight") != bool(is_knight):
                return False
        return True
    except Exception:  # noqa: BLE001
        return False
