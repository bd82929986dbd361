"""Exact resume (sage_unsloth/rlvr/resume.py): a run interrupted and resumed equals the uninterrupted run
bit for bit on CPU: adapter weights, optimizer state and logged metrics.

The scenario is built so that every piece of state a checkpoint used to lose is exercised: the SFT anchor
(two adapters in the checkpoint), 2 optimizer steps per generation batch (steps_per_generation 2), 4
prompts in 2 generation batches per epoch (4 steps), the token guide (noise generator and schedule).
Checkpoints every step; the run lasts 6 steps:

- killed right after checkpoint-5 was written -> resumes from checkpoint-5: inside epoch 1 and inside a
  generation window (the batch generated at step 5 also feeds step 6);
- killed between checkpoints (after step 5's update, before its save) -> resumes from checkpoint-4: an
  epoch and generation-window boundary, step 5 is redone.
"""

import shutil

import pytest
import torch
from rlvr_scenario import (
    adapter_tensors,
    logged_lines,
    logged_steps,
    max_abs_difference,
    optimizer_tensors,
    rlvr_argv,
    train,
)

from sage_unsloth.rlvr.resume import RESUME_STATE_FILE, EpochSeededSampler, last_complete_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("varied_reward")]
VARIANT = "grpo_token"
SCENARIO = [
    "--max_train_rows",
    "20",
    "--generation_batch_size",
    "4",
    "--per_device_train_batch_size",
    "2",
    "--max_steps",
    "6",
    "--save_steps",
    "1",
]  # the first 20 rows hold 4 prompts that fit 160 tokens
LAST, BOUNDARY, INSIDE = 6, 4, 5


@pytest.fixture(scope="module")
def uninterrupted(sft_dir, dapo_sample, tmp_path_factory):
    from rlvr_scenario import text_reward

    from sage_unsloth.rlvr import reward

    with pytest.MonkeyPatch.context() as patch:  # module scope: varied_reward is per test
        patch.setattr(reward, "correctness_reward", text_reward)
        built = train(
            rlvr_argv(VARIANT, sft_dir, tmp_path_factory.mktemp("uninterrupted"), dapo_sample, *SCENARIO)
        )
    return built.plan.output_dir


def _assert_same_run(expected_dir, resumed_dir, checkpoints):
    for name in checkpoints:
        expected, resumed = expected_dir / name, resumed_dir / name
        assert max_abs_difference(adapter_tensors(expected), adapter_tensors(resumed)) == 0.0, name
        assert max_abs_difference(optimizer_tensors(expected), optimizer_tensors(resumed)) == 0.0, name
        assert logged_steps(expected) == logged_steps(resumed), name
    assert (
        max_abs_difference(adapter_tensors(expected_dir), adapter_tensors(resumed_dir)) == 0.0
    )  # final adapter
    # The streamed log: every step once, in order, with the uninterrupted run's values (a killed run's lines
    # after its checkpoint are dropped on resume and logged again). The last line is transformers' summary
    # of the training session: its train_loss averages the steps this session ran, so only its place is equal.
    *steps, summary = logged_lines(resumed_dir)
    *expected_steps, expected_summary = logged_lines(expected_dir)
    assert steps == expected_steps and [line["step"] for line in steps] == list(range(1, LAST + 1))
    assert summary.keys() == expected_summary.keys() and summary["step"] == LAST and "train_loss" in summary


def test_the_scenario_exercises_every_resume_path(uninterrupted):
    """Guard: checkpoint-4 is at an epoch and window boundary, checkpoint-5 inside both, and epoch 1 visits
    the prompts in another order than epoch 0 (else the tests below would pass without testing the sampler
    position or TRL's buffered batch)."""
    import json

    from trl.trainer.utils import RepeatSampler

    epochs = {
        n: json.loads((uninterrupted / f"checkpoint-{n}" / "trainer_state.json").read_text())["epoch"]
        for n in (BOUNDARY, INSIDE)
    }
    assert epochs == {BOUNDARY: 1.0, INSIDE: 1.25}
    state = {
        n: torch.load(
            uninterrupted / f"checkpoint-{n}" / RESUME_STATE_FILE.format(process=0), weights_only=True
        )
        for n in (BOUNDARY, INSIDE)
    }
    assert state[BOUNDARY] == {"step": BOUNDARY, "buffered_inputs": None}
    assert state[INSIDE]["step"] == INSIDE and len(state[INSIDE]["buffered_inputs"]) == 2
    assert (
        uninterrupted / f"checkpoint-{INSIDE}" / "ref" / "adapter_model.safetensors"
    ).is_file()  # 2 adapters
    sampler = RepeatSampler(list(range(4)), mini_repeat_count=2, batch_size=2, repeat_count=2, seed=3407)
    assert list(sampler) != list(sampler)  # the config's seed: epochs 0 and 1 differ


@pytest.fixture(scope="module")
def interrupted(sft_dir, dapo_sample, tmp_path_factory):
    """The same run killed right after checkpoint-5 was written (inside epoch 1 and a generation window)."""
    from rlvr_scenario import text_reward

    from sage_unsloth.rlvr import reward

    root = tmp_path_factory.mktemp("interrupted")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reward, "correctness_reward", text_reward)
        built = train(rlvr_argv(VARIANT, sft_dir, root, dapo_sample, *SCENARIO), stop=(INSIDE, "save"))
    # The killed run kept what it logged: steps 1..5, each once (step 5 is past checkpoint-4).
    assert [line["step"] for line in logged_lines(built.plan.output_dir)] == list(range(1, INSIDE + 1))
    return root, built.plan.output_dir


@pytest.mark.parametrize("resume_from", [INSIDE, BOUNDARY], ids=["after-checkpoint", "between-checkpoints"])
def test_interrupted_and_resumed_run_equals_the_uninterrupted_one(
    resume_from, uninterrupted, interrupted, sft_dir, dapo_sample, tmp_path, capsys
):
    """INSIDE: killed right after checkpoint-5. BOUNDARY: killed after step 5's update but before its save;
    nothing is written between two saves, so that folder is this one without checkpoint-5."""
    root, folder = interrupted
    run_root = tmp_path / "run"
    shutil.copytree(root, run_root)
    run_dir = run_root / folder.relative_to(root)
    for later in range(resume_from + 1, LAST + 1):
        shutil.rmtree(run_dir / f"checkpoint-{later}", ignore_errors=True)
    assert last_complete_checkpoint(run_dir).name == f"checkpoint-{resume_from}"
    capsys.readouterr()
    resumed = train(rlvr_argv(VARIANT, sft_dir, run_root, dapo_sample, *SCENARIO, "--resume"))
    assert f"resuming from checkpoint-{resume_from}" in capsys.readouterr().out
    assert resumed.plan.output_dir == run_dir and resumed.trainer.state.global_step == LAST
    _assert_same_run(uninterrupted, run_dir, [f"checkpoint-{n}" for n in range(resume_from, LAST + 1)])


def test_a_half_written_checkpoint_is_skipped(uninterrupted, tmp_path):
    out = tmp_path / "run"
    for n in (1, 2):
        shutil.copytree(uninterrupted / f"checkpoint-{n}", out / f"checkpoint-{n}")
    (out / "checkpoint-2" / "trainer_state.json").unlink()  # killed while saving: written last
    assert last_complete_checkpoint(out) == out / "checkpoint-1"


def test_epoch_seeded_sampler_replays_the_permutation_sequence_of_one_sampler():
    """Epoch e's order equals the e-th permutation of a sampler that ran e epochs before (TRL's behaviour
    without a resume), whatever the sampler's history."""
    from trl.trainer.utils import RepeatSampler

    def sampler():
        return RepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=3, repeat_count=2, seed=5)

    continuous = sampler()
    epochs = [list(continuous) for _ in range(3)]
    fresh = EpochSeededSampler(sampler())
    for epoch in (2, 0, 1, 2):
        fresh.set_epoch(epoch)
        assert list(fresh) == epochs[epoch]
    assert epochs[0] != epochs[1] != epochs[2]
