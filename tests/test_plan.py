"""The frozen method plan (sage_unsloth/rlvr/plan.py): resolved once per configuration, read by the trainer.

Checked by breaking on purpose: a plan cache keyed on nothing (never rebuilt) fails the in-place change test; a
property that rebuilds every time fails the resolve count; keeping the plan in the pickled state fails the
pickle test (a built-in guide is a closure)."""

from __future__ import annotations

import dataclasses
import pickle
import warnings

import pytest

from sage_unsloth.registry import Registry


def _config(tmp_path, **kw):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SageGRPOConfig(output_dir=str(tmp_path), report_to="none", backend="trl", **kw)


def test_the_config_resolves_each_plug_in_a_bounded_number_of_times_and_then_never(tmp_path, monkeypatch):
    calls: list[str] = []
    resolve = Registry.resolve

    def counting(self, spec):
        calls.append(self.kind)
        return resolve(self, spec)

    monkeypatch.setattr(Registry, "resolve", counting)
    cfg = _config(tmp_path, sage_guide="branch", advantage_estimator="passk", policy_term="entropy_adv")
    # validation once (each kind's own checks) and the plan once
    assert calls.count("guide") <= 2 and calls.count("advantage estimator") <= 2, calls
    built = len(calls)
    plan = cfg.method_plan
    assert cfg.method_plan is plan and cfg.expected_q_source == "loss" and len(calls) == built
    assert (plan.guide.name, plan.estimator.name, plan.policy_term.name, plan.kl_term.name) == (
        "branch",
        "passk",
        "entropy_adv",
        "k3",
    )
    assert plan.estimator_fn is not None and plan.policy_term_fn is not None and plan.kl_in_trl_loss
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.placement = "reward"


def test_a_field_changed_in_place_builds_a_new_plan(tmp_path):
    cfg = _config(tmp_path, sage_guide="branch")
    first = cfg.method_plan
    cfg.sage_guide = "none"
    second = cfg.method_plan
    assert second is not first and not second.guided and first.guided
    assert cfg.method_plan is second  # nothing changed: the same plan
    cfg.sage_guide = "branch"
    third = cfg.method_plan
    cfg.sage_gamma = (
        0.7  # a built-in's flat field is one of its bound arguments: a new plan binds the new value
    )
    assert cfg.method_plan is not third and cfg.method_plan.guide_fn.keywords["gamma"] == 0.7


def test_the_plan_does_not_travel_with_the_pickled_config(tmp_path):
    cfg = _config(tmp_path, sage_guide="branch")
    assert cfg.method_plan.guided
    state = pickle.dumps(cfg)  # transformers saves training_args.bin this way; a closure would not pickle
    again = pickle.loads(state)
    assert "_method_plan" not in vars(again) or again.__dict__["_method_plan"] is None
    assert again.method_plan.guide.name == "branch"


def test_the_reward_placement_puts_q_at_rollout_on_either_class(tmp_path):
    cfg = _config(tmp_path, sage_guide="branch", sage_kl_placement="reward")
    plan = cfg.method_plan
    assert plan.q_source(unsloth_patched=False) == "rollout" == plan.q_source(unsloth_patched=True)
    loss = _config(tmp_path, sage_guide="token").method_plan
    assert loss.q_source(unsloth_patched=False) == "loss" and loss.q_source(unsloth_patched=True) == "rollout"
