"""SageModelConfig: TRL's ModelConfig whose ``__post_init__`` checks the model before anything loads.

A ``model_name_or_path`` that is neither an existing folder nor a hub id ``org/name`` (or, with
``HF_HUB_OFFLINE`` set, a hub id missing from the local cache) is one :class:`ConfigError` line instead
of the loader's OSError traceback. Importing this module imports TRL: a process that trains with Unsloth
imports Unsloth first.
"""

from __future__ import annotations

from dataclasses import dataclass

from trl import ModelConfig

from sage_unsloth.config_args import check_model_name_or_path


@dataclass
class SageModelConfig(ModelConfig):
    def __post_init__(self):
        super().__post_init__()
        check_model_name_or_path(self.model_name_or_path, revision=self.model_revision)
