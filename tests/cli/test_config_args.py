"""Every stage's CLI: a leading YAML becomes TrlParser's --config; a missing one is one clear line."""

import sys

import pytest

from sage_unsloth import cli
from sage_unsloth.config.args import with_config_flag


def test_leading_config_becomes_flag(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("seed: 1\n")
    assert with_config_flag([str(cfg), "--seed", "2"], "configs/x/") == (
        ["--config", str(cfg), "--seed", "2"],
        str(cfg),
    )
    assert with_config_flag(["--seed", "2"], "configs/x/") == (["--seed", "2"], None)
    with pytest.raises(FileNotFoundError, match="configs/x/"):
        with_config_flag([str(tmp_path / "missing.yaml")], "configs/x/")


@pytest.mark.parametrize("stage", ["sft", "rlvr", "eval", "report"])
def test_each_stage_reports_a_missing_config_in_one_line(stage, tmp_path, capsys):
    unsloth_already_imported = "unsloth" in sys.modules
    code = cli.main([stage, str(tmp_path / "missing.yaml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "missing.yaml" in err[0] and f"configs/{stage}/" in err[0]
    # Importing Unsloth patches TRL for the whole process: bad input must be refused before that.
    assert unsloth_already_imported or "unsloth" not in sys.modules


def test_unknown_stage(capsys):
    assert cli.main(["train"]) == 2 and "unknown stage" in capsys.readouterr().err
