"""Checkpoints are complete or skipped (sage_unsloth/runtime/checkpoints.py), in SFT and RLVR alike.

One tiny SFT run with a checkpoint every step gives real checkpoint folders; each case copies them and damages
the newest one the way a full disk does (a file cut short), then checks the resume rule of each stage: the
newest complete checkpoint is resumed from, the damaged one is named as skipped with the reason, and a folder
with only damaged checkpoints is refused with --restart true as the advice (never --resume) and restarted
with it.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from test_sft import build_sft_output, sft_argv

from sage_unsloth.runtime import checkpoints
from sage_unsloth.sft.run import parse_args, prepare_sft

pytestmark = pytest.mark.slow
STEPS = ("--max_steps", 2, "--save_strategy", "steps", "--save_steps", 1)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dir, benchmark_dir) -> Path:
    return build_sft_output(tmp_path_factory.mktemp("ckpt"), tiny_model_dir, benchmark_dir, *STEPS, n_rows=2)


def _cut(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _rewrite_adapter(ckpt: Path, change) -> None:
    """The adapter's tensors changed in place and written back whole (an intact header: only the contents lie)."""
    from safetensors.torch import load_file, save_file

    path = ckpt / "adapter_model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _first(tensors: dict, part: str):
    return tensors[next(name for name in sorted(tensors) if part in name)]


def _nan_moment(ckpt: Path) -> None:
    import torch

    saved = torch.load(ckpt / "optimizer.pt", weights_only=True)
    next(iter(saved["state"].values()))["exp_avg"].view(-1)[0] = float("nan")
    torch.save(saved, ckpt / "optimizer.pt")


DAMAGE = {
    "trainer_state": lambda ckpt: _cut(ckpt / "trainer_state.json"),
    "adapter": lambda ckpt: _cut(ckpt / "adapter_model.safetensors", 0.9),
    "optimizer": lambda ckpt: _cut(ckpt / "optimizer.pt", 0.9),
    "rng": lambda ckpt: [p.unlink() for p in ckpt.glob("rng_state*.pth")],
    # issue 42, item 4: whole files whose contents are not sane
    "nan_adapter": lambda ckpt: _rewrite_adapter(
        ckpt, lambda t: _first(t, "lora_B").view(-1).__setitem__(0, float("nan"))
    ),
    "zero_lora_b": lambda ckpt: _rewrite_adapter(
        ckpt, lambda t: [v.zero_() for k, v in t.items() if ".lora_B." in k]
    ),
    "nan_optimizer": _nan_moment,
}
REASON = {
    "trainer_state": "trainer_state.json is truncated",
    "adapter": "adapter_model.safetensors is truncated",
    "optimizer": "optimizer.pt is truncated",
    "rng": "no rng_state file",
    "nan_adapter": "adapter_model.safetensors holds 1 non-finite tensors of 28",
    "zero_lora_b": "every lora_B tensor of adapter_model.safetensors is zero after 2 steps",
    "nan_optimizer": "optimizer.pt holds 1 non-finite tensors",
}
CONTENTS = ["nan_adapter", "zero_lora_b", "nan_optimizer"]


def _copy_checkpoints(finished: Path, into: Path, steps=(1, 2)) -> Path:
    for n in steps:
        shutil.copytree(finished / f"checkpoint-{n}", into / f"checkpoint-{n}")
    return into


def test_a_whole_checkpoint_is_complete_and_no_staging_folder_is_left(finished):
    assert [p.name for p in checkpoints.checkpoints_newest_first(finished)] == [
        "checkpoint-2",
        "checkpoint-1",
    ]
    for ckpt in checkpoints.checkpoints_newest_first(finished):
        assert checkpoints.checkpoint_problem(ckpt) is None, ckpt
    assert not list(finished.glob(f"{checkpoints.STAGING_PREFIX}*"))  # renamed when whole


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_each_damaged_file_makes_a_checkpoint_incomplete(damage, finished, tmp_path):
    ckpt = _copy_checkpoints(finished, tmp_path, steps=(2,)) / "checkpoint-2"
    DAMAGE[damage](ckpt)
    assert REASON[damage] in checkpoints.checkpoint_problem(ckpt)


def test_a_truncated_adapter_outside_a_checkpoint_is_named():
    assert checkpoints.safetensors_problem("/nonexistent/adapter_model.safetensors").endswith("is missing")


@pytest.mark.parametrize("damage", ["trainer_state", "adapter", *CONTENTS])
def test_sft_resumes_from_the_newest_complete_checkpoint_and_says_what_it_skipped(
    damage, finished, tmp_path, tiny_model_dir, caplog
):
    out = _copy_checkpoints(finished, tmp_path / "sft")
    DAMAGE[damage](out / "checkpoint-2")
    data = finished.parent / "sft_rows.jsonl"
    with pytest.raises(
        FileExistsError, match="pass --resume true"
    ):  # a complete one exists: resume is the advice
        prepare_sft(*parse_args(sft_argv(tiny_model_dir, data, out, *STEPS)))
    with caplog.at_level(logging.WARNING):
        plan = prepare_sft(*parse_args(sft_argv(tiny_model_dir, data, out, *STEPS, "--resume", "true")))
    assert plan.checkpoint == str(out / "checkpoint-1")
    assert "checkpoint-2 is incomplete" in caplog.text and REASON[damage] in caplog.text


def test_sft_with_only_incomplete_checkpoints_is_restarted_with_one_flag(finished, tmp_path, tiny_model_dir):
    out = _copy_checkpoints(finished, tmp_path / "sft")
    DAMAGE["trainer_state"](out / "checkpoint-2")
    DAMAGE["adapter"](out / "checkpoint-1")
    data = finished.parent / "sft_rows.jsonl"
    for extra in ((), ("--resume", "true")):  # neither says "pass --resume" (the trap)
        with pytest.raises(FileExistsError) as caught:
            prepare_sft(*parse_args(sft_argv(tiny_model_dir, data, out, *STEPS, *extra)))
        message = str(caught.value)
        assert "--restart true" in message and "--resume" not in message and "\n" not in message
        assert "checkpoint-2: trainer_state.json is truncated" in message
    plan = prepare_sft(*parse_args(sft_argv(tiny_model_dir, data, out, *STEPS, "--restart", "true")))
    assert plan.checkpoint is None and not list(out.glob("checkpoint-*"))


def test_an_sft_resume_past_a_truncated_checkpoint_trains_to_the_end(finished, tmp_path, tiny_model_dir):
    """Not only planned: the run resumes from checkpoint-1 (today it resumed from the damaged checkpoint-2 and
    crashed) and rewrites checkpoint-2 whole."""
    from sage_unsloth.sft.run import run_sft

    out = _copy_checkpoints(finished, tmp_path / "sft")
    DAMAGE["adapter"](out / "checkpoint-2")
    data = finished.parent / "sft_rows.jsonl"
    run_sft(*parse_args(sft_argv(tiny_model_dir, data, out, *STEPS, "--resume", "true")))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed_from"] == "checkpoint-1" and manifest["train"]["global_step"] == 2
    assert checkpoints.checkpoint_problem(out / "checkpoint-2") is None


# ------------------------------------------------------------------------------------------------ RLVR
def _rlvr_plan(sft_dir, out_root, dataset, *extra):
    from rlvr_scenario import rlvr_argv

    from sage_unsloth.rlvr.run import parse_args as rlvr_parse
    from sage_unsloth.rlvr.run import plan_run

    grpo, stage, model, config = rlvr_parse(rlvr_argv("grpo", sft_dir, out_root, dataset, *extra))
    return plan_run(grpo, stage, model, config)


def _rlvr_output(sft_dir, out_root, dataset) -> Path:
    """The output folder stage 2 plans for these arguments (nothing there yet)."""
    return Path(_rlvr_plan(sft_dir, out_root, dataset).output_dir)


@pytest.fixture(scope="module")
def rlvr_run(sft_dir, dapo_sample, tmp_path_factory) -> Path:
    """A 2-step RLVR run on the tiny model with a checkpoint each step (the text reward: no grader)."""
    from rlvr_scenario import rlvr_argv, text_reward, train

    from sage_unsloth.rlvr import reward

    root = tmp_path_factory.mktemp("rlvr")
    extra = ("--max_train_rows", "20", "--max_steps", "2", "--save_steps", "1")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reward, "correctness_reward", text_reward)
        built = train(rlvr_argv("grpo", sft_dir, root, dapo_sample, *extra))
    return Path(built.plan.output_dir)


@pytest.mark.parametrize("damage", ["trainer_state", "adapter", *CONTENTS])
def test_rlvr_resumes_from_the_newest_complete_checkpoint(
    damage, rlvr_run, sft_dir, dapo_sample, tmp_path, caplog
):
    assert not list(rlvr_run.glob(f"{checkpoints.STAGING_PREFIX}*"))
    for ckpt in checkpoints.checkpoints_newest_first(rlvr_run):
        assert checkpoints.checkpoint_problem(ckpt) is None, ckpt
    out = _rlvr_output(sft_dir, tmp_path, dapo_sample)
    _copy_checkpoints(rlvr_run, out)
    DAMAGE[damage](out / "checkpoint-2")
    with caplog.at_level(logging.WARNING):
        plan = _rlvr_plan(sft_dir, tmp_path, dapo_sample, "--resume", "true")
    assert plan.resume_from == str(out / "checkpoint-1")
    assert "checkpoint-2 is incomplete" in caplog.text and REASON[damage] in caplog.text


@pytest.mark.parametrize("damage", ["nan_adapter", "zero_lora_b"])
def test_an_rlvr_resume_past_an_unsane_checkpoint_ends_where_the_uninterrupted_run_did(
    damage, rlvr_run, sft_dir, dapo_sample, tmp_path, varied_reward
):
    """Not only planned (today --resume resumed from the NaN / all-zero checkpoint-2 and exited 0 with that adapter):
    the run continues from checkpoint-1, rewrites checkpoint-2 sane, and its final adapter is the uninterrupted
    run's, bit for bit."""
    from rlvr_scenario import adapter_tensors, max_abs_difference, rlvr_argv, train

    out = _rlvr_output(sft_dir, tmp_path, dapo_sample)
    _copy_checkpoints(rlvr_run, out)
    DAMAGE[damage](out / "checkpoint-2")
    extra = ("--max_train_rows", "20", "--max_steps", "2", "--save_steps", "1", "--resume")
    built = train(rlvr_argv("grpo", sft_dir, tmp_path, dapo_sample, *extra))
    assert built.plan.resume_from == str(out / "checkpoint-1")
    assert checkpoints.checkpoint_problem(out / "checkpoint-2") is None
    assert max_abs_difference(adapter_tensors(out), adapter_tensors(rlvr_run)) == 0.0


def test_rlvr_with_only_incomplete_checkpoints_is_restarted_with_one_flag(
    rlvr_run, sft_dir, dapo_sample, tmp_path
):
    out = _rlvr_output(sft_dir, tmp_path, dapo_sample)
    _copy_checkpoints(rlvr_run, out)
    for n in (1, 2):
        DAMAGE["trainer_state"](out / f"checkpoint-{n}")
    for extra in ((), ("--resume", "true")):  # today: "start without --resume" / "pass --resume"
        with pytest.raises(FileExistsError) as caught:
            _rlvr_plan(sft_dir, tmp_path, dapo_sample, *extra)
        assert "--restart true" in str(caught.value) and "--resume" not in str(caught.value)
    plan = _rlvr_plan(sft_dir, tmp_path, dapo_sample, "--restart", "true")
    assert plan.resume_from is None and not list(out.glob("checkpoint-*"))


def test_an_interrupted_save_leaves_no_checkpoint(finished, tmp_path, tiny_model_dir, monkeypatch):
    """A save that dies half-way (here: after the weights, before the optimizer) leaves only the staging
    folder, which no resume looks at; a save that runs out of room is one line naming the folder and the free
    space, and removes what it wrote."""
    import errno

    from transformers import Trainer

    from sage_unsloth.sft.run import run_sft

    def no_room(self, output_dir):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", no_room)
    out = tmp_path / "sft"
    data = finished.parent / "sft_rows.jsonl"
    with pytest.raises(checkpoints.CheckpointSaveError) as caught:
        run_sft(*parse_args(sft_argv(tiny_model_dir, data, out, *STEPS)))
    message = str(caught.value)
    assert "checkpoint-1" in message and str(out) in message and "MiB free" in message and "\n" not in message
    assert not list(out.glob("checkpoint-*")) and not list(out.glob(f"{checkpoints.STAGING_PREFIX}*"))


def test_a_file_size_limit_during_a_save_is_one_line_naming_the_folder(finished, tmp_path, tiny_model_dir):
    """The issue's case through the CLI: under ``ulimit -f`` the save fails part-way (torch: "unexpected pos");
    stage 1 prints one line naming the folder and its free space, exit 2, and leaves no checkpoint-N."""
    import resource
    import signal

    from subprocess_run import REPO, env_with_repo, run_python

    out = tmp_path / "sft"
    argv = sft_argv(tiny_model_dir, finished.parent / "sft_rows.jsonl", out, *STEPS)

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))

    done = run_python(
        ["-m", "sage_unsloth.sft", *argv],
        cwd=REPO,
        env=env_with_repo(),
        preexec_fn=limit_file_size,
        timeout=900,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert last.startswith("error: saving checkpoint-1 into ") and str(out) in last and "MiB free" in last, (
        last
    )
    assert not list(out.glob("checkpoint-*")) and not list(out.glob(f"{checkpoints.STAGING_PREFIX}*"))


def test_a_token_given_as_a_flag_reaches_no_written_file(finished, tmp_path, tiny_model_dir, monkeypatch):
    """--hub_token SECRET123 (and the W&B run, offline): no file the run writes holds it, the pickled
    training_args.bin of each checkpoint included; the token is in the environment for the Hub client."""
    import os
    import sys

    from sage_unsloth.sft.run import run_sft

    secret = "SECRET123"
    out, wandb_dir = tmp_path / "sft", tmp_path / "wandb"
    wandb_dir.mkdir()
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    argv = sft_argv(tiny_model_dir, finished.parent / "sft_rows.jsonl", out, *STEPS)
    argv += ["--hub_token", secret, "--report_to", "wandb"]
    monkeypatch.setattr(sys, "argv", ["sage-unsloth", "sft", *argv])  # what W&B records as the command
    sft_args, model_args = parse_args(argv)
    assert sft_args.hub_token is None and os.environ["HF_TOKEN"] == secret
    run_sft(sft_args, model_args)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "training_args.bin" for p in written) and any(p.suffix == ".wandb" for p in written)
    leaks = [str(p) for p in written if secret.encode() in p.read_bytes()]
    assert leaks == []


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),  # torch.save
        Exception("Error while serializing: I/O error: File too large (os error 27)"),  # safetensors
    ],
)
def test_every_writer_s_out_of_room_error_is_recognised(error, tmp_path):
    """The three ways the writers of a checkpoint report a full disk or ``ulimit -f`` (measured on their pins)."""
    line = checkpoints.out_of_room_line(error, tmp_path)
    assert line is not None and str(tmp_path) in line and "MiB free" in line
    assert checkpoints.out_of_room_line(ValueError("a bug"), tmp_path) is None
