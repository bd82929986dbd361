"""The report labels each run by where its RL put the pseudo-KL (sage_kl_placement), read through the eval
manifest's checkpoint from the RLVR manifest, with a name rule when that manifest is not at hand."""

import json

from sage_unsloth.report.paper import kl_placement


def _stage_folder(tmp_path, name, manifest):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return {"stage": "eval", "checkpoint": str(folder)}


def test_placement_from_the_rlvr_manifest(tmp_path):
    reward = _stage_folder(
        tmp_path, "a", {"stage": "rlvr", "config": {"training": {"sage_kl_placement": "reward"}}}
    )
    loss = _stage_folder(
        tmp_path, "b", {"stage": "rlvr", "config": {"training": {"sage_kl_placement": "loss"}}}
    )
    older = _stage_folder(tmp_path, "c", {"stage": "rlvr", "config": {"training": {}}})
    sft = _stage_folder(tmp_path, "d", {"stage": "sft"})
    # the manifest wins over the name
    assert kl_placement("grpo_branch", reward) == "reward"
    assert kl_placement("grpo_branch_reward", loss) == "loss"
    assert kl_placement("grpo", older) == "loss"  # runs from before the field: the loss placement
    assert kl_placement("sft", sft) == "—"


def test_placement_by_name_without_a_manifest(tmp_path):
    missing = {"stage": "eval", "checkpoint": str(tmp_path / "gone")}
    assert kl_placement("GRPO-Branch-Reward_seed2", missing) == "reward"
    assert kl_placement("sft", None) == "—"
    assert kl_placement("grpo_branch", missing) == "?"
