"""`sage-unsloth <stage> CONFIG [--key value ...]`: one entry point dispatching to each stage's main().

Each stage is also runnable as `python -m sage_unsloth.<stage>`. Stages are imported lazily so that
`sage-unsloth eval` never imports Unsloth (evaluation and training must not share a process), and the input of a
stage with a config is checked before its module is imported (sage_unsloth/config/schema.py: every bad value at
once, in about a second).
"""

from __future__ import annotations

import importlib
import sys

STAGES = {
    "sft": ("sage_unsloth.sft.run", "stage 1: LoRA SFT into the paper's format"),
    "rlvr": ("sage_unsloth.rlvr.run", "stage 2: GRPO-family RLVR with the SAGE shaped anchor"),
    "eval": ("sage_unsloth.eval.run", "stage 3: pass@k evaluation"),
    "regrade": ("sage_unsloth.eval.regrade", "stage 3 again: re-grade saved completions (no model, no GPU)"),
    "report": ("sage_unsloth.report.run", "stage 4: report against the paper's tables"),
    "sample": ("sage_unsloth.eval.sample", "read a checkpoint's completions, graded, for a few prompts"),
    "export": (
        "sage_unsloth.eval.export",
        "merge a stage's LoRA into its base model (GGUF on a GPU), push to the hub",
    ),
    "demo": ("sage_unsloth.demo.run", "the whole recipe offline on CPU on a synthetic task"),
    "doctor": (
        "sage_unsloth.doctor",
        "preflight: GPU, driver, pinned stack, memory, a 2-step SAGE self-test; --gpu NAME for a card you lack",
    ),
    "env": (
        "sage_unsloth.doctor.env_report",
        "versions of the pinned stack, CUDA and driver (paste it into a bug report)",
    ),
    "sweep": ("sage_unsloth.jobs.sweep", "RLVR configs x seeds, then eval and report, one job per free GPU"),
    "tiny-model": (
        "sage_unsloth.model.tiny",
        "a random tiny Qwen2 + tokenizer in DIR, offline, to try the stages",
    ),
}
VERSION_FLAGS = ("--version", "-V")


def _usage() -> str:
    lines = ["usage: sage-unsloth <stage> [args...]   (sage-unsloth --version)", "", "stages:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in STAGES.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # no stage: a usage error, as argparse's (exit 2), the help on stderr
        print(_usage(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in VERSION_FLAGS:
        from sage_unsloth import __version__

        print(f"sage-unsloth {__version__}")
        return 0
    stage, rest = argv[0], argv[1:]
    from sage_unsloth.config.args import ConfigError, suggestion

    if stage not in STAGES:
        hint = suggestion(stage, STAGES) or f"; choose one of {', '.join(STAGES)}"
        print(f"error: unknown stage {stage!r}{hint}", file=sys.stderr)
        return 2
    from sage_unsloth.config.schema import STAGE_TYPES, refuse_bad_input

    if stage in STAGE_TYPES and (code := refuse_bad_input(stage, rest)) is not None:
        return code  # every bad input, one line each, before torch/TRL are imported
    from sage_unsloth.runtime.interrupt import handle_sigterm, restore_sigterm

    previous = (
        handle_sigterm()
    )  # SIGTERM (SLURM's pre-emption, `timeout`) takes the Ctrl-C path: one line, 143
    module = importlib.import_module(STAGES[stage][0])
    try:
        return int(module.main(rest) or 0)
    except ConfigError as exc:  # bad input a stage did not report itself: one line, exit 2
        print(f"sage-unsloth {stage}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM in a stage without a line of its own: one line
        from sage_unsloth.runtime.interrupt import interrupted_stage

        return interrupted_stage(stage, rest, exc)
    finally:
        restore_sigterm(previous)


if __name__ == "__main__":
    sys.exit(main())
