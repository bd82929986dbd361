"""Branch q inside Unsloth's patched GRPO loss (sage_unsloth/rlvr/unsloth_hooks.py), on Unsloth 2026.10.9's
generated trainer forced onto the CPU. tests/support/unsloth_path_scenario.py runs once in its own interpreter (the
forced patching stays for the process) and every test reads its result.

Checked against the equations (an unpadded forward of each row, placed in Unsloth's left-packed layout): the
KL Unsloth logs is k3 against ref + log q(H) of the current policy, on every micro-batch; with q == 1 the hook
leaves Unsloth's loss, gradients and forward count exactly as plain GRPO's; the contact point is where the
kit expects it; a loss that never hands the entropies over raises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = Path(__file__).parents[1].joinpath("support", "unsloth_path_scenario.py")


@pytest.fixture(scope="module")
def result(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("unsloth_path")
    # cwd = out: Unsloth writes its unsloth_compiled_cache/ there, not into the repository.
    done = subprocess.run(
        [sys.executable, str(SCENARIO), str(tiny_model_dir), str(out)],
        cwd=out,
        check=False,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads((out / "result.json").read_text())


@pytest.mark.slow
def test_q_comes_from_the_loss_forward_of_the_current_policy(result):
    run = result["in_loss"]
    # the one SAGE trainer class (its Unsloth tap included) and the two checkpoint mixins over Unsloth's class
    assert "UnslothGRPOTrainer" in run["mro"], run["mro"]
    base = run["mro"].index("UnslothGRPOTrainer")
    assert run["mro"][1:base] == ["SageTrainerMixin", "ExactResumeMixin", "CheckpointMixin"], run["mro"]
    assert run["q_in_loss"] and run["extra_passes"] == 0  # no policy pass of the kit's own
    assert run["rollouts"] == 1 and len(run["calls"]) == 2  # num_iterations 2: one rollout, two losses
    for call in run["calls"]:
        assert call["kl"] == pytest.approx(call["want_kl"], rel=1e-5)
        assert call["q_mean"] == pytest.approx(call["want_q_mean"], rel=1e-5)
        assert call["q_max"] == pytest.approx(call["want_q_max"], rel=1e-5)
        assert call["ref_untouched"] and call["ref_is_the_rollouts"] and call["quantile_restored"]
    first, second = run["calls"]
    assert 0 < first["frac_boosted"] < 1 and first["frac_clipped"] > 0  # q = 1, in between, clipped
    # The second loss re-scores the same rollout after an optimizer step: its q is the updated policy's
    # (a q frozen at rollout would repeat the first one).
    assert abs(second["q_mean"] - first["q_mean"]) > 0.05


@pytest.mark.slow
def test_hook_with_q_one_leaves_unsloths_loss_unchanged(result):
    neutral = result["neutral"]
    assert neutral["advantages_nonzero"]
    for case in ("plain", "user_quantile"):
        run = neutral[case]
        assert run["loss_on"] == run["loss_off"], case
        assert run["max_grad_diff"] == 0.0 and run["grad_scale"] > 1e-3, case
        assert run["forwards_on"] == run["forwards_off"] == 1, case  # one policy forward, as plain GRPO
    # A user's own top_entropy_quantile still masks the policy term (the hook returns TRL's mask then).
    assert neutral["user_mask_changes_loss"] > 1e-3


@pytest.mark.slow
def test_loss_without_the_hook_call_raises(result):
    assert result["loud"]["raised"], result["loud"]
    assert "get_high_entropy_mask" in result["loud"]["message"] and "2026.10.9" in result["loud"]["message"]


@pytest.mark.slow
def test_no_non_finite_step_is_applied_under_unsloths_trainer(result):
    """The step guard and the plug-in contract hold on Unsloth's patched trainer and loss too: a NaN batch from no
    plug-in, and an estimator plug-in turning NaN in training, stop step 1 before its optimizer step."""
    guards = result["guards"]
    assert guards["patched"] == "UnslothGRPOTrainer"
    poisoned, plugin = guards["poisoned"], guards["plugin"]
    assert poisoned["raised"] and poisoned["raised"].startswith(
        "step 1: the loss is nan: non-finite in its batch: advantages"
    ), poisoned
    assert plugin["raised"] and plugin["raised"].startswith(
        "advantage estimator 'late_estimator.py:late_nan' at step 1 returned "
    ), plugin
    assert "non-finite advantages" in plugin["raised"]
    assert poisoned["unchanged"] and plugin["unchanged"]


@pytest.mark.slow
def test_contact_point_in_unsloth_zoo(result):
    """unsloth_zoo 2026.10.9 reads args.top_entropy_quantile, hands the entropies to
    trainer.get_high_entropy_mask, then reads the reference: re-check on every Unsloth bump."""
    assert result["contact"] == {"order": True, "calls_trainer": True}


def test_gpu_unsloth_config_expects_branch_q_in_the_loss_and_warns_for_the_token_guide(tmp_path, monkeypatch):
    """The 7B presets' batch (generation 16, per device 8: steps_per_generation 2 > GA 1) under Unsloth on a GPU:
    the branch guide no longer warns (q in the loss); the token guide, still at rollout, does."""
    import warnings

    from sage_unsloth.rlvr import config as rlvr_config

    monkeypatch.setattr(rlvr_config, "_cuda_available", lambda: True)
    from unsloth_cpu import unsloth_config_fields

    common = unsloth_config_fields(tmp_path, per_device_train_batch_size=8, generation_batch_size=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        branch = rlvr_config.SageGRPOConfig(**common, guide="branch")
    assert branch.expected_q_source == "loss" and branch.steps_per_generation == 2
    with pytest.warns(UserWarning, match="rollout policy"):
        token = rlvr_config.SageGRPOConfig(**common, guide="token")
    assert token.expected_q_source == "rollout"


@pytest.mark.slow
def test_loss_contact_check_catches_each_change(result):
    """compat.check_unsloth_loss (run when each trainer above was built, every method) passes Unsloth 2026.10.9's
    generated trainer, and names the path when any one of them is gone from a copy of its source."""
    from sage_unsloth import compat

    contact = result["loss_contact"]
    source, helper = Path(contact["file"]).read_text(), contact["helper"]
    assert contact["problem"] is None and compat.unsloth_loss_problem(source, helper) is None
    functions = compat._functions(source)
    for what, function, text in compat.UNSLOTH_LOSS_PATHS:
        body = next(b for b in functions[function] if text in b)
        # a call of another name in its place, so that the source still parses
        gone = {")": "_sage_removed()", "(": "_sage_removed("}.get(text[-1], '_sage_removed(""')
        broken = source.replace(body, body.replace(text, gone))
        assert what in (compat.unsloth_loss_problem(broken, helper) or ""), what
    loss = next(b for b in functions["grpo_accumulated_loss"] if "UnslothEfficientGRPO.apply(" in b)
    early = loss.replace(":\n", ":\n    UnslothEfficientGRPO.apply(None)\n", 1)  # the reference used first
    assert "before" in compat.unsloth_loss_problem(source.replace(loss, early), helper)
    silent = helper.replace(compat.UNSLOTH_ENTROPY_HELPER[1], "_sage_removed(")
    assert "get_high_entropy_mask" in compat.unsloth_loss_problem(source, silent)
