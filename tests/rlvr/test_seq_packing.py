"""Unsloth's GRPO sequence packing (on by default: one varlen forward of every row, scattered back to Unsloth's
(B, C + max_left_pad) layout) under the SAGE trainer, with Unsloth's GPU-only rewrites forced onto the CPU:
tests/support/seq_packing_scenario.py runs once in its own interpreter; each test reads its result.

The tokenizer's pad is distinct from its EOS, as Unsloth's loader makes it (the stages' stand-in does the same). With
packing on and off on one rollout batch (policy != reference, completions of unequal lengths): Unsloth's packed and
padded reference scorers agree at every token its loss scores; the branch q the kit computes from the entropies
Unsloth's loss hands over is the same per token, and so are the loss, the logged KL and the gradients, for the branch
and the random guide; packing really ran (the decoder got packed_seq_lengths) only when on. From the equations (an
unpadded forward per row, with Unsloth's definition of the tokens it scores): the loss and the KL Unsloth logs, and
what its loss function receives token for token: log pi_theta, and log pi_ref + log q with the kit's q (the random
guide's placed at rollout by compat.to_unsloth_layout, the branch guide's put in by the kit's hook)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from subprocess_run import env_with_repo, run

SCENARIO = Path(__file__).parents[1].joinpath("support", "seq_packing_scenario.py")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("seq_packing")
    # cwd = out: Unsloth writes its unsloth_compiled_cache/ there, not into the repository.
    done = run(
        [sys.executable, str(SCENARIO), str(tiny_model_dir), str(out)],
        cwd=out,
        env=env_with_repo(),
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("guide", ["branch", "random"])
def test_packing_on_and_off_give_the_same_loss_kl_and_gradients(result, guide):
    case = result[guide]
    assert case["packed_forwards"][0] >= 1 and case["packed_forwards"][1] == 0, case["packed_forwards"]
    assert case["verified"] is True and case["unequal_lengths"] > 1  # rows end at different lengths
    (loss_on, loss_off), (kl_on, kl_off) = case["loss"], case["kl"]
    assert loss_on == pytest.approx(loss_off, rel=1e-5) and kl_on == pytest.approx(kl_off, rel=1e-5)
    assert kl_on > 0.1  # the policy is away from the reference: a misplaced token would move it
    assert case["grad_max_diff"] <= 1e-5 * case["grad_scale"]


def test_branch_q_is_the_same_token_for_token(result):
    case = result["branch"]
    assert case["q_max_diff"] < 5e-4  # q = 1 + 20 relu(H - tau): float32 entropies differ by ~1e-6
    low, high = case["q_range"]
    assert (
        low < 1.05 and high == pytest.approx(1.4) and case["q_between"] > 0.5
    )  # q varies: placement matters


def test_rollout_q_sits_on_each_rows_completion_in_the_packed_reference(result):
    assert result["random"]["shifted_reference_gap"] < 1e-5


def test_the_pad_is_not_the_eos_as_unsloths_loader_makes_it(result):
    """Unsloth's loss drops every pad-valued token, so with pad == EOS a finished completion's EOS would leave the loss
    on the CPU stand-in but not on a GPU, where FastLanguageModel repairs such a pad."""
    stand_in = result["stand_in"]
    assert stand_in["pad"] != stand_in["eos"]
    assert stand_in["config_pad"] == stand_in["generation_pad"] == stand_in["pad"]
    for guide in ("branch", "random"):
        assert result[guide]["pad_is_eos"] is False
        # a pad token the policy samples inside a completion is no loss token (Unsloth's definition, the equations')
        assert result[guide]["trl_tokens_not_in_the_loss"] == result[guide]["pad_in_completions"]


def test_padded_and_packed_reference_scorers_agree(result):
    """UNSLOTH_GRPO_SEQ_PACKING=0 (Unsloth's padded loop) scores every loss token as the packed forward does."""
    for guide in ("branch", "random"):
        assert result[guide]["ref_max_diff"] < 1e-5
    assert result["branch"]["ref_on_vs_rollout"] < 1e-5  # the scorer called as the rollout calls it


@pytest.mark.parametrize("guide", ["branch", "random"])
def test_logged_kl_and_loss_are_unsloths_definition_from_the_equations(result, guide):
    """KL: the mean over completions of each one's mean k3 of (log pi_ref + log q - log pi_theta) over its loss
    tokens; loss: the mean over completions of (sum of beta k3 - A over its loss tokens) / their count."""
    case, want = result[guide], result[guide]["equations"]
    for on in (0, 1):
        assert case["kl"][on] == pytest.approx(want["kl"], rel=1e-5)
        assert case["loss"][on] == pytest.approx(want["loss"], rel=1e-5)
    assert case["kit_kl"] == pytest.approx(want["kl"], rel=1e-5)  # the doctor's self-test reads the metric so


@pytest.mark.parametrize("guide", ["branch", "random"])
def test_the_shaped_anchor_enters_unsloths_loss_token_for_token(result, guide):
    """Unsloth's loss function gets, at exactly the loss tokens, log pi_theta and log pi_ref + log q."""
    ref_tolerance = 5e-4 if guide == "branch" else 1e-5  # branch: q from float32 entropies times gamma 20
    for received in result[guide]["loss_inputs"]:  # packing on, off
        assert received["mask_is_loss_tokens"] is True
        assert received["policy"] < 1e-5 and received["ref"] < ref_tolerance
