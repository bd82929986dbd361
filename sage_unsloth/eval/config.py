"""Stage 3's config: :class:`EvalConfig` (a YAML under configs/eval/ plus CLI flags, parsed by TRL's parser) and
its validation, every error one line before any model or dataset loads."""

from __future__ import annotations

from dataclasses import dataclass, field

from sage_unsloth import grading, layout
from sage_unsloth.eval.benchmarks import (
    DEFAULT_BENCHMARKS,
    check_benchmark_names,
    check_source,
    register_local_benchmarks,
)
from sage_unsloth.eval.passk import check_ks, default_ks
from sage_unsloth.eval.shard import parse_shard
from sage_unsloth.prompts import EVAL_USER_TEMPLATE, SOLUTION_END


@dataclass
class EvalConfig:
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
    temperature: float = 0.6
    top_p: float = 0.95
    min_p: float = 0.0
    max_tokens: int = field(
        default=3072, metadata={"help": "new tokens per sample (Qwen2.5-Math has 4096 context)"}
    )
    max_model_len: int = 4096
    stop: list[str] = field(default_factory=lambda: [SOLUTION_END])
    user_template: str = field(
        default=EVAL_USER_TEMPLATE, metadata={"help": "user turn; {problem} is replaced"}
    )
    backend: str = field(default="vllm", metadata={"help": "vllm | hf"})
    seed: int = 0
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
    results_dir: str = layout.RESULTS
    outputs_dir: str = layout.OUTPUTS
    run_name: str | None = field(
        default=None, metadata={"help": "results/<model>/<run_name> (one checkpoint)"}
    )
    limit: int | None = field(default=None, metadata={"help": "max problems per benchmark (smoke runs)"})
    problems_per_batch: int = field(default=64, metadata={"help": "problems per engine call = resume unit"})
    shard: str | None = field(
        default=None,
        metadata={
            "help": "i/N: sample only every N-th chunk (one process per GPU); CSVs come once all chunks exist"
        },
    )
    grading_workers: int | None = None
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
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    enforce_eager: bool = False
    trust_remote_code: bool = False


def parse_args(argv: list[str]) -> EvalConfig:
    from sage_unsloth.config_args import parse_stage_args

    (cfg,), _ = parse_stage_args((EvalConfig,), argv, stage="eval", configs_dir="configs/eval/")
    return cfg


def validate(cfg: EvalConfig) -> list[int]:
    """Every config error as one clear line, before any model or dataset loads. Returns the k list."""
    if not cfg.checkpoints:
        raise ValueError("`checkpoints` is empty: list hub ids or stage output folders to evaluate")
    register_local_benchmarks(cfg.local_benchmarks)
    check_benchmark_names(cfg.benchmarks)
    check_source(cfg.source, cfg.data_dir)
    if cfg.n < 1:
        raise ValueError(f"n={cfg.n}: need at least one sample per problem")
    if cfg.backend not in ("vllm", "hf"):
        raise ValueError(f"backend={cfg.backend!r}: choose 'vllm' or 'hf'")
    if cfg.run_name and len(cfg.checkpoints) > 1:
        raise ValueError("run_name names one checkpoint's results; drop it or evaluate one checkpoint")
    if cfg.problems_per_batch < 1:
        raise ValueError("problems_per_batch must be >= 1")
    if "{problem}" not in cfg.user_template:
        raise ValueError("user_template must contain {problem}")
    if not (0 < cfg.grading_timeout_s <= cfg.grading_retry_timeout_s):
        raise ValueError(
            f"grading_timeout_s={cfg.grading_timeout_s}, grading_retry_timeout_s="
            f"{cfg.grading_retry_timeout_s}: need 0 < grading_timeout_s <= grading_retry_timeout_s"
        )
    parse_shard(cfg.shard)
    return check_ks(cfg.ks, cfg.n) if cfg.ks else default_ks(cfg.n)
