"""Side by side: the kit's grader and math-verify alone, against the expected verdicts of three case sets.

- ``math-verify`` and ``hendrycks``: the public test suites of huggingface/Math-Verify and of the MATH
  dataset's equivalence test, converted to the kit's input (tests/fixtures/public_grading_suites.jsonl;
  only the in-scope cases count, see tests/fixtures/convert_public_suites.py);
- ``kit``: the kit's own labelled set (tests/fixtures/grading_cases.jsonl, the ``sure`` cases).

The kit grades each completion as evaluation and the RL reward do (``GradingPool``); math-verify alone is
called as its README says, ``verify(parse(gold), parse(prediction))``, with the gold in ``$...$`` and the
same completion. Prints agreement per suite and per class (the test function of a public case, the
category of a kit case), and with ``--misses`` every case the kit gets wrong.

    python benchmarks/bench_grading_agreement.py [--misses] [--suite math-verify] [--no-math-verify]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from sage_unsloth.eval.benchmarks import load_benchmark
from sage_unsloth.eval.gradepool import GradingPool

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
PUBLIC = FIXTURES / "public_grading_suites.jsonl"
KIT = FIXTURES / "grading_cases.jsonl"
KIT_BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva", "kk")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def cases() -> list[dict]:
    """Every case as {suite, cls, id, gold (kit form), gold_text, completion, expected}."""
    found = []
    for c in _lines(PUBLIC):
        if c["in_scope"]:
            cls = re.sub(r"\[\d+\]$", "", c["id"].split("::")[-1])
            found.append({**c, "cls": cls, "gold_text": c["gold"]})
    problems = {(n, p.problem_id): p for n in KIT_BENCHMARKS for p in load_benchmark(n)}
    for c in _lines(KIT):
        if not c["sure"]:
            continue
        p = problems[(c["benchmark"], c["problem_id"])]
        gold = (p.kk_solution, p.kk_names) if p.is_kk else p.gold
        found.append(
            {
                "suite": "kit",
                "cls": c["category"],
                "id": f"kit#{c['id']}",
                "gold": gold,
                "gold_text": c["gold"],
                "completion": c["completion"],
                "expected": c["expected"],
            }
        )
    return found


def math_verify_alone(gold_text: str, completion: str) -> bool:
    from math_verify import parse, verify

    try:
        return bool(verify(parse(f"${gold_text}$"), parse(completion)))
    except Exception:  # noqa: BLE001 - a crash is not a yes
        return False


def table(rows: list[dict], key: str, with_mv: bool) -> list[str]:
    groups = defaultdict(list)
    for r in rows:
        groups[r[key]].append(r)
    out = []
    for name in sorted(groups, key=lambda n: (-len(groups[n]), n)):
        g = groups[name]
        kit = sum(r["kit_ok"] for r in g)
        line = f"| {name} | {len(g)} | {kit / len(g):.1%} |"
        if with_mv:
            line += f" {sum(r['mv_ok'] for r in g) / len(g):.1%} |"
        out.append(line)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--suite", action="append", help="only these suites (math-verify, hendrycks, kit)")
    parser.add_argument("--misses", action="store_true", help="list every case the kit gets wrong")
    parser.add_argument("--no-math-verify", action="store_true", help="skip math-verify alone (faster)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--classes", action="store_true", help="also the per-class table")
    args = parser.parse_args()
    rows = [c for c in cases() if not args.suite or c["suite"] in args.suite]
    with GradingPool(workers=args.workers) as pool:
        grades = pool.grade([(r["completion"], r["gold"]) for r in rows])
    for r, g in zip(rows, grades):
        r["kit_ok"] = g.correct == r["expected"]
        r["kit_read"], r["kit_status"] = g.answer, g.status
        if not args.no_math_verify:
            r["mv_ok"] = math_verify_alone(r["gold_text"], r["completion"]) == r["expected"]
    with_mv = not args.no_math_verify
    head = "| suite | cases | kit |" + (" math-verify alone |" if with_mv else "")
    rule = "|---|---:|---:|" + ("---:|" if with_mv else "")
    print("\n".join([head, rule, *table(rows, "suite", with_mv)]))
    if args.classes:
        for suite in dict.fromkeys(r["suite"] for r in rows):
            print(f"\n{suite}, per class\n" + head.replace("suite", "class") + "\n" + rule)
            print("\n".join(table([r for r in rows if r["suite"] == suite], "cls", with_mv)))
    if args.misses:
        for r in rows:
            if not r["kit_ok"]:
                print(
                    f"MISS {r['id']}: gold {r['gold_text']!r} completion {r['completion'][-160:]!r} "
                    f"read {r['kit_read']!r} -> {r['kit_status']}, expected {r['expected']}"
                )
    timeouts = sum(r["kit_status"] == "timeout" for r in rows)
    print(f"\nkit timeouts: {timeouts}")


if __name__ == "__main__":
    main()
