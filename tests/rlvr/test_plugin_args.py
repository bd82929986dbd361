"""One plug-in contract for the four kinds (guide, advantage estimator, policy term, KL term): each one node,
``{name: <registered name or import path>, <its arguments>}``, its arguments checked against the function's
signature (after its per-call inputs) before any model loads, and bound when the plan is built. k3 / k2 / forward are
entries of the KL-term registry (plugins/kl_terms.py), with the backends they support.

The out-of-tree run: an advantage estimator and a policy term written into tmp_path (outside the repo), each with
an argument of its own, trained through the RLVR CLI from a config outside the repo on the tiny model. The
plug-ins record what they received; the references are computed here from those records."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from sage_unsloth.config.args import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _config(**kw):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SageGRPOConfig(output_dir="/tmp/unused", report_to="none", **{"backend": "trl", **kw})


def test_kl_terms_are_registry_entries_with_their_backends():
    from sage_unsloth.plugins.kl_terms import KL_TERMS

    assert KL_TERMS.names() == ("k3", "k2", "forward")
    meta = {name: KL_TERMS.resolve(name).meta for name in KL_TERMS.names()}
    assert meta["k3"]["backends"] == ("trl", "unsloth") and meta["k3"]["shifted_reference"]
    assert meta["k2"]["backends"] == ("trl",) and not meta["k2"]["shifted_reference"]
    assert meta["forward"]["backends"] == ("trl",) and not meta["forward"]["guided"]


def test_kl_terms_by_hand():
    """Per-token values from the definitions: d = log(q pi_ref) - log pi; k3 = e^d - d - 1, k2 = d^2 / 2,
    forward = u log u - u + 1 with u = pi_ref / pi; k2 and forward weighted by pi / pi_old."""
    from sage_unsloth.plugins.kl_terms import KL_TERMS, KLTokens

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


def test_a_node_is_a_mapping_its_json_or_a_bare_name():
    """The same node three ways (the YAML's mapping, the command line's JSON, a bare name without arguments), and
    the config holds it resolved: every argument with its value, the defaults filled."""
    branch = {"name": "branch", "gamma": 0.8, "tau": 0.5, "q_min": 0.6, "q_max": 1.4}
    assert _config(guide={"name": "branch", "gamma": 0.8, "tau": 0.5}).guide == branch
    assert _config(guide='{"name": "branch", "gamma": 0.8, "tau": 0.5}').guide == branch
    assert _config(guide="branch").guide == {**branch, "gamma": 0.3, "tau": 1.2}
    assert _config(kl_term="k2").kl_term == {"name": "k2"}
    assert _config().policy_term == {"name": "none"} and _config().advantage_estimator == {"name": "grpo"}


@pytest.mark.parametrize(
    "overrides, error",
    [
        (
            {"advantage_estimator": {"name": "grpo", "scale": 2.0}},
            "advantage_estimator: advantage estimator 'grpo' has no",
        ),
        ({"policy_term": {"name": "none", "factor": 2.0}}, "policy_term: none takes no arguments"),
        ({"policy_term": {"name": "entropy_adv", "facter": 2}}, "policy_term: policy term"),
        ({"kl_term": {"name": "k3", "x": 1}}, "kl_term: KL term 'k3' has no argument 'x'"),
        ({"advantage_estimator": "{oops"}, "advantage_estimator='{oops' is not a JSON object"),
        ({"guide": {"gamma": 0.8}}, r"guide: the mapping \{'gamma': 0.8\} names no guide"),
        ({"guide": ["branch"]}, "guide must be a guide name or a mapping"),
        ({"kl_term": "k2", "backend": "unsloth"}, "kl_term='k2' is not expressible"),
    ],
)
def test_bad_plugin_args_are_one_line(overrides, error):
    with pytest.raises(ConfigError, match=error) as caught:
        _config(**overrides)
    assert "\n" not in str(caught.value)


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
from sage_unsloth.plugins.policy_terms import TermOutput

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
        f"advantage_estimator: {{name: {mine / 'my_estimator.py'}:centred, scale: 3.0, shift: 0.25, log: {est_log}}}\n"
        f"policy_term: {{name: {mine / 'my_term.py'}:damped, factor: 0.5, log: {term_log}}}\n"
        "max_steps: 1\nsave_strategy: 'no'\n"
    )
    argv = [str(config), "--sft_dir", str(sft_dir), "--output_root", str(mine / "out")]
    assert main([*argv, "--dataset_path", str(dapo_sample)]) == 0
    estimates = [json.loads(line) for line in est_log.read_text().splitlines()]
    terms = [json.loads(line) for line in term_log.read_text().splitlines()]
    # The first call of each is its trial call on a synthetic batch before loading (plugins/probe.py)
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


def test_the_command_line_node_replaces_the_yaml_node_whole(tmp_path, capsys):
    """A node on the command line (a bare name, or its JSON: TRL's convention for a dict field) replaces the YAML's
    node whole, as a ``base:`` file's node is replaced by its child's: the arguments it leaves out take their
    defaults. --help-all shows the file's node."""
    from sage_unsloth.rlvr.run import parse_args

    base = REPO / "configs" / "rlvr" / "tiny-cpu" / "_base.yaml"
    config = tmp_path / "mine.yaml"
    config.write_text(f"base: {base}\nkl_term: k2\nguide: {{name: branch, gamma: 0.8, tau: 0.5}}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = parse_args([str(config)])[0]
        assert parsed.kl_term == {"name": "k2"} and (parsed.guide["gamma"], parsed.guide["tau"]) == (0.8, 0.5)
        assert parse_args([str(config), "--kl_term", "k3"])[0].kl_term == {"name": "k3"}
        assert parse_args([str(config), "--kl-term=k3"])[0].kl_term == {"name": "k3"}
        flag = parse_args([str(config), "--guide", '{"name": "branch", "tau": 0.9}'])[0]
        assert (flag.guide["gamma"], flag.guide["tau"]) == (0.3, 0.9)  # gamma: the branch guide's default
        with pytest.raises(SystemExit):
            parse_args([str(config), "--help-all"])
    assert "kl_term" in capsys.readouterr().out


def test_old_spellings_are_refused_in_one_line_naming_the_node(tmp_path):
    """Every key of the flat spelling, in a YAML or as a flag, is one line naming the node it became, before any
    model loads: from the stage parser and from the pre-import check alike."""
    from sage_unsloth.config.schema import check_stage_input
    from sage_unsloth.rlvr.config import RETIRED_KEYS
    from sage_unsloth.rlvr.run import parse_args

    base = REPO / "configs" / "rlvr" / "tiny-cpu" / "_base.yaml"
    assert {"sage_guide", "sage_guide_args", "sage_gamma", "sage_tau", "kl_estimator", "kl_term_args"} <= set(
        RETIRED_KEYS
    )
    assert {"passk_k", "clip_cov_ub", "kl_cov_coef", "entropy_adv_alpha", "sage_schedule_cycles"} <= set(
        RETIRED_KEYS
    )
    for old, (node, key, entry) in RETIRED_KEYS.items():
        config = tmp_path / f"{old}.yaml"
        config.write_text(f"base: {base}\n{old}: 1\n")
        want = f"{old} is retired: " + (
            f"it is the argument {key} of the {node} node" if key not in (None, "name") else ""
        )
        for argv in ([str(config)], [str(base), f"--{old}", "1"]):
            with pytest.raises(ConfigError) as caught:
                parse_args(argv)
            line = str(caught.value)
            assert want in line and f"{node}: {{name: " in line and "\n" not in line, line
            assert check_stage_input("rlvr", argv) == [line]  # the same line before TRL is imported


# ------------------------------------------------------------------------------- one call shape, knobs in the node
def _builtin_keywords():
    """(registry, entry name, keyword, a valid value off its default) for every keyword argument of a built-in
    (not TRL's own fields, which the node does not set)."""
    import inspect

    from sage_unsloth.rlvr.plan import NODES

    special = {
        "norm": "zscore",
        "cycles": 3,
        "decay": 0.8,
        "k": 2,
        "lb": 0.5,
        "q_min": 0.5,
        "eps_lower": 0.05,
    }
    cases = []
    for registry in NODES.values():
        kit = {k: default for k, (default, _) in registry.kit_args.items()}
        for name in registry.names():
            entry = registry.resolve(name)
            params = list(inspect.signature(entry.obj).parameters.values())[1:]
            for p in params:
                if p.name in (entry.meta["trl_fields"] or {}):
                    continue
                default = kit.get(p.name, p.default)
                cases.append(
                    (registry, name, p.name, special[p.name] if p.name in special else default * 1.5)
                )
    return cases


def _kind_config(registry, name, **args):
    base = {"num_iterations": 2, "beta": 0.05}  # kl_cov needs a reused batch; a guide needs the anchor
    return _config(**{registry.field: {"name": name, **args}, **base})


def _bound(cfg, registry):
    plan = cfg.method_plan
    fn = {
        "guide": plan.guide_fn,
        "advantage_estimator": plan.estimator_call,
        "policy_term": plan.policy_term_fn,
        "kl_term": plan.kl_term_fn,
    }[registry.field]
    return dict(getattr(fn, "keywords", {}))


def test_every_builtin_knob_is_set_in_its_node_and_recorded_resolved():
    """Each keyword of a built-in is set in its node: the plan binds that value, and the config's node (what the
    manifest records) holds it with every other argument at its default."""
    cases = _builtin_keywords()
    assert {(c[1], c[2]) for c in cases} >= {
        ("branch", "gamma"),
        ("branch", "tau"),
        ("passk", "k"),
        ("clip_cov", "ub"),
    }
    for registry, name, key, value in cases:
        cfg = _kind_config(registry, name, **{key: value})
        assert _bound(cfg, registry)[key] == value, (name, key)
        node = getattr(cfg, registry.field)
        assert node["name"] == name and node[key] == value, (name, key)
        default = _kind_config(registry, name)
        assert {k: v for k, v in getattr(default, registry.field).items() if k != key} == {
            k: v for k, v in node.items() if k != key
        }, (name, key)


@pytest.mark.parametrize(
    "overrides, error",
    [
        (
            {"advantage_estimator": {"name": "grpo", "scale_rewards": "none"}},
            r"^advantage_estimator.scale_rewards: advantage estimator 'grpo' reads TRL's own field scale_rewards",
        ),
        (
            {"policy_term": {"name": "entropy_adv", "alpha": "big"}},
            r"^policy_term: policy term 'entropy_adv' argument 'alpha' must be float, got str 'big'$",
        ),
        (
            {"guide": {"name": "token", "cycles": 2.5}},
            r"^guide: guide 'token' argument 'cycles' must be int, got float 2.5$",
        ),
        ({"guide": {"name": "branch", "gamma": -0.1}}, r"^guide.gamma=-0.1 must be >= 0$"),
        ({"guide": {"name": "branch", "q_min": 0}}, r"^guide.q_min=0 must be > 0 \(log q must stay finite"),
        ({"guide": {"name": "branch", "q_min": 1.5}}, r"^guide: q_min=1.5 > q_max=1.4: make q_min <= q_max$"),
        ({"guide": {"name": "random", "eps_upper": 1.5}}, r"^guide.eps_upper=1.5 must be in \[0, 1\]"),
        ({"guide": {"name": "token", "norm": "max"}}, r"^guide.norm='max' is unknown"),
        ({"policy_term": {"name": "clip_cov", "lb": 5.0}}, r"^policy_term: lb=5.0 must be < ub=5.0$"),
        ({"policy_term": {"name": "entropy_adv", "kappa": 1.0}}, r"^policy_term.kappa=1.0 must be > 1"),
    ],
)
def test_a_bad_knob_is_one_line_naming_the_node(overrides, error):
    with pytest.raises(ConfigError, match=error) as caught:
        _config(**overrides)
    assert "\n" not in str(caught.value)


def test_the_command_line_json_and_the_yaml_mapping_give_the_same_run(tmp_path):
    """TRL's convention for a dict field: --advantage_estimator '{"name": "passk", "k": 1}' is the YAML node."""
    from sage_unsloth.rlvr.run import parse_args

    config = tmp_path / "passk.yaml"
    base = REPO / "configs" / "rlvr" / "tiny-cpu" / "_base.yaml"
    config.write_text(f"base: {base}\nadvantage_estimator: {{name: passk, k: 1}}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_yaml = parse_args([str(config), "--output_dir", str(tmp_path)])[0]
        flag = ["--advantage_estimator", '{"name": "passk", "k": 1}', "--output_dir", str(tmp_path)]
        by_flag = parse_args([str(base), *flag])[0]
    assert by_yaml.advantage_estimator == by_flag.advantage_estimator == {"name": "passk", "k": 1}
    assert (
        by_yaml.method_plan.estimator_call.keywords == by_flag.method_plan.estimator_call.keywords == {"k": 1}
    )


def test_each_kind_is_called_with_its_one_record_and_its_keywords(monkeypatch):
    """The one call shape: every kind's plug-in gets exactly one positional input, its kind's frozen record, and
    its knobs as keywords (the trial call before loading goes through the same plugin_calls.call as training)."""
    import dataclasses

    from sage_unsloth.plugins import calls as plugin_calls
    from sage_unsloth.plugins import guides
    from sage_unsloth.plugins.advantages import GroupRewards
    from sage_unsloth.plugins.kl_terms import KLTokens
    from sage_unsloth.plugins.policy_terms import TokenBatch

    seen = {}
    real = plugin_calls.call

    def spy(kind, name, fn, *inputs, **kw):
        seen[kind] = (len(inputs), type(inputs[0]), dict(getattr(fn, "keywords", {})))
        return real(kind, name, fn, *inputs, **kw)

    monkeypatch.setattr(plugin_calls, "call", spy)
    _config(
        guide="branch",
        advantage_estimator={"name": "passk", "k": 2},
        policy_term="kl_cov",
        num_iterations=2,
        kl_term="k2",
    )
    assert seen["guide"] == (1, guides.Signals, {"gamma": 0.3, "tau": 1.2, "q_min": 0.6, "q_max": 1.4})
    assert seen["advantage estimator"] == (1, GroupRewards, {"k": 2})
    assert seen["policy term"] == (1, TokenBatch, {"ratio": 2e-3, "coef": 1.0})
    assert seen["KL term"] == (1, KLTokens, {})
    assert all(dataclasses.is_dataclass(t) and t.__dataclass_params__.frozen for _, t, _ in seen.values())


def test_the_builtins_read_no_config():
    """No plug-in receives the config: each built-in's parameters are its record and its keywords, each with a
    default but the kit's own keys (a guide's clip range) and TRL's fields (grpo's scale_rewards)."""
    import inspect

    from sage_unsloth.rlvr.plan import NODES

    for registry in NODES.values():
        for name in registry.names():
            entry = registry.resolve(name)
            params = list(inspect.signature(entry.obj).parameters.values())
            assert len(params) >= 1 and all(p.kind is p.KEYWORD_ONLY for p in params[1:]), (
                registry.kind,
                name,
            )
            bound_elsewhere = set(registry.kit_args) | set(entry.meta["trl_fields"] or {})
            assert all(p.default is not p.empty for p in params[1:] if p.name not in bound_elsewhere), name
