"""What a reader of a completion sees: comments, hidden and unreachable material are removed before an answer
is looked for, so that nothing the rendered text hides can be graded as the answer (a policy under RL would
learn to hide a second answer: ``\\boxed{3} % the answer is 8`` must not be correct for 8).

Removed, in both the completion and any answer handed to the judge, in this order:

1. HTML comments ``<!-- ... -->`` (an unclosed one hides the rest, as a browser does) and
   ``\\begin{comment} ... \\end{comment}`` (unclosed: the rest);
2. LaTeX comments: ``%`` to the end of the line, unless escaped (``\\%``) or written right after a number
   (``50%``, ``50 %``, ``$50$ %``: a percent sign, the one way models write it without its backslash). The
   exception never lets a later answer through: where the rest of such a line holds an answer (a box, a
   solution tag, the word "answer") and the text read with those percent signs as comments still has an
   answer (``\\boxed{3} 1% \\boxed{8}``), the comment reading is the one graded;
3. everything after ``\\end{document}``, and the branches of conditionals TeX does not typeset
   (``hidden_latex``: ``\\iftrue A \\else B \\fi`` is A);
4. Markdown link reference definitions, which render as nothing: ``[//]: # (the answer is 8)``,
   ``[comment]: <> "..."`` (a title left open, or on the next line, runs to the next blank line);
5. HTML elements a browser does not show, by tag, attribute or style (``hidden_html``: ``display: none``,
   ``visibility: hidden``, white text, ...), and attributes (never text);
6. LaTeX groups a reader cannot see (``hidden_latex``): text coloured like its background in any colour
   spelling (``\\color{white}``, ``\\textcolor[rgb]{1,1,1}``, ``\\textcolor{White}``, ``black!0``,
   ``\\colorbox{black}{...}``), scaled or sized to nothing (``\\scalebox{0}``, ``\\resizebox{0pt}{!}``),
   invisible boxes (``\\phantom{}`` and its kin), shifted off the page.

A completion that can make anything render as anything has no answer (``visible`` returns ""): one that
defines or redefines a command (``\\renewcommand{\\boxed}[1]{8}``), one with a ``<style>`` or ``<script>``
element, and one with Unicode bidirectional controls (U+202A-U+202E, U+2066-U+2069), which show digits in
another order than they are stored.

Each step is a regular expression or a scan that moves forward only, so the cost stays linear in the text
(which is capped before it, ``extract.MAX_COMPLETION_CHARS``); each step first checks for its markers.
"""

from __future__ import annotations

import re

from sage_unsloth.data.prompts import SOLUTION_START
from sage_unsloth.grading.hidden_html import restyles, without_hidden_elements
from sage_unsloth.grading.hidden_latex import (
    before_end_of_document,
    live_branches,
    redefines,
    without_hidden_groups,
)

_BLOCKS = re.compile(r"<!--.*?(?:-->|\Z)|\\begin\s*\{comment\}.*?(?:\\end\s*\{comment\}|\Z)", re.DOTALL)
_BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")
# An unescaped "%" (an even run of backslashes before it is line breaks, "\\\\%").
_PERCENT = re.compile(r"(?<!\\)((?:\\\\)*)%")
# What makes a "%" a percent sign: a number just before it ("50%", "50 %", "$50$%", "$50$ %").
_NUMBER_BEFORE = re.compile(r"\d(?: |\$ ?)?\Z")
_ANSWER_MARK = re.compile(r"\\(?:boxed|fbox)|SOLUTION>|answer", re.IGNORECASE)
_HAS_ANSWER = re.compile(r"\\(?:boxed|fbox)\s*\{|" + re.escape(SOLUTION_START))
_REFERENCE = re.compile(r"(?m)^ {0,3}\[(?:[^\]\\\n]|\\.){1,999}\]:[ \t]*(?:<[^>\n]*>|[^\s<]\S*)([^\n]*)")
_TITLE_OPENERS = ("(", '"', "'")
_NEXT_LINE_TITLE = re.compile(r"\n[ \t]*[\"'(]")
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_MARKERS = re.compile(r"[%<\\\u202a-\u202e\u2066-\u2069]|\]:")


def visible(text: str) -> str:
    """``text`` as a reader sees it (module docstring); "" for a completion that can render as anything."""
    if not _MARKERS.search(text):
        return text
    if "<!--" in text or "comment" in text:
        text = _BLOCKS.sub(" ", text)
    if "%" in text:
        text = _without_comments(text)
    if "\\" in text:
        text = before_end_of_document(text)
    if (not text.isascii() and _BIDI_CONTROLS.search(text)) or restyles(text) or redefines(text):
        return ""
    text = live_branches(text)
    if "]:" in text:
        text = _without_references(text)
    return without_hidden_groups(without_hidden_elements(text))


def _without_comments(text: str) -> str:
    lenient, ambiguous = _comments_removed(text, strict=False)
    if ambiguous:
        strict, _ = _comments_removed(text, strict=True)
        if _HAS_ANSWER.search(strict):
            return strict
    return lenient


def _comments_removed(text: str, *, strict: bool) -> tuple[str, bool]:
    """``text`` without its LaTeX comments, and whether a percent sign kept as one is followed on its line by
    an answer. ``strict``: such a percent sign starts a comment too."""
    kept, position, ambiguous = [], 0, False
    line_end, last_mark = -1, -1  # the current line's end, and where its last answer mark starts
    for match in _PERCENT.finditer(text):
        if match.start() < position:  # inside a comment already removed
            continue
        if match.start() > line_end:
            line_end = text.find("\n", match.end())
            line_end = len(text) if line_end < 0 else line_end
            marks = list(_ANSWER_MARK.finditer(text, match.end(), line_end))
            last_mark = marks[-1].start() if marks else -1
        if not match.group(1) and _NUMBER_BEFORE.search(text, max(0, match.start() - 3), match.start()):
            answer_after = last_mark >= match.end()
            ambiguous |= answer_after
            if not (strict and answer_after):
                continue  # a percent sign
        kept.append(text[position : match.end(1)])
        position = line_end
    kept.append(text[position:])
    return "".join(kept), ambiguous


def _without_references(text: str) -> str:
    """``text`` without its Markdown link reference definitions (module docstring)."""
    kept, position = [], 0
    for match in _REFERENCE.finditer(text):
        if match.start() < position:
            continue
        kept.append(text[position : match.start()])
        end, rest = match.end(), match.group(1).strip()
        following = _NEXT_LINE_TITLE.match(text, end)
        if (not rest and following) or (rest and not _title_closed(rest)):
            blank = _BLANK_LINE.search(text, end)
            end = len(text) if blank is None else blank.start()
        position = end
    kept.append(text[position:])
    return "".join(kept)


def _title_closed(rest: str) -> bool:
    """Whether the title after a reference's destination closes on its line (``"..."``, ``'...'``,
    ``(...)``)."""
    if not rest.startswith(_TITLE_OPENERS):
        return True  # not a title: the line is removed, no more
    closer = ")" if rest[0] == "(" else rest[0]
    return len(rest) > 1 and rest.rstrip().endswith(closer)
