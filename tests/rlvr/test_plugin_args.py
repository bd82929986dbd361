"""One plug-in contract for the four kinds (guide, advantage estimator, policy term, KL term): each named by a
registered name or an import path, its own arguments in ``<kind>_args`` checked against the function's signature
(after its per-call inputs) before any model loads, and bound when the trainer is built. k3 / k2 / forward are
entries of the KL-term registry (rlvr/kl_terms.py), with the backends they support.

The out-of-tree run: an advantage estimator and a policy term written into tmp_path (outside the repo), each with
an argument of its own, trained through the RLVR CLI from a config outside the repo on the tiny model. The
plug-ins record what they received; the references are computed here from those records."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from sage_unsloth.config_args import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _config(**kw):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SageGRPOConfig(output_dir="/tmp/unused", report_to="none", **{"backend": "trl", **kw})


def test_kl_terms_are_registry_entries_with_their_backends():
    from sage_unsloth.rlvr.kl_terms import KL_TERMS

    assert KL_TERMS.names() == ("k3", "k2", "forward")
    meta = {name: KL_TERMS.resolve(name).meta for name in KL_TERMS.names()}
    assert meta["k3"]["backends"] == ("trl", "unsloth") and meta["k3"]["shifted_reference"]
    assert meta["k2"]["backends"] == ("trl",) and not meta["k2"]["shifted_reference"]
    assert meta["forward"]["backends"] == ("trl",) and not meta["forward"]["guided"]


def test_kl_terms_by_hand():
    """Per-token values from the definitions: d = log(q pi_ref) - log pi; k3 = e^d - d - 1, k2 = d^2 / 2,
    forward = u log u - u + 1 with u = pi_ref / pi; k2 and forward weighted by pi / pi_old."""
    from sage_unsloth.rlvr.kl_terms import KL_TERMS, KLTokens

    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]])
    old = torch.tensor([[-1.2, -2.0]])
    tokens = KLTokens(logps=logps, ref_logps=ref, old_logps=old, ratio=False)
    d = ref - logps.detach()
    rho = torch.exp(logps.detach() - old)
    want = {
        "k3": (torch.exp(d) - d - 1, torch.exp(d) - d - 1),
        "k2": (0.5 * d**2 * rho, 0.5 * d**2),
        "forward": ((torch.exp(d) * d - torch.exp(d) + 1) * rho, torch.exp(d) * d - torch.exp(d) + 1),
    }
    for name, (term, value) in want.items():
        out = KL_TERMS.resolve(name).obj(tokens)
        torch.testing.assert_close(out.term.detach(), term)
        torch.testing.assert_close(out.value, value)
        assert out.term.requires_grad and not out.value.requires_grad


def test_kl_term_is_an_alias_of_kl_estimator():
    assert _config(kl_term="k2").kl_estimator == "k2"
    assert _config(kl_estimator="k2").kl_estimator == "k2"
    with pytest.raises(ConfigError, match="name the same field"):
        _config(kl_term="k2", kl_estimator="forward")


@pytest.mark.parametrize(
    "overrides, error",
    [
        (
            {"advantage_estimator_args": {"scale": 2.0}},
            "advantage_estimator_args: advantage estimator 'grpo' has no",
        ),
        ({"policy_term_args": {"factor": 2.0}}, "policy_term_args is set but policy_term=none"),
        ({"policy_term": "entropy_adv", "policy_term_args": {"facter": 2}}, "policy_term_args: policy term"),
        ({"kl_term_args": {"x": 1}}, "kl_term_args: KL term 'k3' has no argument 'x'"),
        ({"advantage_estimator_args": "{oops"}, "advantage_estimator_args='{oops' is not a JSON object"),
        ({"kl_estimator": "k2", "backend": "unsloth"}, "kl_estimator='k2' is not expressible"),
    ],
)
def test_bad_plugin_args_are_one_line(overrides, error):
    with pytest.raises(ConfigError, match=error):
        _config(**overrides)


ESTIMATOR = '''
import json
import torch

def centred(inputs, *, scale=1.0, shift=0.0, log=""):
    """scale * (r - group mean) + shift, NaN rewards as 0."""
    rewards = inputs.rewards
    grouped = torch.nan_to_num(rewards, nan=0.0).view(-1, inputs.num_generations)
    advantages = (scale * (grouped - grouped.mean(1, keepdim=True)) + shift).view(-1)
    with open(log, "a") as f:
        f.write(json.dumps({"scale": scale, "rewards": rewards.tolist(), "out": advantages.tolist()}) + "\\n")
    return advantages
'''

TERM = '''
import json
from sage_unsloth.rlvr.policy_terms import TermOutput

def damped(batch, *, factor=1.0, log=""):
    """Per-token advantages times ``factor``."""
    out = batch.advantages * factor
    with open(log, "a") as f:
        f.write(json.dumps({"factor": factor, "in": batch.advantages.tolist(), "out": out.tolist()}) + "\\n")
    return TermOutput(advantages=out, metrics={})
'''


def test_out_of_tree_estimator_and_term_train_through_the_cli(tmp_path, sft_dir, dapo_sample, varied_reward):
    from sage_unsloth.rlvr.run import main

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "my_estimator.py").write_text(ESTIMATOR)
    (mine / "my_term.py").write_text(TERM)
    est_log, term_log = mine / "estimator.jsonl", mine / "term.jsonl"
    config = mine / "mine.yaml"
    config.write_text(
        f"base: {REPO / 'configs' / 'rlvr' / 'tiny-cpu' / '_base.yaml'}\n"
        f"advantage_estimator: {mine / 'my_estimator.py'}:centred\n"
        f"advantage_estimator_args: {{scale: 3.0, shift: 0.25, log: {est_log}}}\n"
        f"policy_term: {mine / 'my_term.py'}:damped\n"
        f"policy_term_args: {{factor: 0.5, log: {term_log}}}\n"
        "max_steps: 1\nsave_strategy: 'no'\n"
    )
    argv = [str(config), "--sft_dir", str(sft_dir), "--output_root", str(mine / "out")]
    assert main([*argv, "--dataset_path", str(dapo_sample)]) == 0
    estimates = [json.loads(line) for line in est_log.read_text().splitlines()]
    terms = [json.loads(line) for line in term_log.read_text().splitlines()]
    # The first call of each is its trial call on a synthetic batch before loading (rlvr/plugin_probe.py)
    estimates, terms = estimates[1:], terms[1:]
    assert estimates and terms
    assert {e["scale"] for e in estimates} == {3.0} and {t["factor"] for t in terms} == {0.5}
    rewards = torch.nan_to_num(torch.tensor(estimates[0]["rewards"]), nan=0.0).view(-1, 2)
    want = 3.0 * (rewards - rewards.mean(1, keepdim=True)) + 0.25
    torch.testing.assert_close(torch.tensor(estimates[0]["out"]).view(-1, 2), want)
    # the term saw the estimator's advantages (broadcast per token) and halved them
    seen = torch.tensor(terms[0]["in"])
    assert seen.abs().min() > 0  # the shift makes every advantage non-zero, so the halving is visible
    row_adv = torch.tensor(estimates[0]["out"])[: seen.size(0)]
    torch.testing.assert_close(seen, row_adv[:, None].expand_as(seen))
    torch.testing.assert_close(torch.tensor(terms[0]["out"]), 0.5 * seen)


def test_the_command_line_overrides_a_yaml_key_under_either_name(tmp_path, capsys):
    """kl_term in the YAML and --kl_estimator on the command line (or the reverse): the flag wins, as for any
    field, and --help shows the file's value under the field's own name."""
    from sage_unsloth.rlvr.run import parse_args

    base = REPO / "configs" / "rlvr" / "tiny-cpu" / "_base.yaml"
    config = tmp_path / "mine.yaml"
    config.write_text(f"base: {base}\nkl_term: k2\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert parse_args([str(config)])[0].kl_estimator == "k2"
        assert parse_args([str(config), "--kl_estimator", "k3"])[0].kl_estimator == "k3"
        other = tmp_path / "other.yaml"
        other.write_text(f"base: {base}\nkl_estimator: k2\n")
        assert parse_args([str(other), "--kl_term=k3"])[0].kl_estimator == "k3"
        with pytest.raises(ConfigError, match="name the same field"):
            parse_args([str(config), "--kl_term", "k2", "--kl_estimator", "k3"])
        with pytest.raises(SystemExit):
            parse_args([str(config), "--help-all"])
    assert "kl_estimator" in capsys.readouterr().out
    assert parse_args([str(other), "--kl-term", "k3"])[0].kl_estimator == "k3"


# ------------------------------------------------------------------------------- one call shape, knobs in <kind>_args
def _aliased():
    """(registry, kind field, entry name, keyword, flat field, a value off the flat field's default) for every
    keyword of a built-in that has a flat config field."""
    from sage_unsloth.rlvr.plan import REGISTRIES

    cases = []
    for registry in REGISTRIES:
        for name in registry.names():
            for key, flat in (registry.resolve(name).meta["aliases"] or {}).items():
                default = _config().__class__.__dataclass_fields__[flat].default
                cases.append((registry, name, key, flat, _other(flat, default)))
    return cases


def _other(flat, default):
    """A valid value of ``flat`` off its default."""
    special = {
        "sage_token_norm": "zscore",
        "scale_rewards": "batch",
        "passk_k": 2,
        "sage_schedule_decay": 0.8,
    }
    if flat in special:
        return special[flat]
    if isinstance(default, int) and not isinstance(default, float):
        return default + 1
    return default * 1.5 if default else 0.05


def _kind_config(registry, name, **kw):
    base = {"num_iterations": 2, "beta": 0.05}  # kl_cov needs a reused batch; a guide needs the anchor
    return _config(**{registry.field: name, **base, **kw})


def _bound(cfg, registry):
    plan = cfg.method_plan
    fn = {
        "sage_guide": plan.guide_fn,
        "advantage_estimator": plan.estimator_call,
        "policy_term": plan.policy_term_fn,
        "kl_estimator": plan.kl_term_fn,
    }[registry.field]
    return dict(getattr(fn, "keywords", {}))


def test_every_builtin_keyword_has_its_flat_field_as_an_alias():
    """A built-in's flat field and its <kind>_args keyword set the same argument: the same bound arguments, the
    same flat field afterwards (TRL's own flags and the manifest read it), the same config either way."""
    cases = _aliased()
    assert {c[3] for c in cases} >= {"sage_gamma", "sage_tau", "passk_k", "clip_cov_ub", "kl_cov_coef"}
    for registry, name, key, flat, value in cases:
        by_flat = _kind_config(registry, name, **{flat: value})
        by_args = _kind_config(registry, name, **{registry.args_field: {key: value}})
        assert _bound(by_flat, registry)[key] == value == _bound(by_args, registry)[key], (name, key)
        assert _bound(by_flat, registry) == _bound(by_args, registry), (name, key)
        assert getattr(by_args, flat) == value, (name, flat)
        # the same value both ways is no conflict
        same = _kind_config(registry, name, **{flat: value, registry.args_field: {key: value}})
        assert _bound(same, registry) == _bound(by_flat, registry)


@pytest.mark.parametrize(
    "overrides, error",
    [
        (
            {"sage_guide": "branch", "sage_tau": 0.9, "sage_guide_args": {"tau": 1.5}},
            r"^sage_tau=0.9 and sage_guide_args: \{tau: 1.5\} set one argument of guide 'branch' two ways: keep one",
        ),
        (
            {"advantage_estimator": "passk", "passk_k": 2, "advantage_estimator_args": {"k": 3}},
            r"^passk_k=2 and advantage_estimator_args: \{k: 3\} set one argument of advantage estimator 'passk'",
        ),
        (
            {"policy_term": "clip_cov", "clip_cov_ub": 6.0, "policy_term_args": {"ub": 7.0}},
            r"^clip_cov_ub=6.0 and policy_term_args: \{ub: 7.0\} set one argument of policy term 'clip_cov'",
        ),
        (
            {"scale_rewards": "batch", "advantage_estimator_args": {"scale_rewards": "none"}},
            r"^scale_rewards='batch' and advantage_estimator_args: \{scale_rewards: 'none'\} set one argument",
        ),
        (
            {"policy_term": "entropy_adv", "policy_term_args": {"alpha": "big"}},
            r"^policy_term_args: policy term 'entropy_adv' argument 'alpha' must be float, got str 'big'$",
        ),
        (
            {"sage_guide": "token", "sage_guide_args": {"cycles": 2.5}},
            r"^sage_guide_args: guide 'token' argument 'cycles' must be int, got float 2.5$",
        ),
    ],
)
def test_a_knob_set_two_ways_differently_or_of_the_wrong_type_is_one_line(overrides, error):
    with pytest.raises(ConfigError, match=error) as caught:
        _config(**overrides)
    assert "\n" not in str(caught.value)


def test_the_command_line_flag_and_the_args_json_give_the_same_run(tmp_path):
    """TRL users keep their flags: --passk_k 2 and --advantage_estimator_args '{"k": 2}' are one config."""
    from sage_unsloth.rlvr.run import parse_args

    base = [str(REPO / "configs" / "rlvr" / "tiny-cpu" / "_base.yaml"), "--output_dir", str(tmp_path)]
    base += ["--advantage_estimator", "passk"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flat = parse_args([*base, "--passk_k", "1", "--clip_cov_ub", "6.0"])[0]
        args = parse_args([*base, "--advantage_estimator_args", '{"k": 1}', "--clip_cov_ub", "6.0"])[0]
    assert flat.passk_k == args.passk_k == 1
    assert flat.method_plan.estimator_call.keywords == args.method_plan.estimator_call.keywords == {"k": 1}


def test_each_kind_is_called_with_its_one_record_and_its_keywords(monkeypatch):
    """The one call shape: every kind's plug-in gets exactly one positional input, its kind's frozen record, and
    its knobs as keywords (the trial call before loading goes through the same plugin_calls.call as training)."""
    import dataclasses

    from sage_unsloth import guides, plugin_calls
    from sage_unsloth.rlvr.advantages import GroupRewards
    from sage_unsloth.rlvr.kl_terms import KLTokens
    from sage_unsloth.rlvr.policy_terms import TokenBatch

    seen = {}
    real = plugin_calls.call

    def spy(kind, name, fn, *inputs, **kw):
        seen[kind] = (len(inputs), type(inputs[0]), dict(getattr(fn, "keywords", {})))
        return real(kind, name, fn, *inputs, **kw)

    monkeypatch.setattr(plugin_calls, "call", spy)
    _config(
        sage_guide="branch",
        advantage_estimator="passk",
        passk_k=2,
        policy_term="kl_cov",
        num_iterations=2,
        kl_estimator="k2",
    )
    assert seen["guide"] == (1, guides.Signals, {"gamma": 0.3, "tau": 1.2, "q_min": 0.6, "q_max": 1.4})
    assert seen["advantage estimator"] == (1, GroupRewards, {"k": 2})
    assert seen["policy term"] == (1, TokenBatch, {"ratio": 2e-3, "coef": 1.0})
    assert seen["KL term"] == (1, KLTokens, {})
    assert all(dataclasses.is_dataclass(t) and t.__dataclass_params__.frozen for _, t, _ in seen.values())


def test_the_builtins_read_no_config():
    """No plug-in receives the config: each built-in's parameters are its record and its keywords."""
    import inspect

    from sage_unsloth.rlvr.plan import REGISTRIES

    for registry in REGISTRIES:
        for name in registry.names():
            params = list(inspect.signature(registry.resolve(name).obj).parameters.values())
            assert len(params) >= 1 and all(p.kind is p.KEYWORD_ONLY for p in params[1:]), (
                registry.kind,
                name,
            )
            assert set(registry.resolve(name).meta["aliases"] or {}) == {p.name for p in params[1:]}, name
