"""Stage 4's config: :class:`ReportArguments` (a YAML under configs/report/ plus CLI flags, parsed by TRL's
parser). Every field is checked in ``__post_init__`` (``validate()``), one line each, before any result is
read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from sage_unsloth.config.args import DryRunArgs
from sage_unsloth.config.field_rules import Limit, check_field_rules
from sage_unsloth.report import plots
from sage_unsloth.runtime import layout


@dataclass
class ReportArguments(DryRunArgs):
    # One field's own bounds, read by the pre-import check too (sage_unsloth/config/field_rules.py).
    FIELD_RULES: ClassVar[dict] = {
        "resamples": Limit(ge=100, note="bootstrap resamples"),
        "level": Limit(gt=0.5, lt=1, note="the confidence level"),
        "plot_width": Limit(ge=100, note="pixels"),
        "plot_height": Limit(ge=100, note="pixels"),
        "pattern_samples_per_problem": Limit(ge=1, note="null for all"),
    }

    results: str = field(default=layout.RESULTS, metadata={"help": "folder with <model>/<run>/passk.csv"})
    out: str | None = field(
        default=None,
        metadata={
            "help": "report path (default <results>/report.md); "
            "tables and PNGs go to the folder of the same stem"
        },
    )
    pairs: str | None = field(
        default=None,
        metadata={
            "help": "paired comparisons 'run_a:run_b,...' (A-B); default: "
            "the paper's method pairs, e.g. GRPO+Branch vs GRPO"
        },
    )
    mapping: str | None = field(
        default=None, metadata={"help": "YAML/JSON run -> paper {model, method} overrides"}
    )
    paper_dir: str | None = field(
        default=None,
        metadata={
            "help": "folder with published_*.csv (default: <results>/paper, else the kit's results/paper)"
        },
    )
    resamples: int = field(default=2000, metadata={"help": "bootstrap resamples"})
    seed: int = field(default=0, metadata={"help": "bootstrap seed"})
    level: float = field(default=0.95, metadata={"help": "confidence level"})
    completions: str | None = field(
        default=None,
        metadata={
            "help": "glob of completion files for the pattern analysis ({model}, {run} filled in per run; "
            "** recursive); default: the eval manifest's completions_dir, else "
            "outputs/{model}/eval/{run}/**/*.jsonl.gz"
        },
    )
    pattern_samples_per_problem: int | None = field(
        default=None, metadata={"help": "tag only completions with sample_idx below this (default: all)"}
    )
    wandb_project: str | None = field(default=None, metadata={"help": "log the report to this W&B project"})
    wandb_entity: str | None = field(default=None, metadata={"help": "W&B entity for --wandb_project"})
    from_wandb: str | None = field(
        default=None,
        metadata={
            "help": "build the report from W&B instead of --results' folders: ENTITY/PROJECT, or a folder of "
            "local runs (wandb/, offline-run-*) for runs never synced; the runs read are written to "
            "<results>/wandb/ and the report to <results>/wandb/report.md (unless --out)"
        },
    )
    wandb_group: str | None = field(
        default=None,
        metadata={
            "help": "W&B group: --from_wandb reads only its runs; the report's own run (--wandb_project) joins it"
        },
    )
    training_runs: str | None = field(
        default=None,
        metadata={
            "help": "glob of RLVR output folders whose training curves to plot besides the evaluated ones "
            "(each eval manifest's checkpoint), e.g. 'outputs/*/*'"
        },
    )
    support_reference: str | None = field(
        default=None,
        metadata={
            "help": "reference run of the support metrics (run folder or <model>/<run>); "
            "default: each model's run mapped to Base (sft / base)"
        },
    )
    plot_width: int = field(default=plots.DEFAULT_SIZE[0], metadata={"help": "PNG width in pixels"})
    plot_height: int = field(default=plots.DEFAULT_SIZE[1], metadata={"help": "PNG height in pixels"})

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        from sage_unsloth.report.tables import parse_pairs

        check_field_rules(self)  # resamples, level, plot size, pattern samples: the pre-import check's words
        if self.wandb_entity and not self.wandb_project:
            raise ValueError("wandb_entity is set without wandb_project: add --wandb_project NAME or drop it")
        if self.wandb_project:
            from sage_unsloth.config.input_checks import check_wandb_installed

            check_wandb_installed(f"wandb_project={self.wandb_project}")
        if self.wandb_group and not (self.wandb_project or self.from_wandb):
            raise ValueError(
                "wandb_group is set without from_wandb or wandb_project: add --from_wandb ENTITY/PROJECT (or "
                "--wandb_project NAME) or drop it"
            )
        if self.from_wandb:
            from sage_unsloth.report.wandb_read import source_kind

            source_kind(self.from_wandb)  # a folder here or ENTITY/PROJECT, else one line
        parse_pairs(self.pairs)  # "run_a:run_b,..." or a one-line error naming --pairs


def parse_args(argv: list[str]) -> ReportArguments:
    from sage_unsloth.config.args import parse_stage_args

    (args,), _ = parse_stage_args((ReportArguments,), argv, stage="report", configs_dir="configs/report/")
    return args
