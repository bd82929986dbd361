"""Stage folders as the GPU path writes them, for tests that read them without loading a model."""

from __future__ import annotations

import json
from pathlib import Path


def write_adapter(folder: Path, base: str, rank: int = 8) -> Path:
    """An adapter folder as PEFT writes it (config only: nothing here loads weights), with a tokenizer file."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "base_model_name_or_path": base}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


def write_sft_folder(folder: Path, *, recorded: str, base: str, rank: int = 8) -> Path:
    """An SFT output folder: an adapter recording ``recorded`` as its base, a manifest naming ``base``."""
    from sage_unsloth.runtime.manifest import write_manifest

    write_adapter(folder, recorded, rank)
    write_manifest(folder, stage="sft", config={}, base_model=base, adapter=True)
    return folder
