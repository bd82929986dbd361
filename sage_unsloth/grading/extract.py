"""From a completion to its final answer, and from a final answer written in prose to the math in it.

``extract_answer`` takes the last ``<SOLUTION>`` block (the closing tag may be missing: vLLM drops stop
strings), else the last ``\\boxed{}``, and cleans what the model wrapped around the answer: markdown
emphasis (``**902**`` is bold, not a power tower), a leading "The final answer is", math-verify's "I hope
it is correct", a sentence-final full stop.

``math_candidate`` reads a cleaned answer that is a sentence rather than a formula ("The answer is not 5,
it is 4.", "$204$ minutes, including $t = 24$", "2000 calories"). The rules, in order:

1. the answer is cut into clauses at sentence ends, semicolons and commas followed by a word;
2. a clause that negates ("not 5") or states a premise ("since t = 24", "including t = 24") is no answer;
3. the last clause opened by a conclusion word ("so", "therefore", ...) wins, else the first clause left;
4. in that clause: its inline math (``$...$``; only what follows its last "is/are/equals" when some does),
   else what follows that "is", else its formula-like runs of tokens; several values in one clause ("204 or 228") stay together, so a hedged
   answer is graded as the list it is.
"""

from __future__ import annotations

import re

from sage_unsloth.prompts import SOLUTION_END, SOLUTION_START

MAX_COMPLETION_CHARS = 32_768  # only the tail is examined: the answer comes last
MAX_BLOCK_CHARS = 4_096  # a solution block longer than this is rambling; its tail holds the answer

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


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


def solution_block(text: str) -> str | None:
    """The text after the last ``<SOLUTION>``, up to ``</SOLUTION>`` when present; None without one."""
    start = text.rfind(SOLUTION_START)
    if start < 0:
        return None
    body = text[start + len(SOLUTION_START) :]
    end = body.find(SOLUTION_END)
    return body if end < 0 else body[:end]


def extract_answer(completion: str | None) -> str | None:
    """The cleaned final answer of a completion: its last solution block, else its last ``\\boxed{}``."""
    if not completion:
        return None
    text = completion[-MAX_COMPLETION_CHARS:]
    block = solution_block(text)
    if block is not None:
        answer = clean_answer(block)
        if answer:
            return answer
    boxed = last_boxed(text)
    return (clean_answer(boxed) or None) if boxed is not None else None


# ----------------------------------------------------------------------------------------------- cleaning
_BOLD = re.compile(r"\*\*|(?<![\w\\])__|__(?![\w])")
_EMPHASIS = re.compile(r"(?<![\w*\\^_])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![\w*])")
_LINE_MARKER = re.compile(r"(?m)^[ \t]*(?:#{1,6}[ \t]+|>[ \t]*|[*+][ \t]+|-[ \t]+(?=[A-Za-z*]))")
_HOPE = re.compile(r"\s*I hope it is correct\.?\s*$", re.IGNORECASE)
_LEAD_IN = re.compile(
    r"^\s*(?:(?:so|thus|therefore|hence|finally|in conclusion)\s*,?\s+)?(?:the\s+)?(?:final\s+)?"
    r"(?:answer|result)(?:\s+is)?\s*(?::|=|\bis\b)?\s*",
    re.IGNORECASE,
)


def strip_markdown(text: str) -> str:
    """Remove markdown emphasis, inline code ticks and line markers (headings, quotes, bullets)."""
    text = _BOLD.sub("", text).replace("`", "")
    text = _EMPHASIS.sub(r"\1", text)
    return _LINE_MARKER.sub("", text)


def clean_answer(text: str) -> str:
    """What the model wrote as its answer, without the wrapping: a ``\\boxed{}`` inside wins; markdown,
    a lead-in ("The final answer is"), "I hope it is correct" and a final full stop are removed."""
    text = text[-MAX_BLOCK_CHARS:]
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        text = boxed
    text = _HOPE.sub("", strip_markdown(text)).strip()
    # A sentence the model put in \text{} ("\text{The answer is } 721") is prose; "\text{ ergs}" is a unit.
    text = _TEXT_GROUP_INNER.sub(
        lambda m: m.group(1) if _is_sentence(m.group(1)) else m.group(0), text
    ).strip()
    lead = _LEAD_IN.match(text)
    if lead and lead.end() < len(text):
        text = text[lead.end() :]
    return _tidy(text)


def _tidy(answer: str) -> str:
    # A sentence-final full stop ("104.") is punctuation, not part of the number.
    answer = answer.strip()
    while answer.endswith(".") and not answer.endswith(".."):
        answer = answer[:-1].rstrip()
    return answer


# ----------------------------------------------------------------------------------------------- prose
_MATH_SEGMENT = re.compile(r"\$\$(.+?)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_TEXT_GROUP_INNER = re.compile(r"\\text\s*\{([^{}]*)\}")
_TEXT_GROUP = re.compile(r"\\(?:text\w*|mbox|mathrm|operatorname)\s*\{[^{}]*\}")
# A word of a sentence: letters only, and either a common function word or 4+ letters. Shorter letter runs
# ("bv", "dt", "LCs") are juxtaposed variables; spelled-out math and all-capital acronyms (MR, SRMC) are math.
_WORD_RE = re.compile(r"[A-Za-z\u00c0-\u024f']{2,}")
_FUNCTION_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "so",
        "thus",
        "hence",
        "then",
        "and",
        "or",
        "not",
        "no",
        "of",
        "to",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "from",
        "as",
        "if",
        "since",
        "which",
        "what",
        "who",
        "we",
        "our",
        "you",
        "answer",
        "final",
        "result",
        "has",
        "have",
        "had",
        "do",
        "does",
        "get",
        "gets",
        "got",
        "one",
        "two",
        "all",
        "any",
        "each",
        "both",
        "only",
        "just",
        "also",
        "than",
        "about",
        "into",
        "per",
    ]
)
_MATH_WORDS = frozenset(
    [
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "arcsin",
        "arccos",
        "arctan",
        "sinh",
        "cosh",
        "tanh",
        "log",
        "ln",
        "exp",
        "lim",
        "max",
        "min",
        "mod",
        "pmod",
        "gcd",
        "lcm",
        "det",
        "sqrt",
        "pi",
        "inf",
        "infty",
    ]
)
_NEGATION = re.compile(
    r"\b(?:not|no|never|cannot|isn't|aren't|wasn't|incorrect|wrong)\b|n't\b", re.IGNORECASE
)
_PREMISE = re.compile(
    r"^(?:since|because|as|given|where|with|including|for|if|when|assuming|using|from|"
    r"because of|note that|here)\b",
    re.IGNORECASE,
)
_CONCLUSION = re.compile(
    r"^(?:so|thus|therefore|hence|which gives|giving|this gives|i\.e\.|that is)\b[,:]?\s*", re.IGNORECASE
)
_CUE = re.compile(r"\b(?:is|are|was|were|equals|be|becomes|gives|get|to)\b", re.IGNORECASE)
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=\S)|;\s*|,\s+(?=(?!(?:and|or)\b)[A-Za-z]{2,}\b)")
_LIST_WORD = re.compile(r"\s+(?:and|or|&)\s+", re.IGNORECASE)
_PLACEHOLDER = "\x00{}\x00"


def is_prose_word(token: str) -> bool:
    """A whitespace-separated token that is a word of a sentence, not math (see ``_FUNCTION_WORDS``)."""
    word = token.strip('.,;:!?()[]"')
    if (
        not _WORD_RE.fullmatch(word)
        or word.isupper()
        and len(word) > 1
        and word.lower() not in _FUNCTION_WORDS
    ):
        return False
    lower = word.lower()
    return lower not in _MATH_WORDS and (lower in _FUNCTION_WORDS or len(word) >= 4)


def _is_sentence(text: str) -> bool:
    return any(token.strip(".,;:!?").lower() in _FUNCTION_WORDS for token in text.split())


def has_prose(text: str) -> bool:
    """Whether words of a sentence stand outside the math of ``text`` (units in ``\\text{}`` do not count)."""
    bare = _TEXT_GROUP.sub(" ", _MATH_SEGMENT.sub(" ", text))
    return any(is_prose_word(token) for token in bare.split())


def math_candidate(answer: str) -> str | None:
    """The math of a final answer: the answer itself when it is a formula, else what the rules in the
    module docstring pick from its sentence; None when a sentence holds no affirmed value."""
    if not has_prose(answer):
        return _unwrap_math(answer)
    segments: list[str] = []

    def hide(match: re.Match) -> str:
        segments.append(next(g for g in match.groups() if g is not None))
        return _PLACEHOLDER.format(len(segments) - 1)

    masked = _MATH_SEGMENT.sub(hide, answer)
    clauses = [c.strip(" ,;:.") for c in _SPLIT.split(masked) if c and c.strip(" ,;:.")]
    affirmed = [c for c in clauses if not _NEGATION.search(c) and not _PREMISE.match(c)]
    conclusions = [c for c in affirmed if _CONCLUSION.match(c)]
    for clause in list(reversed(conclusions)) or affirmed:
        value = _clause_value(_CONCLUSION.sub("", clause, count=1), segments)
        if value:
            return value
    return None


def _clause_value(clause: str, segments: list[str]) -> str | None:
    cues = list(_CUE.finditer(clause))
    held = [int(i) for i in re.findall(r"\x00(\d+)\x00", clause)]
    if cues:  # "The value of $x$ is $5$": the math after the last "is"
        held = [int(i) for i in re.findall(r"\x00(\d+)\x00", clause[cues[-1].end() :])] or held
    if held:
        return ", ".join(segments[i].strip() for i in held)
    if cues:
        after = clause[cues[-1].end() :]
        value = _formula_runs(after, first_only=True)
        if value:
            return value
    return _formula_runs(clause)


def _formula_runs(text: str, first_only: bool = False) -> str | None:
    """Maximal runs of non-word tokens; a run with a digit or a LaTeX command beats a lone letter."""
    runs, current = [], []
    for token in _LIST_WORD.sub(" , ", text).split():
        if is_prose_word(token):
            if current:
                runs.append(" ".join(current))
                current = []
            if first_only and runs:
                break
        else:
            current.append(token)
    if current:
        runs.append(" ".join(current))
    runs = [re.sub(r"\s+,", ",", r).strip(" ,;:.") for r in runs if r.strip(" ,;:.")]
    strong = [r for r in runs if re.search(r"[\d\\]", r)]
    chosen = strong or runs
    if not chosen:
        return None
    return chosen[0] if first_only else ", ".join(chosen)


def top_level_parts(text: str, separator: str = ",") -> list[str]:
    """``text`` split at separators outside brackets and braces."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(depth - 1, 0)
        elif ch == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _unwrap_math(answer: str) -> str:
    """A formula without its math delimiters (``$...$``, ``\\(...\\)``); the text between several
    delimited parts is kept (it is math too: "$x = 1$, $y = 2$")."""
    text = _MATH_SEGMENT.sub(lambda m: next(g for g in m.groups() if g is not None), answer)
    return text.strip()
