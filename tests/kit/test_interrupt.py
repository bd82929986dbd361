"""Ctrl-C during a stage (sage_unsloth/runtime/interrupt.py): the one line names the command that continues the run, and
never a credential given on the command line (``--hub_token SECRET``): the value is redacted there too."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from sage_unsloth.runtime import interrupt
from sage_unsloth.runtime.credentials import REDACTED

SECRET = "SECRET123"
TINY_SFT = "configs/sft/tiny-cpu.yaml"
TINY_GRPO = "configs/rlvr/tiny-cpu/grpo.yaml"


@pytest.mark.parametrize(
    "given, shown",
    [
        (["--hub_token", SECRET], ["--hub_token", REDACTED]),
        ([f"--hub_token={SECRET}"], [f"--hub_token={REDACTED}"]),
        (["--hub-token", SECRET], ["--hub-token", REDACTED]),
        (["--wandb_api_key", SECRET], ["--wandb_api_key", REDACTED]),
    ],
)
def test_the_ctrl_c_line_redacts_a_token_flag(given, shown, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(interrupt.QUIET_ENV, raising=False)
    argv = [TINY_SFT, *given, "--max_steps", "3"]
    kept = tmp_path / "checkpoint-2"
    assert interrupt.interrupted_training("sft", argv, tmp_path, ("--resume", "true"), lambda _: kept) == 130
    assert interrupt.interrupted_training("rlvr", argv, tmp_path, ("--resume",), lambda _: None) == 130
    assert interrupt.interrupted_eval(argv) == 130
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 3 and SECRET not in captured.err + captured.out, captured.err
    for line, stage, extra in zip(lines, ("sft", "rlvr", "eval"), (["--resume", "true"], [], [])):
        expected = shlex.join(["sage-unsloth", stage, TINY_SFT, *shown, "--max_steps", "3", *extra])
        assert line.endswith(expected), line


def test_a_value_equal_to_a_flag_name_is_not_redacted(capsys, monkeypatch):
    """Only the value after a credential flag goes: the rest of the command is the user's, unchanged."""
    monkeypatch.delenv(interrupt.QUIET_ENV, raising=False)
    interrupt.interrupted_eval(["x.yaml", "--hub_token", "--limit", "2", "--run_name", "token"])
    line = capsys.readouterr().err.strip()
    assert line.endswith("sage-unsloth eval x.yaml --hub_token --limit 2 --run_name token"), line


def test_a_word_with_dashes_inside_is_kept_as_it_is():
    """``my--run`` (or a ``python -c`` program whose text holds flags, as a lock records its command) is one word, no
    flag: kept, while a credential flag inside an argument of flags is still redacted (it once recursed forever)."""
    from sage_unsloth.runtime.credentials import redact_argv

    given = ["--run_name", "my--run", "a--b--c", "--rlvr_args", f"--max_steps 2 --hub_token {SECRET}"]
    assert redact_argv(given) == [*given[:4], f"--max_steps 2 --hub_token {shlex.quote(REDACTED)}"]


def _stage_argv(stage: str, tmp_path: Path, tiny_model_dir: Path, sft_dir: Path) -> list[str]:
    if stage == "sft":
        data = tmp_path / "rows.jsonl"
        data.write_text('{"problem": "1+1?", "generated_solution": "2", "expected_answer": "2"}\n' * 3)
        return [TINY_SFT, "--model_name_or_path", str(tiny_model_dir), "--dataset_path", str(data)] + [
            "--output_dir",
            str(tmp_path / "out"),
        ]
    return [TINY_GRPO, "--sft_dir", str(sft_dir), "--output_root", str(tmp_path / "r")]


@pytest.mark.parametrize("stage", ["sft", "rlvr"])
def test_ctrl_c_in_a_stage_started_with_a_hub_token_prints_no_token(
    stage, tmp_path, capsys, monkeypatch, request, tiny_model_dir
):
    """The stage's own main, Ctrl-C while training: its argv (a copy of the command line) held the token."""
    import sage_unsloth.rlvr.run as rlvr_run
    import sage_unsloth.sft.run as sft_run

    monkeypatch.setenv(
        "HF_TOKEN", "before"
    )  # restored at teardown: the moved value does not leak  # the parser moves the token there; restored afterwards
    monkeypatch.delenv(interrupt.QUIET_ENV, raising=False)

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    if stage == "sft":
        monkeypatch.setattr(sft_run, "run_sft", ctrl_c)
        main, sft_dir = sft_run.main, None
    else:
        monkeypatch.setattr(rlvr_run, "build_stage", ctrl_c)
        main, sft_dir = rlvr_run.main, request.getfixturevalue("sft_dir")
    argv = [*_stage_argv(stage, tmp_path, tiny_model_dir, sft_dir), "--hub_token", SECRET]
    assert main(argv) == 130
    captured = capsys.readouterr()
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith(f"sage-unsloth {stage}: interrupted (Ctrl-C); "), captured.err[-2000:]
    assert f"--hub_token '{REDACTED}'" in line and SECRET not in captured.err + captured.out, line


def test_moving_a_secret_also_redacts_it_from_sys_argv(monkeypatch):
    """W&B records sys.argv: once a credential flag's value is moved to the environment, sys.argv holds it no
    more, in either spelling, and the other arguments are left as they were."""
    import dataclasses
    import sys

    from sage_unsloth.runtime.credentials import REDACTED, move_secrets_to_environment

    @dataclasses.dataclass
    class Args:
        hub_token: str | None = None
        output_dir: str = "out"

    argv = ["prog", "cfg.yaml", "--hub_token", SECRET, "--wandb-api-key=" + SECRET, "--output_dir", "out"]
    monkeypatch.setattr(sys, "argv", list(argv))
    monkeypatch.setenv("HF_TOKEN", "before")  # restored at teardown: the moved value does not leak
    assert move_secrets_to_environment(Args(hub_token=SECRET)) == ["hub_token"]
    assert sys.argv == [*argv[:3], REDACTED, "--wandb-api-key=" + REDACTED, "--output_dir", "out"]


# ----------------------------------------------------------------------------------------------- SIGTERM
def test_sigterm_gets_the_ctrl_c_line_and_its_own_exit_code(tmp_path, capsys, monkeypatch):
    """What SLURM's pre-emption and `timeout` send: the same line as Ctrl-C, naming SIGTERM, exit 128 + 15."""
    monkeypatch.delenv(interrupt.QUIET_ENV, raising=False)
    argv = [TINY_SFT, "--max_steps", "3"]
    kept = tmp_path / "checkpoint-2"
    stopped = interrupt.Terminated()
    assert (
        interrupt.interrupted_training("sft", argv, tmp_path, ("--resume", "true"), lambda _: kept, stopped)
        == 143
    )
    assert interrupt.interrupted_eval(argv, stopped) == 143
    sft_line, eval_line = capsys.readouterr().err.strip().splitlines()
    assert sft_line == (
        f"sage-unsloth sft: interrupted (SIGTERM); {kept} is kept: continue with "
        f"sage-unsloth sft {TINY_SFT} --max_steps 3 --resume true"
    )
    assert eval_line.startswith(
        "sage-unsloth eval: interrupted (SIGTERM); the completion chunks already written"
    )
    assert interrupt.exit_code_stopped(143).__class__ is interrupt.Terminated  # a child's code, re-raised
    assert interrupt.exit_code_stopped(
        130
    ).__class__ is KeyboardInterrupt and not interrupt.exit_code_stopped(1)


def test_a_stage_sent_sigterm_says_so_in_one_line_and_exits_143(tmp_path, tiny_model_dir):
    """A real SIGTERM to a stage's process while it trains (main 0298207: killed, exit -15, no line)."""
    from subprocess_run import REPO, env_with_repo, run_python

    code = (
        "import os, signal, sys, time\n"
        "import sage_unsloth.sft.run as stage\n"
        "def training(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(60)\n"
        "stage.run_sft = training\n"
        "sys.exit(stage.main(sys.argv[1:]))\n"
    )
    argv = _stage_argv("sft", tmp_path, tiny_model_dir, None)
    argv[0] = str(REPO / argv[0])
    env = env_with_repo()
    env.pop(interrupt.QUIET_ENV, None)
    done = run_python(["-c", code, *argv], cwd=tmp_path, timeout=300, env=env)
    assert done.returncode == 143, (done.returncode, done.stderr[-2000:])
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("sage-unsloth sft: interrupted (SIGTERM); no checkpoint yet in "), line
    assert line.endswith(shlex.join(["sage-unsloth", "sft", *argv])), line
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("stopped", [KeyboardInterrupt, interrupt.Terminated])
def test_a_command_without_its_own_line_still_says_one(stopped, capsys, monkeypatch):
    """report, sample, export, ...: Ctrl-C or SIGTERM is one line and 130 or 143, not a traceback."""
    from sage_unsloth import cli
    from sage_unsloth.report import run as report_run

    def stop(argv):
        raise stopped

    monkeypatch.setattr(report_run, "main", stop)
    code = cli.main(["report", "--results", "somewhere"])
    assert code == (143 if stopped is interrupt.Terminated else 130)
    line = capsys.readouterr().err.strip()
    how = "SIGTERM" if stopped is interrupt.Terminated else "Ctrl-C"
    assert line == f"sage-unsloth report: interrupted ({how}); run the same command again: " + (
        "sage-unsloth report --results somewhere"
    )
