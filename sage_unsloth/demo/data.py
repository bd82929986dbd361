"""Seeded writers for the demo's data, in the layouts the kit's stages read from local files.

- SFT (stage 1, OpenMathReasoning-mini local JSONL): ``problem``, ``generated_solution`` (the working
  out only; the SFT stage wraps it in the kit format), ``expected_answer``; plus ``strategy``.
- RL prompts (stage 2, DAPO-Math-17k-Processed layout): ``prompt`` (the problem text), ``solution``
  (the gold answer string).
- Eval benchmark (stage 3, MATH-500 local layout): ``problem``, ``solution`` (a worked solution ending
  in ``\\boxed{gold}``), ``answer``, ``unique_id``; plus ``strategy_reference`` is not stored: the
  labeller needs only the completion.

The three problem sets are disjoint (one seeded shuffle of every problem, see
:func:`sage_unsloth.demo.task.split_problems`). Same arguments -> byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from ..manifest import atomic_write_text
from .task import WORKING, SumTask, gold_answer, problem_text, split_problems

SFT_FILE = "sft.jsonl"
RL_FILE = "rl.jsonl"
EVAL_FILE = "demo.jsonl"
SPEC_FILE = "demo_data.json"


@dataclass(frozen=True)
class DemoDataSpec:
    """Everything that determines the demo data (stored beside it as demo_data.json)."""

    seed: int = 0
    n_terms: int = 4
    low: int = 1
    high: int = 9
    n_eval: int = 200
    n_rl: int = 800
    n_sft: int = 4000           # SFT rows (problems are drawn from the SFT pool, with replacement)
    rare_fraction: float = 0.1  # share of SFT rows written with strategy B (pairing)

    @property
    def task(self) -> SumTask:
        return SumTask(n_terms=self.n_terms, low=self.low, high=self.high)


def sft_rows(spec: DemoDataSpec) -> list[dict]:
    """``n_sft`` rows; exactly round(rare_fraction * n_sft) of them use strategy B, at seeded positions."""
    if not 0.0 <= spec.rare_fraction <= 1.0:
        raise ValueError(f"rare_fraction={spec.rare_fraction}: must be in [0, 1]")
    pool = split_problems(spec.task, seed=spec.seed, n_eval=spec.n_eval, n_rl=spec.n_rl)["sft"]
    rng = random.Random(f"sft-{spec.seed}")
    n_rare = round(spec.rare_fraction * spec.n_sft)
    strategies = ["B"] * n_rare + ["A"] * (spec.n_sft - n_rare)
    rng.shuffle(strategies)
    rows = []
    for strategy in strategies:
        numbers = rng.choice(pool)
        rows.append({"problem": problem_text(numbers), "generated_solution": WORKING[strategy](numbers),
                     "expected_answer": gold_answer(numbers), "strategy": strategy})
    return rows


def rl_rows(spec: DemoDataSpec) -> list[dict]:
    problems = split_problems(spec.task, seed=spec.seed, n_eval=spec.n_eval, n_rl=spec.n_rl)["rl"]
    return [{"prompt": problem_text(x), "solution": gold_answer(x)} for x in problems]


def eval_rows(spec: DemoDataSpec) -> list[dict]:
    problems = split_problems(spec.task, seed=spec.seed, n_eval=spec.n_eval, n_rl=spec.n_rl)["eval"]
    return [{"problem": problem_text(x),
             "solution": WORKING["A"](x).replace("\n", ", ") + f", so the answer is $\\boxed{{{gold_answer(x)}}}$.",
             "answer": gold_answer(x), "unique_id": f"demo/{i:04d}"}
            for i, x in enumerate(problems)]


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def write_demo_data(out_dir: str | Path, spec: DemoDataSpec = DemoDataSpec()) -> dict[str, Path]:
    """Write sft.jsonl, rl.jsonl, demo.jsonl and demo_data.json (spec + sha256s) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"sft": (SFT_FILE, sft_rows(spec)), "rl": (RL_FILE, rl_rows(spec)), "eval": (EVAL_FILE, eval_rows(spec))}
    paths, digests = {}, {}
    for key, (name, rows) in files.items():
        text = _jsonl(rows)
        atomic_write_text(out / name, text)
        paths[key] = out / name
        digests[name] = {"rows": len(rows), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    atomic_write_text(out / SPEC_FILE, json.dumps({"spec": asdict(spec), "files": digests}, indent=2) + "\n")
    return paths
