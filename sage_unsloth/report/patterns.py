r"""Reasoning-pattern tagger: documented regex rules applied to completions, frequency per run.

The paper reports how often completions show Constraint Setup, Structural Reasoning and Proof by
Contradiction (attributed to its Table 2; not traced to the paper's text here, see results/paper/), without
saying how it labelled them. These rules are ours, so the absolute rates are
not comparable with the paper's; differences between runs tagged by the same rules are. A completion
has a pattern when ANY of its rules matches (case-insensitive, on the completion text). For speed the
rules of a pattern are joined into one alternation and run on the lower-cased text (about 3 ms for a
16k-character completion on one CPU core; use --pattern_samples_per_problem to subsample).

| pattern | catches | rules: regex (Python `re`, IGNORECASE and DOTALL; `\|` is alternation) |
|---|---|---|
| constraint_setup | naming unknowns, stating givens/constraints as equations | `\b(let\|suppose\|assume)\s+\$?\\?[a-z]\w*\$?\s*(be\|denote\|=\|represents?\|:)` |
|  |  | `\b(let's\|let us\|we)\s+(denote\|define\|set up\|write down)\b` |
|  |  | `\bdenote\b.{0,40}\b(by\|as)\b` |
|  |  | `\b(constraints?\|conditions?)\s*(are\|is\|:)` |
|  |  | `\b(must\|should) satisfy\b` |
|  |  | `\bsubject to\b` |
|  |  | `\bwe (are given\|know) that\b` |
|  |  | `\bset up (an? \|the )?(equations?\|system\|inequalit)` |
| structural_reasoning | multi-step plan, decomposition, structure (recurrence, symmetry, induction, invariant) | `\bstep\s*\d+\b(.*?)\bstep\s*\d+\b` |
|  |  | `\b(break\|split\|decompose)\w*\b.{0,30}\b(down\|into)\b` |
|  |  | `\bsub-?problems?\b` |
|  |  | `\b(recurrence\|recursive(ly)?\|recursion\|invariant\|symmetr\w*\|by induction\|inductive step\|pattern (is\|emerges))\b` |
| proof_by_contradiction | arguing from a false assumption to an absurdity | `\bcontradict\w*\b` |
|  |  | `\bfor the sake of contradiction\b` |
|  |  | `\b(suppose\|assume)\s+(not\|otherwise\|the contrary\|to the contrary)\b` |
|  |  | `\b(which\|this) is (impossible\|absurd)\b` |
| case_analysis | splitting into cases | `\bcase\s*(\d+\|[ivx]+\b\|[a-d]\b\|:)` |
|  |  | `\b(two\|three\|four\|both\|several\|these\|the following\|all\|possible) (sub)?cases\b` |
|  |  | `\bsub-?cases?\b` |
|  |  | `\bin (the\|this\|each) case\b` |
| verification | checking an answer (substituting back, verifying) | `\b(let's\|let me\|we can\|to) (verify\|double[- ]check\|check)\b` |
|  |  | `\bverif(y\|ying\|ication)\b` |
|  |  | `\b(plug\|substitut)\w*\b.{0,30}\bback\b` |
|  |  | `\bsanity check\b` |
| enumeration | listing possibilities | `\b(enumerat\w*\|list(ing)? (all\|out\|them\|the possible))\b` |
|  |  | `\blet'?s list\b` |
|  |  | `\bpossible (values\|pairs\|combinations\|triples\|outcomes)\b.{0,20}(are\|:)` |
| self_correction | backtracking / noticing an error ("wait,") | `\bwait\b[,.!]` |
|  |  | `\b(i\|we) made (a\|an) (mistake\|error)\b` |
|  |  | `\b(let me\|let's) (re-?(check\|consider\|think\|evaluate\|examine))\b` |
|  |  | `\bthat('s\| is) (not right\|incorrect\|wrong)\b` |
"""

from __future__ import annotations

import glob
import gzip
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pandas as pd

_FLAGS = re.IGNORECASE | re.DOTALL

# The rules as written in the table above; compiled once below (case-insensitive, '.' spans lines).
_RULE_TEXT: dict[str, tuple[str, ...]] = {
    "constraint_setup": (
        r"\b(let|suppose|assume)\s+\$?\\?[a-z]\w*\$?\s*(be|denote|=|represents?|:)",
        r"\b(let's|let us|we)\s+(denote|define|set up|write down)\b",
        r"\bdenote\b.{0,40}\b(by|as)\b",
        r"\b(constraints?|conditions?)\s*(are|is|:)",
        r"\b(must|should) satisfy\b",
        r"\bsubject to\b",
        r"\bwe (are given|know) that\b",
        r"\bset up (an? |the )?(equations?|system|inequalit)",
    ),
    "structural_reasoning": (
        r"\bstep\s*\d+\b(.*?)\bstep\s*\d+\b",
        r"\b(break|split|decompose)\w*\b.{0,30}\b(down|into)\b",
        r"\bsub-?problems?\b",
        (
            r"\b(recurrence|recursive(ly)?|recursion|invariant|symmetr\w*|by induction|inductive step"
            r"|pattern (is|emerges))\b"
        ),
    ),
    "proof_by_contradiction": (
        r"\bcontradict\w*\b",
        r"\bfor the sake of contradiction\b",
        r"\b(suppose|assume)\s+(not|otherwise|the contrary|to the contrary)\b",
        r"\b(which|this) is (impossible|absurd)\b",
    ),
    "case_analysis": (
        r"\bcase\s*(\d+|[ivx]+\b|[a-d]\b|:)",
        r"\b(two|three|four|both|several|these|the following|all|possible) (sub)?cases\b",
        r"\bsub-?cases?\b",
        r"\bin (the|this|each) case\b",
    ),
    "verification": (
        r"\b(let's|let me|we can|to) (verify|double[- ]check|check)\b",
        r"\bverif(y|ying|ication)\b",
        r"\b(plug|substitut)\w*\b.{0,30}\bback\b",
        r"\bsanity check\b",
    ),
    "enumeration": (
        r"\b(enumerat\w*|list(ing)? (all|out|them|the possible))\b",
        r"\blet'?s list\b",
        r"\bpossible (values|pairs|combinations|triples|outcomes)\b.{0,20}(are|:)",
    ),
    "self_correction": (
        r"\bwait\b[,.!]",
        r"\b(i|we) made (a|an) (mistake|error)\b",
        r"\b(let me|let's) (re-?(check|consider|think|evaluate|examine))\b",
        r"\bthat('s| is) (not right|incorrect|wrong)\b",
    ),
}
PATTERN_RULES: dict[str, list[re.Pattern]] = {
    name: [re.compile(rule, _FLAGS) for rule in rules] for name, rules in _RULE_TEXT.items()
}
PATTERNS = tuple(PATTERN_RULES)


# Same rules, one alternation per pattern, matched against lower-cased text (IGNORECASE is ~3x slower).
_COMBINED = {
    name: re.compile("|".join(f"(?:{rule.pattern})" for rule in rules), re.DOTALL)
    for name, rules in PATTERN_RULES.items()
}


def tag(text: str) -> set[str]:
    """The set of patterns whose rules match ``text``."""
    lowered = text.lower()
    return {name for name, rule in _COMBINED.items() if rule.search(lowered)}


def tag_by_rule(text: str) -> set[str]:
    """Reference (slow) form: each documented rule on its own, case-insensitive."""
    return {name for name, rules in PATTERN_RULES.items() if any(rule.search(text) for rule in rules)}


def iter_completions(paths: Iterable[str | Path]) -> Iterator[dict]:
    """One record per completion from *.jsonl(.gz) files.

    Two layouts are accepted: one completion per line ({dataset, problem_id, sample_idx, completion,
    correct}), or one problem per line with its samples in a list ({dataset, problem_id, completions:
    [{text, correct, ...}]}, the eval stage's chunk files); the latter is flattened, sample_idx = position.
    """
    for path in paths:
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                record = json.loads(line)
                if isinstance(record.get("completions"), list):
                    for idx, sample in enumerate(record["completions"]):
                        yield {
                            "dataset": record.get("dataset"),
                            "problem_id": record.get("problem_id"),
                            "sample_idx": idx,
                            "completion": sample.get("text", sample.get("completion", "")),
                            "correct": sample.get("correct", False),
                        }
                else:
                    yield record


# Where completions are looked for when no --completions glob is given: the eval manifest's
# completions_dir, else these templates ({model}, {run} filled in; ** is recursive).
DEFAULT_COMPLETION_GLOBS = (
    "outputs/{model}/eval/{run}/**/*.jsonl.gz",
    "outputs/{model}/{run}/completions/*.jsonl.gz",
)


def completion_files(template: str, *, model: str, run: str) -> list[Path]:
    """Files matching the glob ``template`` with {model} and {run} filled in."""
    return [Path(p) for p in sorted(glob.glob(template.format(model=model, run=run), recursive=True))]


def run_completion_files(run, template: str | None = None) -> list[Path]:
    """A run's completion files: the explicit glob, else the eval manifest's completions_dir, else the defaults."""
    if template:
        return completion_files(template, model=run.model, run=run.run)
    completions_dir = (run.manifest or {}).get("completions_dir")
    if completions_dir:
        files = sorted(Path(completions_dir).glob("**/*.jsonl.gz"))
        if files:
            return files
    for default in DEFAULT_COMPLETION_GLOBS:
        files = completion_files(default, model=run.model, run=run.run)
        if files:
            return files
    return []


def pattern_frequencies(
    records: Iterable[dict], *, samples_per_problem: int | None = None
) -> dict[str, float]:
    """Fraction of completions with each pattern (+ n_completions and the same among correct ones).

    ``samples_per_problem`` keeps only completions with sample_idx below it (a cheap, deterministic
    subsample of every problem's samples).
    """
    counts = dict.fromkeys(PATTERNS, 0)
    correct_counts = dict.fromkeys(PATTERNS, 0)
    total = total_correct = 0
    for rec in records:
        if samples_per_problem is not None and int(rec.get("sample_idx", 0)) >= samples_per_problem:
            continue
        if "completion" not in rec:
            raise ValueError(
                "completion record without a 'completion' field; expected "
                "{dataset, problem_id, sample_idx, completion, correct}"
            )
        found = tag(rec["completion"])
        total += 1
        correct = bool(rec.get("correct", False))
        total_correct += correct
        for name in found:
            counts[name] += 1
            correct_counts[name] += correct
    out = {"n_completions": total, "n_correct": total_correct}
    for name in PATTERNS:
        out[name] = counts[name] / total if total else float("nan")
        out[f"{name}|correct"] = correct_counts[name] / total_correct if total_correct else float("nan")
    return out


def pattern_table(
    runs, template: str | None = None, *, samples_per_problem: int | None = None
) -> pd.DataFrame:
    """One row per run that has completion files: model, run, n_completions, each pattern's frequency."""
    rows = []
    for run in runs:
        files = run_completion_files(run, template)
        if not files:
            continue
        freq = pattern_frequencies(iter_completions(files), samples_per_problem=samples_per_problem)
        rows.append({"model": run.model, "run": run.run, **freq})
    return pd.DataFrame(rows)
