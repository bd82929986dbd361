"""The grader's verdicts on the labelled sets are those recorded under the pinned math-verify.

math-verify decides every pass@k verdict, so it is pinned exactly (pyproject.toml, every lock). The two tests
that grade the labelled sets, the careful human's (test_grading_cases.py: its sure cases) and the public suites'
(test_grading_public_suites.py: the in-scope cases), compare each verdict with tests/fixtures/grading_verdicts.json
(:func:`assert_recorded`), recorded under the pinned release: a math-verify bump (or a grader change) that turns any
verdict fails there, naming the cases, before it changes a result. This file checks the record itself: made under
the math-verify pyproject.toml pins and installed here, covering exactly the cases those tests grade. After a
deliberate change, record the new verdicts with ``python tests/grading/test_grading_verdicts.py --write`` and
say in the commit which verdicts moved and why."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
RECORD = FIXTURES / "grading_verdicts.json"
HUMAN, PUBLIC = "grading_cases.jsonl", "public_grading_suites.jsonl"
GRADED = {HUMAN: "sure", PUBLIC: "in_scope"}  # the cases each set's test grades


def pinned_math_verify() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (requirement,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "math-verify"]
    (spec,) = requirement.specifier
    assert spec.operator == "==", "math-verify decides every verdict: pin it exactly in pyproject.toml"
    return spec.version


def graded_cases(name: str) -> list[dict]:
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    return [case for case in map(json.loads, filter(str.strip, lines)) if case[GRADED[name]]]


def assert_recorded(name: str, cases: list[dict], correct: list[bool]) -> None:
    """Each case's verdict (``correct``) is the one recorded under the pinned math-verify."""
    record = json.loads(RECORD.read_text())
    assert record["math-verify"] == metadata.version("math-verify"), "the record is of another math-verify"
    now = {str(c["id"]): int(ok) for c, ok in zip(cases, correct, strict=True)}
    moved = {i: (record[name].get(i), v) for i, v in now.items() if record[name].get(i) != v}
    assert not moved, f"{name}: verdicts moved, case id -> (recorded, now): {moved}"
    assert set(record[name]) == set(now), f"{name}: recorded cases differ from the graded ones"


def test_the_record_is_of_the_pinned_math_verify_and_covers_the_graded_cases():
    record = json.loads(RECORD.read_text())
    assert record["math-verify"] == pinned_math_verify() == metadata.version("math-verify")
    for name in GRADED:
        ids = {str(c["id"]) for c in graded_cases(name)}
        assert set(record[name]) == ids and len(ids) >= 250, name
        assert set(record[name].values()) == {0, 1}, name  # both verdicts occur


def test_a_moved_verdict_is_named():
    import pytest

    cases = graded_cases(PUBLIC)[:3]
    recorded = json.loads(RECORD.read_text())[PUBLIC]
    correct = [bool(recorded[str(c["id"])]) for c in cases]
    with pytest.raises(AssertionError, match="recorded cases differ"):
        assert_recorded(PUBLIC, cases, correct)  # the verdicts agree, but three cases are not the whole set
    correct[1] = not correct[1]
    with pytest.raises(AssertionError, match=f"verdicts moved.*{re.escape(cases[1]['id'])}"):
        assert_recorded(PUBLIC, cases, correct)


def _record() -> dict:
    """Grade the graded cases as their tests do: the human set through stage 3's pool, the suites in-process."""
    from test_grading_cases import BENCHMARKS, _gold

    from sage_unsloth import grading
    from sage_unsloth.eval.benchmarks import load_benchmark
    from sage_unsloth.eval.gradepool import GradingPool

    problems = {(b, p.problem_id): p for b in BENCHMARKS for p in load_benchmark(b)}
    human = graded_cases(HUMAN)
    with GradingPool(workers=2) as pool:
        grades = pool.grade([(c["completion"], _gold(c, problems)) for c in human])
    public = graded_cases(PUBLIC)
    out = {"math-verify": metadata.version("math-verify")}
    out[HUMAN] = {str(c["id"]): int(g.correct) for c, g in zip(human, grades)}
    out[PUBLIC] = {str(c["id"]): int(grading.grade(c["completion"], c["gold"]).correct) for c in public}
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/grading/test_grading_verdicts.py --write")
    sys.path.insert(0, str(Path(__file__).parent))
    data = _record()
    text = ",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in data.items())
    RECORD.write_text("{\n" + text + "\n}\n")
    print(f"wrote {RECORD} (math-verify {data['math-verify']})")
