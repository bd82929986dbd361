"""The exploration baselines in the real trainer on the tiny model: each tiny config trains through the CLI, a
policy term reaches TRL's loss (composed with SAGE's in-loss q), and a run resumed across a reference reset
equals the uninterrupted one.

Checked by breaking on purpose: dropping the re-sync of SAGE's shifted reference in the trainer's
_compute_loss, or the advantage replacement, fails test_policy_term_reaches_trls_loss_with_sage_q; the
resume test carries its own negative control (a checkpoint whose ``ref`` is the SFT adapter resumes
differently), and fails if the callback copies nothing.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from rlvr_scenario import (
    adapter_tensors,
    fixed_global_batch,
    max_abs_difference,
    optimizer_tensors,
    rlvr_argv,
    train,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("varied_reward")]

METRIC = {
    "grpo_entropy_adv": "entropy_adv/bonus_mean",
    "grpo_clip_cov": "clip_cov/frac_detached",
    "grpo_kl_cov": "kl_cov/frac_penalised",
    "grpo_high_entropy": "entropy",
    "grpo_passk": "reward",
    "grpo_ref_reset": "kl",
}


def train_through_the_cli(variant, sft_dir, dapo_sample, root, *extra):
    """Run stage 2's CLI on ``variant``; check its first logged step has the baseline's metric and a finite
    loss; return the run folder."""
    from sage_unsloth.rlvr.run import main
    from sage_unsloth.runtime.training_log import read_log_history

    assert main(rlvr_argv(variant, sft_dir, root, dapo_sample, *extra)) == 0
    (out,) = [p.parent for p in root.rglob("manifest.json")]
    first = read_log_history(out)[0]
    assert METRIC[variant] in first and torch.isfinite(torch.tensor(first["loss"]))
    return out


# grpo_ref_reset trains through the CLI in test_resume_across_a_reference_reset_is_exact (one build, not two).
@pytest.mark.parametrize("variant", sorted(set(METRIC) - {"grpo_ref_reset"}))
def test_each_baseline_trains_one_step_through_the_cli(variant, sft_dir, dapo_sample, tmp_path):
    train_through_the_cli(
        variant, sft_dir, dapo_sample, tmp_path, "--max_steps", "1", "--save_strategy", "no"
    )


def test_policy_term_reaches_trls_loss_with_sage_q(sft_dir, dapo_sample, tmp_path):
    """entropy_adv + the branch guide, both in the loss: the kit's loss equals TRL's own loss fed the paper's
    shaped advantages A + min(0.4 H, |A| / 2) and the reference shifted by log q, q = clip(1 + 0.3 relu(H - 1.2))."""
    from trl import GRPOTrainer

    from sage_unsloth.rlvr.run import build_stage, parse_args

    argv = rlvr_argv("grpo_entropy_adv", sft_dir, tmp_path, dapo_sample, "--guide", "branch")
    built = build_stage(*parse_args([*argv, "--max_steps", "1", "--save_strategy", "no"]))
    trainer, model = built.trainer, built.model
    trainer.current_gradient_accumulation_steps = 1
    vocab = model.get_input_embeddings().weight.shape[0]
    batch = fixed_global_batch(built.tokenizer.pad_token_id, vocab)
    with torch.no_grad():
        got = trainer._compute_loss(model, dict(batch))
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        width = batch["completion_ids"].size(1)
        _, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, model, input_ids, attention, width, compute_entropy=True
        )
        mask = batch["completion_mask"].float()
        a = batch["advantages"][:, None].expand_as(entropies)
        shaped = a + torch.minimum(0.4 * entropies, a.abs() / 2.0)
        q = torch.where(mask > 0, (1 + 0.3 * (entropies - 1.2).clamp(min=0)).clamp(0.6, 1.4), 1.0)
        oracle_batch = {
            **batch,
            "advantages": shaped,
            "ref_per_token_logps": batch["ref_per_token_logps"] + q.log(),
        }
        expected = GRPOTrainer._compute_loss(trainer, model, oracle_batch)
        plain = GRPOTrainer._compute_loss(trainer, model, dict(batch))
    assert (q > 1).any()  # the guide acts on this batch
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert abs(got.item() - plain.item()) > 1e-3


RESET_SCENARIO = ["--max_steps", "4", "--save_steps", "1", "--ref_reset_steps", "2"]


def _ref(folder):
    return adapter_tensors(folder / "ref")


def test_resume_across_a_reference_reset_is_exact(sft_dir, dapo_sample, tmp_path):
    out = train_through_the_cli("grpo_ref_reset", sft_dir, dapo_sample, tmp_path / "whole", *RESET_SCENARIO)
    sft = adapter_tensors(sft_dir)
    # Step 1: ref is still the SFT adapter; step 2: reset (ref == policy, optimizer moments cleared); step 3: the
    # policy moved on from the reset reference.
    assert max_abs_difference(_ref(out / "checkpoint-1"), sft) == 0.0
    assert max_abs_difference(adapter_tensors(out / "checkpoint-1"), sft) > 0.0
    assert max_abs_difference(_ref(out / "checkpoint-2"), adapter_tensors(out / "checkpoint-2")) == 0.0
    assert optimizer_tensors(out / "checkpoint-2") == {}
    assert max_abs_difference(_ref(out / "checkpoint-3"), adapter_tensors(out / "checkpoint-2")) == 0.0
    assert max_abs_difference(_ref(out / "checkpoint-3"), adapter_tensors(out / "checkpoint-3")) > 0.0

    def resumed(root, spoil_ref: bool):
        run_dir = root / out.relative_to(tmp_path / "whole")
        shutil.copytree(out, run_dir)
        shutil.rmtree(run_dir / "checkpoint-4")
        (run_dir / "manifest.json").unlink()  # killed before its last checkpoint: not a finished run
        if spoil_ref:  # negative control: a checkpoint without the reset reference
            shutil.rmtree(run_dir / "checkpoint-3" / "ref")
            shutil.copytree(out / "checkpoint-1" / "ref", run_dir / "checkpoint-3" / "ref")
        train(rlvr_argv("grpo_ref_reset", sft_dir, root, dapo_sample, *RESET_SCENARIO, "--resume"))
        return run_dir

    good = resumed(tmp_path / "good", spoil_ref=False)
    for name in ("checkpoint-4", "checkpoint-4/ref"):
        assert max_abs_difference(adapter_tensors(good / name), adapter_tensors(out / name)) == 0.0, name
    assert (
        max_abs_difference(optimizer_tensors(good / "checkpoint-4"), optimizer_tensors(out / "checkpoint-4"))
        == 0.0
    )
    spoiled = resumed(tmp_path / "spoiled", spoil_ref=True)
    assert (
        max_abs_difference(adapter_tensors(spoiled / "checkpoint-4"), adapter_tensors(out / "checkpoint-4"))
        > 0.0
    )
