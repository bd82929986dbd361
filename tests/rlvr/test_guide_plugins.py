"""Guides as plug-ins (sage_unsloth/plugins/guides.py): the contract every registered guide keeps, the checks the kit makes
around a guide's q, where q is computed, the logit signals, the config surface (the guide node: name | path
and its arguments, one-line errors before any model loads), a user's own config folder, and the example guide of
examples/top2_margin.py trained through the RLVR CLI on the tiny model under TRL's and Unsloth's trainers.

Independent references are written here from the definitions (top-2 margin: sort the softmax; the example's q
from its docstring formula; the old hard-coded q-source rule as it stood before the registry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from sage_unsloth.config.args import ConfigError
from sage_unsloth.plugins import guides

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "top2_margin.py"
EXAMPLE_SPEC = f"{EXAMPLE}:top2_margin_guide"
SCENARIO = Path(__file__).parents[1].joinpath("support", "guide_plugin_scenario.py")


def _config(tmp_path, **kw):
    from sage_unsloth.rlvr.config import SageGRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SageGRPOConfig(output_dir=str(tmp_path), report_to="none", **{"backend": "trl", **kw})


def _signals(seed=0, generator_seed=7, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(3, 9, generator=g) > 0.3).float()
    mask[2] = 0.0  # a row without completion tokens
    entropies = (torch.rand(3, 9, generator=g) * 3).requires_grad_(requires_grad)
    logps = -(torch.rand(3, 9, generator=g) * 6).requires_grad_(requires_grad)
    return guides.Signals(
        mask=mask,
        step=3,
        max_steps=16,
        generator=torch.Generator().manual_seed(generator_seed),
        entropies=entropies,
        logps=logps,
        logits={"top2_margin": torch.rand(3, 9, generator=g)},
        # its own generator, so the draws above stay as they were
        ref_entropies=torch.rand(3, 9, generator=torch.Generator().manual_seed(seed + 100)) * 3,
    )


def _q(tmp_path, spec, signals, **args):
    plan = _config(tmp_path, guide={"name": spec, **args}).method_plan
    raw = plan.guide_fn(signals)
    return guides.finalise_q(raw, signals, name=plan.guide.name, q_min=plan.q_min, q_max=plan.q_max)


def _guide(tmp_path, spec):
    """(the guide's entry, its needs) as the config's plan resolved them."""
    plan = _config(tmp_path, guide=spec).method_plan
    return plan.guide, plan.guide_needs


# ------------------------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("spec", [*guides.GUIDES.names(), EXAMPLE_SPEC])
def test_every_guide_keeps_the_contract(tmp_path, spec):
    """q = 1 exactly off the mask, finite, inside [q_min, q_max], no gradient, and the same q for the same seed."""
    signals = _signals(requires_grad=True)
    q = _q(tmp_path, spec, signals)
    off = ~signals.mask.bool()
    assert q.shape == signals.mask.shape and q.dtype == torch.float32 and not q.requires_grad
    assert torch.equal(q[off], torch.ones_like(q[off]))
    assert torch.isfinite(q).all() and q.min() >= 0.6 and q.max() <= 1.4
    again = _q(tmp_path, spec, _signals(requires_grad=True))
    assert torch.equal(q, again)


def test_noisy_guides_draw_from_the_seeded_generator(tmp_path):
    for spec in ("token", "random"):
        kw = {"eps_upper": 0.9, "eps_lower": 0.9} if spec == "random" else {}
        a = _q(tmp_path, spec, _signals(generator_seed=1), **kw)
        b = _q(tmp_path, spec, _signals(generator_seed=2), **kw)
        assert not torch.equal(a, b), spec


def test_entropy_guide_is_the_same_in_trl_and_unsloth_layouts(tmp_path):
    """An entropy-only guide runs inside Unsloth's loss on its left-packed layout: the same q per token."""
    from sage_unsloth.compat import to_unsloth_layout

    signals = _signals()
    prompt_ids = torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9], [5, 6, 7, 8]])  # left padding with pad id 0
    completion_ids = torch.randint(1, 50, (3, 9))
    q_trl = _q(tmp_path, "branch", signals, tau=0.5)
    place = lambda t: to_unsloth_layout(t, prompt_ids, completion_ids, 0)
    packed = guides.Signals(
        mask=place(signals.mask),
        step=3,
        max_steps=16,
        generator=torch.Generator(),
        layout="unsloth",
        entropies=place(signals.entropies),
    )
    q_unsloth = _q(tmp_path, "branch", packed, tau=0.5)
    torch.testing.assert_close(q_unsloth, place(q_trl - 1.0) + 1.0, atol=0, rtol=0)


@pytest.mark.parametrize(
    "raw, error",
    [
        (torch.ones(3, 8), r"guide 'g' returned q of shape \(3, 8\), expected \(3, 9\)"),
        (torch.full((3, 9), float("nan")), r"guide 'g' returned \d+ non-finite q on completion tokens"),
        (torch.ones(3, 9, dtype=torch.long), r"guide 'g' returned q of dtype torch.int64"),
        ([1.0], r"guide 'g' returned list, not a tensor"),
    ],
)
def test_finalise_q_refuses_a_bad_q_in_one_line(raw, error):
    with pytest.raises(guides.GuideError, match=error) as caught:
        guides.finalise_q(raw, _signals(), name="g", q_min=0.6, q_max=1.4)
    assert "\n" not in str(caught.value)


def test_finalise_q_clips_and_sets_one_off_the_mask():
    signals = _signals()
    raw = torch.linspace(0.0, 3.0, 27).reshape(3, 9)
    q = guides.finalise_q(raw, signals, name="g", q_min=0.6, q_max=1.4)
    want = torch.where(signals.mask.bool(), raw.clamp(0.6, 1.4), torch.ones_like(raw))
    assert torch.equal(q, want)


# ------------------------------------------------------------------------------------------- where q runs
def _old_rule(guide: str, source: str, patched: bool) -> str:
    """rlvr/trainer.py's sage_q_in_loss before the registry (placement loss), the reference for the built-ins."""
    if guide not in ("branch", "token"):
        return "rollout"
    in_loss = (
        source in ("loss", "auto")
        if guide == "branch"
        else (source == "loss" or (source == "auto" and not patched))
    )
    return "loss" if in_loss else "rollout"


@pytest.mark.parametrize("guide", ["none", "branch", "token", "random"])
@pytest.mark.parametrize("source", ["auto", "loss", "rollout"])
@pytest.mark.parametrize("patched", [False, True])
def test_q_source_of_the_builtins_is_the_old_rule(guide, source, patched):
    needs = guides.GUIDES.resolve(guide).meta["needs"]
    if patched and guides.unsloth_cannot(needs, requested=source, guide=guide):
        return  # refused at config time (test_unsloth_refusals)
    assert guides.q_source(needs, requested=source, unsloth_patched=patched) == _old_rule(
        guide, source, patched
    )


def test_q_source_of_a_logit_signal_guide():
    needs = ("top2_margin",)
    assert guides.q_source(needs, requested="auto", unsloth_patched=False) == "loss"
    assert guides.q_source(needs, requested="auto", unsloth_patched=True) == "rollout"
    assert guides.q_source(needs, requested="rollout", unsloth_patched=False) == "rollout"


def test_unsloth_refusals_are_one_line_before_any_model_loads(tmp_path):
    plugin = tmp_path / "ref_guide.py"
    plugin.write_text("def g(signals):\n    return signals.ref_logps.exp()\ng.needs = ('ref_logps',)\n")
    with pytest.raises(
        ConfigError, match=r"needs ref_logps, which Unsloth's trainer keeps only .*: set backend=trl"
    ):
        _config(tmp_path, guide=f"{plugin}:g", backend="unsloth")
    with pytest.raises(
        ConfigError, match=r"sage_q_source='loss' with guide=.* needs top2_margin inside the loss"
    ):
        _config(tmp_path, guide=EXAMPLE_SPEC, backend="unsloth", sage_q_source="loss")
    _config(tmp_path, guide=EXAMPLE_SPEC, backend="unsloth")  # at rollout: fine
    _config(tmp_path, guide=f"{plugin}:g", backend="trl")


# ------------------------------------------------------------------------------------------- logit signals
def test_top2_margin_against_sorted_probabilities():
    log_probs = torch.log_softmax(torch.randn(40, 11) * 2, dim=-1)
    probs = sorted_probs = log_probs.exp()
    sorted_probs = torch.sort(probs, dim=-1, descending=True).values
    want = sorted_probs[:, 0] - sorted_probs[:, 1]
    got = guides.LOGIT_SIGNALS.resolve("top2_margin").obj(log_probs, torch.zeros(40, dtype=torch.long))
    torch.testing.assert_close(got, want)


def test_a_logit_signal_by_import_path(tmp_path):
    """A signal of one's own: named in needs by path, resolved with its uses_target flag, which decides whether
    the guide's q can differ between candidate tokens (guide_effect)."""
    plugin = tmp_path / "sig.py"
    plugin.write_text(
        "def target_prob(log_probs, targets):\n"
        "    return log_probs.gather(-1, targets[:, None]).squeeze(-1).exp()\n"
        "target_prob.uses_target = True\n"
        "def guide(signals):\n"
        f"    return 1 + signals.logits[{str(plugin) + ':target_prob'!r}]\n"
        f"guide.needs = ({str(plugin) + ':target_prob'!r},)\n"
    )
    entry, needs = _guide(tmp_path, f"{plugin}:guide")
    fns = guides.logit_signal_functions(needs)
    log_probs = torch.log_softmax(torch.randn(5, 7), -1)
    targets = torch.tensor([0, 3, 6, 2, 2])
    torch.testing.assert_close(fns[needs[0]](log_probs, targets), log_probs.exp()[torch.arange(5), targets])
    assert guides.token_dependent(needs) and not guides.token_dependent(("top2_margin",))
    bounds = {"q_min": 0.6, "q_max": 1.4}
    assert guides.guide_effect(entry, "k2", ratio=False, placement="loss", **bounds) is None


def test_trl_label_mask_is_the_scored_positions():
    """compat.trl_label_mask: the completion tokens with attention, in TRL's (B, logits_to_keep) columns."""
    from sage_unsloth.compat import trl_label_mask

    attention = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    got = trl_label_mask(torch.zeros_like(attention), attention, 3)
    assert got.tolist() == [[True, True, False], [True, True, True]]


# ------------------------------------------------------------------------------------------- config surface
def test_guide_by_name_path_and_module(tmp_path, monkeypatch):
    assert _config(tmp_path, guide="branch").guide["name"] == "branch"
    cfg = _config(tmp_path, guide=f'{{"name": "{EXAMPLE_SPEC}", "gamma": 0.5}}')  # JSON from the CLI
    assert cfg.guide == {"name": EXAMPLE_SPEC, "gamma": 0.5, "threshold": 0.2, "q_min": 0.6, "q_max": 1.4}
    monkeypatch.syspath_prepend(str(REPO))
    assert _guide(tmp_path, "examples.top2_margin:top2_margin_guide")[1] == ("top2_margin",)


@pytest.mark.parametrize(
    "overrides, error",
    [
        ({"guide": "brnch"}, r"guide='brnch' is unknown: did you mean 'branch'\?"),
        (
            {"guide": {"name": EXAMPLE_SPEC, "gama": 1}},
            r"has no argument 'gama': did you mean 'gamma'",
        ),
        (
            {"guide": "{gamma"},
            r"guide=.* is not a JSON object",
        ),
        ({"guide": "nowhere.mod:fn"}, r"cannot import module 'nowhere.mod'"),
        ({"guide": f"{EXAMPLE}:top3"}, r"has no 'top3'"),
    ],
)
def test_bad_guide_config_is_one_line(tmp_path, overrides, error):
    with pytest.raises(ConfigError, match=error) as caught:
        _config(tmp_path, **overrides)
    assert "\n" not in str(caught.value)


def test_undeclared_signal_is_refused(tmp_path):
    plugin = tmp_path / "bad_needs.py"
    plugin.write_text("def g(signals):\n    return signals.mask\ng.needs = ('entropy',)\n")
    with pytest.raises(ConfigError, match=r"declares needs 'entropy', which is no signal"):
        _config(tmp_path, guide=f"{plugin}:g")


def test_example_guide_effect_follows_its_needs(tmp_path):
    """Position-constant q (the top-2 margin does not depend on the sampled token): no effect under the reverse-KL
    gradients (k2, k3 * rho), an effect under k3 and in the reward; a guide reading logps acts under k2 too."""
    entry = _guide(tmp_path, EXAMPLE_SPEC)[0]
    bounds = {"q_min": 0.6, "q_max": 1.4}
    assert guides.guide_effect(entry, "k2", ratio=False, placement="loss", **bounds) is not None
    assert guides.guide_effect(entry, "k3", ratio=True, placement="loss", **bounds) is not None
    assert guides.guide_effect(entry, "k3", ratio=False, placement="loss", **bounds) is None
    assert guides.guide_effect(entry, "k2", ratio=False, placement="reward", **bounds) is None
    plugin = tmp_path / "by_token.py"
    plugin.write_text("def g(signals):\n    return 1 - signals.logps\ng.needs = ('logps',)\n")
    by_token = _guide(tmp_path, f"{plugin}:g")[0]
    assert guides.guide_effect(by_token, "k2", ratio=False, placement="loss", **bounds) is None


def test_every_guide_gets_its_gradient_rule_from_its_metadata(tmp_path):
    """guide_effect reads each guide's metadata, never a list of names: every registered guide (ref_branch
    included) follows the rule its registration or its needs give, and a plug-in that declares
    ``gradient_rule = "random"`` gets the random guide's symmetric-bounds rule."""
    import itertools

    from sage_unsloth.plugins import anchor

    rules = {"none": "none", "branch": "branch", "ref_branch": "branch", "token": "token", "random": "random"}
    assert set(guides.GUIDES.names()) == set(rules)  # a new guide is added here with the rule it follows
    settings = itertools.product(("k3", "k2", "forward"), (False, True), ("loss", "reward"), (0.6, 0.5))
    for estimator, ratio, placement, q_min in settings:
        kw = {"ratio": ratio, "placement": placement, "q_min": q_min, "q_max": 1.4}
        for name, rule in rules.items():
            got = guides.guide_effect(guides.GUIDES.resolve(name), estimator, **kw)
            assert got == anchor.guide_effect(rule, estimator, **kw), (name, estimator, kw)
    plugin = tmp_path / "noise.py"
    plugin.write_text("def g(signals):\n    return signals.mask.float()\ng.gradient_rule = 'random'\n")
    noise = _guide(tmp_path, f"{plugin}:g")[0]
    reason = guides.guide_effect(noise, "k3", ratio=False, placement="loss", q_min=0.6, q_max=1.4)
    assert reason is not None and "E[q] = 1" in reason


# ------------------------------------------------------------------------------------------- a user's folder
def test_a_user_config_folder_works_with_every_stage(tmp_path):
    """Configs in a folder of the user's own (no sibling grpo.yaml / _base.yaml; one with a base elsewhere, one
    with a sibling base) parse in every stage."""
    from sage_unsloth.eval.run import parse_args as eval_args
    from sage_unsloth.report.stage import parse_args as report_args
    from sage_unsloth.rlvr.run import parse_args as rlvr_args
    from sage_unsloth.sft.run import parse_args as sft_args

    mine = tmp_path / "my-configs"
    mine.mkdir()
    tiny = REPO / "configs" / "rlvr" / "tiny-cpu" / "_base.yaml"
    (mine / "top2.yaml").write_text(f"base: {tiny}\nguide: {{name: {EXAMPLE_SPEC}, gamma: 0.5}}\n")
    (mine / "_mine.yaml").write_text(f"base: {tiny}\nmax_steps: 3\n")
    (mine / "branch.yaml").write_text("base: _mine.yaml\nguide: {name: branch, gamma: 0.8}\n")
    (mine / "sft.yaml").write_text(f"base: {REPO / 'configs' / 'sft' / 'tiny-cpu.yaml'}\n")
    (mine / "eval.yaml").write_text(f"base: {REPO / 'configs' / 'eval' / 'tiny-cpu.yaml'}\n")
    (mine / "report.yaml").write_text(f"base: {REPO / 'configs' / 'report' / 'default.yaml'}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        top2 = rlvr_args([str(mine / "top2.yaml")])[0]
        branch = rlvr_args([str(mine / "branch.yaml")])[0]
        sft_args([str(mine / "sft.yaml")])
        eval_args([str(mine / "eval.yaml")])
        report_args([str(mine / "report.yaml")])
    assert (top2.guide["name"], top2.guide["gamma"]) == (EXAMPLE_SPEC, 0.5)
    assert (branch.guide["gamma"], branch.max_steps) == (0.8, 3)


# ------------------------------------------------------------------------------------------- the example, trained
def _independent_margins(model_dir, sft_dir, calls, temperature=1.0):
    """top-2 margin of the SFT policy (base + stage-1 LoRA) at each completion token, from a plain forward."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(sft_dir)).eval()
    call = calls[0]
    ids = torch.tensor(call["prompt_ids"] + []), torch.tensor(call["completion_ids"])
    prompt, completion = ids
    attention = torch.cat([torch.tensor(call["prompt_mask"]), torch.tensor(call["completion_mask"])], 1)
    with torch.no_grad():
        logits = model(input_ids=torch.cat([prompt, completion], 1), attention_mask=attention).logits
    c = completion.size(1)
    probs = torch.softmax(logits[:, -c - 1 : -1].float() / temperature, -1)
    top = torch.sort(probs, -1, descending=True).values
    return top[..., 0] - top[..., 1]


def _check_example_run(call, margins, gamma=0.5, threshold=0.2):
    mask = torch.tensor(call["completion_mask"]).bool()
    got = torch.tensor(call["margin"])
    assert mask.any()
    torch.testing.assert_close(got[mask], margins[mask], atol=1e-5, rtol=1e-4)
    want_q = torch.where(mask, (1 + gamma * torch.relu(threshold - margins) / threshold).clamp(0.6, 1.4), 1.0)
    torch.testing.assert_close(torch.tensor(call["q"]), want_q, atol=1e-5, rtol=1e-4)
    assert (want_q[mask] > 1.0).any()  # the guide moved the anchor


def _user_config(tmp_path) -> Path:
    mine = tmp_path / "mine"
    mine.mkdir()
    path = mine / "top2.yaml"
    path.write_text(
        f"base: {REPO / 'configs' / 'rlvr' / 'tiny-cpu' / '_base.yaml'}\n"
        f"guide: {{name: {EXAMPLE_SPEC}, gamma: 0.5, threshold: 0.2}}\nmax_steps: 1\nsave_strategy: 'no'\n"
    )
    return path


def test_example_guide_trains_through_the_cli_on_trl(
    tiny_model_dir, sft_dir, dapo_sample, tmp_path, monkeypatch, varied_reward
):
    """TRL's trainer: q in the loss from the loss forward's own chunked pass (no extra pass), equal to the formula
    on an independent forward of the policy."""
    from guide_plugin_scenario import record_q_calls

    from sage_unsloth.rlvr.run import main

    calls = record_q_calls(monkeypatch)
    argv = [str(_user_config(tmp_path)), "--sft_dir", str(sft_dir), "--output_root", str(tmp_path / "out")]
    assert main([*argv, "--dataset_path", str(dapo_sample)]) == 0
    assert calls and calls[0]["in_loss"] and calls[0]["extra_passes"] == 0
    _check_example_run(calls[0], _independent_margins(tiny_model_dir, sft_dir, calls))
    logs = [
        json.loads(line)
        for line in next((tmp_path / "out").rglob("log_history.jsonl")).read_text().splitlines()
    ]
    assert any(entry.get("sage/q_max", 1.0) > 1.0 for entry in logs)


@pytest.mark.slow
def test_example_guide_trains_through_the_cli_under_unsloth(tiny_model_dir, sft_dir, dapo_sample, tmp_path):
    """Unsloth's generated trainer (forced onto the CPU): the top-2 margin is not in its loss, so q is computed at
    rollout from one extra no-grad pass of the policy; same formula, same independent check."""
    out = tmp_path / "unsloth"
    out.mkdir()
    argv = [str(_user_config(tmp_path)), "--sft_dir", str(sft_dir), "--output_root", str(out / "runs")]
    done = subprocess.run(
        [sys.executable, str(SCENARIO), str(out / "result.json"), *argv, "--dataset_path", str(dapo_sample)],
        cwd=out,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "support")])),
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    result = json.loads((out / "result.json").read_text())
    assert result["rc"] == 0 and "UnslothGRPOTrainer" in result["mro"], result["mro"]
    call = result["calls"][0]
    assert not call["in_loss"] and call["extra_passes"] == 1
    _check_example_run(call, _independent_margins(tiny_model_dir, sft_dir, result["calls"]))
