"""The GPU path read against the pinned libraries (issue: the first GPU run), checked on CPU without a model:
what the kit hands Unsloth's loader (exact hub ids, the adapter's rank for vLLM, the T4 sampler switch, the
configured base under a mirror-named adapter), the base-model checks of stages 2 and 3, bfloat16 and 4-bit refused
before a model loads, and the version guard as a stage prints it. The libraries' own rules these rely on are
tested in tests/kit/test_compat.py; the stages on real hub ids in tests/cli/test_hub_ids.py."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
from gpu_path_helpers import write_adapter, write_sft_folder
from trl import ModelConfig

from sage_unsloth import compat
from sage_unsloth.model import loading as models

REPO = Path(__file__).resolve().parents[2]
MATH_7B, MIRROR_7B = "Qwen/Qwen2.5-Math-7B", "unsloth/Qwen2.5-Math-7B"


class FakeFastLanguageModel:
    """Records what the kit hands Unsloth's loader (and which base the adapter folder it gets records)."""

    calls: ClassVar[list[dict]] = []

    @staticmethod
    def from_pretrained(model_name, **kwargs):
        config = Path(model_name) / "adapter_config.json"
        recorded = json.loads(config.read_text())["base_model_name_or_path"] if config.is_file() else None
        FakeFastLanguageModel.calls.append({"model_name": model_name, "recorded": recorded, **kwargs})
        # what PEFT records as the adapter's base: the repository the weights came from
        base = types.SimpleNamespace(base_model_name_or_path=recorded or model_name)
        return types.SimpleNamespace(peft_config={"default": base}), "tokenizer"

    @staticmethod
    def get_peft_model(model, **kwargs):
        return model


@pytest.fixture
def fake_unsloth(monkeypatch):
    FakeFastLanguageModel.calls = []
    monkeypatch.setitem(
        sys.modules, "unsloth", types.SimpleNamespace(FastLanguageModel=FakeFastLanguageModel)
    )
    monkeypatch.setattr(models, "import_unsloth", lambda: None)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # what the loader exports stays in this test
    os.environ.pop(compat.UNSLOTH_NO_FLASHINFER_ENV, None)
    return FakeFastLanguageModel.calls


def _load(model_args, adapter=None, fast_inference=True, four_bit=False):
    return models._load_unsloth(
        model_args,
        0,
        None if adapter is None else str(adapter),
        four_bit,
        False,
        max_seq_length=1024,
        fast_inference=fast_inference,
        gpu_memory_utilization=0.5,
        gradient_checkpointing=True,
    )


def test_unsloth_loader_arguments(fake_unsloth, monkeypatch, tmp_path):
    """Findings 1, 3 and 6 at the loader: the hub id as configured, vLLM's max_lora_rank from the adapter being
    trained (rank 12 -> 16, not the config's lora_r 8), Unsloth's sampler switch on a 7.5 GPU; a mirror-named
    adapter is loaded on the configured base through a view of it that records that base."""
    monkeypatch.setattr(models, "cuda_capability", lambda: (7, 5))
    adapter = write_adapter(tmp_path / "sft", MIRROR_7B, rank=12)
    _load(ModelConfig(model_name_or_path=MATH_7B, lora_r=8, dtype="float16"), adapter)
    (call,) = fake_unsloth
    assert call[compat.EXACT_NAME_KWARG] is True and call["fast_inference"] is True
    assert call["max_lora_rank"] == 16 and call["recorded"] == MATH_7B and call["model_name"] != str(adapter)
    assert not Path(call["model_name"]).exists()  # the view is gone once the model is loaded
    assert os.environ[compat.UNSLOTH_NO_FLASHINFER_ENV] == "1"
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == MIRROR_7B

    # An adapter that records the configured name is loaded from its own folder; an 8.0 GPU keeps FlashInfer.
    os.environ.pop(compat.UNSLOTH_NO_FLASHINFER_ENV)
    monkeypatch.setattr(models, "cuda_capability", lambda: (8, 0))
    same = write_adapter(tmp_path / "same", MATH_7B, rank=8)
    _load(ModelConfig(model_name_or_path=MATH_7B, lora_r=64), same)
    assert fake_unsloth[-1]["model_name"] == str(same) and fake_unsloth[-1]["max_lora_rank"] == 8
    assert compat.UNSLOTH_NO_FLASHINFER_ENV not in os.environ
    # on a GPU machine whose nvcc is not torch's CUDA (a CUDA 12 image under the CUDA 13 torch): FlashInfer off
    monkeypatch.setattr(models, "cuda_available", lambda: True)
    monkeypatch.setattr(compat, "flashinfer_toolchain_here", lambda: "nvcc is CUDA 12.5, torch CUDA 13.0")
    _load(ModelConfig(model_name_or_path=MATH_7B, lora_r=64), same)
    assert os.environ.pop(compat.UNSLOTH_NO_FLASHINFER_ENV) == "1"
    monkeypatch.setattr(compat, "flashinfer_toolchain_here", lambda: None)  # nvcc 13.x: Unsloth's own choice
    _load(ModelConfig(model_name_or_path=MATH_7B, lora_r=64), same)
    assert compat.UNSLOTH_NO_FLASHINFER_ENV not in os.environ
    monkeypatch.setattr(models, "cuda_available", lambda: False)
    # A fresh LoRA (no adapter): the config's rank, rounded up to one vLLM accepts; SFT starts no vLLM.
    _load(ModelConfig(model_name_or_path=MATH_7B, lora_r=12))
    assert fake_unsloth[-1]["model_name"] == MATH_7B and fake_unsloth[-1]["max_lora_rank"] == 16
    _load(ModelConfig(model_name_or_path=MATH_7B, lora_r=12), fast_inference=False)
    assert "max_lora_rank" not in fake_unsloth[-1] and fake_unsloth[-1][compat.EXACT_NAME_KWARG] is True


@pytest.fixture
def unsloth_tables():
    """Unsloth's mapper, read before fake_unsloth hides the package (compat caches it)."""
    return compat.unsloth_mapper()


def test_four_bit_loads_unsloths_prequantised_mirror(unsloth_tables, fake_unsloth, tmp_path):
    """load_in_4bit: the 4-bit files of Unsloth's mirror (its mapper's FLOAT_TO_INT_MAPPER, the repository its own
    loader picks), not the 16-bit ones quantised on load; the adapter still records the configured base. A local
    folder, a pinned revision and 16-bit loads keep the configured repository."""
    mirror = unsloth_tables.FLOAT_TO_INT_MAPPER["qwen/qwen2.5-3b"]  # Unsloth's own table
    assert mirror.lower().endswith("bnb-4bit")
    model, _ = _load(ModelConfig(model_name_or_path="Qwen/Qwen2.5-3B"), fast_inference=False, four_bit=True)
    assert fake_unsloth[-1]["model_name"] == mirror and fake_unsloth[-1]["revision"] is None
    assert fake_unsloth[-1]["load_in_4bit"] is True
    assert model.peft_config["default"].base_model_name_or_path == "Qwen/Qwen2.5-3B"
    _load(ModelConfig(model_name_or_path="Qwen/Qwen2.5-3B"), fast_inference=False)
    assert fake_unsloth[-1]["model_name"] == "Qwen/Qwen2.5-3B"  # 16-bit
    pinned = ModelConfig(model_name_or_path="Qwen/Qwen2.5-3B", model_revision="0123abc")
    _load(pinned, fast_inference=False, four_bit=True)
    assert fake_unsloth[-1]["model_name"] == "Qwen/Qwen2.5-3B" and fake_unsloth[-1]["revision"] == "0123abc"
    (tmp_path / "local").mkdir()
    _load(ModelConfig(model_name_or_path=str(tmp_path / "local")), fast_inference=False, four_bit=True)
    assert fake_unsloth[-1]["model_name"] == str(tmp_path / "local")
    # stage 2 continuing the SFT adapter in 4-bit: Unsloth reads the base from a view that names the mirror
    adapter = write_adapter(tmp_path / "sft", "Qwen/Qwen2.5-3B", rank=8)
    model, _ = _load(
        ModelConfig(model_name_or_path="Qwen/Qwen2.5-3B"), adapter, fast_inference=False, four_bit=True
    )
    assert fake_unsloth[-1]["recorded"] == mirror
    assert model.peft_config["default"].base_model_name_or_path == "Qwen/Qwen2.5-3B"
    assert (
        json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
        == "Qwen/Qwen2.5-3B"
    )


def test_adapter_base_is_the_model_or_its_mirror(tmp_path):
    for recorded, configured in ((MIRROR_7B, MATH_7B), (MATH_7B, MIRROR_7B), (MATH_7B, MATH_7B)):
        models.check_adapter_base(write_adapter(tmp_path / recorded.replace("/", "_"), recorded), configured)
    other = write_adapter(tmp_path / "other", "Qwen/Qwen2.5-7B")
    with pytest.raises(ValueError) as caught:
        models.check_adapter_base(other, MATH_7B, "sft_dir")
    assert "\n" not in str(caught.value) and "trained on 'Qwen/Qwen2.5-7B' but the base model is" in str(
        caught.value
    )


def _sft_folder(tmp_path: Path, recorded: str, base: str = MATH_7B) -> Path:
    return write_sft_folder(tmp_path / "sft", recorded=recorded, base=base)


def test_stage_2_takes_a_mirror_named_sft_folder_and_refuses_another_base(tmp_path):
    from sage_unsloth.rlvr.run import RLVRStageArgs, _resolve_sft

    folder = _sft_folder(tmp_path, MIRROR_7B)
    for configured in (None, MATH_7B, MIRROR_7B):  # --model_name_or_path unsloth/... is the same model too
        assert (
            _resolve_sft(RLVRStageArgs(sft_dir=str(folder)), ModelConfig(model_name_or_path=configured))[2]
            == MATH_7B
        )
    folder = _sft_folder(tmp_path / "b", "Qwen/Qwen2.5-Math-7B-Instruct")
    with pytest.raises(ValueError, match="sft_dir=.* was trained on 'Qwen/Qwen2.5-Math-7B-Instruct'"):
        _resolve_sft(RLVRStageArgs(sft_dir=str(folder)), ModelConfig())


def test_stage_3_serves_an_adapter_on_its_base_or_a_recorded_mirror(tmp_path, monkeypatch, caplog):
    from sage_unsloth.eval.sampling import check_served_base, resolve_checkpoint

    folder = _sft_folder(tmp_path, MIRROR_7B)
    assert resolve_checkpoint(str(folder)).base_model == MATH_7B  # Unsloth's mapper says mirror
    manifest = {
        "base_model": MATH_7B,
        "base_model_mirrors": compat.unsloth_mirrors(MATH_7B),
    }  # as stage 1 writes
    monkeypatch.setattr(compat, "unsloth_mapper", lambda: None)  # .venv-eval on CPU: no Unsloth to ask
    check_served_base("ck", folder, MATH_7B, manifest)  # what stage 1 recorded decides
    check_served_base("ck", folder, MATH_7B, {"base_model": MATH_7B})  # an older manifest: only a warning
    assert "cannot tell" in caplog.text
    with pytest.raises(ValueError, match="trained on 'unsloth/Qwen2.5-Math-7B', not on 'Qwen/Qwen2.5-7B'"):
        check_served_base("ck", folder, "Qwen/Qwen2.5-7B", {"base_model_mirrors": []})


def _preset(path: str) -> dict:
    from sage_unsloth.config.args import load_config

    return load_config(str(REPO / path))


@pytest.mark.parametrize(
    "preset",
    [
        "configs/sft/qwen2.5-1.5b.yaml",
        "configs/sft/qwen2.5-3b.yaml",
        "configs/rlvr/qwen2.5-1.5b/grpo_branch.yaml",
        "configs/rlvr/qwen2.5-3b/grpo_branch.yaml",
    ],
)
def test_16gb_presets_run_in_float16_on_a_t4(preset):
    """Finding 5: the presets sold for 16 GB cards need no bfloat16 (the T4 is compute capability 7.5)."""
    cfg = _preset(preset)
    assert cfg["dtype"] == "float16" and cfg["bf16"] is False
    assert models.precision_problem(cfg["dtype"], cfg["bf16"], (7, 5)) is None


def test_bfloat16_on_a_t4_is_refused_before_loading(monkeypatch):
    cfg = _preset("configs/sft/qwen2.5-math-7b.yaml")
    problem = models.precision_problem(cfg["dtype"], cfg["bf16"], (7, 5))
    assert problem.startswith("bf16=true and dtype=bfloat16: a GPU of compute capability 7.5 has no bfloat16")
    assert "--dtype float16 --bf16 false" in problem
    assert models.precision_problem(cfg["dtype"], cfg["bf16"], (8, 0)) is None
    assert models.precision_problem(cfg["dtype"], cfg["bf16"], None) is None  # CPU: the configs use float32
    args = types.SimpleNamespace(bf16=True)
    monkeypatch.setattr(models, "cuda_capability", lambda: (7, 5))
    with pytest.raises(ValueError, match="has no bfloat16"):
        models.check_gpu_setup(ModelConfig(dtype="bfloat16"), args, backend="unsloth", fast_inference=False)
    models.check_gpu_setup(
        ModelConfig(dtype="float16"),
        types.SimpleNamespace(bf16=False),
        backend="unsloth",
        fast_inference=False,
    )


def test_4bit_with_unsloths_vllm_needs_the_bnb_plugin(monkeypatch):
    problem = models.bnb_plugin_problem(True, "unsloth", True, installed=False)
    assert (
        f'pip install "vllm-bnb-plugin=={compat.PINNED["vllm-bnb-plugin"]}"' in problem
        and "\n" not in problem
    )
    assert models.bnb_plugin_problem(True, "unsloth", True, installed=True) is None
    assert models.bnb_plugin_problem(True, "unsloth", False, installed=False) is None  # no vLLM: no plugin
    assert models.bnb_plugin_problem(False, "unsloth", True, installed=False) is None
    monkeypatch.setattr(models, "cuda_capability", lambda: (7, 5))
    with pytest.raises(ValueError, match="vllm-bnb-plugin"):
        models.check_gpu_setup(
            ModelConfig(load_in_4bit=True, dtype="float16"),
            types.SimpleNamespace(bf16=False),
            backend="unsloth",
            fast_inference=True,
        )


def test_unpinned_unsloth_is_one_line(monkeypatch, capsys, tiny_config=REPO / "configs/sft/tiny-cpu.yaml"):
    """Finding 4: a stage that imports Unsloth refuses another Unsloth in one line before anything loads."""
    from sage_unsloth.sft.run import main

    monkeypatch.setattr(compat, "installed_version", lambda name: "2026.11.1" if name == "unsloth" else None)
    code = main(
        [
            str(tiny_config),
            "--backend",
            "unsloth",
            "--unsloth_without_gpu",
            "true",
            "--model_name_or_path",
            "x/y",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: unsloth 2026.11.1 (tested: 2026.10.9)") and compat.UNPINNED_ENV in err[0]
