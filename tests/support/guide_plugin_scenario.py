"""The example guide's run under Unsloth's generated GRPOTrainer forced onto the CPU (a fresh interpreter: the
patching stays for the process), and the spy both runs use. Run by tests/rlvr/test_guide_plugins.py.

Usage: guide_plugin_scenario.py RESULT.json RLVR_ARGV..."""

from __future__ import annotations

import json
import os
import sys


def record_q_calls(monkeypatch=None) -> list[dict]:
    """Record every q the trainer computes: where (in the loss or at rollout), the batch it came from, the
    top-2 margin the guide received and the q the kit produced."""
    from sage_unsloth.rlvr.trainer import SageTrainerMixin

    original = SageTrainerMixin.sage_q
    calls: list[dict] = []

    def spy(self, output, mask, *, layout, policy, reference=None):
        q = original(self, output, mask, layout=layout, policy=policy, reference=reference)
        calls.append(
            {
                "in_loss": self.sage_q_in_loss,
                "extra_passes": self.sage_forward_passes,
                "mro": [c.__name__ for c in type(self).__mro__],
                **{
                    k: output[k].tolist()
                    for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
                },
                "margin": policy["logits"]["top2_margin"].tolist(),
                "q": q.tolist(),
            }
        )
        return q

    if monkeypatch is not None:
        monkeypatch.setattr(SageTrainerMixin, "sage_q", spy)
    else:
        SageTrainerMixin.sage_q = spy
    return calls


def _forced_unsloth_run(result_path: str, argv: list[str]) -> None:
    os.environ.update(
        UNSLOTH_ALLOW_CPU="1",
        UNSLOTH_COMPILE_DISABLE="1",
        UNSLOTH_GRPO_PREFIX_GROUPER="0",  # off, as under vLLM (tests/support/unsloth_cpu.py says why)
        UNSLOTH_SKIP_TORCHVISION_CHECK="1",
        HF_HUB_OFFLINE="1",
    )
    from sage_unsloth.runtime.backend import import_unsloth

    import_unsloth()
    import unsloth.models.rl as unsloth_rl

    unsloth_rl._patch_trl_rl_trainers("grpo_trainer")  # private: rewrites TRL's GRPOTrainer as on a GPU

    from rlvr_scenario import text_reward

    from sage_unsloth.model import loading as models
    from sage_unsloth.rlvr import reward
    from sage_unsloth.rlvr.run import main

    reward.correctness_reward = text_reward
    load = models.load_for_training

    def load_for_unsloths_trainer(*args, **kwargs):
        # the stage loads a plain transformers model on CPU; give it what FastLanguageModel's would have
        model, tokenizer = load(*args, **kwargs)
        for target in (model, model.get_base_model()):
            target.for_training = target.for_inference = lambda *a, **k: None
            target._unsloth_user_float32 = True  # else Unsloth's loss autocasts the fp32 model to fp16
        return model, tokenizer

    models.load_for_training = load_for_unsloths_trainer
    calls = record_q_calls()
    rc = main(argv)
    with open(result_path, "w") as f:
        json.dump({"rc": rc, "mro": calls[0]["mro"] if calls else [], "calls": calls[:1]}, f)


if __name__ == "__main__":
    _forced_unsloth_run(sys.argv[1], sys.argv[2:])
