"""Stage 4 report: `python -m sage_unsloth.report [CONFIG.yaml] [--results results] [--out results/report.md]
[--pairs "grpo_branch:grpo,..."] [--mapping map.yaml] [--training_runs 'outputs/*/*'] [--wandb_project P]`.

Reads results/<model>/<run>/{passk.csv, per_problem.csv, manifest.json} and the log_history.jsonl of each
evaluated RLVR folder, writes results/report.md and results/report/ (comparison/pairs/patterns/support/
training CSVs, pass@k and training-curve PNGs, manifest.json). See --help for all options.
"""

from __future__ import annotations

import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from sage_unsloth.report.stage import build_report, parse_args

    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args = parse_args(argv)
        build_report(args)
    except (ValueError, FileNotFoundError) as exc:  # bad input: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
