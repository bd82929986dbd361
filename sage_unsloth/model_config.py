"""SageModelConfig: TRL's ModelConfig whose ``__post_init__`` checks the model before anything loads.

A ``model_name_or_path`` that is neither an existing folder nor a hub id ``org/name`` is one
:class:`ConfigError` line instead of the loader's OSError traceback (a hub id missing from the local
cache under ``HF_HUB_OFFLINE`` is refused when the run is planned: ``check_hub_model_cached``).
Importing this module imports TRL: a process that trains with Unsloth imports Unsloth first.
"""

from __future__ import annotations

from dataclasses import dataclass

from trl import ModelConfig

from sage_unsloth.config_args import check_model_name_or_path


@dataclass
class SageModelConfig(ModelConfig):
    def __post_init__(self):
        super().__post_init__()
        check_model_name_or_path(self.model_name_or_path)
