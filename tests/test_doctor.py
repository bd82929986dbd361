"""`sage-unsloth doctor`: each machine / stack rule on made-up facts (a P100, an old driver, a wrong pin), the
memory estimate, and the whole doctor on this CPU machine: it passes, and it fails clearly when one thing is
broken on purpose (a wrong pinned version reported, or a hook that drops q)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from subprocess_run import run_python

from sage_unsloth import doctor
from sage_unsloth.doctor import env, memory
from sage_unsloth.doctor.report import Check

REPO = Path(__file__).resolve().parents[1]
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
    check = env.driver_check(facts((7, 5), driver=driver, cuda=cuda))
    assert check.status == ("PASS" if ok else "FAIL"), check
    if not ok:
        assert f"CUDA {cuda.split('.')[0]}.x" in check.detail and "update the NVIDIA driver" in check.fix


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
    assert pins["torch"].version == "2.13.0" and pins["torch"].extras == ()
    assert pins["trl"].version == "1.15.0" and pins["vllm"].extras == ("gpu",)
    assert pins["bitsandbytes"].version == "0.50.2" and pins["torchvision"].version == "0.28.0"
    assert set(pins["unsloth"].extras) == {"gpu", "unsloth"}


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
    from sage_unsloth.config_args import load_config

    return load_config(REPO / relative)  # as the doctor reads it: with its base: chain


def test_memory_estimate_for_the_paper_config():
    path = "configs/rlvr/qwen2.5-math-7b/grpo_branch.yaml"
    guess = memory.estimate(_config(path), path)
    assert guess.model == "qwen2.5-math-7b" and guess.vllm_fraction == 0.5
    extra = guess.total_gib(80.0) - 40.0  # training beside vLLM's half of an 80 GiB card
    assert 8 < extra < 25
    h100 = facts((9, 0), total=79.6, free=79.0)
    t4 = facts((7, 5), total=15.0, free=14.6)
    assert doctor._memory_check(_config(path), path, h100).status == "PASS"
    assert doctor._memory_check(_config(path), path, t4).status == "FAIL"


def test_memory_estimate_parts_follow_the_config():
    qlora = memory.estimate(_config("configs/sft/qwen2.5-3b.yaml") | {"load_in_4bit": True})
    full = memory.estimate(_config("configs/sft/qwen2.5-3b.yaml") | {"load_in_4bit": False})
    assert full.parts["weights"] == pytest.approx(3.09e9 * 2 / 2**30)
    assert qlora.parts["weights"] < 0.5 * full.parts["weights"]
    evaluation = memory.estimate(
        _config("configs/eval/qwen2.5-math-7b.yaml"), "configs/eval/qwen2.5-math-7b.yaml"
    )
    assert evaluation is None or evaluation.vllm_fraction == 0.9
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
        "trainer.SageTrainerMixin.sage_unsloth_q = lambda self, entropies, mask: torch.ones_like(entropies)\n"
        "from sage_unsloth.doctor.selftest import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = _run([str(script), str(tmp_path / "work"), "--backend", "unsloth", "--quick"], tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert any(line.startswith("[PASS] patched") for line in lines)
    assert any(line.startswith("[FAIL] q_in_loss") and "= 0.000000" in line for line in lines), lines
    assert any(line.startswith("[FAIL] q_source") for line in lines)
