"""Faults while training stop the run before the optimizer step, in one line, and nothing non-finite is written
(issue 41, items 1 and 2): a plug-in that passed its trial call and fails later (sage_unsloth/plugins/calls.py), a
batch or gradient that is not finite for any other reason (sage_unsloth/runtime/finite_steps.py), weights that are no longer
finite when a checkpoint or the final adapter is saved (sage_unsloth/runtime/checkpoints.py, runtime/checkpoint_contents.py).

Each run is the tiny RLVR recipe with a checkpoint every step. Most faults come at step 1 of a 1-step run (the
cheapest run that trains: nothing may be written but the log); one of each kind of stop comes at step 2 of a 2-step
run, so checkpoint-1 is written first and must stay the newest complete checkpoint, named by the line. No file
under the output root may hold a non-finite tensor. Under Unsloth's patched trainer the same guards are checked by
tests/support/unsloth_path_scenario.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from rlvr_scenario import adapter_tensors, rlvr_argv

from sage_unsloth.runtime import checkpoints
from sage_unsloth.runtime.checkpoints import UnsaneCheckpoint
from sage_unsloth.runtime.finite_steps import NonFiniteStep

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("varied_reward")]
RUN = ("--max_steps", "2", "--save_steps", "1", "--max_train_rows", "20")
ONE_STEP = ("--max_steps", "1", "--save_steps", "1", "--max_train_rows", "20")

# Plug-ins that pass their first call (the trial call before loading) and fail from their second (step 1) on, or,
# the *_at_2 ones, from their third (step 2: after checkpoint-1 was written).
LATE = """
import sys
import torch
from sage_unsloth.plugins.kl_terms import KLOutput
from sage_unsloth.plugins.policy_terms import TermOutput

CALLS = {}

def late(name):
    CALLS[name] = CALLS.get(name, 0) + 1
    return CALLS[name] > (2 if name.endswith("_at_2") else 1)

def guide_nan(signals):
    q = 1 + 0.1 * signals.entropies
    return q * float("nan") if late("guide_nan") else q
guide_nan.needs = ("entropies",)

def guide_exit(signals):
    if late("guide_exit"):
        sys.exit(0)
    return 1 + 0.1 * signals.entropies
guide_exit.needs = ("entropies",)

def est_nan_at_2(inputs):
    out = inputs.rewards - inputs.rewards.mean()
    return out * float("nan") if late("est_nan_at_2") else out

def est_nan(inputs):
    out = inputs.rewards - inputs.rewards.mean()
    return out * float("nan") if late("est_nan") else out

def est_absurd(inputs):
    out = inputs.rewards - inputs.rewards.mean()
    return out * 0 + 1e30 if late("est_absurd") else out

def est_short(inputs):
    out = inputs.rewards - inputs.rewards.mean()
    return out[:-1] if late("est_short") else out

def est_list(inputs):
    out = inputs.rewards - inputs.rewards.mean()
    return out.tolist() if late("est_list") else out

def term_nan(batch):
    out = batch.advantages * (float("nan") if late("term_nan") else 1.0)
    return TermOutput(advantages=out)

def kl_nan(tokens):
    d = tokens.ref_logps - tokens.logps
    out = d.exp() - d - 1
    return KLOutput(out * float("nan") if late("kl_nan") else out, out.detach())
"""

CASES = {
    "guide_nan": (("--guide",), r"guide '.*late\.py:guide_nan' at step 1 returned \d+ non-finite q"),
    "guide_exit": (
        ("--guide",),
        r"guide '.*:guide_exit' at step 1 called sys\.exit\(0\) \(late\.py:\d+\)",
    ),
    "est_nan_at_2": (
        ("--advantage_estimator",),
        r"estimator '.*:est_nan_at_2' at step 2 returned 4 non-finite",
    ),
    "est_absurd": (
        ("--advantage_estimator",),
        r"'.*:est_absurd' at step 1 returned advantages of magnitude 1e\+30",
    ),
    "est_short": (
        ("--advantage_estimator",),
        r"'.*:est_short' at step 1 returned advantages of shape \(3,\)",
    ),
    "est_list": (
        ("--advantage_estimator",),
        r"'.*:est_list' at step 1 returned list, not a tensor of advantages",
    ),
    "term_nan": (
        ("--policy_term",),
        r"policy term '.*:term_nan' at step 1 returned \d+ non-finite advantages",
    ),
    "kl_nan": (
        ("--guide", "none", "--kl_term"),
        r"KL term '.*:kl_nan' at step 1 returned \d+ non-finite",
    ),
}


def nonfinite_in_files(root: Path) -> list[str]:
    """Every written tensor file under ``root`` (weights and optimizer states) that holds a non-finite value."""
    from safetensors.torch import load_file

    bad = []
    for path in root.rglob("*.safetensors"):
        if any(not torch.isfinite(t).all() for t in load_file(str(path)).values() if t.is_floating_point()):
            bad.append(str(path))
    for path in root.rglob("optimizer.pt"):
        state = torch.load(path, weights_only=True)["state"]
        values = [v for entry in state.values() for v in entry.values() if torch.is_tensor(v)]
        if any(v.is_floating_point() and not torch.isfinite(v).all() for v in values):
            bad.append(str(path))
    return bad


def _kept(root: Path, step: int) -> Path:
    """The run folder under ``root``: its checkpoints are exactly those of the steps before ``step`` (each complete),
    and neither its final adapter nor its manifest was written."""
    (run_dir,) = {p.parent for p in root.rglob("log_history.jsonl")}
    written = sorted(p.name for p in run_dir.iterdir() if p.name.startswith(("checkpoint-", ".saving-")))
    assert written == [f"checkpoint-{n}" for n in range(1, step)], written
    assert all(checkpoints.checkpoint_problem(run_dir / name) is None for name in written)
    assert not (run_dir / "manifest.json").exists() and not (run_dir / "adapter_model.safetensors").exists()
    return run_dir


@pytest.mark.parametrize("case", list(CASES))
def test_a_plugin_fault_in_training_stops_before_the_step_in_one_line(
    case, sft_dir, dapo_sample, tmp_path, capsys
):
    from sage_unsloth.rlvr.run import main

    plugin = tmp_path / "late.py"
    plugin.write_text(LATE)
    flags, expected = CASES[case]
    step = 2 if case.endswith("_at_2") else 1
    root = tmp_path / "out"
    argv = rlvr_argv(
        "grpo", sft_dir, root, dapo_sample, *(RUN if step == 2 else ONE_STEP), *flags, f"{plugin}:{case}"
    )
    capsys.readouterr()
    assert main(argv) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(expected, errors[0]), errors
    kept = "; checkpoint-1 is kept: fix the cause and continue with --resume" if step == 2 else ""
    assert errors[0].endswith(f"the step was not applied{kept}"), errors[0]
    _kept(root, step)
    assert nonfinite_in_files(root) == []


def test_weights_that_overflow_the_forward_stop_the_run_in_one_line(sft_dir, dapo_sample, tmp_path, capsys):
    """A learning rate of 1e30: step 1's gradients are finite, so it is applied, and the weights it leaves make the
    next rollout sample from NaN probabilities (a torch.multinomial traceback before): one line saying so, no
    advice to resume from checkpoint-1, which holds those weights."""
    from sage_unsloth.rlvr.run import main

    root = tmp_path / "out"
    capsys.readouterr()
    assert main(rlvr_argv("grpo", sft_dir, root, dapo_sample, *RUN, "--learning_rate", "1e30")) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: step 2: sampling its rollout met non-finite next-token probabilities: the policy overflows (the "
        "largest trainable weight is "
    ), errors
    assert "lower the learning rate and start over" in errors[0] and "--resume" not in errors[0]
    assert nonfinite_in_files(root) == []


def _poison_at(trainer, step: int, where: str):
    """A rollout step (appended to the trainer's) that makes the batch's advantages NaN at optimizer step ``step``,
    bypassing every plug-in check: the cause is not a plug-in."""

    def poison(rollout):
        if rollout.context.step == step:
            rollout.output[where] = rollout.output[where] * float("nan")

    return poison


def test_a_nan_batch_from_any_cause_is_never_applied(sft_dir, dapo_sample, tmp_path, monkeypatch):
    from sage_unsloth.rlvr.run import build_stage, parse_args

    built = build_stage(*parse_args(rlvr_argv("grpo", sft_dir, tmp_path, dapo_sample, *RUN)))
    trainer = built.trainer
    trainer.rollout_steps = (*trainer.rollout_steps, _poison_at(trainer, 2, "advantages"))
    with pytest.raises(NonFiniteStep) as caught:
        built.train_and_save()
    message = str(caught.value)
    assert message.startswith(
        "step 2: the loss is nan: non-finite in its batch: advantages (4 of 4, e.g. nan)"
    )
    assert (
        message.endswith("the step was not applied and no checkpoint of it was written")
        and "\n" not in message
    )
    run_dir = _kept(tmp_path, 2)
    # the weights are checkpoint-1's: step 2 never reached the optimizer
    policy = {
        name.replace(".default", ""): p.detach()
        for name, p in trainer.model.named_parameters()
        if ".default." in name and "lora_" in name
    }
    saved = adapter_tensors(run_dir / "checkpoint-1")
    assert saved and all(torch.equal(policy[name], saved[name]) for name in saved)
    assert nonfinite_in_files(tmp_path) == []


def test_non_finite_gradients_with_a_finite_loss_are_never_applied(sft_dir, dapo_sample, tmp_path):
    from sage_unsloth.rlvr.run import build_stage, parse_args

    built = build_stage(*parse_args(rlvr_argv("grpo", sft_dir, tmp_path, dapo_sample, *ONE_STEP)))
    param = next(p for p in built.trainer.model.parameters() if p.requires_grad)
    param.register_hook(lambda g: g * float("inf"))
    with pytest.raises(NonFiniteStep, match=r"^step 1: the loss is finite but 1 of 28 trainable tensors"):
        built.train_and_save()
    _kept(tmp_path, 1)
    assert nonfinite_in_files(tmp_path) == []


def _corrupt_weights_at(step: int):
    """A callback that makes one policy weight NaN after optimizer step ``step`` (before its save): weights that
    went bad for a reason no step guard sees."""
    from transformers import TrainerCallback

    class Corrupt(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == step:
                with torch.no_grad():
                    next(p for n, p in model.named_parameters() if ".default." in n).view(-1)[0] = float(
                        "nan"
                    )

    return Corrupt()


def test_a_checkpoint_holding_a_nan_is_never_written(sft_dir, dapo_sample, tmp_path):
    from sage_unsloth.rlvr.run import build_stage, parse_args

    built = build_stage(*parse_args(rlvr_argv("grpo", sft_dir, tmp_path, dapo_sample, *ONE_STEP)))
    built.trainer.add_callback(_corrupt_weights_at(1))
    with pytest.raises(UnsaneCheckpoint) as caught:
        built.train_and_save()
    assert re.fullmatch(
        r"checkpoint-1 was not written: adapter_model\.safetensors holds 1 non-finite tensors of 28 \(first: .*\)",
        str(caught.value),
    ), caught.value
    _kept(tmp_path, 1)
    assert nonfinite_in_files(tmp_path) == []


def test_a_final_adapter_holding_a_nan_is_never_written(sft_dir, dapo_sample, tmp_path):
    from sage_unsloth.rlvr.run import build_stage, parse_args

    argv = rlvr_argv("grpo", sft_dir, tmp_path, dapo_sample, "--max_steps", "1", "--save_strategy", "no")
    built = build_stage(*parse_args(argv))
    built.trainer.add_callback(_corrupt_weights_at(1))
    with pytest.raises(
        UnsaneCheckpoint, match=r"^the final adapter was not written to .*: the policy adapter holds 1"
    ):
        built.train_and_save()
    assert list(tmp_path.rglob("*.safetensors")) == [] and list(tmp_path.rglob("manifest.json")) == []


def test_sft_never_applies_a_non_finite_step(tiny_model_dir, benchmark_dir, tmp_path, monkeypatch):
    """The same guard over stage 1's trainer: a NaN loss at step 1 stops the run; nothing is written."""
    import trl
    from test_sft import build_sft_output

    compute_loss = trl.SFTTrainer.compute_loss

    def nan_loss(self, *args, **kwargs):
        out = compute_loss(self, *args, **kwargs)
        return (out[0] * float("nan"), *out[1:]) if isinstance(out, tuple) else out * float("nan")

    monkeypatch.setattr(trl.SFTTrainer, "compute_loss", nan_loss)
    with pytest.raises(
        NonFiniteStep, match=r"^step 1: the loss is nan: its batch is finite, so the model's forward"
    ):
        build_sft_output(tmp_path, tiny_model_dir, benchmark_dir, "--max_steps", 1, n_rows=2)
    assert list((tmp_path / "sft").rglob("*.safetensors")) == []
