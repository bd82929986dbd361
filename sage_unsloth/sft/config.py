"""SageSFTConfig: TRL's SFTConfig plus the kit's stage-1 fields, with the official recipe as defaults.

Parsed together with ``trl.ModelConfig`` by ``trl.TrlParser`` (YAML, then CLI overrides); see
:func:`sage_unsloth.sft.run.parse_args`. Importing this module imports TRL, so a process that trains with
Unsloth imports Unsloth first (``sage_unsloth.sft.run.main`` does that before importing this).

Defaults are the official SFT recipe (2 epochs, lr 2e-4, batch 1, 5 warmup steps, linear schedule, weight
decay 0.01, adamw_8bit, seed 3407); the YAML configs pin them again. Loss on assistant tokens only
(TRL's ``assistant_only_loss`` with the ``{% generation %}`` markers of the kit's chat template).
``max_length`` is derived from ``max_seq_length`` (one knob for the data filter, the loader and TRL).
Without a GPU: 8-bit optimizers fall back to adamw_torch and bf16/fp16 to float32, each with a logged notice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from trl import SFTConfig

from ..config.args import ConfigError, check_hub_model_cached, check_training_fields
from ..config.field_rules import TRAINING_RULES, Limit, Names
from ..config.training_cli import StageRunArgs
from ..model.loading import BACKENDS, model_short_name
from ..runtime import layout
from ..runtime.backend import cuda_available
from ..runtime.checkpoints import choose_checkpoint
from ..runtime.manifest import MANIFEST_NAME

logger = logging.getLogger(__name__)


@dataclass
class SageSFTConfig(StageRunArgs, SFTConfig):
    # One field's own bounds and names, read by the pre-import check too (sage_unsloth/config/field_rules.py).
    FIELD_RULES: ClassVar[dict] = {
        **TRAINING_RULES,
        "backend": Names(BACKENDS),
        "max_seq_length": Limit(gt=0, note="a token count"),
        "max_length_fraction": Limit(gt=0, le=1, note="official: 0.5"),
        "dataset_max_rows": Limit(gt=0),
    }

    # --- kit fields (resume, restart, unsloth_without_gpu: StageRunArgs, shared with stage 2) ------------
    backend: str = field(
        default="unsloth", metadata={"help": "unsloth (FastLanguageModel) or trl (transformers+peft)"}
    )
    dataset_name: str | None = field(
        default="unsloth/OpenMathReasoning-mini",
        metadata={"help": "Hub dataset id (ignored when dataset_path is set)"},
    )
    dataset_split: str = field(default="cot", metadata={"help": "Split of dataset_name"})
    dataset_path: str | None = field(
        default=None, metadata={"help": "Local JSONL/parquet; overrides dataset_name"}
    )
    dataset_max_rows: int | None = field(default=None, metadata={"help": "Use only the first N raw rows"})
    numeric_answers_only: bool = field(
        default=True, metadata={"help": "Keep rows with numeric expected_answer"}
    )
    strip_think_tags: bool = field(default=True, metadata={"help": "Remove <think>/</think> from solutions"})
    max_length_fraction: float = field(
        default=0.5,
        metadata={"help": "Drop rows longer than this fraction of max_seq_length tokens (official: 0.5)"},
    )
    max_seq_length: int = field(
        default=2048, metadata={"help": "Model context for training; sets max_length"}
    )
    output_root: str = field(
        default=layout.OUTPUTS,
        metadata={"help": "Root of outputs/<model_short_name>/sft (used when output_dir is not given)"},
    )
    model_short_name: str | None = field(
        default=None,
        metadata={"help": "Folder name for the model (default: derived from model_name_or_path)"},
    )
    save_merged: bool = field(
        default=False, metadata={"help": "Also write a merged 16-bit model to <out>/merged"}
    )
    # --- official recipe as defaults (the YAML configs pin them again) ----------------------------------
    learning_rate: float = field(default=2e-4, metadata={"help": "Official SFT: 2e-4"})
    num_train_epochs: float = field(default=2.0, metadata={"help": "Official SFT: 2"})
    per_device_train_batch_size: int = field(default=1, metadata={"help": "Official SFT: 1"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Official SFT: 1"})
    warmup_steps: float = field(default=5, metadata={"help": "Official SFT: 5"})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "Official SFT: linear"})
    weight_decay: float = field(default=0.01, metadata={"help": "Official SFT: 0.01"})
    optim: str = field(
        default="adamw_8bit", metadata={"help": "Official SFT: adamw_8bit (adamw_torch on CPU)"}
    )
    seed: int = field(default=3407, metadata={"help": "Official: 3407"})
    logging_steps: float = field(default=1, metadata={"help": "Log every N steps"})
    report_to: None | str | list[str] = field(default="none", metadata={"help": "none, wandb, ..."})
    assistant_only_loss: bool = field(default=True, metadata={"help": "Loss on assistant tokens only"})

    def __post_init__(self):
        self.output_dir_given = self.output_dir is not None
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend {self.backend!r} is unknown: use one of {', '.join(BACKENDS)}")
        if self.max_seq_length is None or self.max_seq_length <= 0:
            raise ConfigError(f"max_seq_length {self.max_seq_length}: must be a positive token count")
        check_training_fields(self, learning_rate_hint="official SFT: 2e-4")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ConfigError(
                f"max_steps={self.max_steps}, num_train_epochs={self.num_train_epochs}: nothing to train; "
                "set max_steps > 0 or num_train_epochs > 0"
            )
        self.max_length = self.max_seq_length
        if not cuda_available():
            if "8bit" in str(getattr(self.optim, "value", self.optim)):
                logger.warning("optim %s needs a GPU (bitsandbytes): using adamw_torch on CPU", self.optim)
                self.optim = "adamw_torch"
            if self.bf16 or self.fp16:
                logger.warning("bf16/fp16 mixed precision needs a GPU here: training in float32 on CPU")
            self.bf16, self.fp16 = False, False
            self.dataloader_pin_memory = False
        super().__post_init__()

    def validate(self, model_args) -> None:
        """One-line errors naming the field and the fix, raised before any model or data loads."""
        if not model_args.model_name_or_path:
            raise ValueError("model_name_or_path is not set: set it in the YAML or pass --model_name_or_path")
        if self.model_short_name is not None:  # a folder of output_root: one name, never a path
            layout.check_name(self.model_short_name, "model_short_name", example="qwen2.5-math-7b")
        check_hub_model_cached(model_args.model_name_or_path, revision=model_args.model_revision)
        local = Path(model_args.model_name_or_path).expanduser()
        if local.is_dir():
            # Recorded in the manifest and the adapter's config, which stages 2 and 3 read from any working
            # directory: a relative path would only resolve from the folder stage 1 ran in.
            model_args.model_name_or_path = str(local.resolve())
        from ..config.input_checks import check_data_file, check_wandb

        check_wandb(self.report_to)
        if self.dataset_path:
            if not Path(self.dataset_path).is_file():
                raise FileNotFoundError(
                    f"dataset_path {self.dataset_path} does not exist: fix it or unset it"
                )
            from .data import row_problem

            # unreadable, empty, truncated, or a row without its fields: one line naming the line
            check_data_file(self.dataset_path, row_problem=row_problem)
        elif not self.dataset_name:
            raise ValueError("no dataset: set dataset_name (hub id) or dataset_path (local JSONL/parquet)")
        if not 0 < self.max_length_fraction <= 1:
            raise ValueError(
                f"max_length_fraction {self.max_length_fraction}: must be in (0, 1] (official 0.5)"
            )
        if self.dataset_max_rows is not None and self.dataset_max_rows <= 0:
            raise ValueError(f"dataset_max_rows {self.dataset_max_rows}: must be positive, or unset it")
        if not self.assistant_only_loss:
            logger.warning("assistant_only_loss is false: the loss also covers the system prompt and problem")
        if self.packing or self.padding_free:
            raise ValueError(
                "packing/padding_free: not supported with assistant_only_loss here; set them false"
            )
        if model_args.load_in_8bit:
            raise ValueError("load_in_8bit is not supported: use load_in_4bit (GPU) or 16-bit weights")

    def resolve_output_dir(self, model_args) -> Path:
        """outputs/<model_short_name>/sft unless output_dir was given; sets and returns it (and a W&B run_name)."""
        short = self.model_short_name or model_short_name(model_args.model_name_or_path)
        if not self.output_dir_given:
            self.output_dir = str(layout.sft_dir(self.output_root, short))
        if not self.run_name or self.run_name == self.output_dir:
            self.run_name = f"{short}/{layout.SFT_RUN}"
        return Path(self.output_dir)

    def resume_checkpoint(self) -> str | None:
        """The checkpoint to resume from, or None to start fresh; a clear error instead of overwriting a run
        (the rule, complete checkpoints only, is sage_unsloth/runtime/checkpoints.py's, shared with stage 2)."""
        out = Path(self.output_dir)
        if not self.resume and (out / MANIFEST_NAME).is_file():
            raise FileExistsError(
                f"output_dir {out} already holds a finished SFT run: choose another output_dir or remove it"
            )
        last = choose_checkpoint(out, resume=self.resume, restart=self.restart, resume_flag="--resume true")
        if self.resume and last is None:
            logger.warning("resume: no checkpoint in %s, starting from scratch", out)
        return str(last) if last is not None else None
