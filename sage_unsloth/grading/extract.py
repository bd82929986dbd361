"""From a completion to its final answer, and from a final answer written in prose to the math in it.

``extract_answer`` takes the last ``<SOLUTION>`` block (the closing tag may be missing: vLLM drops stop
strings), else the last ``\\boxed{}``, and cleans what the model wrapped around the answer: markdown
emphasis (``**902**`` is bold, not a power tower; ``2**10`` is a power), a leading "The final answer is", math-verify's "I hope
it is correct", a sentence-final full stop.

``math_candidate`` reads a cleaned answer that is a sentence rather than a formula ("The answer is not 5,
it is 4.", "$204$ minutes, including $t = 24$", "2000 calories"). The rules, in order:

1. the answer is cut into clauses at sentence ends, semicolons and commas followed by a word;
2. a clause that states a premise ("since t = 24", "including t = 24") is no answer; one that negates
   ("not 5") is none either, unless it affirms a value after the negation ("not 10, it's 12": 12);
3. the last clause opened by a conclusion word ("so", "therefore, ...", ...) wins, else the first clause left;
4. in that clause: what follows its last "is/are/equals" (its inline math, else a formula-like run: "The
   largest $n$ is 34." is 34), else its inline math, else its formula-like runs of tokens; several values in one clause ("204 or 228") stay together, so a hedged
   answer is graded as the list it is.
"""

from __future__ import annotations

import re

from sage_unsloth.data.prompts import SOLUTION_END, SOLUTION_START
from sage_unsloth.grading.visible import visible

MAX_COMPLETION_CHARS = 32_768  # only the tail is examined: the answer comes last
MAX_BLOCK_CHARS = 4_096  # a solution block longer than this is rambling; its tail holds the answer

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Where a generated turn ends: a chat template's special tokens; what follows is not the model's answer.
_END_OF_TURN = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|end_of_text|start_header_id)\|>")
# What may stand between the boxes of one answer boxed piece by piece ("\boxed{1}, \boxed{2}",
# "\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}", "\boxed{a} for part (a) and \boxed{b}"): math
# delimiters, spacing, punctuation and these words. Anything else (a sentence) separates two answers.
_BOX_JOINERS = frozenset(["and", "or", "for", "part", "parts", "&"])
_BOX_GAP_NOISE = re.compile(
    r"\\(?:text\w*|mathrm|mbox)\s*\{([^{}]*)\}|\\q?quad|\\[,;:! ]|\\[()\[\]]|\$|[\s,;.+]|\\\\|~"
)
_FINAL_ANSWER = re.compile(r"(?:\bfinal\s+answer\b(?:\s+is\b)?|\bthe\s+answer\s+is\b)\s*:?", re.IGNORECASE)


_STATEMENT_END = re.compile(r"\bI hope it is correct|\n\s*\n|\bNote:", re.IGNORECASE)


def _box_spans(text: str) -> list[tuple[int, int]]:
    """(start of the content, end of the content) of every closed ``\\boxed{...}`` among the last few."""
    spans = []
    for match in list(_BOXED.finditer(text))[-16:]:  # only the last few: keeps unclosed-box spam linear
        depth, i = 1, match.end()
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
                    spans.append((match.end(), i))
                    break
            i += 1
    # A box inside another box is part of it, not an answer of its own.
    return [s for s in spans if not any(o[0] < s[0] and s[1] < o[1] for o in spans)]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), or None when there is none or it is unclosed."""
    spans = _box_spans(text)
    return text[spans[-1][0] : spans[-1][1]] if spans else None


# "y_1 = \\boxed{...}": the name a box is the value of, written just before it.
_BOXED_OPEN_END = re.compile(r"\\(?:boxed|fbox)\s*\{$")
_BOX_LABEL = re.compile(r"((?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w+\}?)?)\s*=\s*(?:\$\s*|\\[(\[]\s*)*$")


def _joins(gap: str) -> bool:
    """Whether the text between two boxes only connects them: ``_BOX_JOINERS`` and punctuation, or an
    "and"/"or" with at most two other words; the next box's label ("and y_2 =") may close the gap."""
    if len(gap) > 80:
        return False
    gap = _BOX_LABEL.sub("", gap)
    words = _BOX_GAP_NOISE.sub(lambda m: f" {m.group(1)} " if m.group(1) else " ", gap).split()
    others = [
        w for w in words if w.strip("()").lower() not in _BOX_JOINERS and not re.fullmatch(r"\(?[a-z]\)?", w)
    ]
    # "\\boxed{1} papers and \\boxed{2} bins": a unit word or two beside an "and" still joins two parts.
    return not others or (len(others) <= 2 and any(w.lower() in ("and", "or") for w in words))


def final_boxed(text: str) -> str | None:
    """The boxed answer of ``text``: the last box, together with the boxes before it that only a connector
    separates (a multi-part answer boxed piece by piece), distinct values joined by ", " in order."""
    spans = _box_spans(text)
    if not spans:
        return None
    group = [spans[-1]]
    for span in reversed(spans[:-1]):
        if not _joins(_gap(text, span, group[0])):
            break
        group.insert(0, span)
    if len(group) == 1:
        return text[group[0][0] : group[0][1]]
    labels = [_BOX_LABEL.search(_BOXED_OPEN_END.sub("", text[max(0, a - 48) : a])) for a, _ in group]
    if all(labels):  # "y_1 = \\boxed{A} and y_2 = \\boxed{B}": the answer is "y_1 = A, y_2 = B"
        values = [f"{m.group(1)} = {text[a:b].strip()}" for m, (a, b) in zip(labels, group)]
    else:
        values = [text[a:b].strip() for a, b in group]
    return ", ".join(v for v in dict.fromkeys(values) if v)


def _gap(text: str, before: tuple[int, int], after: tuple[int, int]) -> str:
    # From the closing brace of one box to the opening "\boxed{" of the next.
    start = text.rfind("\\", before[1], after[0])
    gap = text[before[1] + 1 : start if start >= 0 else after[0]]
    return _BOXED.sub("", gap)


def solution_block(text: str) -> str | None:
    """The text after the last ``<SOLUTION>``, up to ``</SOLUTION>`` when present; None without one."""
    start = text.rfind(SOLUTION_START)
    if start < 0:
        return None
    body = text[start + len(SOLUTION_START) :]
    end = body.find(SOLUTION_END)
    return body if end < 0 else body[:end]


def extract_answer(completion: str | None) -> str | None:
    """The cleaned final answer of a completion: its last solution block, else its boxed answer
    (``final_boxed``), or a "The final answer is" statement written after the last box. Only what a reader
    sees counts: comments and invisible boxes are removed first (``visible``)."""
    if not completion:
        return None
    text = visible(completion[-MAX_COMPLETION_CHARS:])
    turn_end = _END_OF_TURN.search(text)
    if turn_end:  # the turn ended there: what follows is not the model's answer
        head = text[: turn_end.start()]
        answer = _answer_of(head)
        # Unless the token lies inside a box, "\\boxed{... 2/3. <|im_start|>user}": that box is the answer.
        if answer or len(_BOXED.findall(head)) == len(_box_spans(head)):
            return answer
    return _answer_of(text)


def _answer_of(text: str) -> str | None:
    block = solution_block(text)
    if block is not None:
        answer = clean_answer(block)
        if answer:
            return answer
    spans = _box_spans(text)
    if not spans:
        return None  # without a box or a block there is no answer: the format is the model's to keep
    # "... = \\boxed{255}$. So ... Final Answer: The final answer is $10,455$.": the last word counts.
    statements = list(_FINAL_ANSWER.finditer(text, spans[-1][1]))
    if statements:
        return clean_answer(text[statements[-1].start() :]) or None
    boxed = final_boxed(text)
    return (clean_answer(boxed) or None) if boxed is not None else None


# ----------------------------------------------------------------------------------------------- cleaning
# Bold is "**" opening before a word or closing after one ("**902**", "The answer is **5**."); between two
# operands ("2**10", "(a+b)**2") it is a power and stays.
_BOLD = re.compile(r"(?<![\w)}\]])\*\*|\*\*(?![\w({\[\\])|(?<![\w\\])__|__(?![\w])")
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
    boxed = final_boxed(text)
    if boxed is not None and boxed.strip():
        text = boxed
    text = _END_OF_TURN.split(text, maxsplit=1)[0]
    text = strip_markdown(text)
    # A sentence the model put in \text{} ("\text{The answer is } 721") is prose; "\text{ ergs}" is a unit.
    text = _TEXT_GROUP_INNER.sub(
        lambda m: m.group(1) if _is_sentence(m.group(1)) else m.group(0), text
    ).strip()
    statements = list(_FINAL_ANSWER.finditer(text))
    if statements and statements[-1].start() > 0:  # a solution ending "Final Answer: The final answer is 7"
        text = text[statements[-1].start() :]
    text = _STATEMENT_END.split(text, maxsplit=1)[0] if statements else text
    text = _HOPE.sub("", text).strip()
    for _ in range(2):  # "Final Answer: The final answer is 7": two lead-ins
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
    r"because of|note that)\b",
    re.IGNORECASE,
)
_CONCLUSION = re.compile(
    r"^(?:so|thus|therefore|hence|which gives|giving|this gives|i\.e\.|that is)\b[,:]?\s*", re.IGNORECASE
)
_CUE = re.compile(r"\b(?:is|are|was|were|equals|be|becomes|gives|get|to|it's)(?!\w)", re.IGNORECASE)
_OPENER = re.compile(r"(?:so|thus|therefore|hence|finally|then|in conclusion)", re.IGNORECASE)
_SPLIT = re.compile(
    r"(?<=[.!?])\s+(?=\S)|:\s+|\s+(?=(?:Therefore|Thus|Hence|So)\b)|;\s*|,\s+(?=(?!(?:and|or)\b)[A-Za-z]{2,}\b)"
)
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
    clauses = _merge_openers([c.strip(" ,;:.") for c in _SPLIT.split(masked) if c and c.strip(" ,;:.")])
    affirmed = [a for a in (_affirmed(c) for c in clauses if not _PREMISE.match(c)) if a]
    conclusions = [c for c in affirmed if _CONCLUSION.match(c)]
    for clause in list(reversed(conclusions)) or affirmed:
        value = _clause_value(_CONCLUSION.sub("", clause, count=1), segments)
        if value:
            return value
    return None


def _merge_openers(clauses: list[str]) -> list[str]:
    """ "Therefore, there are 12 sequences": a conclusion word cut off by its comma opens the next clause."""
    merged: list[str] = []
    for clause in clauses:
        if merged and _OPENER.fullmatch(merged[-1]):
            merged[-1] = f"{merged[-1]}, {clause}"
        else:
            merged.append(clause)
    return merged


def _affirmed(clause: str) -> str | None:
    """The clause, or for a clause with a negation the statement after it ("the number is not 10 which is
    1,000.99", "it's not 10, it's 12"); None when nothing is affirmed after the negation."""
    negations = list(_NEGATION.finditer(clause))
    if not negations:
        return clause
    rest = clause[negations[-1].end() :]
    cue = _CUE.search(rest)
    return rest[cue.start() :] if cue else None


def _placeholders(text: str) -> list[int]:
    return [int(i) for i in re.findall(r"\x00(\d+)\x00", text)]


def _clause_value(clause: str, segments: list[str]) -> str | None:
    """The value a clause states: what follows its last "is/are/equals" (inline math first, then a formula
    run: "The largest $n$ is 34" is 34, not n), else its inline math, else its formula runs."""
    cues = list(_CUE.finditer(clause))
    if cues:
        after = clause[cues[-1].end() :]
        held = _placeholders(after)
        if held:
            return ", ".join(segments[i].strip() for i in held)
        value = _formula_runs(after, first_only=True)
        if value:
            return value
    held = _placeholders(clause)
    if held:
        return ", ".join(segments[i].strip() for i in held)
    return _formula_runs(clause)


def _formula_runs(text: str, first_only: bool = False) -> str | None:
    """Maximal runs of non-word tokens; a run with a digit or a LaTeX command beats a lone letter."""
    runs, current = [], []
    tokens = _LIST_WORD.sub(" , ", text).split()
    for i, token in enumerate(tokens):
        # "is a zero matrix": "a" before a word is the article, not the variable a
        article = token in ("a", "A") and i + 1 < len(tokens) and is_prose_word(tokens[i + 1])
        if article or is_prose_word(token):
            if current:
                runs.append(" ".join(current))
                current = []
            if first_only and runs:
                break
        else:
            current.append(token)
    if current:
        runs.append(" ".join(current))
    # "19, 46, and 82": the comma before "and" and the one standing for it are one separator
    runs = [re.sub(r"(?:\s*,)+", ",", r).strip(" ,;:.") for r in runs if r.strip(" ,;:.")]
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
