"""Issue 41 item 3 and issue 42 item 6: config errors before imports, all at once, each saying what happened.

The pre-import check (sage_unsloth/config/schema.py) reads a committed schema of every stage's fields. These tests
hold that schema to the parsers it was generated from, each of its rules to what the real dataclasses refuse (at
the rule's bounds), the check to no false alarm on any shipped config, and the stages to reporting a missing or
broken config, and every bad value of one, before torch, transformers or TRL are imported."""

from __future__ import annotations

import importlib
import json
import math
import shutil
from pathlib import Path

import pytest
from subprocess_run import env_with_repo, run_python

from sage_unsloth import cli
from sage_unsloth.config import schema as config_schema
from sage_unsloth.config.args import ConfigError, stage_parser
from sage_unsloth.config.training_cli import refuse_before_parsing

REPO = Path(__file__).resolve().parents[2]
BASE_CONFIG = {
    "sft": "configs/sft/tiny-cpu.yaml",
    "rlvr": "configs/rlvr/tiny-cpu/grpo.yaml",
    "eval": "configs/eval/tiny-cpu.yaml",
    "report": "configs/report/default.yaml",
    "sweep": "configs/sweep/tiny-cpu.yaml",
}
HEAVY = ("torch", "transformers", "trl", "peft", "datasets", "unsloth")


# ------------------------------------------------------------------------------------------ schema = parsers
def test_the_schema_matches_the_parsers_and_rules():
    """stage_schema.json is what the parsers and FIELD_RULES say (regenerate: python -m
    sage_unsloth.config.schema --write)."""
    committed, live = json.loads(config_schema.SCHEMA.read_text()), config_schema.live_schema()
    assert set(committed) == set(live)
    for stage in live:
        for part in ("flags", "switches"):
            assert committed[stage][part] == live[stage][part], (stage, part)
        ours, theirs = committed[stage]["fields"], live[stage]["fields"]
        assert set(ours) == set(theirs), (stage, set(ours) ^ set(theirs))
        for name in theirs:
            assert ours[name] == theirs[name], (stage, name, ours[name], theirs[name])


def _probes(field: dict) -> list[tuple[object, bool]]:
    """(value, accepted?) at each bound of the field's rule, and a name that is not one."""
    limit, whole = field.get("limit"), field["type"] == "int"
    step = 1 if whole else 1e-3
    out = []
    if limit:
        if "ge" in limit:
            out += [(limit["ge"], True), (limit["ge"] - step, False)]
        if "gt" in limit:
            out += [(limit["gt"], False), (limit["gt"] + step, True)]
        if "le" in limit:
            out += [(limit["le"], True), (limit["le"] + step, False)]
        if "lt" in limit:
            out += [(limit["lt"], False), (limit["lt"] - step, True)]
        if not whole and not field.get("infinite_ok"):
            out.append((math.inf, False))
    names = field.get("names") or field.get("choices")
    if names:
        out += [("no_such_name", False), *((name, True) for name in names)]
    return [(int(v) if whole and isinstance(v, float) and v.is_integer() else v, ok) for v, ok in out]


# What an accepted value needs from other fields (or cannot be accepted at all, for another field's rule).
CONTEXT = {
    ("rlvr", "advantage_estimator", "passk"): ["--num_generations", "4"],  # passk's k defaults to 4
    ("rlvr", "policy_term", "kl_cov"): ["--num_iterations", "2"],
    ("rlvr", "steps_per_generation", 1): ["--generation_batch_size", "none"],
    ("eval", "grading_retry_timeout_s", 0.001): ["--grading_timeout_s", "0.001"],
    ("eval", "source", "local"): ["--data_dir", "sage_unsloth/data/benchmarks"],
}
OTHER_RULE = {  # value -> the other field whose rule refuses it
    ("rlvr", "generation_batch_size", 1): "per_device_train_batch_size",  # whole batches of whole groups
    ("sft", "lr_scheduler_type", "reduce_lr_on_plateau"): "eval strategy",
    ("sft", "lr_scheduler_type", "greedy"): "eval strategy",
    ("rlvr", "lr_scheduler_type", "reduce_lr_on_plateau"): "eval strategy",
    ("rlvr", "lr_scheduler_type", "greedy"): "eval strategy",
}
MACHINE_DEPENDENT = {"ddp_backend"}  # accepted only inside a process group


def _rule_cases():
    schema = json.loads(config_schema.SCHEMA.read_text())
    for stage, entry in schema.items():
        for name, field in entry["fields"].items():
            if "limit" in field or "names" in field or "choices" in field:
                yield pytest.param(stage, name, field, id=f"{stage}-{name}")


@pytest.fixture(scope="module")
def real_config(tmp_path_factory):
    """stage, argv -> the real parser's and the stage's own refusal (its message) or None: the dataclasses'
    __post_init__, and what the stage checks of its config before anything loads (sft validate, eval
    validate)."""
    parsers = {}
    model = tmp_path_factory.mktemp("model")  # an existing folder is a valid model_name_or_path
    extra = {"sft": ["--model_name_or_path", str(model)], "eval": ["--checkpoints", "a/b"]}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)

        def refusal(stage: str, argv: list[str]) -> str | None:
            if stage not in parsers:
                types = tuple(
                    getattr(importlib.import_module(m), n) for m, n in config_schema.STAGE_TYPES[stage]
                )
                parsers[stage] = stage_parser(types, stage)
            try:
                parsed = parsers[stage].parse(["--config", BASE_CONFIG[stage], *extra.get(stage, []), *argv])
                if stage == "sft":
                    parsed[0].validate(parsed[1])
                if stage == "eval":
                    from sage_unsloth.eval.config import validate

                    validate(parsed[0])
            except (ValueError, FileNotFoundError) as exc:
                return str(exc)
            return None

        yield refusal


@pytest.mark.parametrize("stage, name, field", list(_rule_cases()))
def test_each_rule_is_what_the_real_config_refuses(stage, name, field, real_config):
    """At each bound of a rule, the real config refuses a value outside and accepts one inside, as the check
    does; a name outside the choices is refused by both. So the check never refuses a config the stage would
    run, and refuses what the stage would refuse later."""
    from sage_unsloth.config.field_rules import rule_from_json

    for value, accepted in _probes(field):
        if accepted and name in MACHINE_DEPENDENT:
            continue
        text = str(value)
        light = config_schema.check_stage_input(stage, [BASE_CONFIG[stage], f"--{name}", text])
        assert (light == []) == accepted, (value, light)
        if rule_from_json(field) is not None and not accepted:
            assert light[0].startswith(f"{name}="), light
        refused = real_config(stage, [f"--{name}", text, *CONTEXT.get((stage, name, value), [])])
        if accepted and (stage, name, value) in OTHER_RULE:
            assert refused is not None and OTHER_RULE[(stage, name, value)] in refused, refused
            continue
        assert (refused is None) == accepted, (value, refused)


# The few choice fields whose bad YAML value the stack accepts when parsing (argparse checks the choices of flags
# only) and fails on later, past the point of a one-line error: the pre-import check refuses them first.
LATE_CHOICES = {("sft", "bnb_4bit_quant_type"), ("sft", "dataloader_multiprocessing_context")}


@pytest.mark.parametrize(
    "stage, name, field", [p for p in _rule_cases() if "choices" in p.values[2] or "names" in p.values[2]]
)
def test_a_bad_name_in_the_yaml_is_refused_by_both(stage, name, field, real_config, tmp_path):
    config = tmp_path / "c.yaml"
    bad = "[no_such_name]" if field.get("list") else "no_such_name"
    config.write_text(f"base: {REPO / BASE_CONFIG[stage]}\n{name}: {bad}\n")
    light = config_schema.check_stage_input(stage, [str(config)])
    assert len(light) == 1 and light[0].startswith(f"{config}: {name}='no_such_name'"), light
    if (stage, name) not in LATE_CHOICES:
        assert real_config(stage, ["--config", str(config)]) is not None


# ------------------------------------------------------------------------------------------ no false alarm
def _shipped_configs():
    for stage, pattern in (
        ("sft", "configs/sft/*.yaml"),
        ("rlvr", "configs/rlvr/*/*.yaml"),
        ("rlvr", "configs/demo/grpo*.yaml"),
        ("rlvr", "examples/*.yaml"),
        ("eval", "configs/eval/*.yaml"),
        ("report", "configs/report/default.yaml"),
        ("sweep", "configs/sweep/*.yaml"),
    ):
        for path in sorted(REPO.glob(pattern)):
            yield pytest.param(stage, path, id=str(path.relative_to(REPO)))


@pytest.mark.parametrize("stage, path", list(_shipped_configs()))
def test_every_shipped_config_passes_the_check(stage, path, monkeypatch):
    monkeypatch.chdir(REPO)
    assert config_schema.check_stage_input(stage, [str(path)]) == []


@pytest.mark.parametrize(
    "argv",
    [
        [
            "--max_steps",
            "3",
            "--resume",
            "--beta=0.1",
            "--max_train_rows",
            "8",
        ],  # a bool with no value; key=value
        ["--resume", "false", "--no_vllm_importance_sampling_correction", "--learning_rate", "-1e-5"],
        # plug-ins that are where they say (the check looks for the file or the package, importing neither)
        [
            "--guide",
            f"{REPO}/examples/top2_margin.py:top2_margin_guide",
            "--advantage_estimator",
            "sage_unsloth.plugins.advantages:passk_group_advantages",
        ],
        [
            "--policy_term",
            "none",
            "--kl_term",
            f"{REPO}/examples/clipped_k3.py:clipped_k3",
            "--sage_seed",
            "none",
        ],
        ["--max-steps", "3", "--report_to", "none", "--lora_target_modules", "q_proj", "v_proj"],
    ],
)
def test_flags_the_parser_takes_pass_the_check(argv):
    light = config_schema.check_stage_input("rlvr", [BASE_CONFIG["rlvr"], *argv])
    if "--learning_rate" in argv:  # the only bad value: a negative rate
        assert light == ["learning_rate=-1e-05 must be > 0"]
    else:
        assert light == []


# ------------------------------------------------------------------------------------------ all at once
def test_every_bad_value_is_reported_at_once(tmp_path):
    """beta: high used to hide max_steps: ten (one error at a time, each after the imports)."""
    config = tmp_path / "bad.yaml"
    config.write_text(
        f"base: {REPO / BASE_CONFIG['rlvr']}\nbeta: high\nmax_steps: ten\nguide: {{name: brnch, gamma: 0.8}}\nlerning_rate: 1\n"
        "temperature: -1\n"
    )
    lines = config_schema.check_stage_input("rlvr", [str(config), "--top_p", "3", "--betaa", "2"])
    assert lines == [  # the file's (in the order of the merged YAML, types first), then the command line's
        f"{config}: max_steps: 'ten' is not an integer",
        f"{config}: beta: 'high' is not a number; e.g. beta: 0.05",
        f"{config}: unknown key 'lerning_rate': did you mean 'learning_rate'?",
        (
            f"{config}: guide='brnch' is unknown: did you mean 'branch'? (use one of none, branch, "
            "ref_branch, token, random, or 'package.module:function' or 'path/to/file.py:function')"
        ),
        f"{config}: temperature=-1 must be > 0 (GRPO samples its rollouts; paper: 1.0)",
        "unknown flag --betaa: did you mean '--beta'?",
        "top_p=3.0 must be in (0, 1] (paper: 1.0; 1 = off)",
    ]


def test_a_limit_says_its_interval_as_written():
    """Each end closed ([ ]), open (( )) or absent; a lone end as an inequality; a non-finite value adds 'finite'."""
    from sage_unsloth.config.field_rules import Limit

    assert Limit(ge=0, le=1).describe() == "in [0, 1]"
    assert Limit(gt=0.5, lt=1).describe() == "in (0.5, 1)"
    assert Limit(gt=0, le=1).describe() == "in (0, 1]"
    assert Limit(ge=1, lt=2**32).describe() == "in [1, 2**32)"
    assert [Limit(ge=2).describe(), Limit(gt=0).describe()] == [">= 2", "> 0"]
    assert [Limit(le=3).describe(), Limit(lt=0.25).describe()] == ["<= 3", "< 0.25"]
    assert [Limit().describe(), Limit().describe(float("nan")), Limit(ge=0).describe(float("inf"))] == [
        "anything",
        "finite",
        ">= 0 and finite",
    ]


def test_a_value_the_command_line_replaces_is_not_judged(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"base: {REPO / BASE_CONFIG['rlvr']}\nbeta: -1\nmax_steps: ten\n")
    lines = config_schema.check_stage_input("rlvr", [str(config), "--beta", "0.1", "--max_steps", "3"])
    assert lines == [f"{config}: max_steps: 'ten' is not an integer"]  # the parser refuses a bad type anyway


@pytest.mark.parametrize(
    "stage, argv, expected",
    [
        (
            "eval",
            ["--benchmarks", "aime24", "mat500"],
            "benchmarks='mat500' is unknown: did you mean 'math500'?",
        ),
        ("eval", ["--backend", "vlm"], "backend='vlm' is unknown: did you mean 'vllm'?"),
        (
            "rlvr",
            ["--advantage_estimator", "pask"],
            "advantage_estimator='pask' is unknown: did you mean 'passk'?",
        ),
        (
            "rlvr",
            ["--policy_term", "clip_covv"],
            "policy_term='clip_covv' is unknown: did you mean 'clip_cov'?",
        ),
        ("rlvr", ["--kl_term", "k33"], "kl_term='k33' is unknown: did you mean 'k3'?"),
        ("rlvr", ["--loss_type", "dapoo"], "loss_type='dapoo' is unknown: did you mean 'dapo'?"),
        ("sft", ["--optim", "adamw_torh"], "optim='adamw_torh' is unknown: did you mean 'adamw_torch'?"),
        ("sweep", ["--executor", "slurn"], "executor='slurn' is unknown: did you mean 'slurm'?"),
        ("report", ["--level", "0.5"], "level=0.5 must be in (0.5, 1) (the confidence level)"),
        ("rlvr", ["--guide", "mod:"], "guide='mod:' is not a registered name nor an import path"),
        ("eval", ["--output_dir", "x"], "--output_dir is not a flag of sage-unsloth eval: stage 3 writes"),
    ],
)
def test_every_name_the_kit_accepts_has_did_you_mean(stage, argv, expected):
    lines = config_schema.check_stage_input(stage, [BASE_CONFIG[stage], *argv])
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_a_node_is_checked_by_its_name_before_trl_is_imported(tmp_path):
    """A plug-in node's name is checked the same in its three spellings (mapping, JSON, bare name); a key of the
    flat spelling is one line naming the node it became."""
    config = tmp_path / "c.yaml"
    config.write_text(
        f"base: {REPO / BASE_CONFIG['rlvr']}\npolicy_term: {{name: clip_covv, ratio: 0.1}}\nsage_tau: 0.5\n"
    )
    lines = config_schema.check_stage_input("rlvr", [str(config), "--guide", '{"name": "brnch"}'])
    assert lines[0].startswith(f"{config}: sage_tau is retired: it is the argument tau of the guide node"), (
        lines
    )
    assert lines[1].startswith(f"{config}: policy_term='clip_covv' is unknown: did you mean 'clip_cov'?"), (
        lines
    )
    assert lines[2].startswith("guide='brnch' is unknown: did you mean 'branch'?") and len(lines) == 3, lines
    config.write_text(f"base: {REPO / BASE_CONFIG['rlvr']}\nguide: {{name: branch, gamma: 0.8, tau: 0.5}}\n")
    assert config_schema.check_stage_input("rlvr", [str(config), "--kl_term", '{"name": "k2"}']) == []


def test_local_benchmarks_add_names():
    argv = [BASE_CONFIG["eval"], "--local_benchmarks", "mine=rows.jsonl", "--benchmarks", "mine", "aime24"]
    assert config_schema.check_stage_input("eval", argv) == []


def test_an_unknown_stage_has_did_you_mean(capsys):
    assert cli.main(["rlvx", "x.yaml"]) == 2
    assert capsys.readouterr().err.strip() == "error: unknown stage 'rlvx': did you mean 'rlvr'?"


# ------------------------------------------------------------------------------------------ before the imports
PROBE = """
import runpy, sys, time
sys.argv = [{module!r}, *{argv!r}]
started = time.perf_counter()
try:
    runpy.run_module({module!r}, run_name="__main__", alter_sys=True)  # as python -m does
    code = 0
except SystemExit as stop:
    code = stop.code
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print(code, ",".join(heavy) or "-")
"""


def _run_stage_module(module: str, argv: list[str]):
    done = run_python(
        ["-c", PROBE.format(module=module, argv=argv, heavy=HEAVY)],
        cwd=REPO,
        env=env_with_repo(),
        timeout=300,
    )
    code, heavy = done.stdout.strip().splitlines()[-1].split(" ")
    return int(code), heavy, done.stderr.strip().splitlines()


@pytest.mark.parametrize("stage", ["sft", "rlvr", "eval", "report", "sweep"])
def test_a_missing_config_fails_before_torch_is_imported(stage, tmp_path):
    """`python -m sage_unsloth.<stage>` (what scripts/0N_*.sh run): the package import used to pull in TRL
    (stage 2: 5-14 s before the one line)."""
    module = {"sweep": "sage_unsloth.jobs.sweep"}.get(stage, f"sage_unsloth.{stage}")
    missing = tmp_path / "missing.yaml"
    code, heavy, err = _run_stage_module(module, [str(missing)])
    assert (code, heavy) == (2, "-"), err
    assert err == [f"error: config file {missing} not found: pass a YAML from configs/{stage}/"]


def test_a_broken_config_and_bad_values_fail_before_torch_is_imported(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00beta: 1\n")
    code, heavy, err = _run_stage_module("sage_unsloth.rlvr", [str(binary)])
    assert (code, heavy) == (2, "-") and err == [
        f"error: {binary} is not a text file (not UTF-8): pass a YAML config"
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {REPO / BASE_CONFIG['rlvr']}\nbeta: high\nmax_steps: ten\n")
    code, heavy, err = _run_stage_module("sage_unsloth.rlvr", [str(bad)])
    assert (code, heavy) == (2, "-") and len(err) == 2, err


# ------------------------------------------------------------------------------------------ YAML syntax errors
def _broken_preset(preset: Path, folder: Path) -> Path:
    """A copy of ``preset`` (and its base chain) with a line that is not YAML at its end."""
    for source in preset.parent.glob("*.yaml"):
        shutil.copy(source, folder / source.name)
    broken = folder / preset.name
    broken.write_text(broken.read_text() + "max_steps: [1, 2\n")
    return broken


@pytest.mark.parametrize(
    "stage, preset",
    [("rlvr", "configs/rlvr/qwen2.5-math-7b/grpo.yaml"), ("sft", "configs/sft/qwen2.5-math-7b.yaml")],
)
def test_a_yaml_syntax_error_in_a_preset_is_said_with_its_place(stage, preset, tmp_path, capsys):
    """It used to read as "backend=unsloth: this machine has no GPU" (the YAML's backend could not be read)."""
    broken = _broken_preset(REPO / preset, tmp_path)
    last = len(broken.read_text().splitlines())
    expected = (
        f"error: {broken}, line {last + 1}, column 1: not valid YAML (expected ',' or ']', but got "
        f"'<stream end>', while parsing a flow sequence at line {last}, column 12): fix the syntax there"
    )
    assert cli.main([stage, str(broken)]) == 2
    assert capsys.readouterr().err.strip() == expected
    # the stage's own pre-parse refusal (its no-GPU check reads the YAML's backend) says it too
    assert refuse_before_parsing([str(broken)], f"configs/{stage}/") == 2
    assert capsys.readouterr().err.strip() == expected


def test_a_yaml_error_in_a_base_names_the_base(tmp_path):
    base = tmp_path / "_base.yaml"
    base.write_text("beta: 0.1\n  learning_rate: 1\n")
    config = tmp_path / "grpo.yaml"
    config.write_text("base: _base.yaml\n")
    (line,) = config_schema.check_stage_input("rlvr", [str(config)])
    assert line.startswith(f"{base}, line 2, column 16: not valid YAML (mapping values are not allowed here")


def test_load_config_errors_are_one_line(tmp_path):
    from sage_unsloth.config.args import load_config

    folder = tmp_path / "d.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(folder)
