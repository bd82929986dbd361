"""SageModelConfig: TRL's ModelConfig whose ``__post_init__`` checks the model before anything loads.

A ``model_name_or_path`` that is neither an existing folder nor a hub id ``org/name``, or a LoRA rank,
alpha or dropout out of range (PEFT refuses those only after the model has loaded), is one
:class:`ConfigError` line (a hub id missing from the local cache under ``HF_HUB_OFFLINE`` is refused when
the run is planned: ``check_hub_model_cached``).
Importing this module imports TRL: a process that trains with Unsloth imports Unsloth first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trl import ModelConfig

from sage_unsloth.config.args import ConfigError, check_model_name_or_path
from sage_unsloth.config.field_rules import Limit


@dataclass
class SageModelConfig(ModelConfig):
    FIELD_RULES: ClassVar[dict] = {
        "lora_r": Limit(ge=1, note="the LoRA rank"),
        "lora_alpha": Limit(gt=0),
        "lora_dropout": Limit(ge=0, lt=1),
    }

    def __post_init__(self):
        super().__post_init__()
        check_model_name_or_path(self.model_name_or_path)
        # PEFT refuses these only when the adapter is built, after the model has loaded (a long traceback)
        if self.lora_r is None or self.lora_r < 1:
            raise ConfigError(f"lora_r={self.lora_r} must be >= 1 (the LoRA rank): e.g. lora_r: 8")
        if self.lora_alpha is None or not self.lora_alpha > 0:
            raise ConfigError(f"lora_alpha={self.lora_alpha} must be > 0: e.g. lora_alpha: 16 (2 x lora_r)")
        if self.lora_dropout is None or not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout={self.lora_dropout} must be in [0, 1): e.g. lora_dropout: 0")
