"""scripts/gpu_acceptance.sh --cpu-rehearsal: the acceptance check of the GPU path on this CPU, with Unsloth's
GPU-only trainer rewrites forced onto it (sage_unsloth/acceptance/). One rehearsal per test session (11 stage
processes, each importing Unsloth: about 4 minutes of one core, docs/benchmarks.md); each test reads its verdict.

Through Unsloth's rewritten Trainer.training_step and inner loop and its generated UnslothSFTTrainer (assistant-only
loss) and UnslothGRPOTrainer (Branch guide): a checkpoint save, a SIGKILL right after it, a resume whose step 3 is
poisoned (the step guard refuses it, the checkpoint is kept), a resume that ends where the uninterrupted run did, bit
for bit; stage 2's step 1 with Unsloth's sequence packing on and off. The verdict functions themselves are also fed
made-up runs below, each broken in one way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from subprocess_run import REPO, env_with_repo, run

from sage_unsloth.acceptance import checks


@pytest.fixture(scope="module")
def verdict(tmp_path_factory):
    work = tmp_path_factory.mktemp("acceptance")
    done = run(
        ["bash", str(REPO / "scripts" / "gpu_acceptance.sh"), "--cpu-rehearsal", "--workdir", str(work)],
        cwd=REPO,
        env=env_with_repo(),
        timeout=2400,
    )
    found = json.loads((work / "verdict.json").read_text()) if (work / "verdict.json").is_file() else {}
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    found["exit"], found["summary"] = done.returncode, done.stdout
    return found


@pytest.mark.slow
def test_the_rehearsal_passes_and_prints_one_screen(verdict):
    failed = {name: c.get("line") for name, c in verdict["checks"].items() if c["ok"] is False}
    assert verdict["ok"] and verdict["exit"] == 0 and not failed, failed
    summary = verdict["summary"].strip().splitlines()
    assert summary[0].startswith("GPU ACCEPTANCE PASS (cpu-rehearsal") and len(summary) == 1 + len(
        verdict["checks"]
    )
    skipped = {name for name, c in verdict["checks"].items() if c["ok"] is None}
    assert skipped == {"sft_memory", "rlvr_memory", "vllm"}  # no GPU memory and no vLLM on a CPU


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "trainer", "steps"), [("sft", "UnslothSFTTrainer", 4), ("rlvr", "UnslothGRPOTrainer", 4)]
)
def test_stages_train_through_unsloths_gpu_rewrites(verdict, stage, trainer, steps):
    check = verdict["checks"][f"{stage}_rewrites"]
    assert check["functions"] == {
        "training_step": "_unsloth_training_step",
        "_inner_training_loop": "_fast_inner_training_loop",
    }
    assert check["calls"] == {"training_step": steps, "_inner_training_loop": 1}
    kit = f"Sage{trainer}"  # the kit's class over Unsloth's generated one
    assert check["classes"][0] == kit and trainer in check["classes"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "rlvr"])
def test_save_kill_poison_resume(verdict, stage):
    found = verdict["checks"]
    assert found[f"{stage}_sigkill"]["exit"] == checks.SIGKILL_EXIT
    assert found[f"{stage}_step_guard"]["last_line"].startswith("error: step 3: the loss is nan")
    assert "checkpoint-2 is kept" in found[f"{stage}_step_guard"]["last_line"]
    exact = found[f"{stage}_resume_exact"]
    assert exact["final_difference"] == 0.0 and exact["noise_at_step"] == 0.0 and exact["same_log"]


@pytest.mark.slow
def test_sft_loss_is_on_the_assistant_turn_under_unsloths_trainer(verdict):
    spans = verdict["checks"]["sft_assistant_only"]["spans"]
    assert len(spans) == 2 and all(s["trained"].endswith("</SOLUTION><|endoftext|>") for s in spans)


@pytest.mark.slow
def test_packing_on_and_off_agree_at_step_1(verdict):
    found = verdict["checks"]
    assert found["rlvr_packing_used"]["on"] is True and found["rlvr_packing_used"]["off"] is None
    assert all(d <= 1e-4 for d in found["rlvr_packing_on_off"]["relative_differences"].values())


# ---------------------------------------------------------------------------------------------- the verdicts
def test_rewrites_verdict_wants_unsloths_functions_and_every_step():
    good = {
        "functions": {
            "training_step": "_unsloth_training_step",
            "_inner_training_loop": "_fast_inner_training_loop",
        },
        "calls": {"training_step": 8, "_inner_training_loop": 1},
        "classes": ["SageGRPOTrainer", "UnslothGRPOTrainer"],
    }
    assert checks.rewrites(good, "UnslothGRPOTrainer", 4, 2)[0]
    plain = {
        **good,
        "functions": {"training_step": "training_step", "_inner_training_loop": "_inner_training_loop"},
    }
    assert not checks.rewrites(plain, "UnslothGRPOTrainer", 4, 2)[0]  # transformers' own: not the GPU path
    assert not checks.rewrites(good, "UnslothGRPOTrainer", 4, 1)[0]  # a micro-step more than asked for
    assert not checks.rewrites({**good, "classes": ["GRPOTrainer"]}, "UnslothGRPOTrainer", 4, 2)[0]


def test_assistant_only_verdict_refuses_a_span_with_the_prompt():
    span = {"one_span": True, "ends_at_last_token": True, "labels_are_ids": True}
    good = {
        **span,
        "before": "What is 2+2?\n\n<start_working_out>",
        "trained": "2+2=4<end_working_out><SOLUTION>4</SOLUTION><|endoftext|>",
    }
    assert checks.assistant_only({"labelled": [good]})[0]
    prompt = {**good, "before": "", "trained": "What is 2+2?\n\n<start_working_out>" + good["trained"]}
    assert not checks.assistant_only({"labelled": [prompt]})[0]
    assert not checks.assistant_only({"labelled": [{**good, "trained": good["trained"][:-13]}]})[
        0
    ]  # no EOS trained
    assert not checks.assistant_only({"labelled": []})[0]


def _adapter(folder: Path, value: float) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.full((2, 2), value)}, str(folder / "adapter_model.safetensors"))
    return folder


def _resumed_case(tmp_path, final: float, killed_at_2: float) -> tuple:
    from sage_unsloth.runtime.training_log import log_line

    uninterrupted, resumed = _adapter(tmp_path / "a", 1.0), _adapter(tmp_path / "b", final)
    _adapter(uninterrupted / "checkpoint-2", 0.5), _adapter(resumed / "checkpoint-2", killed_at_2)
    for folder in (uninterrupted, resumed):
        (folder / "log_history.jsonl").write_text(log_line({"step": 1, "loss": 0.5, "step_time": 3.0}))
    (resumed / "manifest.json").write_text(json.dumps({"resumed_from": "checkpoint-2"}))
    return {"exit": 0}, resumed, uninterrupted, resumed, 2


def test_resume_verdict_is_bitwise_unless_two_fresh_runs_differ(tmp_path):
    assert checks.resumed_exactly(*_resumed_case(tmp_path / "exact", 1.0, 0.5))[0]
    assert not checks.resumed_exactly(*_resumed_case(tmp_path / "off", 1.0 + 1e-6, 0.5))[
        0
    ]  # deterministic, yet off
    assert checks.resumed_exactly(*_resumed_case(tmp_path / "noisy", 1.0 + 1e-6, 0.5 + 1e-6))[0]  # GPU noise
    assert not checks.resumed_exactly(*_resumed_case(tmp_path / "far", 1.1, 0.5 + 1e-6))[0]  # far beyond it


def test_packing_verdict_and_memory_verdict():
    step = {"step": 1, "loss": 0.1, "kl": 0.06, "grad_norm": 0.02}
    step.update({"sage/q_mean": 1.3, "sage/q_min": 1.0, "sage/q_max": 1.4, "sage/frac_boosted": 0.9})
    assert checks.packing_equal([step], [dict(step)], rtol=1e-4)[0]
    assert not checks.packing_equal([step], [{**step, "kl": 0.0601}], rtol=1e-4)[0]
    assert not checks.packing_equal([step], [], rtol=1e-4)[0]
    assert checks.memory({"peak_reserved_gib": 9.0}, 10.0, 80.0)[0] is True
    assert checks.memory({"peak_reserved_gib": 11.0}, 10.0, 80.0)[0] is False  # the doctor under-estimates
    assert checks.memory({"peak_reserved_gib": 11.0}, None, 80.0)[0] is False
    assert checks.memory({"peak_reserved_gib": None}, 10.0, None)[0] is None  # no GPU: skipped


def test_guard_verdict_wants_the_one_line_and_the_kept_checkpoint(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    line = "error: step 3: the loss is nan: ...; checkpoint-2 is kept: fix the cause and continue with --resume true"
    run_ = {"exit": 1, "stderr": "progress\n" + line}
    ok, detail = checks.guarded(run_, tmp_path, 3, 2)
    assert not ok and detail["checkpoints"] == ["checkpoint-2"]  # an empty folder is no complete checkpoint
    assert not checks.guarded({**run_, "exit": 0}, tmp_path, 3, 2)[0]
