"""One error contract for the four plug-in kinds (guide, advantage estimator, policy term, KL term), before any model
loads (issue 41, item 1): import, signature and node argument types are checked when the config is built, and
each plug-in is called once on a synthetic batch through the run-time checks (sage_unsloth/plugins/calls.py,
plugins/probe.py). Every fault is one line naming the field and the plug-in (``file.py:function``, with the
line for a syntax error), exit 2, nothing written; plug-ins receive copies of what they read.

The run-time half (a plug-in that passes its trial call and fails in training stops the run before the optimizer
step, naming the step) is tests/kit/test_training_faults.py."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from sage_unsloth import cli
from sage_unsloth.config.args import ConfigError
from sage_unsloth.plugins import guides

REPO = Path(__file__).resolve().parents[2]
TINY_GRPO = "configs/rlvr/tiny-cpu/grpo.yaml"
FIELDS = {
    "guide": "guide",
    "estimator": "advantage_estimator",
    "term": "policy_term",
    "kl": "kl_term",
}


def _config(**kw):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SageGRPOConfig(output_dir="/tmp/unused", report_to="none", **{"backend": "trl", **kw})


def _plugin(tmp_path: Path, source: str, name: str = "mine.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


# ------------------------------------------------------------------------------------------- import and signature
@pytest.mark.parametrize(
    "source, expected",
    [
        (
            "import torch\ndef g(signals)\n    return signals.mask\n",
            r"mine\.py line 2: SyntaxError: expected ':'",
        ),
        ("def g(signals):\n\treturn 1\n        x = 2\n", r"mine\.py line 3: (IndentationError|TabError)"),
        (
            "import sys\nsys.exit(0)\ndef g(signals):\n    pass\n",
            r"importing it called sys\.exit\(0\) \(mine\.py:2\)",
        ),
        (
            "x = 1\nundefined_name + 1\n",
            r"importing it raised NameError: name 'undefined_name' .*\(mine\.py:2\)",
        ),
        (
            "import not_a_module_anywhere\n",
            r"raised ModuleNotFoundError: No module named 'not_a_module_anywhere'",
        ),
    ],
)
def test_a_plugin_file_that_does_not_import_is_one_line_naming_its_line(tmp_path, source, expected):
    path = _plugin(tmp_path, source)
    with pytest.raises(ConfigError, match=expected) as caught:
        _config(guide=f"{path}:g")
    message = str(caught.value)
    assert message.startswith(f"guide='{path}:g': ") and "\n" not in message


def test_a_module_plugin_whose_own_import_fails_names_the_missing_dependency(tmp_path, monkeypatch):
    """'cannot import module' is said only when the named module itself is missing."""
    _plugin(tmp_path, "import not_a_module_anywhere\ndef g(signals):\n    pass\n", "broken_guides.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"raised ModuleNotFoundError: No module named 'not_a_module_anywhere'"
    ):
        _config(guide="broken_guides:g")
    with pytest.raises(ConfigError, match=r"cannot import module 'no_such_guides'"):
        _config(guide="no_such_guides:g")


@pytest.mark.parametrize(
    "kind, source, expected",
    [
        (
            "guide",
            "def f():\n    return 1\n",
            r"takes no positional input; a guide is called as fn\(signals, \*\*arguments\)",
        ),
        ("kl", "def f():\n    pass\n", r"a KL term is called as fn\(tokens, \*\*arguments\)"),
        # the earlier call shapes of the estimators and the policy terms: one line naming the new one
        (
            "estimator",
            "def f(rewards, num_generations, args):\n    return rewards\n",
            (
                r"takes 'num_generations', 'args', the earlier call shape: an advantage estimator is now called as "
                r"fn\(inputs, \*\*arguments\) with its knobs as keyword arguments"
            ),
        ),
        (
            "estimator",
            "def f(rewards, args, *, scale=1.0):\n    return rewards\n",
            r"takes 'args', the earlier call shape",
        ),
        (
            "term",
            "def f(batch, args, *, factor=1.0):\n    pass\n",
            (
                r"takes 'args', the earlier call shape: a policy term is now called as fn\(batch, "
                r"\*\*arguments\)"
            ),
        ),
    ],
)
def test_a_plugin_that_cannot_take_its_inputs_is_refused(tmp_path, kind, source, expected):
    path = _plugin(tmp_path, source)
    with pytest.raises(ConfigError, match=expected):
        _config(**{FIELDS[kind]: f"{path}:f"})


ANNOTATED = """
from typing import Literal, Optional
import torch

def g(signals, *, gamma: float = 0.3, n: int = 1, flag: bool = False, label: str = "a",
      mode: Literal["up", "down"] = "up", cap: Optional[float] = None, ids: list[int] = ()):
    return torch.ones_like(signals.mask, dtype=torch.float32)
"""


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"gamma": "high"}, r"argument 'gamma' must be float, got str 'high'"),
        ({"gamma": True}, r"argument 'gamma' must be float, got bool True"),
        ({"n": 2.5}, r"argument 'n' must be int, got float 2\.5"),
        ({"flag": 1}, r"argument 'flag' must be bool, got int 1"),
        ({"label": 3}, r"argument 'label' must be str, got int 3"),
        ({"mode": "sideways"}, r"argument 'mode' must be one of 'up', 'down', got str 'sideways'"),
        ({"cap": "none"}, r"argument 'cap' must be float or None, got str 'none'"),
        ({"ids": 3}, r"argument 'ids' must be list, got int 3"),
    ],
)
def test_plugin_argument_types_come_from_its_annotations(tmp_path, args, expected):
    path = _plugin(tmp_path, ANNOTATED)
    with pytest.raises(ConfigError, match=f"guide: guide '.*mine.py:g' {expected}"):
        _config(guide={"name": f"{path}:g", **args})


def test_well_typed_plugin_arguments_pass(tmp_path):
    path = _plugin(tmp_path, ANNOTATED)
    args = {"gamma": 1, "n": 3, "flag": True, "label": "b", "mode": "down", "cap": None, "ids": [1, 2]}
    assert _config(guide={"name": f"{path}:g", **args}).guide == {
        "name": f"{path}:g",
        **args,
        "q_min": 0.6,
        "q_max": 1.4,
    }
    _config(guide=f'{{"name": "{path}:g", "cap": 0.5}}')  # JSON from the command line


def test_a_plugin_parameter_called_name_is_refused(tmp_path):
    """``name`` is the node's key that names the plug-in, so a parameter of that name could never be set."""
    path = _plugin(tmp_path, "def g(signals, *, name='x'):\n    return signals.mask\n")
    with pytest.raises(
        ConfigError, match=r"has a parameter 'name', the key that names the plug-in in its node"
    ):
        _config(guide=f"{path}:g")


def test_argument_types_of_every_kind_are_checked(tmp_path):
    path = _plugin(
        tmp_path,
        """
        from sage_unsloth.plugins.kl_terms import KLOutput
        from sage_unsloth.plugins.policy_terms import TermOutput

        def est(inputs, *, scale: float = 1.0):
            return inputs.rewards * scale
        def term(batch, *, factor: float = 1.0):
            return TermOutput(advantages=batch.advantages * factor)
        def kl(tokens, *, cap: float = 10.0):
            d = tokens.ref_logps - tokens.logps
            return KLOutput(d.clamp(max=cap), d.detach())
        """,
    )
    for field, fn, args in (
        ("advantage_estimator", "est", "scale"),
        ("policy_term", "term", "factor"),
        ("kl_term", "kl", "cap"),
    ):
        with pytest.raises(ConfigError, match=f"{field}: .* argument '{args}' must be float, got str"):
            _config(**{field: {"name": f"{path}:{fn}", args: "x"}})
        _config(**{field: {"name": f"{path}:{fn}", args: 2}})


# ------------------------------------------------------------------------------------------- the trial call
FAULTS = {
    "raises": "raise KeyError('oops')",
    "exits": "import sys; sys.exit(0)",
    "nan": "out = out * float('nan')",
    "inf": "out = out + float('inf')",
    "absurd": "out = out * 0 + 1e30",
    "shape": "out = out[..., :-1] if out.dim() > 1 else out[:-1]",
    "type": "out = out.tolist()",
    "integer": "out = out.long()",
}
EXPECTED = {
    "raises": r"raised KeyError: 'oops' \(faulty\.py:\d+\)",
    "exits": r"called sys\.exit\(0\) \(faulty\.py:\d+\)",
    "nan": r"returned \d+ non-finite .*\(first: nan\)",
    "inf": r"returned \d+ non-finite .*\(first: inf\)",
    "absurd": r"of magnitude 1e\+30, beyond 1e\+(06|10) \(absurd",
    "shape": r"of shape \(\d+(, 5)?,?\), expected \(\d+(, 6)?,?\)",
    "type": r"returned list, not a tensor of",
    "integer": r"of dtype torch\.int64: return a floating tensor",
}
# Each kind's plug-in with the fault applied to its output (the guide's q needs none of the loss's bounds: q is
# clipped, so its 'absurd' case is not a fault and is left out).
KIND_SOURCES = {
    "guide": "def f(signals):\n    out = 1 + 0.1 * signals.entropies\n    {fault}\n    return out\n"
    "f.needs = ('entropies',)\n",
    "estimator": "def f(inputs):\n    out = inputs.rewards - inputs.rewards.mean()\n    {fault}\n"
    "    return out\n",
    "term": "from sage_unsloth.plugins.policy_terms import TermOutput\n"
    "def f(batch):\n    out = batch.advantages * 0.5\n    {fault}\n    return TermOutput(advantages=out)\n",
    "kl": "from sage_unsloth.plugins.kl_terms import KLOutput\n"
    "def f(tokens):\n    d = tokens.ref_logps - tokens.logps\n    out = d.exp() - d - 1\n    {fault}\n"
    "    return KLOutput(out, out)\n",
}
CASES = [(k, f) for k in KIND_SOURCES for f in FAULTS if not (k == "guide" and f == "absurd")]


@pytest.mark.parametrize("kind, fault", CASES)
def test_every_fault_of_every_kind_fails_its_trial_call_in_one_line(tmp_path, kind, fault):
    source = KIND_SOURCES[kind].replace("{fault}", FAULTS[fault])
    if fault == "type" and kind in ("term", "kl"):  # their tensors sit inside the output record
        source = source.replace("out = out.tolist()", "out = [out]")
    path = _plugin(tmp_path, source, "faulty.py")
    extra = {"guide": "none"} if kind == "kl" else {}
    with pytest.raises(ConfigError) as caught:
        _config(**{FIELDS[kind]: f"{path}:f", **extra})
    message = str(caught.value)
    assert message.startswith(
        f"{FIELDS[kind]}='{path}:f': its trial call on a synthetic batch before loading"
    )
    assert "\n" not in message
    import re

    assert re.search(EXPECTED[fault], message), message


def test_a_guide_with_a_large_q_is_clipped_not_refused(tmp_path):
    path = _plugin(tmp_path, "def f(signals):\n    return signals.mask * 0 + 1e30\n")
    _config(guide=f"{path}:f")


def test_the_builtins_and_the_examples_pass_their_trial_call():
    """Every registered entry of every kind (with what it needs configured) and each example of examples/."""
    for name in guides.GUIDES.names():
        _config(guide=name)
    _config(advantage_estimator={"name": "passk", "k": 2})
    for term, extra in (("entropy_adv", {}), ("clip_cov", {}), ("kl_cov", {"num_iterations": 2})):
        _config(policy_term=term, **extra)
    _config(kl_term="k2", guide="branch")
    _config(kl_term="forward")
    examples = REPO / "examples"
    _config(guide=f"{examples / 'top2_margin.py'}:top2_margin_guide")
    _config(advantage_estimator=f"{examples / 'centred_advantage.py'}:centred_advantage")
    _config(policy_term=f"{examples / 'damped_advantage_term.py'}:damped_advantage")
    _config(kl_term=f"{examples / 'clipped_k3.py'}:clipped_k3")


def test_the_trial_call_leaves_the_global_rng_alone(tmp_path):
    path = _plugin(tmp_path, "import torch\ndef f(signals):\n    return 1 + torch.rand(signals.mask.shape)\n")
    torch.manual_seed(5)
    before = torch.rand(3)
    torch.manual_seed(5)
    _config(guide=f"{path}:f")
    assert torch.equal(torch.rand(3), before)


def test_a_bad_plugin_on_the_command_line_is_one_line_exit_2_before_anything(tmp_path, capsys, monkeypatch):
    """Through the stage CLI: exit 2, one line, nothing written, no model loaded (the loaders are a tripwire)."""
    from sage_unsloth.model import loading as models

    def tripwire(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad plug-in was reported")

    monkeypatch.setattr(models, "load_for_training", tripwire)
    monkeypatch.setattr(models, "load_tokenizer", tripwire)
    monkeypatch.chdir(REPO)
    bad = _plugin(tmp_path, KIND_SOURCES["estimator"].replace("{fault}", FAULTS["nan"]), "faulty.py")
    out = tmp_path / "out"
    argv = ["rlvr", TINY_GRPO, "--sft_dir", str(tmp_path / "sft"), "--output_root", str(out)]
    assert cli.main([*argv, "--advantage_estimator", f"{bad}:f"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: advantage_estimator='{bad}:f': its trial call"), err
    assert "non-finite advantages" in err[0] and not out.exists()
    syntax = _plugin(tmp_path, "def g(signals)\n    pass\n", "broken.py")
    assert cli.main([*argv, "--guide", f"{syntax}:g"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: guide='{syntax}:g': broken.py line 1: SyntaxError: expected ':'"], err


# ------------------------------------------------------------------------------------------- copies
def _signals():
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(4, 5)
    mask[3, 2:] = 0
    return guides.Signals(
        mask=mask,
        step=0,
        max_steps=10,
        generator=torch.Generator().manual_seed(1),
        entropies=torch.rand(4, 5, generator=g) * 2,
        logps=-torch.rand(4, 5, generator=g),
        logits={"top2_margin": torch.rand(4, 5, generator=g)},
    )


def test_a_guide_that_writes_into_its_signals_changes_nothing_the_loss_uses(tmp_path):
    """It zeroes the mask and the entropies, overwrites the log-probs and a logit signal: the kit's tensors stay
    as they were, and q is set to 1 off the kit's mask, not the guide's."""

    def vandal(signals):
        signals.mask.zero_()
        signals.entropies.fill_(99.0)
        signals.logps.mul_(0.0)
        signals.logits["top2_margin"].zero_()
        return torch.full(signals.mask.shape, 1.3)

    signals = _signals()
    before = {k: v.clone() for k, v in vars(signals).items() if torch.is_tensor(v)}
    margin = signals.logits["top2_margin"].clone()
    entry = guides.Entry("vandal.py:vandal", vandal, {"needs": ("entropies",)}, registered=False)
    q, _ = guides.run_guide(entry, vandal, signals, step=3, q_min=0.6, q_max=1.4)
    for name, value in before.items():
        assert torch.equal(getattr(signals, name), value), name
    assert torch.equal(signals.logits["top2_margin"], margin)
    assert torch.equal(q, torch.where(before["mask"].bool(), torch.tensor(1.3), torch.tensor(1.0)))


def test_a_policy_term_and_a_kl_term_get_copies_but_keep_the_gradient():
    from sage_unsloth.plugins import calls as plugin_calls
    from sage_unsloth.plugins.kl_terms import KLOutput, KLTokens
    from sage_unsloth.plugins.policy_terms import TermOutput, TokenBatch

    logps = (-torch.rand(2, 3)).requires_grad_(True)
    mask, advantages, ref = torch.ones(2, 3), torch.ones(2, 3), -torch.rand(2, 3)
    tokens = TokenBatch(logps, logps.detach().clone(), torch.rand(2, 3), advantages, mask, 0.2, 0.2, None)

    def term(batch):
        batch.mask.zero_()
        batch.advantages.mul_(-5.0)
        return TermOutput(loss=batch.logps * 2.0)

    out = plugin_calls.call(
        "policy term",
        "t",
        term,
        tokens,
        step=1,
        check=lambda o: plugin_calls.term_output_problem(o, (2, 3), mask),
    )
    assert torch.equal(mask, torch.ones(2, 3)) and torch.equal(advantages, torch.ones(2, 3))
    out.loss.sum().backward()
    assert torch.equal(logps.grad, torch.full((2, 3), 2.0))  # the copy's graph reaches the policy's log-probs

    def kl(tokens):
        tokens.ref_logps.zero_()
        return KLOutput(tokens.logps * 1.0, tokens.logps.detach())

    saved = ref.clone()
    plugin_calls.call(
        "KL term",
        "k",
        kl,
        KLTokens(logps, ref, None, False),
        step=1,
        check=lambda o: plugin_calls.kl_output_problem(o, (2, 3), mask),
    )
    assert torch.equal(ref, saved)


def test_an_estimator_that_writes_into_its_inputs_changes_only_its_copy():
    from sage_unsloth.plugins import calls as plugin_calls
    from sage_unsloth.plugins.advantages import GroupRewards

    def greedy(inputs):
        inputs.rewards.zero_()
        return inputs.rewards

    rewards = torch.ones(4)
    plugin_calls.call(
        "advantage estimator",
        "g",
        greedy,
        GroupRewards(rewards, 2),
        step=1,
        check=lambda o: plugin_calls.advantages_problem(o, 4),
    )
    assert torch.equal(rewards, torch.ones(4))


def test_a_run_time_fault_names_the_kind_the_plugin_and_the_step():
    from sage_unsloth.plugins import calls as plugin_calls

    def boom(signals):
        return signals.nothing

    with pytest.raises(plugin_calls.PluginFault) as caught:
        plugin_calls.call("guide", "mine.py:boom", boom, _signals(), step=7, check=lambda o: None)
    message = str(caught.value)
    assert (
        message.startswith("guide 'mine.py:boom' at step 7 raised AttributeError: ") and "\n" not in message
    )
    assert "test_plugin_contract.py:" in message and message.endswith("the step was not applied")
    # A real Ctrl-C stays the user's (the stage's own line and exit 130), a plug-in's own KeyboardInterrupt is its
    # fault: tests/rlvr/test_plugin_misbehaviour.py.


def test_guide_argument_types_of_a_lab_config_are_checked_before_the_lab_trains(tmp_path, capsys):
    """The lab's preflight parses each method config as stage 2 will (sage_unsloth/demo/run.py): a guide argument
    of the wrong type is its one line, exit 2, before any step runs."""
    from sage_unsloth.demo.run import check_stage2_configs

    path = _plugin(tmp_path, ANNOTATED)
    config = tmp_path / "my_method.yaml"
    config.write_text(
        f"base: {REPO / 'configs' / 'rlvr' / 'tiny-cpu' / '_base.yaml'}\n"
        f"guide: {{name: {path}:g, gamma: high}}\n"
    )
    assert check_stage2_configs([str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    want = f"error: my_method ({config}): guide: guide '{path}:g' argument 'gamma' must be float, got str"
    assert err == [f"{want} 'high'"], err
