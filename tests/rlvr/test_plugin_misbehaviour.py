"""Plug-ins that misbehave toward the run rather than return a bad number (issue 52, item 3), each caught at the
trial call before any model loads, or in training through the same call (sage_unsloth/plugins/calls.py,
plugins/guard.py, plugins/probe.py), in one line naming the plug-in:

- a KL term (or a policy term's added loss) without a gradient, when beta > 0: it would train with no KL, silently;
- outputs on the meta device, in a sparse layout, or (for the terms the kit does not move) on another device than
  their inputs: said before anything indexes them, never a traceback from inside the finiteness check;
- a plug-in's own KeyboardInterrupt (not the user's Ctrl-C: exit 2 or 1, never 130), ``os._exit`` (never exit 0
  with no manifest), and a call past its time budget (stopped; one that will not stop ends the process in one line);
- a guide reading a signal its ``needs`` does not declare: the ``needs`` line to write;
- credential-like plug-in arguments: ``<redacted>`` in the pickled arguments (training_args.bin), their JSON, their
  repr, the manifest's config and sys.argv, while the plug-in gets the value;
- a logit signal's relative path in ``needs``: beside the guide's own file (where the lab's YAML puts it)."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from subprocess_run import env_with_repo, run_python
from test_plugin_contract import _config, _plugin  # the configs and plug-in files the contract tests build

from sage_unsloth.config.args import ConfigError
from sage_unsloth.plugins import calls as plugin_calls

REPO = Path(__file__).resolve().parents[2]
TINY_GRPO = "configs/rlvr/tiny-cpu/grpo.yaml"
TRIAL = "its trial call on a synthetic batch before loading"


def _refused(field: str, spec: str, **kw) -> str:
    """The one line the config's trial call refuses ``spec`` with."""
    with pytest.raises(ConfigError) as caught:
        _config(**{field: spec, **kw})
    message = str(caught.value)
    assert message.startswith(f"{field}={spec!r}: {TRIAL}") and "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------------------ gradients
KL_TERMS = """
import torch
from sage_unsloth.plugins.kl_terms import KLOutput

def k3(tokens):
    d = tokens.ref_logps - tokens.logps
    out = d.exp() - d - 1
    return KLOutput(out, out.detach())

def detached(tokens):
    d = (tokens.ref_logps - tokens.logps).detach()
    out = d.exp() - d - 1
    return KLOutput(out, out)

def under_no_grad(tokens):
    with torch.no_grad():
        d = tokens.ref_logps - tokens.logps
        out = d.exp() - d - 1
    return KLOutput(out, out)

def from_the_reference(tokens):
    out = tokens.ref_logps.exp()
    return KLOutput(out, out)

def a_fresh_leaf(tokens):
    d = (tokens.ref_logps - tokens.logps).detach()
    return KLOutput((d.exp() - d - 1).requires_grad_(), d)

def a_graph_of_its_own(tokens):
    w = torch.ones((), requires_grad=True)
    return KLOutput(w * tokens.ref_logps.exp(), tokens.ref_logps.exp())
"""


@pytest.mark.parametrize(
    "fn, expected",
    [
        ("detached", "returned its term without a gradient"),
        ("under_no_grad", "returned its term without a gradient"),
        ("from_the_reference", "returned its term without a gradient"),
        ("a_fresh_leaf", "returned its term without a gradient"),
        ("a_graph_of_its_own", "whose gradient does not reach inputs.logps"),
    ],
)
def test_a_kl_term_without_a_gradient_is_refused_at_its_trial_call(tmp_path, fn, expected):
    path = _plugin(tmp_path, KL_TERMS)
    message = _refused("kl_term", f"{path}:{fn}", guide="none", beta=0.05)
    assert expected in message and "train" in message, message
    _config(kl_term=f"{path}:k3", guide="branch", beta=0.05)  # one with its gradient passes


def test_a_policy_term_whose_added_loss_has_no_gradient_is_refused():
    source = """
    from sage_unsloth.plugins.policy_terms import TermOutput

    def detached(batch):
        return TermOutput(loss=(batch.logps - batch.old_logps).abs().detach() * 0.1)

    def fine(batch):
        return TermOutput(loss=(batch.logps - batch.old_logps).abs() * 0.1)
    """
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = _plugin(Path(folder), source)
        message = _refused("policy_term", f"{path}:detached")
        assert "returned its loss without a gradient" in message
        _config(policy_term=f"{path}:fine")


# ------------------------------------------------------------------------------------------------ devices
@pytest.mark.parametrize(
    "kind, body, expected",
    [
        (
            "guide",
            "return torch.ones(signals.mask.shape, device='meta')",
            "returned a tensor on the meta device",
        ),
        (
            "guide",
            "return (signals.mask * 1.1).to_sparse()",
            "returned a tensor in the torch.sparse_coo layout",
        ),
        ("estimator", "return torch.zeros(inputs.rewards.shape, device='meta')", "on the meta device"),
        (
            "kl",
            "d = tokens.ref_logps - tokens.logps\n    out = (d.exp() - d - 1).to('meta')\n    return KLOutput(out, out)",
            "returned term on the meta device",
        ),
    ],
)
def test_an_output_on_the_meta_device_or_sparse_is_one_line_not_a_traceback(tmp_path, kind, body, expected):
    head = "import torch\nfrom sage_unsloth.plugins.kl_terms import KLOutput\n"
    arg = {"guide": "signals", "estimator": "inputs", "kl": "tokens"}[kind]
    path = _plugin(
        tmp_path, f"{head}def f({arg}):\n    {body}\n" + ("f.needs = ('entropies',)\n" * (kind == "guide"))
    )
    field = {"guide": "guide", "estimator": "advantage_estimator", "kl": "kl_term"}[kind]
    extra = {"guide": "none"} if kind == "kl" else {}
    message = _refused(field, f"{path}:f", **extra)
    assert expected in message, message


def test_a_term_on_another_device_than_its_inputs_is_named_before_the_loss_reads_it():
    """A KL term's output enters the loss as it is: on another device than its inputs it is refused in one line
    (here the inputs are on the meta device, the only second device a CPU machine has)."""
    from sage_unsloth.plugins.kl_terms import KLOutput, KLTokens

    logps = torch.zeros(2, 3, device="meta")
    tokens = KLTokens(logps=logps, ref_logps=logps, old_logps=None, ratio=False)
    with pytest.raises(
        plugin_calls.PluginFault, match=r"returned term on cpu, its inputs are on meta: create it"
    ):
        plugin_calls.call(
            "KL term",
            "cpu.py:kl",
            lambda t: KLOutput(torch.zeros(2, 3), torch.zeros(2, 3)),
            tokens,
            step=4,
            check=lambda out: None,
        )


def test_an_output_the_checks_cannot_read_is_the_plugins_fault():
    class Odd:
        advantages = loss = None

        @property
        def metrics(self):
            raise RuntimeError("no metrics today")

    with pytest.raises(
        plugin_calls.PluginFault, match=r"returned Odd that the kit cannot read \(RuntimeError"
    ):
        plugin_calls.call(
            "policy term",
            "odd.py:t",
            lambda batch: Odd(),
            torch.zeros(2, 3),
            step=1,
            check=lambda out: plugin_calls.term_output_problem(out, (2, 3), torch.ones(2, 3)),
        )


# ------------------------------------------------------------------------------------------------ interrupts, exits
def test_a_plugins_own_keyboard_interrupt_is_its_fault_a_real_ctrl_c_stays_the_users(tmp_path):
    path = _plugin(tmp_path, "def g(signals):\n    raise KeyboardInterrupt\n")
    message = _refused("guide", f"{path}:g")
    assert "raised KeyboardInterrupt itself (no Ctrl-C came) (mine.py:2)" in message
    with pytest.raises(plugin_calls.PluginFault, match="at step 3 raised KeyboardInterrupt itself"):
        plugin_calls.call(
            "guide", "g", lambda s: (_ for _ in ()).throw(KeyboardInterrupt()), 1, step=3, check=None
        )

    def pressed_ctrl_c(signals):
        signal.raise_signal(signal.SIGINT)  # what the terminal sends on Ctrl-C
        time.sleep(5)

    # Python's own Ctrl-C handler, as a stage process has it (a pytest-xdist worker may hold SIGINT ignored)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            plugin_calls.call("guide", "g", pressed_ctrl_c, 1, step=3, check=lambda out: None)
    finally:
        signal.signal(signal.SIGINT, previous_int)

    class Terminated(BaseException):
        """What a stage's own SIGTERM handler might raise (it handles SIGTERM as Ctrl-C)."""

    def terminated(signum, frame):
        raise Terminated()

    def sent_sigterm(signals):
        os.kill(os.getpid(), signal.SIGTERM)  # what SLURM's pre-emption and `timeout` send
        time.sleep(5)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with pytest.raises(Terminated):
            plugin_calls.call("guide", "g", sent_sigterm, 1, step=3, check=lambda out: None)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_plugins_keyboard_interrupt_through_the_stage_is_exit_2_not_130(tmp_path, capsys, monkeypatch):
    from sage_unsloth import cli

    monkeypatch.chdir(REPO)
    path = _plugin(tmp_path, "def g(signals):\n    raise KeyboardInterrupt\n")
    argv = ["rlvr", TINY_GRPO, "--sft_dir", str(tmp_path / "sft"), "--output_root", str(tmp_path / "out")]
    assert cli.main([*argv, "--guide", f"{path}:g"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "raised KeyboardInterrupt itself" in err[0] and "interrupted" not in err[0], err


OS_EXIT = """
import os

def g(signals):
    os._exit(0)

def swallowed(signals):
    try:
        os._exit(0)
    except BaseException:
        return signals.mask * 1.0
"""


@pytest.mark.slow
@pytest.mark.parametrize("fn", ["g", "swallowed"])
def test_os_exit_in_a_plugin_never_ends_the_stage_with_exit_0(tmp_path, fn):
    """In a child process, since on a kit without the guard os._exit(0) ends whatever process it runs in."""
    path = _plugin(tmp_path, OS_EXIT)
    out = tmp_path / "out"
    argv = [
        "-m",
        "sage_unsloth.rlvr",
        TINY_GRPO,
        "--sft_dir",
        str(tmp_path / "sft"),
        "--output_root",
        str(out),
    ]
    done = run_python([*argv, "--guide", f"{path}:{fn}"], cwd=REPO, timeout=300, env=env_with_repo())
    err = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert len(err) == 1 and f"{TRIAL} (4 rows x 6 tokens) called os._exit(0)" in err[0], done.stderr[-2000:]
    assert not out.exists()


@pytest.mark.slow
def test_os_exit_in_a_plugin_at_a_training_step_is_a_fault_not_an_exit(tmp_path):
    code = textwrap.dedent(
        """
        import os, sys
        from sage_unsloth.plugins import calls as plugin_calls
        try:
            plugin_calls.call("advantage estimator", "mine.py:est", lambda i: os._exit(0), 1, step=7, check=None)
        except plugin_calls.PluginFault as fault:
            print(f"error: {fault}", file=sys.stderr)
            sys.exit(1)
        """
    )
    done = run_python(["-c", code], cwd=REPO, timeout=120, env=env_with_repo())
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert done.stderr.strip() == (
        "error: advantage estimator 'mine.py:est' at step 7 called os._exit(0), which would end the run with no "
        "error and no manifest (<string>:5): the step was not applied"
    ), done.stderr


# ------------------------------------------------------------------------------------------------ time budget
def test_a_guide_that_sleeps_is_stopped_at_its_budget_in_one_line(tmp_path, monkeypatch):
    path = _plugin(
        tmp_path, "import time\ndef g(signals):\n    time.sleep(25)\n    return signals.mask * 1.0\n"
    )
    _config(guide="branch")  # the built-ins' first-call imports are done before the budget is short
    monkeypatch.setenv("SAGE_PLUGIN_TRIAL_TIMEOUT_S", "1")
    start = time.monotonic()
    message = _refused("guide", f"{path}:g")
    assert time.monotonic() - start < 15
    assert "ran past its time budget of 1 s (SAGE_PLUGIN_TRIAL_TIMEOUT_S=SECONDS sets it, 0: none)" in message
    assert message.endswith("and was stopped (mine.py:3)"), message


def test_a_training_call_past_its_budget_stops_before_the_step(monkeypatch):
    monkeypatch.setenv("SAGE_PLUGIN_TIMEOUT_S", "0.5")

    def slow(inputs):
        time.sleep(25)

    start = time.monotonic()
    with pytest.raises(plugin_calls.PluginFault) as caught:
        plugin_calls.call("advantage estimator", "slow.py:slow", slow, torch.ones(4), step=12, check=None)
    assert time.monotonic() - start < 10
    assert str(caught.value) == (
        "advantage estimator 'slow.py:slow' at step 12 ran past its time budget of 0.5 s (SAGE_PLUGIN_TIMEOUT_S="
        "SECONDS sets it, 0: none) and was stopped (test_plugin_misbehaviour.py:"
        f"{slow.__code__.co_firstlineno + 1}): the step was not applied"
    )
    monkeypatch.setenv("SAGE_PLUGIN_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match=r"SAGE_PLUGIN_TIMEOUT_S='soon' must be a number of seconds >= 0"):
        plugin_calls.call("advantage estimator", "e", lambda i: i, torch.ones(4), step=1, check=None)


def test_a_call_that_swallows_its_stop_past_the_budget_is_judged_when_it_returns(monkeypatch):
    monkeypatch.setenv("SAGE_PLUGIN_TIMEOUT_S", "0.3")

    def stubborn(inputs):
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            try:
                time.sleep(0.05)
            except BaseException:  # noqa: BLE001, S110 (the plug-in under test swallows its stop)
                pass
        return inputs

    with pytest.raises(plugin_calls.PluginFault, match=r"at step 2 ran past its time budget of 0\.3 s"):
        plugin_calls.call("advantage estimator", "s.py:s", stubborn, torch.ones(4), step=2, check=None)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None, 0)  # put back
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.slow
def test_a_guide_that_will_not_stop_ends_the_process_in_one_line(tmp_path):
    path = _plugin(
        tmp_path,
        """
        import time

        def g(signals):
            while True:
                try:
                    time.sleep(3600)
                except BaseException:
                    pass
        """,
    )
    argv = ["-m", "sage_unsloth.rlvr", TINY_GRPO, "--sft_dir", str(tmp_path / "sft")]
    argv += ["--output_root", str(tmp_path / "out"), "--guide", f"{path}:g"]
    done = run_python(argv, cwd=REPO, timeout=240, env=env_with_repo(SAGE_PLUGIN_TRIAL_TIMEOUT_S="1"))
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: guide '{path}:g': its trial call ran past its time budget of 1 s (SAGE_PLUGIN_TRIAL_TIMEOUT_S="
        "SECONDS sets it, 0: none) and would not stop: the process ends here"
    )


# ------------------------------------------------------------------------------------------------ undeclared signals
@pytest.mark.parametrize(
    "body, needs, signal_read, line",
    [
        (
            "return 1 + 0.1 * signals.logps.abs()",
            ("entropies",),
            "signals.logps",
            'g.needs = ("entropies", "logps")',
        ),
        ("return 1 + signals.entropies * 0.1", (), "signals.entropies", 'g.needs = ("entropies",)'),
        (
            "return torch.exp(signals.ref_logps)",
            ("logps",),
            "signals.ref_logps",
            'g.needs = ("logps", "ref_logps")',
        ),
        (
            "return 1 + (signals.completion_ids[:, :] > 3).float()",
            ("entropies",),
            "signals.completion_ids",
            'g.needs = ("entropies", "completion_ids")',
        ),
        (
            "return 1 + signals.logits['top1_prob']",
            ("entropies",),
            "signals.logits['top1_prob']",
            'g.needs = ("entropies", "top1_prob")',
        ),
    ],
)
def test_a_guide_reading_a_signal_it_did_not_declare_fails_its_trial_call(
    tmp_path, body, needs, signal_read, line
):
    path = _plugin(tmp_path, f"import torch\ndef g(signals):\n    {body}\ng.needs = {needs!r}\n")
    message = _refused("guide", f"{path}:g")
    assert f"reads {signal_read}, a signal its needs do not declare" in message, message
    assert f"declare it, {line} (mine.py:3)" in message, message


def test_a_guide_reading_what_it_declares_passes():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = _plugin(
            Path(folder),
            """
            def g(signals):
                return 1 + 0.1 * signals.entropies + 0.01 * signals.logits["top1_prob"] + 0 * signals.completion_ids
            g.needs = ("entropies", "top1_prob", "completion_ids")
            """,
        )
        _config(guide=f"{path}:g")


# ------------------------------------------------------------------------------------------------ credentials
KEYED = """
import json, os

def est(inputs, *, api_key: str = "", options: dict | None = None, scale: float = 1.0):
    with open(os.environ["KEYED_LOG"], "a") as fh:
        fh.write(json.dumps({"api_key": api_key, "options": options}) + "\\n")
    return (inputs.rewards - inputs.rewards.mean()) * scale
"""


@pytest.mark.parametrize("given_as", ["yaml", "flag"])
def test_a_credential_like_plugin_argument_is_redacted_from_every_record(tmp_path, monkeypatch, given_as):
    from sage_unsloth.plugins.advantages import GroupRewards
    from sage_unsloth.rlvr.run import parse_args, resolved_config

    monkeypatch.chdir(REPO)
    secret, nested = "sk-live-7f3a9c1e", "hunter2-pass"
    log = tmp_path / "seen.jsonl"
    monkeypatch.setenv("KEYED_LOG", str(log))
    path = _plugin(tmp_path, KEYED)
    args = {"api_key": secret, "options": {"password": nested, "region": "eu"}, "scale": 2.0}
    node = json.dumps({"name": f"{path}:est", **args})  # the estimator's node: its name and its arguments
    config = tmp_path / "keyed.yaml"
    body = f"base: {REPO / TINY_GRPO}\nadvantage_estimator: {path}:est\n"
    if given_as == "yaml":
        body = f"base: {REPO / TINY_GRPO}\nadvantage_estimator: {node}\n"
    config.write_text(body)
    flags = [] if given_as == "yaml" else ["--advantage_estimator", node]
    monkeypatch.setattr(sys, "argv", ["sage-unsloth", str(config), *flags])
    grpo, stage, model, _ = parse_args(sys.argv[1:])

    saved = io.BytesIO()
    torch.save(grpo, saved)  # what the Trainer writes as training_args.bin
    records = {
        "training_args.bin": saved.getvalue().decode("latin-1"),
        "to_json_string (W&B's run config)": grpo.to_json_string(),
        "repr": repr(grpo),
        "the manifest's config": json.dumps(resolved_config(grpo, stage, model), default=str),
        "sys.argv": " ".join(sys.argv),
    }
    for record, text in records.items():
        assert secret not in text and nested not in text, record
    assert grpo.advantage_estimator["api_key"] == "<redacted>"
    assert grpo.advantage_estimator["options"] == {"password": "<redacted>", "region": "eu"}

    log.unlink()
    grpo.method_plan.estimator_call(GroupRewards(torch.tensor([0.0, 1.0, 1.0, 1.0]), 2))
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert seen == [
        {"api_key": secret, "options": {"password": nested, "region": "eu"}}
    ]  # the plug-in has it


# ------------------------------------------------------------------------------------------------ needs paths
def test_a_logit_signals_path_in_needs_is_found_beside_the_guides_own_file(tmp_path, monkeypatch, capsys):
    """The lab's layout: the YAML, the guide and its logit signal in one folder of one's own, the stage run from the
    repository; ``needs`` names the signal by a path relative to that folder, as the guide node's ``name`` is."""
    from sage_unsloth.demo.run import check_stage2_configs

    monkeypatch.chdir(REPO)
    _plugin(
        tmp_path,
        """
        import torch

        def second_prob(log_probs, targets):
            return log_probs.topk(2, dim=-1).values[:, 1].exp()
        """,
        "signals.py",
    )
    guide = _plugin(
        tmp_path,
        """
        def g(signals):
            return 1.0 + signals.logits["signals.py:second_prob"]
        g.needs = ("signals.py:second_prob",)
        """,
        "near_guide.py",
    )
    from sage_unsloth.plugins import guides

    cfg = _config(guide=f"{guide}:g")  # its trial call read the signal under the name it declared
    plan = cfg.method_plan
    assert plan.guide_needs == ("signals.py:second_prob",)
    (fn,) = guides.logit_signal_functions(plan.guide_needs, plan.guide).values()  # what the trainer evaluates
    log_probs = torch.log_softmax(torch.tensor([[0.0, 2.0, 1.0]]), dim=-1)
    assert torch.allclose(fn(log_probs, None), torch.softmax(torch.tensor([0.0, 2.0, 1.0]), -1)[2:3])
    config = tmp_path / "near.yaml"
    config.write_text(f"base: {REPO / 'configs' / 'rlvr' / 'tiny-cpu' / '_base.yaml'}\nguide: {guide}:g\n")
    assert check_stage2_configs([str(config)]) == 0, capsys.readouterr().err
    os.remove(tmp_path / "signals.py")  # and without the file beside it, the line names the need as written
    with pytest.raises(ConfigError, match=r"declares needs 'signals\.py:second_prob', which is no signal"):
        _config(guide=f"{guide}:g")


def test_a_credential_like_plugin_argument_reaches_no_file_of_a_trained_run(
    sft_dir, dapo_sample, tmp_path, monkeypatch
):
    """One step of the tiny recipe with a keyed estimator, a checkpoint at the step: no file under the output root
    (training_args.bin's pickle, trainer_state.json, the manifest, the log) holds the key; the plug-in had it."""
    from conftest import files_holding
    from rlvr_scenario import rlvr_argv

    from sage_unsloth.rlvr.run import main

    secret = "sk-live-9d8c7b6a5f"
    log = tmp_path / "seen.jsonl"
    monkeypatch.setenv("KEYED_LOG", str(log))
    path = _plugin(tmp_path, KEYED)
    root = tmp_path / "out"
    node = json.dumps({"name": f"{path}:est", "api_key": secret, "scale": 1.0})
    argv = rlvr_argv("grpo", sft_dir, root, dapo_sample, "--max_steps", "1", "--save_steps", "1")
    argv += [
        "--max_train_rows",
        "20",
        "--advantage_estimator",
        node,
    ]
    monkeypatch.setattr(sys, "argv", ["sage-unsloth-rlvr", *argv])
    assert main(argv) == 0
    written = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert any(name.endswith("training_args.bin") for name in written), written
    assert files_holding(root, secret) == []
    assert {json.loads(line)["api_key"] for line in log.read_text().splitlines()} == {secret}
