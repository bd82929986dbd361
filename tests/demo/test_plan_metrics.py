"""One name and one definition per plan metric of the demo lab (issue 41): the minority-plan share (every plan
but the common one) and the pair-plan share (pairs and outer). Before, the console printed "rare plans" for the
first while README called the pair plans "rare": two quantities under near names."""

import ast
import re
from pathlib import Path

from sage_unsloth.demo import task
from sage_unsloth.demo.strategies import (
    MINORITY,
    MINORITY_PLANS,
    PAIR_PLANS,
    PLAN_METRICS,
    markdown_table,
    problem_shares,
    strategy_rows,
)

ROOT = Path(__file__).resolve().parents[2]


def test_each_plan_metric_has_one_name_and_one_definition():
    assert set(PLAN_METRICS) == {"minority-plan share", "pair-plan share"}
    assert set(MINORITY_PLANS) == set(task.STRATEGIES) - {task.COMMON}
    assert set(PAIR_PLANS) < set(MINORITY_PLANS)
    assert all(p in PLAN_METRICS["pair-plan share"] for p in PAIR_PLANS)
    assert all(p in PLAN_METRICS["minority-plan share"] for p in MINORITY_PLANS)


def test_the_minority_row_counts_every_plan_but_the_common_one():
    def completion(plan):
        return {"text": task.solution((5, 8, 6, 7), plan)[len("<start_working_out>") :], "correct": True}

    records = [
        {"problem_id": "p0", "completions": [completion(p) for p in ("left", "right", "pairs", "outer")]}
    ]
    rows = {r["strategy"]: r for r in strategy_rows("grpo", records)}
    assert rows[MINORITY]["fraction"] == 0.75  # right, pairs, outer
    assert sum(rows[p]["fraction"] for p in PAIR_PLANS) == 0.5
    assert problem_shares(records).shape == (1, len(task.STRATEGIES) + 2)
    assert "minority-plan share" in markdown_table(list(rows.values()))


def _strings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    out += [
        "".join(v.value for v in n.values if isinstance(v, ast.Constant))
        for n in ast.walk(tree)
        if isinstance(n, ast.JoinedStr)
    ]
    return out


def test_no_output_of_the_lab_calls_a_plan_group_rare():
    """What the lab prints and writes (its strings) and what README and docs say use the two names only."""
    for name in ("lab.py", "strategies.py", "analysis.py", "dose_response.py"):
        said = [s for s in _strings(ROOT / "sage_unsloth" / "demo" / name) if re.search(r"\brare\b", s)]
        assert not said, (name, said)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\brare (?:\"pair\" )?plans?\b", text), page.name
