"""``sage-unsloth export``: no non-finite weight leaves the kit, and the model card names the base model's hub id,
never a local path (docs/stages.md, "Export").

- an adapter holding one non-finite value is refused in one line before any model loads (main 0298207 merged it
  and exited 0);
- a merge whose weights overflow (an adapter's product beyond float16) is refused in one line, nothing is left
  under --out or beside it (main wrote the merged model with inf weights, exit 0);
- the card and the manifest copy hold no absolute local path, and a base read from the Hugging Face cache is
  named by its hub id (main embedded the base model's absolute path).
"""

import json
import re
import shutil
from pathlib import Path

import pytest

from sage_unsloth import cli
from sage_unsloth.eval import export

ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:tmp|home|root|Users|var|work|private)/")


def _adapter_tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def _save_adapter(folder: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


def test_an_adapter_with_a_non_finite_value_is_refused_before_loading(sft_dir, tmp_path, monkeypatch, capsys):
    stage = tmp_path / "stage"
    shutil.copytree(sft_dir, stage)
    tensors = _adapter_tensors(stage)
    name = min(n for n in tensors if "lora_B" in n)
    tensors[name][0, 0] = float("nan")
    _save_adapter(stage, tensors)
    from sage_unsloth.model import loading as models

    monkeypatch.setattr(models, "merge_lora_into_base", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "merged"
    assert cli.main(["export", str(stage), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: "), err
    assert "non-finite" in err and name in err and "nothing was exported" in err, err
    assert not out.exists() and not list(tmp_path.glob(".*exporting"))


def test_a_merge_that_overflows_is_refused_and_leaves_nothing(sft_dir, tmp_path, capsys):
    """Every factor is finite in the adapter; their product (1e3 * 1e3 * r * alpha / r) is beyond float16."""
    stage = tmp_path / "stage"
    shutil.copytree(sft_dir, stage)
    tensors = _adapter_tensors(stage)
    for key, value in tensors.items():
        if "lora_" in key:
            value.fill_(1e3)
    _save_adapter(stage, tensors)
    out = tmp_path / "merged"
    assert cli.main(["export", str(stage), "--out", str(out), "--dtype", "float16"]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    line = err.splitlines()[-1]  # after the library's loading bars: one line
    assert line.startswith("error: the merged model") and "non-finite" in line, line
    assert "--dtype float32" in line and "nothing was written" in line, line  # the fix, and what is kept
    assert not out.exists() and not list(tmp_path.glob(".*exporting"))


def test_the_card_names_no_local_path(sft_dir, tmp_path):
    out = tmp_path / "merged"
    assert cli.main(["export", str(sft_dir), "--out", str(out)]) == 0
    for name in (export.CARD, export.MANIFEST_COPY):
        text = (out / name).read_text()
        assert not ABSOLUTE_PATH.search(text), (name, ABSOLUTE_PATH.search(text))
    card = (out / export.CARD).read_text()
    assert "base_model:" not in card.split("---")[1]  # a local model has no hub id to link
    assert "a local model" in card


def test_a_base_from_the_hub_cache_is_named_by_its_hub_id(hub_cache, tmp_path):
    from rlvr_scenario import build_sft_dir

    snapshot = next((hub_cache / "models--Qwen--Qwen2.5-1.5B" / "snapshots").iterdir())
    stage = build_sft_dir(snapshot, tmp_path / "sft")
    assert json.loads((stage / "manifest.json").read_text())["base_model"] == str(
        snapshot
    )  # an absolute path
    out = tmp_path / "merged"
    assert cli.main(["export", str(stage), "--out", str(out)]) == 0
    card = (out / export.CARD).read_text()
    assert "base_model: Qwen/Qwen2.5-1.5B" in card.split("---")[1]
    assert "on `Qwen/Qwen2.5-1.5B`" in card
    assert not ABSOLUTE_PATH.search(card) and str(hub_cache) not in card
