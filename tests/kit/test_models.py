"""The shared loader (sage_unsloth.model.loading), trl backend in-process; the Unsloth backend is covered by
tests/sft/test_sft.py::test_unsloth_backend_trains_on_cpu_and_adapter_continues (its own process)."""

from __future__ import annotations

import pytest
import torch
from trl import ModelConfig

from sage_unsloth.data.prompts import CHAT_TEMPLATE
from sage_unsloth.model.loading import (
    DEFAULT_TARGET_MODULES,
    load_for_training,
    load_tokenizer,
    model_short_name,
    prepare_tokenizer,
)


@pytest.mark.parametrize(
    "name, short",
    [
        ("Qwen/Qwen2.5-Math-7B", "qwen2.5-math-7b"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "deepseek-r1-distill-qwen-7b"),
        ("/tmp/run 1/My_Model/", "my_model"),
        ("Qwen2.5-1.5B", "qwen2.5-1.5b"),
    ],
)
def test_model_short_name(name, short):
    assert model_short_name(name) == short


def lora_args(model_dir, **kw) -> ModelConfig:
    return ModelConfig(
        **{"model_name_or_path": str(model_dir), "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, **kw}
    )


def test_fresh_lora_and_prepared_tokenizer(tiny_model_dir):
    from peft import PeftModel

    model, tok = load_for_training(lora_args(tiny_model_dir), backend="trl", max_seq_length=256, seed=0)
    assert isinstance(model, PeftModel)
    cfg = model.peft_config["default"]
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout) == (8, 16, 0.0)
    assert set(cfg.target_modules) == set(DEFAULT_TARGET_MODULES)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert len(trainable) == 2 * 2 * 7  # A and B, 2 layers, 7 projections
    assert tok.chat_template == CHAT_TEMPLATE and tok.padding_side == "left" and tok.pad_token is not None


def test_lora_init_follows_seed(tiny_model_dir):
    a = load_for_training(lora_args(tiny_model_dir), backend="trl", max_seq_length=256, seed=1)[0]
    b = load_for_training(lora_args(tiny_model_dir), backend="trl", max_seq_length=256, seed=1)[0]
    c = load_for_training(lora_args(tiny_model_dir), backend="trl", max_seq_length=256, seed=2)[0]
    name = next(n for n, _ in a.named_parameters() if "lora_A" in n)
    pa, pb, pc = (dict(m.named_parameters())[name] for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_existing_adapter_loads_trainable_with_its_weights(tiny_model_dir, tmp_path):
    model, tok = load_for_training(lora_args(tiny_model_dir), backend="trl", max_seq_length=256, seed=0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)  # something a fresh LoRA (B = 0) would not have
    model.save_pretrained(tmp_path / "adapter")
    tok.save_pretrained(tmp_path / "adapter")
    # A different rank in model_args must not matter: the saved adapter's own config wins.
    again, tok2 = load_for_training(
        lora_args(tiny_model_dir, lora_r=4),
        backend="trl",
        max_seq_length=256,
        seed=5,
        adapter_path=str(tmp_path / "adapter"),
    )
    assert again.peft_config["default"].r == 8
    params = dict(again.named_parameters())
    for n, p in model.named_parameters():
        if "lora_" in n:
            assert params[n].requires_grad and torch.equal(params[n], p)
    assert tok2.chat_template == CHAT_TEMPLATE


def test_adapter_from_another_base_is_refused(tiny_model_dir, tmp_path):
    model, _ = load_for_training(lora_args(tiny_model_dir), backend="trl", max_seq_length=256, seed=0)
    model.save_pretrained(tmp_path / "adapter")
    with pytest.raises(ValueError, match="was trained on .* but model_name_or_path is 'other/model'"):
        load_for_training(
            ModelConfig(model_name_or_path="other/model"),
            backend="trl",
            max_seq_length=256,
            seed=0,
            adapter_path=str(tmp_path / "adapter"),
        )
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        load_for_training(
            lora_args(tiny_model_dir), backend="trl", max_seq_length=256, seed=0, adapter_path=str(tmp_path)
        )


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"backend": "vllm"}, "backend 'vllm' is unknown"),
        ({"backend": "unsloth", "fast_inference": True}, "fast_inference .* needs backend unsloth on a GPU"),
        ({"backend": "trl", "fast_inference": True}, "fast_inference .* needs backend unsloth on a GPU"),
    ],
)
def test_bad_arguments_fail_before_loading(kwargs, error):
    with pytest.raises(ValueError, match=error):
        load_for_training(
            ModelConfig(model_name_or_path="never/loaded"), max_seq_length=256, seed=0, **kwargs
        )


def test_4bit_is_ignored_on_cpu_with_a_notice(tiny_model_dir, caplog):
    model, _ = load_for_training(
        lora_args(tiny_model_dir, load_in_4bit=True), backend="trl", max_seq_length=256, seed=0
    )
    assert "load_in_4bit ignored" in caplog.text
    assert next(model.parameters()).dtype == torch.float32


def test_prepare_tokenizer_sets_missing_pad(tiny_model_dir):
    tok = load_tokenizer(ModelConfig(model_name_or_path=str(tiny_model_dir)))
    tok.pad_token = None
    tok.padding_side = "right"
    tok.chat_template = None
    prepare_tokenizer(tok)
    assert (
        tok.pad_token == tok.eos_token and tok.padding_side == "left" and tok.chat_template == CHAT_TEMPLATE
    )
