"""RLVR on 2 processes through the real launcher: ``accelerate launch --config_file configs/accelerate/ddp.yaml
--num_processes 2`` (DDP over gloo on CPU), the TRL backend, the tiny model.

- On the same global batch, the SAGE loss and the DDP-synced gradients of 2 ranks equal one process's
  (within 1e-6), for grpo + branch (k3) and dapo + branch with the loss-level k2 term.
- The logged q metrics are reduced over ranks (they equal the one-process values, not a rank's own).
- The token and random guides draw different noise on each rank, the same noise on a rerun.
- A 2-rank run resumed from a checkpoint inside an epoch and a generation window equals the uninterrupted one.

Two launches (the uninterrupted run with the fixed-batch steps, then the resumed run); the one-process
references run in this process.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rlvr_scenario import (
    REPO,
    adapter_tensors,
    fixed_batch_step,
    logged_steps,
    max_abs_difference,
    optimizer_tensors,
    rlvr_argv,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("varied_reward")]
DDP_CONFIG = REPO / "configs" / "accelerate" / "ddp.yaml"
# The random tiny model's token entropies lie in [6.530, 6.533]: this gamma / tau spreads the branch q over
# [1, 1.4], so that each rank's own q mean differs from the global one.
BRANCH = ["--guide", '{"name": "branch", "gamma": 200, "tau": 6.531}']
FIXED = {"grpo_branch": BRANCH, "dapo_branch_k2": [*BRANCH, "--kl_term", "k2"]}
RUN = [
    "--max_train_rows",
    "20",
    "--generation_batch_size",
    "8",
    "--per_device_train_batch_size",
    "2",
    "--max_steps",
    "4",
    "--save_steps",
    "1",
]  # 4 prompts = 1 generation batch = 2 steps per epoch
RESUME_FROM = 3  # epoch 1, inside the generation window of steps 3-4


def _fixed_argv(name, sft_dir, out_root, dataset, per_device):
    variant = name.removesuffix("_k2")
    return rlvr_argv(
        variant,
        sft_dir,
        out_root / name,
        dataset,
        *FIXED[name],
        "--generation_batch_size",
        "4",
        "--per_device_train_batch_size",
        str(per_device),
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(out: Path, fixed_argvs, run_argv) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    command = [
        str(bin_dir / "accelerate"),
        "launch",
        "--config_file",
        str(DDP_CONFIG),
        "--num_processes",
        "2",
        "--main_process_port",
        str(_free_port()),
        str(REPO / "tests" / "support" / "rlvr_scenario.py"),
        str(out),
        json.dumps(fixed_argvs),
        json.dumps(run_argv),
    ]
    # ACCELERATE_USE_CPU: without a GPU, TrainingArguments would make every rank a single process.
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "true",
    }
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    (out / "launch.log").write_text(result.stdout + result.stderr)
    first_error = result.stderr.find("Traceback")
    assert result.returncode == 0, result.stderr[first_error : first_error + 6000]
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]


@pytest.fixture(scope="module")
def two_ranks(sft_dir, dapo_sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks")
    fixed = [_fixed_argv(name, sft_dir, root / "fixed", dapo_sample, per_device=2) for name in FIXED]
    run_argv = rlvr_argv("grpo_token", sft_dir, root / "run", dapo_sample, *RUN)
    uninterrupted = _launch(root / "a", fixed, run_argv)

    # A run killed after checkpoint-3: its folder without the later checkpoint and the final files.
    resumed_root = root / "resumed"
    shutil.copytree(root / "run", resumed_root)
    run_dir = Path(uninterrupted[0]["output_dir"])
    resumed_dir = resumed_root / run_dir.relative_to(root / "run")
    for name in ("checkpoint-4", "adapter_model.safetensors", "manifest.json"):
        path = resumed_dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    resumed_argv = rlvr_argv("grpo_token", sft_dir, resumed_root, dapo_sample, *RUN, "--resume")
    resumed = _launch(root / "b", [], resumed_argv)
    return {
        "fixed": [r["fixed"] for r in uninterrupted],
        "noise": [r["noise"] for r in uninterrupted],
        "noise_rerun": [r["noise"] for r in resumed],
        "run_dir": run_dir,
        "resumed_dir": resumed_dir,
        "world": uninterrupted[0]["world"],
    }


@pytest.mark.parametrize("index,name", list(enumerate(FIXED)))
def test_two_ranks_match_one_process_on_the_same_global_batch(
    index, name, two_ranks, sft_dir, dapo_sample, tmp_path
):
    assert two_ranks["world"] == 2
    single = fixed_batch_step(_fixed_argv(name, sft_dir, tmp_path, dapo_sample, per_device=4))
    rank0, rank1 = (two_ranks["fixed"][rank][index] for rank in (0, 1))
    grads = rank0["grads"]
    assert grads and grads.keys() == single["grads"].keys()
    assert all(".ref." not in k for k in grads)
    print(
        f"\n{name}: max |grad(2 ranks) - grad(1 process)| = {max_abs_difference(grads, single['grads']):.3g}, "
        + ", ".join(f"|{k}| diff {abs(rank0[k] - single[k]):.3g}" for k in ("loss", "kl", "sage/q_mean"))
    )
    assert max_abs_difference(grads, single["grads"]) < 1e-6
    assert max(g.abs().max().item() for g in grads.values()) > 1e-3  # a real gradient, not zeros
    for key in ("loss", "kl", "sage/q_mean", "sage/q_min", "sage/q_max", "sage/frac_boosted"):
        assert rank0[key] == rank1[key] == pytest.approx(single[key], abs=1e-6), key
    # Reduced over ranks: the global mean, which neither rank's own q mean is.
    assert abs(rank0["local_q_mean"] - rank1["local_q_mean"]) > 1e-4
    assert single["sage/q_mean"] == pytest.approx(single["local_q_mean"], abs=1e-6)


def test_guides_draw_other_noise_per_rank_and_the_same_on_a_rerun(two_ranks):
    for guide in ("token", "random"):
        first, rerun = two_ranks["noise"], two_ranks["noise_rerun"]
        assert not torch.equal(first[0][guide], first[1][guide]), guide  # same rows, other rank
        for rank in (0, 1):
            assert torch.equal(first[rank][guide], rerun[rank][guide]), (guide, rank)
        assert (first[0][guide] != 1.0).any()


def test_two_rank_run_resumes_exactly(two_ranks):
    run_dir, resumed_dir = two_ranks["run_dir"], two_ranks["resumed_dir"]
    for rank in (0, 1):  # per-process RNG and TRL generation-buffer files
        for name in (f"rng_state_{rank}.pth", f"sage_resume_state_{rank}.pt"):
            assert (run_dir / f"checkpoint-{RESUME_FROM}" / name).is_file(), name
    state = torch.load(run_dir / f"checkpoint-{RESUME_FROM}" / "sage_resume_state_1.pt", weights_only=True)
    assert state["buffered_inputs"] is not None  # the checkpoint is inside a generation window
    for folder in ("checkpoint-4", "."):
        assert (
            max_abs_difference(adapter_tensors(run_dir / folder), adapter_tensors(resumed_dir / folder))
            == 0.0
        )
    assert (
        max_abs_difference(
            optimizer_tensors(run_dir / "checkpoint-4"), optimizer_tensors(resumed_dir / "checkpoint-4")
        )
        == 0.0
    )
    assert logged_steps(run_dir / "checkpoint-4") == logged_steps(resumed_dir / "checkpoint-4")
    manifest = json.loads((resumed_dir / "manifest.json").read_text())
    assert manifest["num_processes"] == 2 and manifest["resumed_from"] == f"checkpoint-{RESUME_FROM}"
