"""Shared fixtures: the tiny offline model is built once per test session."""

import os

os.environ.setdefault("UNSLOTH_SKIP_TORCHVISION_CHECK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SAGE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from sage_unsloth.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "math500.jsonl").is_file():
        pytest.fail(f"shared benchmark data not found at {SHARED_DATA}; set SAGE_SHARED_DATA")
    return SHARED_DATA
