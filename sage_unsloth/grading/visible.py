"""What a reader of a completion sees: comments and invisible material are removed before an answer is
looked for, so that nothing the rendered text hides can be graded as the answer (a policy under RL would
learn to hide a second answer: ``\\boxed{3} % the answer is 8`` must not be correct for 8).

Removed, in both the completion and any answer handed to the judge:

- LaTeX comments: ``%`` to the end of the line, unless escaped (``\\%``) or written right after a number
  (``50%``, ``50 %``, ``$50$ %``: a percent sign, the one way models write it without its backslash);
- HTML comments ``<!-- ... -->`` (an unclosed one hides the rest, as a browser does);
- ``\\iffalse ... \\fi`` and ``\\begin{comment} ... \\end{comment}`` (unclosed: the rest);
- invisible boxes: ``\\phantom{...}``, ``\\hphantom{...}``, ``\\vphantom{...}`` (space the size of their
  argument, which is not shown) and ``\\textcolor{white}{...}`` (white on the page), each with its braced
  argument (unclosed: the rest).

Each step is a regular expression or a scan that moves forward only, so the cost stays linear in the text
(which is capped before it, ``extract.MAX_COMPLETION_CHARS``); a text with none of the markers is returned
after a few substring checks.
"""

from __future__ import annotations

import re

# "%" not escaped (an even run of backslashes before it is line breaks, "\\\\%") and not a percent sign
# after a number ("50%", "50 %", "$50$%", "$50$ %").
_LATEX_COMMENT = re.compile(r"(?<![\\\d])(?<!\d )(?<!\d\$)(?<!\d\$ )((?:\\\\)*)%[^\n]*")
_BLOCKS = re.compile(
    r"<!--.*?(?:-->|\Z)"
    r"|\\iffalse(?![A-Za-z]).*?(?:\\fi(?![A-Za-z])|\Z)"
    r"|\\begin\s*\{comment\}.*?(?:\\end\s*\{comment\}|\Z)",
    re.DOTALL,
)
_INVISIBLE_BOX = re.compile(r"\\(?:[hv]?phantom|textcolor\s*\{\s*white\s*\})\s*\{")
_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character (\{, \}) is no brace
_MARKERS = ("%", "<!--", "\\iffalse", "comment", "phantom", "white")


def visible(text: str) -> str:
    """``text`` without its comments and invisible boxes (module docstring)."""
    if not any(marker in text for marker in _MARKERS):
        return text
    if "<!--" in text or "\\iffalse" in text or "comment" in text:
        text = _BLOCKS.sub(" ", text)
    if "%" in text:
        text = _LATEX_COMMENT.sub(r"\1", text)
    if "phantom" in text or "white" in text:
        text = _without_invisible_boxes(text)
    return text


def _without_invisible_boxes(text: str) -> str:
    """Each ``\\phantom{...}`` (and the other invisible boxes) removed with its balanced argument; one left
    open removes the rest of the text. A box inside a removed one goes with it."""
    kept, position = [], 0
    for match in _INVISIBLE_BOX.finditer(text):
        if match.start() < position:  # inside a box already removed
            continue
        kept.append(text[position : match.start()])
        depth, end = 1, None
        for brace in _BRACE.finditer(text, match.end()):
            token = brace.group(0)
            if token == "{":
                depth += 1
            elif token == "}":
                depth -= 1
                if depth == 0:
                    end = brace.end()
                    break
        if end is None:
            return "".join(kept)
        position = end
    kept.append(text[position:])
    return "".join(kept)
