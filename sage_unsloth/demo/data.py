"""Seeded writers for the demo's data, in the layouts the kit's stages read from local files.

- SFT (stage 1, OpenMathReasoning-mini local JSONL): ``problem``, ``generated_solution`` (the working
  out only; the SFT stage wraps it in the kit format), ``expected_answer``; plus ``strategy``.
- RL prompts (stage 2, DAPO-Math-17k-Processed layout): ``prompt`` (the problem text), ``solution``
  (the gold answer string).
- Eval benchmark (stage 3, MATH-500 local layout): ``problem``, ``solution`` (a worked solution ending
  in ``\\boxed{gold}``), ``answer``, ``unique_id``.

The three problem sets are disjoint (one seeded shuffle of every problem, see
:func:`sage_unsloth.demo.task.split_problems`). Same arguments -> byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..runtime.manifest import atomic_write_text
from .task import (
    COMMON,
    STRATEGIES,
    SumTask,
    gold_answer,
    plan_needs_gap,
    problem_text,
    split_problems,
    working,
)

SFT_FILE = "sft.jsonl"
RL_FILE = "rl.jsonl"
EVAL_FILE = "demo.jsonl"
SPEC_FILE = "demo_data.json"
# The SFT prior over the plans: one common running total, two rare ones and the two pair plans (the only
# ones that avoid the base model's gap, task.GAP_ONES_SUMS) rarest, 8% together, so that 64 samples of the
# SFT policy sometimes miss them on the gap problems and RL can lose or keep them (docs/lab.md, "The regime
# and the pilot that chose it": at 70/10/10/5/5 the SFT model solved every problem within 64 samples).
DEFAULT_MIX = (("left", 0.74), ("right", 0.09), ("pairs", 0.05), ("outer", 0.03), ("middle", 0.09))


@dataclass(frozen=True)
class DemoDataSpec:
    """Everything that determines the demo data (stored beside it as demo_data.json)."""

    seed: int = 0
    low: int = 5
    high: int = 9
    n_eval: int = 100
    n_rl: int = 200
    n_sft: int = 4000  # SFT rows (problems drawn from the SFT pool, with replacement)
    mix: tuple[tuple[str, float], ...] = field(default=DEFAULT_MIX)  # SFT share of each plan

    @property
    def task(self) -> SumTask:
        return SumTask(low=self.low, high=self.high)

    def __post_init__(self):
        names = [name for name, _ in self.mix]
        if sorted(names) != sorted(STRATEGIES):
            raise ValueError(f"mix: name every plan of {STRATEGIES} once, got {names}")
        if any(share < 0 for _, share in self.mix) or abs(sum(s for _, s in self.mix) - 1.0) > 1e-9:
            raise ValueError(f"mix: shares must be >= 0 and add up to 1, got {dict(self.mix)}")

    def splits(self) -> dict[str, list[tuple[int, ...]]]:
        return split_problems(self.task, seed=self.seed, n_eval=self.n_eval, n_rl=self.n_rl)


def sft_strategies(spec: DemoDataSpec) -> list[str]:
    """The plan of each SFT row: exact counts (largest remainder) at seeded positions."""
    exact = {name: share * spec.n_sft for name, share in spec.mix}
    counts = {name: int(value) for name, value in exact.items()}
    by_remainder = sorted(exact, key=lambda n: (-(exact[n] - counts[n]), n != COMMON, n))
    for name in by_remainder[: spec.n_sft - sum(counts.values())]:
        counts[name] += 1
    strategies = [name for name, _ in spec.mix for _ in range(counts[name])]
    random.Random(f"sft-plans-{spec.seed}").shuffle(strategies)
    return strategies


def sft_rows(spec: DemoDataSpec) -> list[dict]:
    """Each row's plan from :func:`sft_strategies`; its problem drawn from the SFT pool among those the plan
    solves without the base model's gap (task.GAP_ONES_SUMS), so SFT never teaches the missing additions."""
    pool = spec.splits()["sft"]
    usable = {s: [x for x in pool if not plan_needs_gap(s, x)] for s in STRATEGIES}
    rng = random.Random(f"sft-{spec.seed}")
    rows = []
    for strategy in sft_strategies(spec):
        numbers = rng.choice(usable[strategy])
        rows.append(
            {
                "problem": problem_text(numbers),
                "generated_solution": working(strategy, numbers),
                "expected_answer": gold_answer(numbers),
                "strategy": strategy,
            }
        )
    return rows


def rl_rows(spec: DemoDataSpec) -> list[dict]:
    return [{"prompt": problem_text(x), "solution": gold_answer(x)} for x in spec.splits()["rl"]]


def eval_rows(spec: DemoDataSpec) -> list[dict]:
    return [
        {
            "problem": problem_text(x),
            "solution": working(COMMON, x).replace("\n", ", ")
            + f", so the answer is $\\boxed{{{gold_answer(x)}}}$.",
            "answer": gold_answer(x),
            "unique_id": f"demo/{i:04d}",
        }
        for i, x in enumerate(spec.splits()["eval"])
    ]


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def write_demo_data(out_dir: str | Path, spec: DemoDataSpec = DemoDataSpec()) -> dict[str, Path]:
    """Write sft.jsonl, rl.jsonl, demo.jsonl and demo_data.json (spec + sha256s) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "sft": (SFT_FILE, sft_rows(spec)),
        "rl": (RL_FILE, rl_rows(spec)),
        "eval": (EVAL_FILE, eval_rows(spec)),
    }
    paths, digests = {}, {}
    for key, (name, rows) in files.items():
        text = _jsonl(rows)
        atomic_write_text(out / name, text)
        paths[key] = out / name
        digests[name] = {"rows": len(rows), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    atomic_write_text(out / SPEC_FILE, json.dumps({"spec": asdict(spec), "files": digests}, indent=2) + "\n")
    return paths


def spec_from_json(text: str) -> DemoDataSpec:
    """A DemoDataSpec from its asdict() JSON (the runner passes it on the command line)."""
    fields = json.loads(text)
    if "mix" in fields:
        fields["mix"] = tuple((str(name), float(share)) for name, share in fields["mix"])
    return DemoDataSpec(**fields)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m sage_unsloth.demo.data", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out", required=True, help="folder for sft.jsonl, rl.jsonl, demo.jsonl, demo_data.json"
    )
    parser.add_argument("--spec", default="{}", help="DemoDataSpec fields as JSON (default: the defaults)")
    args = parser.parse_args(argv)
    paths = write_demo_data(args.out, spec_from_json(args.spec))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
