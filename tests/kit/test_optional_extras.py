"""The kit without its optional extras: W&B ([wandb], in [gpu] and [dev]) is asked for only by ``report_to:
wandb`` and stage 4's ``--wandb_project``; without wandb installed the kit runs, and a config that asks for W&B gets
one line naming the extra, before anything is loaded. (tests/kit/test_dependencies.py checks that no extra is
imported at the top of a module.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sage_unsloth import cli
from sage_unsloth.config.input_checks import check_wandb

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "report" / "results"
PAPER_DIR = REPO / "results" / "paper"
WITHOUT_WANDB = "import sys; sys.modules['wandb'] = None; "  # `import wandb` raises, find_spec says None


@pytest.fixture
def no_wandb(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setenv("WANDB_MODE", "offline")


def test_report_to_wandb_without_wandb_names_the_extra(no_wandb):
    for report_to in ("wandb", ["tensorboard", "wandb"]):
        with pytest.raises(ValueError) as raised:
            check_wandb(report_to)
        line = str(raised.value)
        assert "\n" not in line and line.startswith("report_to=wandb: wandb is not installed")
        assert "pip install 'sage-unsloth[wandb]'" in line
    check_wandb("all")  # the installed integrations: none asked for
    check_wandb("none")


def test_the_report_asking_for_wandb_without_it_is_one_line(no_wandb, tmp_path, capsys):
    argv = ["report", "--results", str(FIXTURE), "--out", str(tmp_path / "r.md"), "--wandb_project", "sage"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    hint = "pip install 'sage-unsloth[wandb]' (or pip install wandb), or leave W&B off"
    assert err == [f"error: wandb_project=sage: wandb is not installed: {hint}"]
    assert not (tmp_path / "r.md").exists()


@pytest.mark.slow
def test_the_report_runs_without_wandb_installed(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    out = tmp_path / "report.md"
    code = WITHOUT_WANDB + (
        "from sage_unsloth.report.run import main; "
        f"sys.exit(main(['--results', {str(results)!r}, '--out', {str(out)!r}, '--paper-dir', {str(PAPER_DIR)!r}, "
        "'--resamples', '100']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.is_file()  # every `import wandb` would have raised
