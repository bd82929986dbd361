"""Stage 4 report: `python -m sage_unsloth.report [CONFIG.yaml] [--results results] [--out results/report.md]
[--pairs "grpo_branch:grpo,..."] [--mapping map.yaml] [--training_runs 'outputs/*/*'] [--wandb_project P]
[--from_wandb ENTITY/PROJECT|wandb/ [--wandb_group G]]`.

Reads results/<model>/<run>/{passk.csv, per_problem.csv, manifest.json} and the log_history.jsonl of each
evaluated RLVR folder, writes results/report.md and results/report/ (comparison/pairs/patterns/support/
training CSVs, pass@k and training-curve PNGs, manifest.json). See --help for all options.
"""

from __future__ import annotations

import logging
import sys


def dry_run(args, argv: list[str]) -> int:
    """The resolved config and what the report would read and write (no result is loaded, nothing written)."""
    from pathlib import Path

    from sage_unsloth.config import dry_run as dry
    from sage_unsloth.runtime.results import PASSK_FILE

    dry.show("report", dry.resolved_config("report", (args,), argv))
    if args.from_wandb:
        from sage_unsloth.report.stage import WANDB_RESULTS

        into = Path(args.results) / WANDB_RESULTS
        out = Path(args.out) if args.out else into / "report.md"
        dry.show_plan(
            {
                "source": f"W&B {args.from_wandb}"
                + (f", group {args.wandb_group}" if args.wandb_group else ""),
                "runs read into": into,
                "report": out,
                "tables and plots": out.with_suffix(""),
            }
        )
        return 0
    results = Path(args.results)
    if not results.is_dir():
        raise FileNotFoundError(f"results folder {results} not found: pass --results DIR")
    runs = sorted(str(p.parent.relative_to(results)) for p in results.glob(f"*/*/{PASSK_FILE}"))
    out = Path(args.out) if args.out else results / "report.md"
    dry.show_plan(
        {
            "runs": runs or "none yet (run the eval stage first)",
            "report": out,
            "tables and plots": out.with_suffix(""),
        }
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    from sage_unsloth.config.schema import refuse_bad_input

    argv = list(sys.argv[1:] if argv is None else argv)
    if (code := refuse_bad_input("report", argv)) is not None:  # every bad input at once, before the imports
        return code
    from sage_unsloth.report.stage import build_report, parse_args

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args = parse_args(argv)
        if args.dry_run:
            return dry_run(args, argv)
        build_report(args)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:  # bad input: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
