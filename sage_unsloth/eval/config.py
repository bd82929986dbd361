"""Stage 3's config: :class:`EvalConfig` (a YAML under configs/eval/ plus CLI flags, parsed by TRL's parser).

Every field is checked in ``__post_init__``, as TRL's configs do, so a bad value fails where the config is
built (one line naming the field, before any model or dataset loads). :func:`validate` adds what only a run
needs: at least one checkpoint (the notebook configs leave ``checkpoints`` to the command line) and
benchmarks that exist once the run's ``local_benchmarks`` files are added."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from sage_unsloth import grading
from sage_unsloth.config.args import DryRunArgs
from sage_unsloth.config.field_rules import Limit, Names, check_field_rules
from sage_unsloth.data.prompts import EVAL_USER_TEMPLATE, SOLUTION_END
from sage_unsloth.eval.backend_choice import AUTO, BACKENDS
from sage_unsloth.eval.benchmarks import (
    BENCHMARKS,
    DEFAULT_BENCHMARKS,
    SOURCES,
    check_benchmark_names,
    check_source,
    with_local_benchmarks,
)
from sage_unsloth.eval.passk import check_ks, default_ks
from sage_unsloth.eval.shard import parse_shard
from sage_unsloth.runtime import layout


@dataclass
class EvalConfig(DryRunArgs):
    # One field's own bounds and names, read by the pre-import check too (sage_unsloth/config/field_rules.py).
    FIELD_RULES: ClassVar[dict] = {
        "benchmarks": Names(tuple(BENCHMARKS), also_from="local_benchmarks"),
        "backend": Names((AUTO, *BACKENDS)),
        "source": Names(SOURCES),
        "n": Limit(ge=1, note="samples per problem"),
        "ks": Limit(ge=1),
        "temperature": Limit(ge=0, finite=False, note="0 = greedy"),
        "top_p": Limit(gt=0, le=1),
        "min_p": Limit(ge=0, lt=1, note="0 = off"),
        "max_tokens": Limit(ge=1),
        "limit": Limit(ge=1, note="problems per benchmark; null for all"),
        "problems_per_batch": Limit(ge=1),
        "grading_workers": Limit(ge=1, note="null for one per core"),
        "grading_timeout_s": Limit(gt=0),
        "grading_retry_timeout_s": Limit(gt=0, finite=False),
        "gpu_memory_utilization": Limit(gt=0, le=1, note="a fraction"),
        "report_to": Names(("none", "wandb")),
    }

    checkpoints: list[str] = field(
        default_factory=list,
        metadata={
            "help": "hub ids, model folders, or stage output folders (outputs/<model>/sft, outputs/<model>/<variant>)"
        },
    )
    benchmarks: list[str] = field(
        default_factory=lambda: list(DEFAULT_BENCHMARKS),
        metadata={
            "help": f"any of {list(DEFAULT_BENCHMARKS)} or kk_logicrl / kk_official (kk = the variant of the source)"
        },
    )
    n: int = field(default=256, metadata={"help": "samples per problem"})
    ks: list[int] = field(default_factory=list, metadata={"help": "pass@k values; empty = 1, 2, 4, ..., n"})
    # The official evaluator used 0.3 / 0.95; pass@k at large k is usually measured hotter. 0.6 / 0.95 is
    # the common choice for pass@k curves (DeepSeek-R1, simpleRL); the paper's setting is unknown.
    temperature: float = field(default=0.6, metadata={"help": "sampling temperature (0 = greedy)"})
    top_p: float = field(default=0.95, metadata={"help": "nucleus sampling mass, in (0, 1]"})
    min_p: float = field(default=0.0, metadata={"help": "min-p sampling threshold, in [0, 1) (0 = off)"})
    max_tokens: int = field(
        default=3072, metadata={"help": "new tokens per sample (Qwen2.5-Math has 4096 context)"}
    )
    max_model_len: int = field(default=4096, metadata={"help": "prompt + completion tokens per sequence"})
    stop: list[str] = field(
        default_factory=lambda: [SOLUTION_END],
        metadata={"help": "strings that end a sample (cut off, as vLLM does)"},
    )
    user_template: str = field(
        default=EVAL_USER_TEMPLATE, metadata={"help": "user turn; {problem} is replaced"}
    )
    backend: str = field(
        default="auto",
        metadata={
            "help": "auto | vllm | hf; auto: vLLM on a GPU, else the faster of the two for this job "
            "(the rule: sage_unsloth/eval/backend_choice.py), decided at run time and recorded in the manifest"
        },
    )
    seed: int = field(default=0, metadata={"help": "sampling seed; each problem's seed derives from it"})
    source: str = field(
        default="bundled",
        metadata={
            "help": "benchmark rows: 'bundled' (the kit's checked files, offline), 'local' (data_dir), 'hub'"
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "folder with benchmark JSONL files named like the bundled ones (implies source=local)"
        },
    )
    local_benchmarks: list[str] = field(
        default_factory=list,
        metadata={
            "help": "extra benchmarks as name=path.jsonl (MATH-500 layout: problem, answer); list them in benchmarks"
        },
    )
    results_dir: str = field(
        default=layout.RESULTS, metadata={"help": "CSVs go to <results_dir>/<model>/<run>/"}
    )
    outputs_dir: str = field(
        default=layout.OUTPUTS, metadata={"help": "completions go to <outputs_dir>/<model>/eval/<run>/"}
    )
    run_name: str | None = field(
        default=None, metadata={"help": "<results_dir>/<model>/<run_name> (one checkpoint)"}
    )
    limit: int | None = field(default=None, metadata={"help": "max problems per benchmark (smoke runs)"})
    problems_per_batch: int = field(default=64, metadata={"help": "problems per engine call = resume unit"})
    shard: str | None = field(
        default=None,
        metadata={
            "help": "i/N: sample only every N-th chunk (one process per GPU); CSVs come once all chunks exist"
        },
    )
    grading_workers: int | None = field(
        default=None,
        metadata={"help": "grading processes (default: one per core); verdicts do not depend on it"},
    )
    grading_timeout_s: float = field(
        default=grading.DEFAULT_TIMEOUT_S,
        metadata={
            "help": "CPU seconds per (answer, gold) pair; a pair over it is retried at the end of the run"
        },
    )
    grading_retry_timeout_s: float = field(
        default=grading.RETRY_TIMEOUT_S,
        metadata={
            "help": "CPU seconds per pair in the end-of-run retry; pairs over it are counted as unresolved"
        },
    )
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "vLLM: share of GPU memory to use"})
    dtype: str = field(default="auto", metadata={"help": "model dtype: auto, bfloat16, float16, float32"})
    enforce_eager: bool = field(
        default=False, metadata={"help": "vLLM: no CUDA graphs (slower, less memory)"}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "run the model repo's own code (only for a repo you trust)"}
    )
    report_to: str = field(
        default="none",
        metadata={
            "help": "none | wandb: log each checkpoint's pass@k into the W&B run that trained it (its manifest "
            "names it), else into a new run (job_type eval) of the model's group"
        },
    )
    wandb_project: str | None = field(
        default=None,
        metadata={"help": "W&B project of a new eval run (default: WANDB_PROJECT, else sage-unsloth)"},
    )
    wandb_entity: str | None = field(
        default=None, metadata={"help": "W&B entity of a new eval run (default: WANDB_ENTITY, else yours)"}
    )
    wandb_group: str | None = field(
        default=None,
        metadata={
            "help": "W&B group of a new eval run (default: WANDB_RUN_GROUP, else the model's short name)"
        },
    )

    def __post_init__(self):
        check_fields(self)


def parse_args(argv: list[str]) -> EvalConfig:
    from sage_unsloth.config.args import parse_stage_args

    (cfg,), _ = parse_stage_args((EvalConfig,), argv, stage="eval", configs_dir="configs/eval/")
    return cfg


def validate(cfg: EvalConfig) -> list[int]:
    """What a run needs beyond valid fields (checked when the config was built): a checkpoint, and benchmarks
    that exist once ``local_benchmarks`` are added (the demo's config names one its runner adds).
    Returns the k list (``ks``, else 1, 2, 4, ..., n)."""
    if not cfg.checkpoints:
        raise ValueError("`checkpoints` is empty: list hub ids or stage output folders to evaluate")
    check_benchmark_names(cfg.benchmarks, known_benchmarks(cfg))
    return check_ks(cfg.ks, cfg.n) if cfg.ks else default_ks(cfg.n)


def known_benchmarks(cfg: EvalConfig):
    """The benchmarks this run knows by name: the built-ins and its ``local_benchmarks`` (a view for the run; the
    module's registry is never changed)."""
    return with_local_benchmarks(cfg.local_benchmarks)


def check_fields(cfg: EvalConfig) -> None:
    """Every field's own check, one line each (called by ``EvalConfig.__post_init__``): its FIELD_RULES (the
    pre-import check's words), then what needs two fields."""
    # benchmarks: validate() checks the names once the run's local_benchmarks are added (a config may name one
    # the command line adds, as the demo's does); the pre-import check reads both
    check_field_rules(cfg, later=("benchmarks",))
    check_source(cfg.source, cfg.data_dir)
    if cfg.ks:
        check_ks(cfg.ks, cfg.n)
    if cfg.max_tokens >= cfg.max_model_len:
        raise ValueError(
            f"max_tokens={cfg.max_tokens}, max_model_len={cfg.max_model_len}: need 1 <= max_tokens < "
            "max_model_len (the prompt needs room too)"
        )
    if cfg.run_name is not None:
        layout.check_name(cfg.run_name, "run_name", example="grpo_branch")
    if cfg.run_name and len(cfg.checkpoints) > 1:
        raise ValueError("run_name names one checkpoint's results; drop it or evaluate one checkpoint")
    if "{problem}" not in cfg.user_template:
        raise ValueError("user_template must contain {problem}")
    if cfg.grading_timeout_s > cfg.grading_retry_timeout_s:
        raise ValueError(
            f"grading_timeout_s={cfg.grading_timeout_s}, grading_retry_timeout_s="
            f"{cfg.grading_retry_timeout_s}: need 0 < grading_timeout_s <= grading_retry_timeout_s"
        )
    parse_shard(cfg.shard)
    if cfg.report_to != "wandb" and (cfg.wandb_project or cfg.wandb_entity or cfg.wandb_group):
        raise ValueError(
            "wandb_project / wandb_entity / wandb_group are set without report_to=wandb: add --report_to wandb "
            "or drop them"
        )
