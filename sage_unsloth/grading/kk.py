"""Knights-and-Knaves answers: who is a knight and who is a knave, read from the answer text.

The answer block (``<SOLUTION>``, else the completion's tail) is cleaned of markdown (``**Amelia** is a
**knight**``, tables, bullets) and searched for statements about the inhabitants, in three forms:

- "<name> <link> <role>": ``Amelia is a knight``, ``Amelia: Knight``, ``so Evelyn must be a knave``,
  ``Evelyn is not a knight`` (a negated role is the other role: there are only two);
- "<names> are <role>s": ``Amelia and Penelope are knights``, ``Amelia, Penelope: knights``;
- "<role>s: <names>": ``Knights: Amelia, Penelope``, ``The knaves are Evelyn``;
- the rest: ``Only Evelyn is a knave``, ``Evelyn is the only knave``, ``the others are knights`` give the
  inhabitants not named otherwise the other (resp. the stated) role.

An answer that never says knight or knave may say truth-teller / truthful and liar instead.

The link between a name and its role is short, stays within one sentence and names nobody else (so
"Amelia said that Evelyn is a knave" says nothing about Amelia). Statements inside "if/assume/suppose"
clauses are hypotheses, not answers. Every name must have a role, and one only:

- a statement giving a name both roles ("Amelia is a knight and a knave", "either a knight or a knave",
  "Amelia and Evelyn are knights and knaves") gives it none;
- in an answer block (``<SOLUTION>``) every statement is final, so two that disagree about a name
  contradict each other and the name has no role; in a completion without a block the reasoning comes
  first, so the last statement about each name counts ("Ann is a knave. Wait, no: Ann is a knight.").

Comments and invisible boxes are removed first (``visible``): only what a reader sees is an answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sage_unsloth.grading.extract import MAX_COMPLETION_CHARS, solution_block, strip_markdown
from sage_unsloth.grading.visible import visible

KK_MAX_CHARS = 8_192
_ROLE = r"(knights?|knaves?)"
_HYPOTHESIS = re.compile(
    r"\b(?:if|assume|assuming|suppose|supposing|whether|hypothetically)\b[^.;\n]*$", re.IGNORECASE
)
_NEGATED = re.compile(r"\b(?:not|cannot|never|isn't|is\s+no)\b|n't\b", re.IGNORECASE)


_SYNONYMS = (
    (re.compile(r"\btruth[- ]?tellers\b", re.IGNORECASE), "knights"),
    (re.compile(r"\b(?:truth[- ]?teller|truthful|honest)\b", re.IGNORECASE), "knight"),
    (re.compile(r"\bliars\b", re.IGNORECASE), "knaves"),
    (re.compile(r"\b(?:liar|lying|dishonest)\b", re.IGNORECASE), "knave"),
)
_OTHERS = re.compile(
    rf"\b(?:the\s+)?(?:others|rest|remaining\s+\w+|everyone\s+else|all\s+the\s+others)\s+"
    rf"(?:are|were|is|:)\s+(?:all\s+)?{_ROLE}\b",
    re.IGNORECASE,
)


def _clean(text: str) -> str:
    text = re.sub(r"[|*_`#]", " ", strip_markdown(text))
    if not re.search(r"\bkn(?:igh|av)", text, re.IGNORECASE):
        for pattern, role in _SYNONYMS:
            text = pattern.sub(role, text)
    return text


# What may follow a role to give the same name the other role too: "a knight and a knave", "knight or
# knave", "knight/knave", "a knight but also a knave" (a negated second role is the first: "a knight, not
# a knave" agrees with itself).
_SECOND_ROLE = re.compile(
    rf"\s*,?\s*(?:and|or|/|&|but)\s*(?:also\s+)?(not\s+)?(?:(?:a|an)\s+)?{_ROLE}\b", re.IGNORECASE
)


def _both_roles(text: str, end: int, knight: bool) -> bool:
    """Whether the role ending at ``end`` is followed by the other role for the same subject."""
    second = _SECOND_ROLE.match(text, end)
    return bool(second) and (second.group(2).lower().startswith("knight") != bool(second.group(1))) != knight


def kk_assignments(text: str, names: Sequence[str], *, final: bool = False) -> dict[str, bool | None]:
    """{name: is_knight} from the statements in ``text``; None for a name given both roles (module
    docstring). ``final``: ``text`` is an answer block, where statements that disagree contradict each
    other; otherwise the last statement about each name wins."""
    text = _clean(text)
    name_alt = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    if not name_alt:
        return {}
    other_name = re.compile(rf"\b(?:{name_alt})\b")
    found: list[tuple[int, str, bool | None]] = []
    others: list[tuple[int, bool]] = []  # (position, role) for the inhabitants no statement names

    def hypothetical(start: int) -> bool:
        return _HYPOTHESIS.search(text[max(0, start - 80) : start]) is not None

    # "<name> <link> <role>"
    for m in re.finditer(rf"\b({name_alt})\b([^.;!?\n]{{0,40}}?)\b{_ROLE}\b", text, re.IGNORECASE):
        link = m.group(2)
        if other_name.search(link) or re.search(
            r"\b(?:said|says|claims?|stated?|told)\b", link, re.IGNORECASE
        ):
            continue
        if hypothetical(m.start()):
            continue
        knight = m.group(3).lower().startswith("knight") != bool(_NEGATED.search(link))
        both = _both_roles(text, m.end(), knight)
        found.append((m.start(), _canonical(m.group(1), names), None if both else knight))
        before = text[max(0, m.start() - 12) : m.start()]
        if not both and re.search(r"\bonly\b", f"{link} {before}", re.IGNORECASE):
            others.append((m.start(), not knight))  # "Evelyn is the only knave": the rest are knights
    name_list = rf"((?:\b(?:{name_alt})\b\s*(?:,|\band\b|&)?\s*)+)"
    for pattern, role_group, list_group in (
        (rf"{name_list}\s*(?:are|were|:|-|=)\s*(?:both\s+|all\s+)?{_ROLE}\b", 2, 1),  # "<names> are <role>s"
        (rf"\b{_ROLE}\s*(?::|=|-|\bare\b|\bis\b)\s*{name_list}", 1, 2),
    ):  # "<role>s: <names>"
        for m in re.finditer(pattern, text, re.IGNORECASE):
            if hypothetical(m.start()):
                continue
            knight = m.group(role_group).lower().startswith("knight")
            role = None if _both_roles(text, m.end(role_group), knight) else knight
            for n in re.finditer(rf"\b({name_alt})\b", m.group(list_group)):
                found.append((m.start(list_group) + n.start(), _canonical(n.group(1), names), role))
    others += [
        (m.start(), m.group(1).lower().startswith("knight"))
        for m in _OTHERS.finditer(text)
        if not hypothetical(m.start())
    ]
    result: dict[str, bool | None] = {}
    for _, name, knight in sorted(found, key=lambda f: f[0]):
        if final and name in result and result[name] != knight:
            knight = None  # two final statements disagree (or one gave both roles): no role
        result[name] = knight
    if others and result:
        rest = max(others)[1]
        result.update({n: rest for n in names if n not in result})
    return result


def _canonical(name: str, names: Sequence[str]) -> str:
    return next((n for n in names if n.lower() == name.lower()), name)


def kk_answer(completion: str) -> tuple[str, bool]:
    """(the text the roles are read from, whether it is an answer block): the visible text of the last
    ``<SOLUTION>`` block, else of the completion's tail."""
    text = visible(completion[-MAX_COMPLETION_CHARS:])
    block = solution_block(text)
    final = block is not None and bool(block.strip())
    return (block if final else text)[-KK_MAX_CHARS:], final


def kk_read(completion: str, names: Sequence[str]) -> dict[str, bool | None]:
    """The roles a completion's answer gives (``kk_assignments`` of ``kk_answer``)."""
    text, final = kk_answer(completion)
    return kk_assignments(text, names, final=final)


def grade_kk(completion: str | None, solution_booleans: Sequence[bool], names: Sequence[str]) -> bool:
    """True when the completion's answer names every inhabitant with the right role (True = knight), one
    role each."""
    try:
        if not completion or len(solution_booleans) != len(names) or not names:
            return False
        said = kk_read(completion, names)
        return all(said.get(n) is bool(k) for n, k in zip(names, solution_booleans))
    except Exception:  # noqa: BLE001 - a grader never raises; an unreadable answer is a wrong answer
        return False


def format_assignments(said: dict[str, bool], names: Sequence[str]) -> str:
    """The parsed answer, for the saved record: "Amelia=knight, Penelope=both, Evelyn=?" (both: given both
    roles; ?: given none)."""
    roles = {True: "knight", False: "knave", None: "both"}
    return ", ".join(f"{n}={roles[said[n]]}" if n in said else f"{n}=?" for n in names)
