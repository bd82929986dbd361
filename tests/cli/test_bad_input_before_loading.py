"""Issue 30, item 7: each bad input is one line, exit 2, before any model loads (the loaders are a tripwire):
data files that are truncated, empty or unreadable (naming the file and the line), output folders that are files,
W&B with no key and not offline, backend=unsloth without a GPU, a truncated SFT adapter; and a flag typo is
found before torch, transformers or TRL are imported."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from subprocess_run import env_with_repo, run_python
from test_input_errors import (  # noqa: F401  (no_model_loads: the fixture below)
    TINY_GRPO,
    TINY_SFT,
    _one_line_error,
    no_model_loads,
    sft_argv,
)

from sage_unsloth.config import schema as config_schema
from sage_unsloth.config.input_checks import check_data_file
from sage_unsloth.doctor import speak_of_no_gpu

pytestmark = pytest.mark.usefixtures("no_model_loads")  # any model load fails the test
REPO = Path(__file__).resolve().parents[2]
ROW = {"problem": "1+1?", "generated_solution": "2", "expected_answer": "2"}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _rows(path: Path, n: int = 3, cut: int = 0) -> Path:
    text = "".join(json.dumps(ROW) + "\n" for _ in range(n))
    path.write_text(text[: len(text) - cut] if cut else text)
    return path


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda p: _rows(p, 3, cut=8), "line 3 is truncated"),  # the disk filled while it was written
        (lambda p: _write(p, ""), "is empty"),
        (lambda p: _write(p, "\n\n"), "is empty"),
        (lambda p: _write(p, json.dumps(ROW) + "\n[1, 2]\n"), "line 2 is not a JSON object"),
        (lambda p: _write(p, json.dumps(ROW) + "\n{oops\n" + json.dumps(ROW) + "\n"), "line 2 is not JSON"),
    ],
)
def test_a_broken_data_file_is_named_with_its_line(make, expected, tmp_path):
    path = make(tmp_path / "rows.jsonl")
    with pytest.raises(ValueError) as caught:
        check_data_file(path)
    assert expected in str(caught.value) and str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_truncated_parquet_file_is_refused(tmp_path):
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 40)  # no footer
    with pytest.raises(ValueError, match="not a whole parquet file"):
        check_data_file(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_data_file_is_named(tmp_path):
    path = _rows(tmp_path / "rows.jsonl")
    path.chmod(0)
    with pytest.raises(ValueError, match="cannot be read"):
        check_data_file(path)


def test_a_file_that_cannot_be_opened_is_one_line_naming_it(tmp_path):
    """An OSError other than a missing file (a folder here; root reads a chmod-0 file), data and config alike."""
    from sage_unsloth.config.args import ConfigError, load_config

    folder = tmp_path / "input.yaml"
    folder.mkdir()
    why = r"cannot be read \(.*\): fix its permissions$"
    with pytest.raises(ValueError, match=rf"^dataset_path={re.escape(str(folder))} {why}"):
        check_data_file(folder)
    with pytest.raises(ConfigError, match=rf"^config file {re.escape(str(folder))} {why}"):
        load_config(folder)


def _sft(tiny_model_dir, tmp_path, *extra) -> list[str]:
    return sft_argv(tiny_model_dir, tmp_path / "o", *extra)


def _rlvr(sft_dir, tmp_path, *extra) -> list[str]:
    return ["rlvr", TINY_GRPO, "--sft_dir", str(sft_dir), "--output_root", str(tmp_path / "r"), *extra]


def test_sft_data_and_output_errors_are_one_line_before_loading(tiny_model_dir, tmp_path, capsys):
    truncated = _rows(tmp_path / "cut.jsonl", 74, cut=10)
    line = _one_line_error(capsys, _sft(tiny_model_dir, tmp_path, "--dataset_path", str(truncated)))
    assert "line 74 is truncated" in line and str(truncated) in line, line
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "is empty" in _one_line_error(capsys, _sft(tiny_model_dir, tmp_path, "--dataset_path", str(empty)))
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    argv = _sft(tiny_model_dir, tmp_path, "--dataset_path", str(_rows(tmp_path / "ok.jsonl")))
    line = _one_line_error(capsys, [*argv, "--output_dir", str(a_file / "sft")])
    assert "output_dir=" in line and "is a file" in line, line


@pytest.fixture
def no_wandb_key(monkeypatch, tmp_path):
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    empty = tmp_path / "netrc"
    empty.write_text("")
    monkeypatch.setenv("NETRC", str(empty))


def test_wandb_without_key_or_offline_mode_is_one_line(
    tiny_model_dir, sft_dir, tmp_path, capsys, no_wandb_key, monkeypatch
):
    data = str(_rows(tmp_path / "ok.jsonl"))
    line = _one_line_error(
        capsys, _sft(tiny_model_dir, tmp_path, "--dataset_path", data, "--report_to", "wandb")
    )
    assert "`wandb login`" in line and "WANDB_MODE=offline" in line, line
    line = _one_line_error(capsys, _rlvr(sft_dir, tmp_path, "--report_to", "wandb"))
    assert "`wandb login`" in line and "WANDB_MODE=offline" in line, line
    monkeypatch.setenv("WANDB_MODE", "offline")
    from sage_unsloth.config.input_checks import check_wandb

    check_wandb("wandb")  # offline: no key needed


def test_unsloth_without_a_gpu_is_refused_unless_forced(
    tiny_model_dir, sft_dir, tmp_path, capsys, monkeypatch
):
    from sage_unsloth.runtime import backend

    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    imported = []
    monkeypatch.setattr(backend, "import_unsloth", lambda: imported.append(1))
    data = str(_rows(tmp_path / "ok.jsonl"))
    line = _one_line_error(
        capsys, _sft(tiny_model_dir, tmp_path, "--dataset_path", data, "--backend", "unsloth")
    )
    assert "no GPU" in line and "--unsloth_without_gpu true" in line and not imported, line
    line = _one_line_error(capsys, _rlvr(sft_dir, tmp_path, "--backend", "unsloth"))
    assert "no GPU" in line and "--unsloth_without_gpu true" in line, line
    from sage_unsloth.config.input_checks import check_unsloth_has_gpu

    check_unsloth_has_gpu("unsloth", forced=True)  # the documented way to run the CPU fallback
    check_unsloth_has_gpu("trl", forced=False)


@pytest.mark.parametrize("stage", ["sft", "rlvr"])
def test_both_stages_refuse_unsloth_without_a_gpu_before_parsing(
    stage, tiny_model_dir, sft_dir, tmp_path, capsys, monkeypatch
):
    """One check for both stages (sage_unsloth/config/training_cli.py), made from the command line and the YAML before
    the stage parses (stage 1 imports Unsloth before parsing): a config error that needs the parser (several
    fields) is not reached; one of a field's own value comes first (the pre-import check, before any machine
    check)."""
    from sage_unsloth.runtime import backend

    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    imported = []
    monkeypatch.setattr(backend, "import_unsloth", lambda: imported.append(1))
    # refused by the parser (two fields), after the no-GPU check
    bad = ("--max_steps", "0", "--num_train_epochs", "0", "--backend", "unsloth")
    argv = _sft(tiny_model_dir, tmp_path, *bad) if stage == "sft" else _rlvr(sft_dir, tmp_path, *bad)
    line = _one_line_error(capsys, argv)
    assert "no GPU" in line and "--unsloth_without_gpu true" in line and not imported, line
    line = _one_line_error(capsys, [*argv, "--unsloth_without_gpu", "true"])
    assert "max_steps=0, num_train_epochs=0.0: nothing to train" in line, line
    imported.clear()
    line = _one_line_error(capsys, [*argv, "--learning_rate", "-1"])
    assert line == "error: learning_rate=-1.0 must be > 0" and not imported, line


@pytest.mark.parametrize(
    "stage, config",
    [("sft", "configs/sft/qwen2.5-math-7b.yaml"), ("rlvr", "configs/rlvr/qwen2.5-math-7b/grpo.yaml")],
)
def test_help_after_an_unsloth_config_is_shown_without_a_gpu(stage, config, capsys, monkeypatch):
    from sage_unsloth import cli
    from sage_unsloth.runtime import backend

    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    imported = []
    monkeypatch.setattr(backend, "import_unsloth", lambda: imported.append(1))
    with pytest.raises(SystemExit) as stopped:
        cli.main([stage, config, "--help"])
    out = capsys.readouterr().out
    assert stopped.value.code == 0 and f"usage: sage-unsloth {stage} CONFIG.yaml" in out and not imported


@pytest.mark.parametrize("stage", ["sft", "rlvr"])
def test_an_input_error_of_several_lines_is_its_first_line(
    stage, tiny_model_dir, sft_dir, tmp_path, capsys, monkeypatch
):
    """Both stages end an input error the same way (sage_unsloth/config/training_cli.py, run_training_stage)."""
    import sage_unsloth.rlvr.run as rlvr_run
    import sage_unsloth.sft.run as sft_run

    def refuse(*args, **kwargs):
        raise ValueError("what is wrong and the fix\n  details a library added")

    monkeypatch.setattr(*((sft_run, "prepare_sft") if stage == "sft" else (rlvr_run, "plan_run")), refuse)
    argv = _sft(tiny_model_dir, tmp_path, "--dataset_path", str(_rows(tmp_path / "ok.jsonl")))
    assert _one_line_error(capsys, argv if stage == "sft" else _rlvr(sft_dir, tmp_path)) == (
        "error: what is wrong and the fix"
    )


def test_a_truncated_sft_adapter_is_named_before_loading(sft_dir, tmp_path, capsys):
    import shutil

    copy = tmp_path / "sft"
    shutil.copytree(sft_dir, copy)
    adapter = copy / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:-100])
    line = _one_line_error(capsys, _rlvr(copy, tmp_path))
    assert "adapter_model.safetensors is truncated" in line and str(copy) in line, line


def test_rlvr_output_dir_that_is_a_file_is_one_line(sft_dir, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    line = _one_line_error(
        capsys, ["rlvr", TINY_GRPO, "--sft_dir", str(sft_dir), "--output_root", str(a_file)]
    )
    assert "is a file" in line, line


# ------------------------------------------------------------------------------------------------ flag typos
TYPO = """
import sys, time
started = time.perf_counter()
from sage_unsloth.cli import main
code = main([{stage!r}, {config!r}, "--lerning_rate", "1e-5"])
heavy = sorted(m for m in ("torch", "transformers", "trl", "datasets", "unsloth") if m in sys.modules)
print(code, time.perf_counter() - started, ",".join(heavy))
"""


@pytest.mark.parametrize("stage, config", [("sft", TINY_SFT), ("rlvr", TINY_GRPO)])
def test_a_flag_typo_fails_before_torch_is_imported(stage, config):
    done = run_python(
        ["-c", TYPO.format(stage=stage, config=config)], cwd=REPO, env=env_with_repo(), timeout=300
    )
    code, _seconds, heavy = (done.stdout.strip().splitlines()[-1].split(" ") + [""])[:3]
    assert code == "2" and heavy == "", done.stdout + done.stderr
    assert done.stderr.strip() == "error: unknown flag --lerning_rate: did you mean '--learning_rate'?"


def test_a_yaml_key_typo_fails_before_torch_is_imported(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("lerning_rate: 1e-5\n")
    assert config_schema.check_stage_input("sft", [str(config)]) == [
        f"{config}: unknown key 'lerning_rate': did you mean 'learning_rate'?"
    ]
    assert config_schema.check_stage_input("sft", [TINY_SFT, "--max_steps", "3"]) == []


def test_doctor_on_cpu_says_no_gpu():
    line = (
        "Unsloth: Model is in float32 and this GPU has no bfloat16 support, so training stays in float32.\n"
    )
    assert speak_of_no_gpu(line).startswith("no GPU on this machine")
    assert speak_of_no_gpu("step 1 loss 0.3\n") == "step 1 loss 0.3\n"
