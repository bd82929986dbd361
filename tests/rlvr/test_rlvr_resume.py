"""Exact resume (sage_unsloth/rlvr/resume.py): a run interrupted and resumed equals the uninterrupted run
bit for bit on CPU: adapter weights, optimizer state and logged metrics.

The scenario is built so that every piece of state a checkpoint used to lose is exercised: the SFT anchor
(two adapters in the checkpoint), 2 optimizer steps per generation batch (steps_per_generation 2), 4
prompts in 2 generation batches per epoch (4 steps), the token guide (noise generator and schedule).
Checkpoints every step; the run lasts 6 steps. One run is SIGKILLed in its own process during its final
save; each phase of a run is that folder without what was written after it, resumed in-process:

- mid-interval (after step 5's update, before its save) -> resumes from checkpoint-4: an epoch and
  generation-window boundary, step 5 is redone;
- right after checkpoint-5 was written -> inside epoch 1 and inside a generation window (the batch
  generated at step 5 also feeds step 6);
- after the last checkpoint (checkpoint-6 = max_steps) and during the final save -> nothing more is
  trained (transformers ran a 7th step here), only the final outputs are written.
"""

import json
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

from sage_unsloth.rlvr.resume import RESUME_STATE_FILE, EpochSeededSampler
from sage_unsloth.runtime.checkpoints import last_complete_checkpoint

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
    # after its checkpoint are dropped on resume and logged again). The last line is transformers' summary of
    # the run: its train_loss is the mean over the whole run, as uninterrupted (it used to average only the
    # steps of the resumed session over all the run's steps: 0.00276 against 0.00329 in issue 42).
    *steps, summary = logged_lines(resumed_dir)
    *expected_steps, expected_summary = logged_lines(expected_dir)
    assert steps == expected_steps and [line["step"] for line in steps] == list(range(1, LAST + 1))
    assert summary == expected_summary and summary["step"] == LAST and summary["train_loss"] != 0.0
    assert max(line["step"] for line in logged_lines(resumed_dir)) == LAST


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
def killed(sft_dir, dapo_sample, tmp_path_factory):
    """The same run in its own process, SIGKILLed during its final save (rlvr_scenario.py --kill-in-final-save):
    every checkpoint written, the final adapter too, no manifest."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from rlvr_scenario import KILL, REPO

    root = tmp_path_factory.mktemp("killed")
    argv = rlvr_argv(VARIANT, sft_dir, root, dapo_sample, *SCENARIO)
    script = str(REPO / "tests" / "support" / "rlvr_scenario.py")
    result = subprocess.run(
        [sys.executable, script, KILL, json.dumps(argv)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-4000:]
    (folder,) = [p.parent for p in root.rglob("checkpoint-1")]
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == [
        f"checkpoint-{n}" for n in range(1, LAST + 1)
    ]
    assert (folder / "adapter_model.safetensors").is_file() and not (folder / "manifest.json").exists()
    return root, folder


# Each phase of a run, as the folder a kill there leaves: the killed run's folder without what was written
# after that point. Between two saves nothing is written but log lines (a resume rewrites the log from its
# checkpoint); the final save writes the files beside the checkpoints.
PHASES = {
    "mid-interval": BOUNDARY,  # after step 5's update, before its checkpoint: resumes from checkpoint-4
    "right-after-a-checkpoint": INSIDE,  # inside epoch 1 and a generation window
    "after-the-last-checkpoint": LAST,  # every step done, nothing of the final save written
    "during-the-final-save": None,  # as killed: the final adapter written, no manifest
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_run_killed_in_any_phase_resumes_to_the_uninterrupted_run(
    phase, uninterrupted, killed, sft_dir, dapo_sample, tmp_path, capsys
):
    root, folder = killed
    run_root = tmp_path / "run"
    shutil.copytree(root, run_root)
    run_dir = run_root / folder.relative_to(root)
    if PHASES[phase] is not None:
        for path in run_dir.iterdir():
            later = path.name.startswith("checkpoint-") and int(path.name.split("-")[1]) > PHASES[phase]
            if later or not (path.name.startswith("checkpoint-") or path.name == "log_history.jsonl"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    resume_from = PHASES[phase] or LAST
    assert last_complete_checkpoint(run_dir).name == f"checkpoint-{resume_from}"
    capsys.readouterr()
    resumed = train(rlvr_argv(VARIANT, sft_dir, run_root, dapo_sample, *SCENARIO, "--resume"))
    assert f"resuming from checkpoint-{resume_from}" in capsys.readouterr().out
    assert resumed.plan.output_dir == run_dir and resumed.trainer.state.global_step == LAST
    # never a step past max_steps (transformers resumed checkpoint-6 into a 7th step)
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == [
        f"checkpoint-{n}" for n in range(1, LAST + 1)
    ]
    _assert_same_run(uninterrupted, run_dir, [f"checkpoint-{n}" for n in range(resume_from, LAST + 1)])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["global_step"] == LAST and manifest["resumed_from"] == f"checkpoint-{resume_from}"


def test_resume_on_a_finished_run_says_so_and_changes_nothing(
    uninterrupted, sft_dir, dapo_sample, tmp_path, capsys
):
    """--resume on a run whose manifest is written and whose steps are all done: exit 0, one line saying so, every
    file as it was (it used to train nothing, then rewrite log_history with train_loss 0.0 and the manifest)."""
    import hashlib
    import os

    from sage_unsloth.rlvr.run import main

    run_root = tmp_path / "run"
    shutil.copytree(uninterrupted.parent.parent, run_root)  # <root>/<model>/<variant>

    def snapshot():
        return {
            p: (hashlib.sha256(p.read_bytes()).hexdigest(), os.stat(p).st_mtime_ns)
            for p in sorted(run_root.rglob("*"))
            if p.is_file()
        }

    before = snapshot()
    capsys.readouterr()
    assert main(rlvr_argv(VARIANT, sft_dir, run_root, dapo_sample, *SCENARIO, "--resume")) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].endswith(
        f"holds a finished run (step {LAST}, manifest.json): nothing to resume, nothing was changed; to train "
        f"further pass a --max_steps above {LAST}"
    ), out
    assert snapshot() == before


def _as_from_a_terminal() -> None:
    """The child starts as from a terminal: SIGINT handled and not blocked (an ignored or blocked SIGINT, which
    a child inherits across exec from whatever ran before in this worker, would swallow the Ctrl-C)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_ends_in_one_line_that_says_how_to_resume(sft_dir, dapo_sample, tmp_path):
    """SIGINT (Ctrl-C) to a real stage-2 process once it has a checkpoint: exit 130 and one line naming the
    command that continues it, no KeyboardInterrupt traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from rlvr_scenario import REPO

    argv = rlvr_argv("grpo", sft_dir, tmp_path, dapo_sample, "--max_steps", "500", "--save_steps", "1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sage_unsloth.rlvr", *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,  # noqa: PLW1509 - signal calls only
    )
    from sage_unsloth.runtime.checkpoints import STAGING_PREFIX

    def saved() -> list:
        """checkpoint-1 in place, not its staging copy (.saving-checkpoint-1/checkpoint-1), which holds
        trainer_state.json before its check and rename: a Ctrl-C then finds no complete checkpoint yet."""
        found = tmp_path.rglob("checkpoint-1/trainer_state.json")
        return [p for p in found if not p.parent.parent.name.startswith(STAGING_PREFIX)]

    deadline = time.monotonic() + 300
    while not saved() and proc.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint-1 after 300 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("sage-unsloth rlvr: interrupted (Ctrl-C); ") and "/checkpoint-" in last, last
    assert last.endswith(" is kept: continue with sage-unsloth rlvr " + " ".join([*argv, "--resume"])), last


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
