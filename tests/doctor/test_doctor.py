"""`sage-unsloth doctor`: each machine / stack rule on made-up facts (a P100, an old driver, a wrong pin), the
memory estimate, and the whole doctor on this CPU machine: it passes, and it fails clearly when one thing is
broken on purpose (a wrong pinned version reported, or a hook that drops q)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gpu_path_helpers import write_sft_folder
from subprocess_run import run_python

from sage_unsloth import compat, doctor
from sage_unsloth.doctor import card as cards
from sage_unsloth.doctor import env, memory
from sage_unsloth.doctor.report import Check

REPO = Path(__file__).resolve().parents[2]
CUDA13_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]


def facts(capability, *, name="GPU", bf16=None, driver="580.65.06", total=16.0, free=15.0, cuda="13.0"):
    device = env.Device(name, capability, total, free, capability[0] >= 8 if bf16 is None else bf16)
    return env.GpuFacts("2.13.0+cu130", cuda, CUDA13_ARCHS, [device], driver)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


# ----------------------------------------------------------------------------------------------- GPU rules
@pytest.mark.parametrize(
    "capability, ok",
    [
        ((6, 0), False),
        ((7, 0), False),
        ((7, 5), True),
        ((8, 9), True),
        ((9, 0), True),
        ((12, 1), True),
        ((13, 0), True),
    ],
)
def test_compute_capability_against_the_wheels_kernels(capability, ok):
    """sm_89 runs sm_86 code (same major), sm_130 JIT-compiles compute_120 PTX; P100 / V100 have nothing."""
    assert env.arch_supported(capability, CUDA13_ARCHS) is ok
    check = by_name(env.gpu_checks(facts(capability), needs_gpu=True, wants_bf16=False))["gpu 0"]
    assert check.status == ("PASS" if ok else "FAIL")
    if not ok:
        assert "sm_75..sm_120" in check.detail and "7.5" in check.fix and "P100" in check.fix


@pytest.mark.parametrize(
    "driver, cuda, ok",
    [
        ("580.65.06", "13.0", True),
        ("575.57.08", "13.0", False),
        ("550.54.15", "12.8", True),
        ("470.82.01", "12.8", False),
    ],
)
def test_driver_against_the_cuda_of_torch(driver, cuda, ok):
    check = env.driver_check(facts((7, 5), name="Tesla T4", driver=driver, cuda=cuda))
    assert check.status == ("PASS" if ok else "FAIL"), check
    if not ok:
        assert f"CUDA {cuda.split('.')[0]}.x" in check.detail
        # CUDA 13 on a data-centre card: NVIDIA's forward-compatibility package; CUDA 12 is not the kit's pin
        wanted = "sage_unsloth.doctor.driver --enable" if cuda == "13.0" else "update the NVIDIA driver"
        assert wanted in check.fix, check.fix


def test_forward_compatible_libcuda_passes_an_older_kernel_driver():
    """nvidia-smi reports the kernel module (550); the libcuda the process loaded runs the CUDA 13 driver API."""
    old = facts((7, 5), name="Tesla T4", driver="550.54.15")
    assert env.driver_check(old).status == "FAIL"
    old.driver_api = 13000
    check = env.driver_check(old)
    assert check.status == "PASS" and "forward-compatibility libcuda (driver API 13.0)" in check.detail
    consumer = facts((8, 9), name="NVIDIA GeForce RTX 4090", driver="550.54.15")
    assert "update the NVIDIA driver to >= 580" in env.driver_check(consumer).fix


def test_bf16_on_a_t4_fails_with_the_fp16_fix():
    checks = by_name(env.gpu_checks(facts((7, 5), name="Tesla T4"), needs_gpu=True, wants_bf16=True))
    assert checks["bf16"].status == "FAIL" and "--bf16 false --dtype float16" in checks["bf16"].fix
    assert by_name(env.gpu_checks(facts((8, 0)), needs_gpu=True, wants_bf16=True))["bf16"].status == "PASS"


def test_no_gpu_is_a_skip_unless_the_config_needs_one():
    cpu = env.GpuFacts("2.13.0+cpu", None)
    assert env.gpu_checks(cpu, needs_gpu=False, wants_bf16=False)[0].status == "SKIP"
    needed = env.gpu_checks(cpu, needs_gpu=True, wants_bf16=True)[0]
    assert needed.status == "FAIL" and "needs one" in needed.detail


# ----------------------------------------------------------------------------------------------- stack
def test_kit_pins_come_from_the_package_metadata():
    pins = {p.name: p for p in env.kit_pins()}
    assert pins["torch"].version == "2.13.0" and pins["torch"].extras == ("gpu",)  # the core takes a range
    assert pins["trl"].version == "1.15.0" and pins["vllm"].extras == ("gpu",)
    assert pins["bitsandbytes"].version == "0.50.2" and pins["torchvision"].version == "0.28.0"
    assert set(pins["unsloth"].extras) == {"gpu", "unsloth"}  # [gpu] names [unsloth]
    assert pins["math-verify"].extras == () and "numpy" not in pins


def test_stack_rules():
    pins = [
        env.Pin("torch", "2.13.0", ()),
        env.Pin("trl", "1.15.0", ()),
        env.Pin("unsloth", "2026.10.9", ("gpu",)),
        env.Pin("vllm", "0.31.0", ("gpu",)),
    ]
    versions = {"torch": "2.13.0+cu130", "trl": "1.16.0", "unsloth": None, "vllm": None}
    checks = by_name(env.stack_checks(pins, versions, needed={"unsloth"}))
    assert checks["pin torch"].status == "PASS"  # the local label names the build, not another release
    assert checks["pin trl"].status == "FAIL" and "1.16.0 installed" in checks["pin trl"].detail
    assert checks["pin trl"].fix == 'pip install "trl==1.15.0"'
    assert checks["pin unsloth"].status == "FAIL" and "not installed" in checks["pin unsloth"].detail
    assert "pin vllm" not in checks  # optional here and absent


def test_doctor_fails_clearly_on_a_wrong_pinned_version(monkeypatch, capsys):
    """Break one thing: the installed trl reports 1.16.0. The run stops at 1 with the line and the fix."""
    real = env.installed_versions

    def one_wrong(names):
        versions = real(names)
        versions["trl"] = "1.16.0"
        return versions

    monkeypatch.setattr(env, "installed_versions", one_wrong)
    monkeypatch.setattr(env, "probe_vllm", lambda python=None, timeout=0: (False, "not probed in this test"))
    config = REPO / "configs" / "rlvr" / "tiny-cpu" / "grpo_branch.yaml"
    assert doctor.main([str(config), "--skip-selftest"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] pin trl        1.16.0 installed, the kit is pinned to 1.15.0" in out
    assert 'fix: pip install "trl==1.15.0"' in out and "fix the FAIL lines" in out
    monkeypatch.setattr(env, "installed_versions", real)
    assert doctor.main([str(config), "--skip-selftest"]) == 0  # and passes once nothing is wrong


def test_bad_config_is_one_line(tmp_path, capsys):
    assert doctor.main([str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: CONFIG") and "\n" not in err


# ----------------------------------------------------------------------------------------------- memory
def _config(relative: str) -> dict:
    from sage_unsloth.config.args import load_config

    return load_config(REPO / relative)  # as the doctor reads it: with its base: chain


def test_memory_estimate_for_the_paper_config():
    """Finding 8: the preset's activation checkpoints live in CPU RAM (Unsloth's offloaded checkpointing), not on
    the GPU. Each term from the equations: hidden states of every layer for 8 x (1024 + 3072) tokens, 16-bit; one
    layer's saved tensors 2 x (6h + 2 kv d + 4I) bytes a token; Unsloth's logits one sequence in 4 float32 chunks
    with their gradient; Unsloth's vLLM holds the weights (one copy) and a 16 x 4096-token KV cache."""
    path = "configs/rlvr/qwen2.5-math-7b/grpo_branch.yaml"
    guess = memory.estimate(_config(path), path)
    assert guess.model == "qwen2.5-math-7b" and guess.vllm_fraction == 0.5
    tokens, hidden, layers, inter, vocab = 8 * 4096, 3584, 28, 18944, 152064
    assert guess.cpu_parts == {"offloaded checkpoints": pytest.approx(tokens * hidden * 2 * layers / 2**30)}
    step = guess.phases["training step"]
    assert step["activations (1 layer)"] == pytest.approx(
        tokens * 2 * (6 * hidden + 2 * 4 * 128 + 4 * inter) / 2**30
    )
    assert step["logits"] == pytest.approx(4096 * vocab * 4 * 2 / 4 / 2**30)
    assert "weights" not in guess.parts and guess.vllm_holds["weights"] == pytest.approx(7.62e9 * 2 / 2**30)
    assert guess.vllm_holds["KV cache (16 x 4096 tokens)"] == pytest.approx(
        16 * 4096 * layers * 2 * 4 * 128 * 2 / 2**30
    )
    trl = memory.estimate(_config(path) | {"backend": "trl"}, path)  # without Unsloth they stay on the GPU
    assert not trl.cpu_parts
    kept = trl.phases["training step"]["activations (1 layer + checkpoints)"] - step["activations (1 layer)"]
    assert kept == pytest.approx(tokens * hidden * 2 * layers / 2**30)


def test_memory_estimate_parts_follow_the_config():
    qlora = memory.estimate(_config("configs/sft/qwen2.5-3b.yaml") | {"load_in_4bit": True})
    full = memory.estimate(_config("configs/sft/qwen2.5-3b.yaml") | {"load_in_4bit": False})
    assert full.parts["weights"] == pytest.approx(3.09e9 * 2 / 2**30)
    assert qlora.parts["weights"] < 0.5 * full.parts["weights"]
    assert qlora.cache_gib == full.cache_gib == pytest.approx(3.09e9 * 2 / 2**30)  # 4-bit: the 16-bit files
    evaluation = memory.estimate(
        _config("configs/eval/qwen2.5-math-7b.yaml"), "configs/eval/qwen2.5-math-7b.yaml"
    )
    assert evaluation.vllm_fraction == 0.9 and evaluation.model == "Qwen/Qwen2.5-Math-7B"
    notebook = memory.estimate(
        _config("configs/eval/notebook-qwen2.5-3b.yaml"), "configs/eval/notebook-qwen2.5-3b.yaml"
    )
    assert notebook.model == "qwen2.5-3b" and not notebook.cpu_parts
    shape = memory.shape_from_config(
        {
            "hidden_size": 3584,
            "num_hidden_layers": 28,
            "vocab_size": 152064,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "intermediate_size": 18944,
            "tie_word_embeddings": False,
        }
    )
    assert shape.params == pytest.approx(7.62e9, rel=0.01)  # Qwen2.5-7B's 7.62B, biases aside


def test_breakdown_names_every_term_and_the_total():
    """What the GPU acceptance script compares with the measured peak: every term and the total, in GiB."""
    path = "configs/rlvr/qwen2.5-math-7b/grpo.yaml"
    guess = memory.estimate(_config(path), path)
    parts = guess.breakdown(40.0)
    assert parts["vLLM share"] == 20.0 and parts["total"] == pytest.approx(guess.total_gib(40.0))
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
    assert guess.breakdown()["total"] is None  # the share needs the card


# ----------------------------------------------------------------------------------------------- whole doctor
def _run(args, cwd):
    return run_python(args, cwd=cwd, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=900)


@pytest.mark.slow
def test_doctor_passes_on_this_cpu_machine(tmp_path):
    config = REPO / "configs" / "rlvr" / "tiny-cpu" / "grpo_branch.yaml"
    done = _run(
        [
            "-m",
            "sage_unsloth.cli",
            "doctor",
            str(config),
            "--backend",
            "unsloth",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(tmp_path / "doctor.json"),
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    import json

    checks = {c["name"]: c for c in json.loads((tmp_path / "doctor.json").read_text())}
    for name in ("patched", "trains", "q_in_loss", "q_source", "anchor_sft", "lora_sync", "anchor_base"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert checks["pin torch"]["status"] == "PASS" and checks["gpu"]["status"] == "SKIP"
    assert "UnslothGRPOTrainer" in checks["patched"]["detail"]
    assert "extra policy passes for q: 0" in checks["q_in_loss"]["detail"]


@pytest.mark.slow
def test_doctor_fails_when_the_hook_drops_q(tmp_path):
    """Break one thing: Unsloth's in-loss hook computes q = 1. The self-test names the failing checks."""
    script = tmp_path / "broken.py"
    script.write_text(
        "import sys, torch\n"
        "from sage_unsloth.rlvr import trainer\n"
        "q = trainer.SageTrainerMixin.sage_q\n"
        "trainer.SageTrainerMixin.sage_q = lambda self, batch, mask, *, layout, policy, reference=None: (\n"
        "    torch.ones_like(policy['entropies']) if layout == 'unsloth'\n"
        "    else q(self, batch, mask, layout=layout, policy=policy, reference=reference))\n"
        "from sage_unsloth.doctor.selftest import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = _run([str(script), str(tmp_path / "work"), "--backend", "unsloth", "--quick"], tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert any(line.startswith("[PASS] patched") for line in lines)
    assert any(line.startswith("[FAIL] q_in_loss") and "= 0.000000" in line for line in lines), lines
    assert any(line.startswith("[FAIL] q_source") for line in lines)


# ----------------------------------------------------------------------------------------------- --gpu NAME
PRESETS_16GB = [
    "configs/sft/qwen2.5-1.5b.yaml",
    "configs/rlvr/qwen2.5-1.5b/grpo.yaml",
    "configs/rlvr/qwen2.5-1.5b/grpo_branch.yaml",
    "configs/eval/notebook-qwen2.5-1.5b.yaml",
    "configs/sft/qwen2.5-3b.yaml",
    "configs/rlvr/qwen2.5-3b/grpo.yaml",
    "configs/rlvr/qwen2.5-3b/grpo_branch.yaml",
    "configs/eval/notebook-qwen2.5-3b.yaml",
]
ROOMY = cards.Host(free_disk_gib=500.0, available_ram_gib=64.0)


def _card_checks(path, gpu, **kw):
    return by_name(cards.card_checks(_config(path), path, cards.CARDS[gpu], host=kw.pop("host", ROOMY), **kw))


@pytest.mark.parametrize("path", PRESETS_16GB)
def test_16gb_presets_pass_on_a_t4(path):
    checks = _card_checks(path, "t4", environ={})
    assert all(c.status != "FAIL" for c in checks.values()), [c.line() for c in checks.values()]
    assert checks["precision"].status == "PASS" and "float16" in checks["precision"].detail
    assert {"memory train", "memory eval"} & set(checks)


def test_7b_rlvr_preset_passes_on_an_a100_80gb_and_fails_on_a_t4(capsys):
    path = "configs/rlvr/qwen2.5-math-7b/grpo_branch.yaml"
    assert all(c.status != "FAIL" for c in _card_checks(path, "a100-80gb", environ={}).values())
    t4 = _card_checks(path, "t4", environ={})
    assert t4["memory vllm"].status == "FAIL" and "must hold weights 14.2" in t4["memory vllm"].detail
    assert t4["precision"].status == "FAIL" and "--dtype float16 --bf16 false" in t4["precision"].fix
    assert doctor.main([str(REPO / path), "--gpu", "t4"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] memory vllm" in out and "no model is loaded" in out and "fix the FAIL lines" in out
    assert doctor.main([str(REPO / path), "--gpu", "a100-80gb"]) == 0


def test_sampler_switch_on_a_t4():
    path = "configs/rlvr/qwen2.5-1.5b/grpo_branch.yaml"
    assert (
        "the kit sets UNSLOTH_VLLM_NO_FLASHINFER=1" in _card_checks(path, "t4", environ={})["sampler"].detail
    )
    for environ in ({"UNSLOTH_VLLM_NO_FLASHINFER": "0"}, {"VLLM_USE_FLASHINFER_SAMPLER": "1"}):
        check = _card_checks(path, "t4", environ=environ)["sampler"]
        assert check.status == "FAIL" and "does not start" in check.detail, environ
        assert _card_checks(path, "l4", environ=environ)["sampler"].status == "PASS"  # 8.9 runs it
    assert _card_checks("configs/sft/qwen2.5-1.5b.yaml", "t4", environ={})["sampler"].status == "SKIP"


def test_sampler_on_newer_cards_follows_the_flashinfer_toolchain():
    """>= 8.0: FlashInfer JIT-compiles with nvcc; a CUDA 12 nvcc under the CUDA 13 torch fails, and with the sampler
    forced vLLM raises. The doctor on the GPU machine knows the toolchain; for a named card it says the rule."""
    path = "configs/rlvr/qwen2.5-1.5b/grpo_branch.yaml"
    wrong = "nvcc is CUDA 12.5, torch CUDA 13.0: FlashInfer's JIT would build for the wrong CUDA"
    forced = _card_checks(path, "l4", environ={"VLLM_USE_FLASHINFER_SAMPLER": "1"}, toolchain=wrong)[
        "sampler"
    ]
    assert forced.status == "FAIL" and "vLLM raises" in forced.detail
    opt_in = _card_checks(path, "l4", environ={"UNSLOTH_VLLM_NO_FLASHINFER": "0"}, toolchain=wrong)["sampler"]
    assert opt_in.status == "FAIL" and "unset UNSLOTH_VLLM_NO_FLASHINFER" in opt_in.fix
    off = _card_checks(path, "l4", environ={}, toolchain=wrong)["sampler"]
    assert off.status == "PASS" and off.detail.startswith("FlashInfer off (nvcc is CUDA 12.5")
    assert "FlashInfer on" in _card_checks(path, "l4", environ={}, toolchain=None)["sampler"].detail
    assert "stays off unless" in _card_checks(path, "l4", environ={})["sampler"].detail


def test_4bit_needs_the_plugin_with_unsloths_vllm():
    config = _config("configs/rlvr/qwen2.5-3b/grpo.yaml")
    declared = {"vllm-bnb-plugin": compat.PINNED["vllm-bnb-plugin"], "bitsandbytes": "0.50.2"}
    assert cards.four_bit_check(config, declared, None).status == "PASS"
    assert cards.four_bit_check(config, {"bitsandbytes": "0.50.2"}, None).status == "FAIL"  # not in the extra
    missing = cards.four_bit_check(config, declared, False)  # a GPU machine without it installed
    assert missing.status == "FAIL" and 'pip install "vllm-bnb-plugin==' in missing.fix
    assert cards.four_bit_check(config | {"use_vllm": False}, declared, False).status == "PASS"


def test_adapter_rank_and_base_with_sft_dir(tmp_path):
    path = "configs/rlvr/qwen2.5-math-7b/grpo.yaml"
    mirror = write_sft_folder(
        tmp_path / "mirror", recorded="unsloth/Qwen2.5-Math-7B", base="Qwen/Qwen2.5-Math-7B", rank=12
    )
    checks = _card_checks(path, "a100-80gb", sft_dir=str(mirror), environ={})
    assert (
        checks["lora rank"].status == "PASS"
        and "rank 12: vLLM gets max_lora_rank 16" in checks["lora rank"].detail
    )
    assert checks["base"].status == "PASS" and "Unsloth's mapper" in checks["base"].detail
    other = write_sft_folder(tmp_path / "other", recorded="Qwen/Qwen2.5-7B", base="Qwen/Qwen2.5-Math-7B")
    base = _card_checks(path, "a100-80gb", sft_dir=str(other), environ={})["base"]
    assert base.status == "FAIL" and "'Qwen/Qwen2.5-7B'" in base.detail
    huge = write_sft_folder(
        tmp_path / "huge", recorded="Qwen/Qwen2.5-Math-7B", base="Qwen/Qwen2.5-Math-7B", rank=1024
    )
    assert _card_checks(path, "a100-80gb", sft_dir=str(huge), environ={})["lora rank"].status == "FAIL"
    assert _card_checks(path, "a100-80gb", environ={})["lora rank"].status == "SKIP"


def test_driver_disk_and_ram_lines():
    assert cards.driver_check(cards.Host()).status == "SKIP"
    old = cards.driver_check(cards.Host(driver="550.54.15"), cards.CARDS["t4"])
    assert old.status == "WARN" and "forward-compatibility package" in old.detail
    assert "apt-get install cuda-compat-13-0" in old.fix and "/usr/local/cuda-13.0/compat" in old.fix
    assert cards.driver_check(cards.Host(driver="580.65.06")).status == "PASS"
    path = "configs/rlvr/qwen2.5-math-7b/grpo.yaml"
    small = cards.Host(free_disk_gib=5.0, available_ram_gib=4.0)
    elsewhere = _card_checks(path, "a100-80gb", host=small, environ={})
    assert elsewhere["disk"].status == "WARN" and "14.2 GiB for the model" in elsewhere["disk"].detail
    assert elsewhere["ram"].status == "WARN" and "6.1 GiB of offloaded checkpoints" in elsewhere["ram"].detail
    here = _card_checks(
        path,
        "a100-80gb",
        host=cards.Host(free_disk_gib=5.0, available_ram_gib=4.0, on_target=True),
        environ={},
    )
    assert here["disk"].status == here["ram"].status == "FAIL"


def test_gpu_needs_a_config(capsys):
    assert doctor.main(["--gpu", "t4"]) == 2
    assert "--gpu NAME checks a CONFIG" in capsys.readouterr().err


@pytest.mark.parametrize(
    "preset, doctor_config",
    [
        ("configs/sft/qwen2.5-1.5b.yaml", "configs/sft/qwen2.5-1.5b.yaml"),
        ("configs/sft/qwen2.5-3b.yaml", "configs/sft/qwen2.5-3b.yaml"),
        ("configs/rlvr/qwen2.5-1.5b/_base.yaml", "configs/rlvr/qwen2.5-1.5b/grpo.yaml"),
        ("configs/rlvr/qwen2.5-3b/_base.yaml", "configs/rlvr/qwen2.5-3b/grpo.yaml"),
    ],
)
def test_preset_memory_comments_are_the_doctors_figures(preset, doctor_config):
    import re

    said = re.search(r"# Memory \(an estimate[^)]*\): ([\d.]+) GiB", (REPO / preset).read_text()).group(1)
    guess = memory.estimate(_config(doctor_config), doctor_config)
    assert said == f"{guess.total_gib(cards.CARDS['t4'].total_gib):.1f}"
