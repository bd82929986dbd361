"""Golds that are words or a multiple-choice letter (``\\text{Evelyn}``, ``\\text{east}``, ``\\text{(C)}``).

Such a gold is compared as text, never parsed as math (``Evelyn`` is not the product E·v·e·l·y·n):

- a letter gold (``(C)``) matches when the answer names exactly that option: ``(C)``, ``C``, ``\\textbf{(C)}``,
  ``The answer is (C).``, ``(C) Plane``; ``C and D`` or ``(A) or (B)`` name two and do not match;
- a word gold (``Evelyn``) matches when, after a lead-in ("The answer is", "It is", articles), the answer
  starts with it ("Evelyn has the greatest average speed."), or is a short sentence ending with it ("The
  student with the greatest average speed is Evelyn.") with no negation in it ("Not Evelyn; it is Briana").
"""

from __future__ import annotations

import re

_TEXT_GOLD = re.compile(r"\s*\\(?:text|textbf|textrm|mathrm|mbox)\s*\{\s*([^{}]*?)\s*\}\s*")
_BARE_LETTER = re.compile(r"\s*(\(?\s*[A-Z]\s*\)?)\s*")  # "C", "(C)": an option, not the variable C
_LETTER = re.compile(r"\(?\s*([A-Z])\s*\)?")
_WRAPPERS = re.compile(r"\\(?:text\w*|mathrm|mathbf|mbox|boxed)\s*\{([^{}]*)\}")
_LEAD = re.compile(
    r"^(?:(?:the\s+)?(?:final\s+)?(?:answer|option|choice|correct\s+option)\s*(?:is|:)?\s*|"
    r"it\s+is\s+|it's\s+|so\s+|thus\s+|therefore\s*,?\s+|(?:the|an?)\s+)+",
    re.IGNORECASE,
)
_NEGATIONS = frozenset({"not", "no", "never", "isn't", "neither", "nor"})


def word_gold(gold: str) -> tuple[str, str] | None:
    """("letter", "C") or ("words", "evelyn") when the gold is text, else None (a math gold)."""
    match = _TEXT_GOLD.fullmatch(gold) or _BARE_LETTER.fullmatch(gold)
    if not match:
        return None
    inner = match.group(1).strip()
    letter = _LETTER.fullmatch(inner)
    if letter and (inner.startswith("(") or len(inner) == 1):
        return "letter", letter.group(1)
    words = _words(_LEAD.sub("", inner))  # "The ..." loses its article as the answer does
    return ("words", " ".join(words)) if words else None


def _words(text: str) -> list[str]:
    text = _WRAPPERS.sub(r" \1 ", text)
    return re.findall(
        r"[a-z0-9\u00c0-\u024f'](?:[a-z0-9\u00c0-\u024f'-]*[a-z0-9\u00c0-\u024f'])?", text.lower()
    )


def _options(text: str) -> list[str]:
    text = _WRAPPERS.sub(r" \1 ", text)
    named = re.findall(r"\(\s*([A-Z])\s*\)", text)
    if named:
        return named
    # Bare capitals, except "I" and "A" used as words ("I think", "A plane").
    return re.findall(r"(?<![A-Za-z])(?!(?:I|A)\s+[a-z])([A-Z])(?![A-Za-z'])", text)  # E' is no option


def words_match(kind: str, gold: str, answer: str) -> bool:
    """Whether the answer states the text gold (see the module docstring)."""
    if kind == "letter":
        options = _options(answer)
        return bool(options) and set(options) == {gold}
    target = gold.split()
    text = _LEAD.sub("", answer.strip())
    words = _words(text)
    if not words:
        return False
    n = len(target)
    if words == target:
        return True
    if re.search(r"[\d+*/=^]|\\frac|(?<!\w)-(?!\w)", text):
        return False  # "Evelyn + 1" is math around the name, not a sentence about it
    if words[:n] == target:
        return True
    # "... is Evelyn", "She is facing east": a short sentence ending with the gold, with no negation in it.
    return len(words) <= 12 and words[-n:] == target and not _NEGATIONS & set(words)
