"""Configs are read at config time, all at once, and bounded (issue 52, item 4): a YAML file is read within a size
limit, its aliases counted before anything expands them, a key set twice refused naming both lines
(sage_unsloth/config/yaml_files.py); a text field given an unquoted yes/no/on/off is named by its line before torch is
imported; the pre-import check reports a plug-in that is not where it says (a missing file, a syntax error, a
missing function, a missing package) beside the unknown keys and the bad values, in one round
(sage_unsloth/config/schema.py); ``--dry-run`` checks the input files (a dataset path that does not exist, a row
without its answer, named by its line) and prints the plan on a machine without the config's GPU, saying what that
GPU would need; the report refuses a pass@k that is not a probability or that its per_problem.csv contradicts."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from subprocess_run import env_with_repo, run_python

from sage_unsloth import cli
from sage_unsloth.config import schema as config_schema
from sage_unsloth.config.args import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
TINY_BASE = REPO / "configs" / "rlvr" / "tiny-cpu" / "_base.yaml"
TINY_GRPO = "configs/rlvr/tiny-cpu/grpo.yaml"
PRESET_7B = "configs/rlvr/qwen2.5-math-7b/grpo_branch.yaml"


def _yaml(folder: Path, text: str, name: str = "mine.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _bomb(key: str, depth: int = 9) -> str:
    """A YAML alias bomb under ``key``: level i is a list of nine level i-1's (9**9 strings expanded)."""
    lines = [f"{key}:", "  l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, depth)]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ bounded YAML
@pytest.mark.parametrize("key", ["guide", "advantage_estimator"])  # plug-in nodes: mappings
def test_an_alias_bomb_in_an_accepted_field_is_refused_before_it_expands(tmp_path, key):
    config = _yaml(tmp_path, f"base: {TINY_BASE}\n" + _bomb(key))
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"line 8 expands to more than 100,000 values \(its aliases"):
        load_config(config)
    lines = config_schema.check_stage_input("rlvr", [str(config)])  # the stage's first check says the same
    assert time.monotonic() - start < 10
    assert len(lines) == 1 and "expands to more than 100,000 values" in lines[0], lines


def test_an_alias_bomb_in_a_list_field_and_an_alias_that_contains_itself_are_refused(tmp_path):
    bounded = _yaml(tmp_path, "ks: &k [1, 2, 4]\nlocal_benchmarks: [*k]\n")  # a bounded alias is fine
    assert load_config(bounded) == {"ks": [1, 2, 4], "local_benchmarks": [[1, 2, 4]]}
    levels = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 8)]
    bomb = _yaml(tmp_path, "\n".join(levels) + "\nks: [*a7, *a7]\n", "list.yaml")
    with pytest.raises(
        ConfigError, match=r"list\.yaml: the value at line 6 expands to more than 100,000 values"
    ):
        load_config(bomb)
    looped = _yaml(tmp_path, "ks: &loop [1, *loop]\n", "loop.yaml")
    with pytest.raises(ConfigError, match=r"loop\.yaml: the alias at line 1 contains itself"):
        load_config(looped)


def test_a_config_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path):
    config = tmp_path / "big.yaml"
    config.write_text(f"base: {TINY_BASE}\n" + "# padding\n" * 300_000)  # 3 MB of comments
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"big\.yaml is 2\.9 MiB: a config is at most 1 MiB"):
        load_config(config)
    assert time.monotonic() - start < 1.0


def test_a_key_set_twice_is_refused_naming_both_lines(tmp_path):
    config = _yaml(tmp_path, f"base: {TINY_BASE}\nbeta: 0.1\nmax_steps: 3\nbeta: 0.2\n")
    message = f"{config}: key 'beta' is set twice, on line 2 and line 4: keep one (YAML would keep the last in silence)"
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert str(caught.value) == message
    assert config_schema.check_stage_input("rlvr", [str(config)]) == [message]
    nested = _yaml(
        tmp_path, "guide:\n  name: branch\n  gamma: 0.5\n  tau: 1.0\n  gamma: 0.7\n", "nested.yaml"
    )
    with pytest.raises(ConfigError, match=r"key 'gamma' is set twice, on line 3 and line 5"):
        load_config(nested)
    merged = _yaml(
        tmp_path, "guide:\n  <<: {name: branch, gamma: 0.5, tau: 1.0}\n  gamma: 0.7\n", "merged.yaml"
    )
    assert load_config(merged) == {
        "guide": {"name": "branch", "gamma": 0.7, "tau": 1.0}
    }  # a merge key is overridden


# ------------------------------------------------------------------------------------------------ YAML 1.1 booleans
def test_a_text_field_given_an_unquoted_no_is_named_by_its_line(tmp_path):
    base = _yaml(tmp_path, f"base: {TINY_BASE}\nvariant: on\n", "base.yaml")
    config = _yaml(tmp_path, "base: base.yaml\n\nguide: no\nbf16: no\nlora_target_modules: [q_proj, off]\n")
    lines = config_schema.check_stage_input("rlvr", [str(config)])
    assert lines == [  # the merged YAML's order: the base's keys first
        f"{base}, line 2: variant: on is read by YAML as the boolean True, not as text: quote it, variant: 'on'",
        (
            f"{config}, line 3: guide: no is read by YAML as the boolean False, not as text: quote it, "
            "guide: 'no'"
        ),
        (
            f"{config}: lora_target_modules: ['q_proj', False] is a YAML boolean, not text (an unquoted yes, no, on, "
            "off, true or false): quote the text, e.g. lora_target_modules: 'no'"
        ),
    ], lines  # bf16: no is a boolean field's boolean: fine
    quoted = _yaml(tmp_path, f"base: {TINY_BASE}\nguide: 'no'\n", "quoted.yaml")
    assert config_schema.check_stage_input("rlvr", [str(quoted)]) == [
        (
            f"{quoted}: guide='no' is unknown: did you mean 'none'? (use one of none, branch, ref_branch, token, "
            "random, or 'package.module:function' or 'path/to/file.py:function')"
        )
    ]


BEFORE_IMPORTS = """
import sys
from sage_unsloth.rlvr.run import main
code = main([{config!r}])
print(code, ",".join(sorted(m for m in ("torch", "transformers", "trl") if m in sys.modules)))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "line, error",
    [
        (
            "guide: no",
            "{config}, line 2: guide: no is read by YAML as the boolean False, not as text: quote it, guide: 'no'",
        ),
        (  # a node's plug-in that is not there: the same first round, before the heavy imports
            "guide: {name: missing_guide_file.py:fn, gamma: 0.8}",
            (
                "guide='missing_guide_file.py:fn': no file 'missing_guide_file.py' (paths are relative to the "
                "working directory)"
            ),
        ),
    ],
)
def test_a_first_round_error_fails_before_torch_is_imported(tmp_path, line, error):
    config = _yaml(tmp_path, f"base: {TINY_BASE}\n{line}\n")
    code = BEFORE_IMPORTS.format(config=str(config))
    done = run_python(["-c", code], cwd=REPO, env=env_with_repo(), timeout=300)
    assert done.stdout.split() == ["2"], done.stdout + done.stderr  # exit 2, and none of the three imported
    assert done.stderr.strip() == "error: " + error.format(config=config)


# ------------------------------------------------------------------------------------------------ one round
def test_every_config_error_of_every_kind_comes_in_one_round(tmp_path, monkeypatch):
    """An unknown key, a retired key, a value of the wrong type, a boolean for text and four plug-ins that are not
    where they say (bare names and nodes' names): all in the first round, found without importing any of them
    (before: the plug-ins came in a second round, after torch, one at a time)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.py").write_text("def g(signals)\n    return 1\n")
    (tmp_path / "named.py").write_text("import torch\n\ndef guide(signals):\n    return 1\n")
    config = _yaml(
        tmp_path,
        f"base: {TINY_BASE}\nlerning_rate: 1e-5\nsage_tau: 0.5\nbeta: lots\nguide: {{name: gone.py:g, gamma: 0.8}}\n"
        "advantage_estimator: broken.py:g\npolicy_term: {name: named.py:gide, ratio: 0.1}\n"
        "kl_term: no_such_package_here.terms:k\n",
    )
    assert config_schema.check_stage_input("rlvr", [str(config), "--max_steps", "x"]) == [
        f"{config}: unknown key 'lerning_rate': did you mean 'learning_rate'?",
        (
            f"{config}: sage_tau is retired: it is the argument tau of the guide node, guide: {{name: branch, tau: "
            "<value>} (scripts/migrate_configs.py FILE rewrites a config; docs/extending.md)"
        ),
        f"{config}: beta: 'lots' is not a number; e.g. beta: 0.05",
        "guide='gone.py:g': no file 'gone.py' (paths are relative to the working directory)",
        "advantage_estimator='broken.py:g': broken.py line 1: SyntaxError: expected ':'",
        "policy_term='named.py:gide': module 'named.py' has no 'gide': did you mean 'guide'?",
        (
            "kl_term='no_such_package_here.terms:k': cannot import module 'no_such_package_here.terms' (No module "
            "named 'no_such_package_here'); put its folder on PYTHONPATH or name the file ('path/to/file.py:function')"
        ),
        "--max_steps x: not an integer",
    ]


def test_a_nodes_plugin_given_as_json_on_the_command_line_is_checked_in_the_first_round(
    tmp_path, monkeypatch
):
    """A node on the command line (its JSON, which replaces the YAML's node whole) is looked for like a YAML one."""
    monkeypatch.chdir(tmp_path)
    config = _yaml(tmp_path, f"base: {TINY_BASE}\nguide: {{name: branch, gamma: 0.8}}\n")
    node = json.dumps({"name": "missing.py:fn", "gamma": 0.8})
    assert config_schema.check_stage_input("rlvr", [str(config), "--guide", node]) == [
        "guide='missing.py:fn': no file 'missing.py' (paths are relative to the working directory)"
    ]
    (tmp_path / "missing.py").write_text("def fn(signals, *, gamma=0.3):\n    return 1 + gamma\n")
    assert config_schema.check_stage_input("rlvr", [str(config), "--guide", node]) == []


def test_a_plugin_that_is_where_it_says_passes_the_first_round(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(
        "import torch\ntry:\n    from math import inf\nexcept ImportError:\n    inf = 1e30\n\n"
        "def g(signals):\n    return 1 + 0 * signals.entropies\n\ncentred = lambda inputs: inputs.rewards\n"
    )
    config = _yaml(
        tmp_path, f"base: {TINY_BASE}\nguide: mine.py:g\nadvantage_estimator: {{name: mine.py:centred}}\n"
    )
    assert config_schema.check_stage_input("rlvr", [str(config), "--policy_term", "mine.py:inf"]) == []


# ------------------------------------------------------------------------------------------------ dry runs
def _fake_sft(folder: Path, base: str) -> Path:
    """A stage-1 folder as stage 2 reads it before loading (manifest, adapter config), no weights."""
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"stage": "sft", "base_model": base, "config": {}}))
    (folder / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": base, "peft_type": "LORA"})
    )
    return folder


def test_a_dry_run_checks_every_input_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    sft = _fake_sft(tmp_path / "sft", "Qwen/Qwen2.5-Math-1.5B")
    argv = ["rlvr", TINY_GRPO, "--dry-run", "--sft_dir", str(sft), "--max_seq_length", "512"]
    argv += ["--output_root", str(tmp_path / "out")]
    assert cli.main(argv) == 0  # the inputs are there: the plan, exit 0
    assert "plan:" in capsys.readouterr().out
    missing = tmp_path / "nowhere.jsonl"
    assert cli.main([*argv, "--dataset_path", str(missing)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: dataset_path={missing} does not exist: fix the path"
    ]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({"prompt": "1+1?", "solution": "2"}) + "\n" + json.dumps({"prompt": "2+2?"}) + "\n"
    )
    assert cli.main([*argv, "--dataset_path", str(rows)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        (
            f"error: dataset_path={rows} line 2 has no gold answer (one of solution, answer, or "
            "'reward_model.ground_truth'): fix or remove that line"
        )
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("missing, answer", [("expected_answer", None), ("expected_answer", "absent")])
def test_an_sft_row_without_its_answer_is_named_by_its_line_not_dropped(
    tmp_path, capsys, monkeypatch, missing, answer
):
    monkeypatch.chdir(REPO)
    row = {"problem": "1+1?", "generated_solution": "It is 2.", "expected_answer": "2"}
    bad = dict(row)
    if answer == "absent":
        del bad[missing]
    else:
        bad[missing] = answer
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in (row, row, bad, row)))
    model = tmp_path / "tiny-model"  # a local model folder: nothing is loaded in a dry run
    model.mkdir()
    argv = ["sft", "configs/sft/tiny-cpu.yaml", "--model_name_or_path", str(model)]
    argv += ["--output_dir", str(tmp_path / "out"), "--dataset_path", str(rows), "--dry-run"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        (
            f"error: dataset_path={rows} line 3 has no 'expected_answer' (SFT rows need problem, generated_solution, "
            "expected_answer): fix or remove that line"
        )
    ]


def test_the_7b_presets_dry_run_prints_its_plan_on_any_machine(tmp_path, capsys, monkeypatch):
    """On a machine without a GPU (this one, or any CPU laptop): no bf16 error from transformers, the plan, and a
    gpu: line with what the GPU would need, as the doctor says it; on a GPU, the plan."""
    from sage_unsloth.runtime.backend import cuda_available

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("WANDB_MODE", "offline")  # the preset logs to W&B; this machine has no key
    sft = _fake_sft(tmp_path / "sft", "Qwen/Qwen2.5-Math-7B")
    argv = ["rlvr", PRESET_7B, "--dry-run", "--sft_dir", str(sft), "--max_seq_length", "4096"]
    assert cli.main([*argv, "--output_root", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "plan:" in out and f"output_dir: {tmp_path / 'out'}/qwen2.5-math-7b/grpo_branch" in out
    assert "bf16: true" in out  # the config the GPU would run, not a CPU fallback
    gpu = [line for line in out.splitlines() if line.startswith("gpu:")]
    if cuda_available():
        assert gpu == []
        return
    assert len(gpu) == 1, out
    for need in ("bfloat16 (compute capability 8.0+", "Unsloth (CUDA kernels)", "vLLM"):
        assert need in gpu[0], gpu
    assert f"(sage-unsloth doctor {PRESET_7B} --gpu NAME judges a card and estimates the memory)" in gpu[0]
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ the report's pass@k
FIXTURE = REPO / "tests" / "fixtures" / "report" / "results" / "tiny" / "grpo"


def _edited_run(tmp_path: Path, old: str, new: str) -> Path:
    run = tmp_path / "results" / "tiny" / "grpo"
    shutil.copytree(FIXTURE, run)
    text = (run / "passk.csv").read_text()
    assert old in text
    (run / "passk.csv").write_text(text.replace(old, new, 1))
    return run


@pytest.mark.parametrize(
    "old, new, expected",
    [
        (
            "aime24,1,0.25,",
            "aime24,1,7.0,",
            "line 2: aime24 pass@1 = 7 is not a probability (outside [0, 1])",
        ),
        ("aime24,1,0.25,", "aime24,1,-0.5,", "line 2: aime24 pass@1 = -0.5 is not a probability"),
        (
            "aime24,2,0.4166666667,",
            "aime24,2,0.9,",
            "line 3: aime24 pass@2 = 0.9, but per_problem.csv gives 0.416667: the two files disagree",
        ),
    ],
)
def test_the_report_refuses_a_pass_at_k_its_counts_do_not_give(tmp_path, capsys, old, new, expected):
    from sage_unsloth.report.loading import load_run

    run = _edited_run(tmp_path, old, new)
    with pytest.raises(ValueError) as caught:
        load_run(run)
    message = str(caught.value)
    assert message.startswith(f"{run / 'passk.csv'} {expected}") and "\n" not in message, message
    assert message.endswith(
        "re-run the eval stage for this run (or sage-unsloth regrade it), or restore the file"
    )
    code = cli.main(["report", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "report.md")])
    assert code == 2 and not (tmp_path / "report.md").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {message}"


def test_the_report_reads_a_table_its_counts_give():
    from sage_unsloth.report.loading import load_run

    run = load_run(FIXTURE)
    assert run.reported("aime24", 2) == pytest.approx(0.4166666667)
