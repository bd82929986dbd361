"""Stage 3 on the demo benchmark: ``python -m sage_unsloth.demo.eval_stage CONFIG [--key value ...]``.

The eval stage knows a fixed set of benchmarks (sage_unsloth.eval.benchmarks.BENCHMARKS). This entry
point adds ``demo`` (local file ``demo.jsonl`` under ``data_dir``, MATH-500 layout) to that registry in
this process, then runs the eval stage's own ``main``. Give it one checkpoint per call: with several,
the eval stage re-launches itself per checkpoint, and those child processes would not know ``demo``.
"""

from __future__ import annotations

import sys

from .data import EVAL_FILE

DEMO_BENCHMARK = "demo"


def register_demo_benchmark() -> None:
    from sage_unsloth.eval.benchmarks import BENCHMARKS, BenchmarkSpec

    BENCHMARKS.setdefault(DEMO_BENCHMARK, BenchmarkSpec(hub_id="(local only: python -m sage_unsloth.demo)",
                                                        split="test", local_file=EVAL_FILE))


def main(argv: list[str] | None = None) -> int:
    register_demo_benchmark()
    from sage_unsloth.eval.run import main as eval_main

    return eval_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
