"""No dead pointers: every ``docs/...`` reference the kit prints, writes or says in a comment, and every relative
link of README.md and docs/*.md, names a file that exists and, where it names a section, a section that exists.

Forms of a reference (in code and in prose): ``docs/x.md``, ``docs/x.md#anchor`` (GitHub's anchor of a
heading), ``docs/x.md, "Section"`` or ``'Section'`` (quoted, with or without the comma) and ``docs/x.md:
Section`` (after a colon, up to a closing bracket); a section is a heading of the page or a paragraph's bold
lead (``**Same samples as before?**``), named in full or by its first words. Code is read as Python reads it:
string literals after implicit concatenation (what is printed), and comments.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REFERENCE = re.compile(
    r"docs/(?P<page>[\w.-]+\.md)(?:#(?P<anchor>[\w-]+))?"
    r"(?:,?\s+[\"'](?P<quoted>[^\"'\n]+)[\"']|:\s+(?P<after_colon>[^)\n]+?)\s*(?:\)|$))?",
    re.MULTILINE,
)
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def _prose(text: str) -> list[str]:
    """The lines of a markdown page outside code fences, without inline code spans."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else re.sub(r"`[^`\n]*`", "", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the text without markup, lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def sections(page: Path) -> tuple[set[str], list[str]]:
    """(anchors, names) of a page: its headings' anchors (with GitHub's -1, -2 for repeats), and the names a
    reference may use (headings and bold paragraph leads, lower case, without markup)."""
    anchors, names, seen = set(), [], {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.add(base if count == 0 else f"{base}-{count}")
            names.append(heading.group(1).replace("`", "").strip().lower())
        lead = re.match(r"^\s*(?:[-*]\s+)?\*\*(.+?)\*\*", line)
        if lead:
            names.append(lead.group(1).replace("`", "").strip().lower())
    return anchors, names


def _names_a_section(name: str, names: list[str]) -> bool:
    name = " ".join(name.lower().split()).rstrip(".")
    return any(n == name or (n.startswith(name) and not n[len(name)].isalnum()) for n in names)


def dead(page_name: str, anchor: str | None, section: str | None) -> str | None:
    """Why a reference to docs/<page_name> is dead, or None."""
    page = ROOT / "docs" / page_name
    if not page.is_file():
        return f"docs/{page_name} does not exist"
    anchors, names = sections(page)
    if anchor and anchor not in anchors:
        return f"docs/{page_name} has no section with the anchor #{anchor}"
    if section and not _names_a_section(section, names):
        return f"docs/{page_name} has no section named {section!r}"
    return None


def _references(text: str):
    for m in REFERENCE.finditer(text):
        yield m.group(0), m["page"], m["anchor"], m["quoted"] or m["after_colon"]


# ----------------------------------------------------------------------------------------------- the kit's code
def _code_texts(path: Path) -> list[str]:
    """What a Python file can print or write (its string literals, f-strings with their fields as {}) and its
    comments."""
    source = path.read_text(encoding="utf-8")
    texts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            texts.append(
                "".join(
                    v.value if isinstance(v, ast.Constant) else "{}" for v in node.values if v is not None
                )
            )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    comments = [t.string.lstrip("#") for t in tokens if t.type == tokenize.COMMENT]
    # A comment that goes on over several lines is one text.
    texts.append(" ".join(comments))
    return texts


CODE = sorted((ROOT / "sage_unsloth").rglob("*.py"))


def test_the_kit_points_to_docs_at_all():
    found = [ref for path in CODE for text in _code_texts(path) for ref in _references(text)]
    assert len(found) >= 15  # the test reads what it should: the kit has about twenty such references


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_docs_reference_the_kit_prints_writes_or_says_exists(path):
    problems = [
        f"{text!r}: {why}"
        for source in _code_texts(path)
        for text, page, anchor, section in _references(source)
        if (why := dead(page, anchor, section))
    ]
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------- the pages
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_docs_reference_of_a_page_exists(page):
    problems = []
    for number, line in enumerate(_prose(page.read_text(encoding="utf-8")), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path_part, _, anchor = target.partition("#")
            resolved = (page.parent / path_part).resolve() if path_part else page
            if not resolved.exists():
                problems.append(f"line {number}: {target}: {resolved.relative_to(ROOT)} does not exist")
            elif anchor and resolved.suffix == ".md" and anchor not in sections(resolved)[0]:
                problems.append(f"line {number}: {target}: no section with the anchor #{anchor}")
        for text, name, anchor, section in _references(line):
            if why := dead(name, anchor, section):
                problems.append(f"line {number}: {text!r}: {why}")
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_the_checker_finds_what_is_dead():
    """The checks themselves: a missing page, anchor and section are found, a live one is not."""
    assert dead("nope.md", None, None) == "docs/nope.md does not exist"
    assert dead("lab.md", None, "how they vary") == "docs/lab.md has no section named 'how they vary'"
    assert dead("lab.md", "no-such-anchor", None)
    assert dead("lab.md", None, "Intervals and power") is None
    assert dead("benchmarks.md", None, "Stage 3 on CPU") is None  # the first words of a heading
    assert dead("benchmarks.md", None, "Same samples as before?") is None  # a bold lead
    assert dead("theory.md", "the-objective", None) is None
    assert slug("The demo runner (`make demo`)") == "the-demo-runner-make-demo"
    refs = list(_references('x (docs/lab.md: how they vary) y docs/theory.md, "The objective".'))
    assert [(r[1], r[3]) for r in refs] == [("lab.md", "how they vary"), ("theory.md", "The objective")]
