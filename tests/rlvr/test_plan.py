"""The frozen method plan (sage_unsloth/rlvr/plan.py): resolved once per configuration, read by the trainer.

Checked by breaking on purpose: a plan cache keyed on nothing (never rebuilt) fails the in-place change test; a
property that rebuilds every time fails the resolve count; keeping the plan in the pickled state fails the
pickle test (a built-in guide is a closure)."""

from __future__ import annotations

import dataclasses
import pickle
import warnings

import pytest

from sage_unsloth.plugins.registry import Registry


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
    cfg = _config(tmp_path, guide="branch", advantage_estimator="passk", policy_term="entropy_adv")
    # the plan once: every other check reads it
    assert [calls.count(kind) for kind in ("guide", "advantage estimator", "policy term", "KL term")] == [
        1
    ] * 4
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
    cfg = _config(tmp_path, guide="branch")
    first = cfg.method_plan
    cfg.guide = "none"
    second = cfg.method_plan
    assert second is not first and not second.guided and first.guided
    assert cfg.method_plan is second  # nothing changed: the same plan
    cfg.guide = "branch"
    third = cfg.method_plan
    cfg.guide = {"name": "branch", "gamma": 0.7}  # a new node: a new plan binds its value
    assert cfg.method_plan is not third and cfg.method_plan.guide_fn.keywords["gamma"] == 0.7


def test_the_plan_does_not_travel_with_the_pickled_config(tmp_path):
    cfg = _config(tmp_path, guide="branch")
    assert cfg.method_plan.guided
    state = pickle.dumps(cfg)  # transformers saves training_args.bin this way; a closure would not pickle
    again = pickle.loads(state)
    assert "_method_plan" not in vars(again) or again.__dict__["_method_plan"] is None
    assert again.method_plan.guide.name == "branch"


def test_the_reward_placement_puts_q_at_rollout_on_either_class(tmp_path):
    cfg = _config(tmp_path, guide="branch", sage_kl_placement="reward")
    plan = cfg.method_plan
    assert plan.q_source(unsloth_patched=False) == "rollout" == plan.q_source(unsloth_patched=True)
    loss = _config(tmp_path, guide="token").method_plan
    assert loss.q_source(unsloth_patched=False) == "loss" and loss.q_source(unsloth_patched=True) == "rollout"


def _step_names(plan, *, unsloth_patched: bool) -> tuple:
    steps = plan.steps(unsloth_patched=unsloth_patched)
    return tuple(tuple(step.__name__ for step in kind) for kind in steps)


# config -> (TRL's class, Unsloth's patched class): the step names after each rollout, after the batch, in the loss.
CHOSEN_STEPS = [
    (  # plain GRPO: nothing of a guide runs (q = 1 by definition), TRL's own advantage stands: no step at all
        {},
        ((), (), ()),
        ((), (), ()),
    ),
    (
        {"guide": "branch"},
        ((), (), ("q_in_the_loss",)),
        ((), (), ("q_in_the_unsloth_loss",)),
    ),
    (  # no KL (a guide needs one: the config refuses it): no reference to shift, only the policy term in the loss
        {"beta": 0.0, "policy_term": "entropy_adv"},
        ((), (), ("policy_term",)),
        ((), (), ()),
    ),
    (
        {"guide": "random"},
        (("q_at_rollout", "shift_reference_at_rollout"), (), ()),
        (("q_at_rollout", "shift_reference_at_rollout"), (), ()),
    ),
    (  # the token guide reads the log-probs: in TRL's loss, at rollout under Unsloth's
        {"guide": "token"},
        ((), (), ("q_in_the_loss",)),
        (("q_at_rollout", "shift_reference_at_rollout"), (), ()),
    ),
    (  # the reward placement: q with the reward, the advantages recomputed, no q step in the loss
        {"guide": "branch", "sage_kl_placement": "reward"},
        (("summed_rewards", "q_at_rollout", "reward_placement", "estimate_advantages"), (), ()),
        (("summed_rewards", "q_at_rollout", "reward_placement", "estimate_advantages"), (), ()),
    ),
    (  # the reward placement without a guide: its pseudo-KL reads q = 1 (not logged)
        {"sage_kl_placement": "reward"},
        (("summed_rewards", "q_at_rollout", "reward_placement", "estimate_advantages"), (), ()),
        (("summed_rewards", "q_at_rollout", "reward_placement", "estimate_advantages"), (), ()),
    ),
    (  # the TRL-only steps (policy term, KL term) never on Unsloth's layout
        {"guide": "branch", "policy_term": "clip_cov", "kl_term": "k2"},
        ((), (), ("q_in_the_loss", "policy_term", "kl_term")),
        ((), (), ("q_in_the_unsloth_loss",)),
    ),
    (
        {"advantage_estimator": "passk", "loss_type": "dapo", "dapo_normalizer": "generation"},
        (("summed_rewards", "estimate_advantages"), ("dapo_normaliser",), ()),
        (("summed_rewards", "estimate_advantages"), ("dapo_normaliser",), ()),
    ),
    (
        {"loss_type": "dapo", "dapo_normalizer": "window"},
        ((), (), ()),
        ((), (), ()),
    ),
]


@pytest.mark.parametrize("fields,trl,unsloth", CHOSEN_STEPS)
def test_the_plan_chooses_the_steps_that_run_for_each_configuration(tmp_path, fields, trl, unsloth):
    plan = _config(tmp_path, **fields).method_plan
    assert _step_names(plan, unsloth_patched=False) == trl
    assert _step_names(plan, unsloth_patched=True) == unsloth


def test_the_vllm_importance_sampling_metric_step_runs_only_with_the_correction(tmp_path):
    cfg = _config(tmp_path)
    cfg.use_vllm, cfg.vllm_importance_sampling_correction = True, True  # no vLLM here: set after validation
    assert _step_names(cfg.method_plan, unsloth_patched=False)[1] == ("log_importance_sampling",)
    cfg.vllm_importance_sampling_correction = False
    assert _step_names(cfg.method_plan, unsloth_patched=False)[1] == ()


def test_no_step_tests_a_setting_when_it_runs():
    """The steps open with no `if <setting>: return` guard and read none of the settings the plan chose them by."""
    import ast
    import inspect
    import textwrap

    from sage_unsloth.rlvr import taps

    chosen_by = {
        "placement",
        "guided",
        "reads_policy",
        "sage_q_in_loss",
        "kl_in_trl_loss",
        "dynamic_sampling",
    }
    for step in (
        taps.summed_rewards,
        taps.q_at_rollout,
        taps.reward_placement,
        taps.estimate_advantages,
        taps.shift_reference_at_rollout,
        taps.log_importance_sampling,
        taps.dapo_normaliser,
        taps.q_in_the_loss,
        taps.q_in_the_unsloth_loss,
        taps.policy_term,
        taps.kl_term,
    ):
        body = ast.parse(textwrap.dedent(inspect.getsource(step))).body[0].body
        first = body[1] if isinstance(body[0], ast.Expr) else body[0]  # after the docstring
        guard = isinstance(first, ast.If) and isinstance(first.body[0], ast.Return)
        assert not guard, f"{step.__name__} opens with a guard"
        assert not chosen_by & set(step.__code__.co_names), (
            step.__name__,
            chosen_by & set(step.__code__.co_names),
        )
