"""Unsloth's GRPO sequence packing (on by default: one varlen forward of every row, scattered back to Unsloth's
(B, C + max_left_pad) layout) under the SAGE trainer, with Unsloth's GPU-only rewrites forced onto the CPU:
tests/support/seq_packing_scenario.py runs once in its own interpreter; each test reads its result.

With packing on and off on one rollout batch (policy != reference, completions of unequal lengths): the branch q the
kit computes from the entropies Unsloth's loss hands over is the same per token, and so are the loss, the logged KL and
the gradients, for the branch and the random guide; packing really ran (the decoder got packed_seq_lengths) only
when on. The random guide's q, placed at rollout with compat.to_unsloth_layout, sits on each row's own completion
tokens of the packed reference (checked against an unpadded forward per row). Finding: Unsloth's padded reference
scorer (packing off) disagrees with the packed one there, by up to 7 nats on this model: the kit keeps packing on
(docs/verification.md)."""

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
    assert result["random"]["oracle"]["shifted_reference_gap"] < 1e-5


def test_padded_reference_scorer_disagrees_with_the_packed_one(result):
    """The finding behind keeping packing on: with packing off Unsloth's reference scorer gives other values at the
    completion tokens than the packed scorer, which the test above ties to the equations."""
    assert result["branch"]["ref_on_vs_rollout"] < 1e-5  # the scorer called as the rollout calls it
    assert result["branch"]["ref_max_diff"] > 1.0
