"""One path for bad input: each bad input a new user tries fails in one line naming the field and the fix,
exit 2, before any model loads (the loaders are replaced by a tripwire); --help is short and kit-first."""

from __future__ import annotations

import pytest

from sage_unsloth import cli
from sage_unsloth.config.args import ConfigError

TINY_GRPO = "configs/rlvr/tiny-cpu/grpo.yaml"
TINY_SFT = "configs/sft/tiny-cpu.yaml"


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails the test loudly (not a ValueError, so no stage reports it as bad input)."""
    from sage_unsloth.model import loading as models

    def tripwire(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was reported")

    monkeypatch.setattr(models, "load_for_training", tripwire)
    monkeypatch.setattr(models, "load_tokenizer", tripwire)


def sft_argv(model, out, *extra) -> list[str]:
    """`sage-unsloth sft` of the tiny config on ``model`` into ``out``, then ``extra``."""
    return ["sft", TINY_SFT, "--model_name_or_path", str(model), "--output_dir", str(out), *extra]


def _one_line_error(capsys, argv) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


# the bad flags and values | what the one line says (the TRL / PEFT fields a user commonly sets: issue 25;
# no abbreviations: --max_step; e-notation is a number: -1e-5; 4 % 3 rollouts: a partial group; backend=unsloth
# with --unsloth_without_gpu true: past the no-GPU refusal, which comes first on a CPU-only machine)
RLVR_CASES = """
--beta -0.1 | beta=-0.1 must be >= 0 (the KL coefficient; paper: 0.05; 0 = no KL)
--learning_rate -1 | learning_rate=-1.0 must be > 0
--model_name_or_path /nonexistent/model | model_name_or_path='/nonexistent/model' is neither an existing
--kl_term k2 --backend unsloth --unsloth_without_gpu true | kl_term='k2' is not expressible as a shifted reference
--dynamic_sampling true --backend unsloth --unsloth_without_gpu true | dynamic_sampling merges rollouts in TRL's layout
--beta abc | --beta abc: not a number; e.g. --beta 0.05
--use_vllm maybe | --use_vllm maybe: not true or false
--betaa 0.1 | unknown flag --betaa: did you mean '--beta'?
--max_step 3 | unknown flag --max_step: did you mean '--max_steps'?
--learning_rate -1e-5 | learning_rate=-1e-05 must be > 0
--guide brnach | guide='brnach' is unknown: did you mean 'branch'?
--anchor sftt | anchor='sftt' is unknown: did you mean 'sft'?
--num_train_epochs -1 --max_steps -1 | max_steps=-1, num_train_epochs=-1.0: nothing to train
--num_generations 0 | num_generations=0 must be >= 2
--num_generations 1 | num_generations=1 must be >= 2
--num_generations 3 | of 4 rollouts (generation_batch_size
--generation_batch_size 6 | generation_batch_size=6 must be a multiple of per_device_train_batch_size x processes = 4
--steps_per_generation 2 | generation_batch_size=4 and steps_per_generation=2 are both set
--per_device_train_batch_size 0 | per_device_train_batch_size=0 must be >= 1
--gradient_accumulation_steps 0 | gradient_accumulation_steps=0 must be >= 1
--num_iterations 0 | num_iterations=0 must be >= 1
--temperature -1 | temperature=-1.0 must be > 0
--temperature 0 | temperature=0.0 must be > 0
--top_p 0 | top_p=0.0 must be in (0, 1]
--top_p 1.5 | top_p=1.5 must be in (0, 1]
--min_p 1 | min_p=1.0 must be in [0, 1)
--min_p -0.1 | min_p=-0.1 must be in [0, 1)
--epsilon -0.2 | epsilon=-0.2 must be > 0
--epsilon_high 0.1 | epsilon_high=0.1 must be >= epsilon=0.2
--max_completion_length 0 | max_completion_length=0 must be >= 1
--max_seq_length 64 --max_completion_length 64 | max_completion_length=64 leaves no room for a prompt in the 64-token context
--max_seq_length 64 --max_prompt_length 60 | max_prompt_length=60 + max_completion_length=16 exceeds the 64-token context
--learning_rate inf | learning_rate=inf must be > 0 and finite
--learning_rate nan | learning_rate=nan must be > 0 and finite
--save_steps 0 | save_steps=0.0 must be > 0
--logging_steps 0 | logging_steps=0.0 must be > 0
--lora_r 0 | lora_r=0 must be >= 1
--lora_alpha 0 | lora_alpha=0 must be > 0
--seed -1 | seed=-1 must be in [0, 2**32)
--warmup_steps -1 | warmup_steps=-1.0 must be >= 0
--weight_decay -1 | weight_decay=-1.0 must be >= 0
--dataloader_num_workers -1 | dataloader_num_workers=-1 must be >= 0
--guide {"name":"branch","gamma":-0.3} | guide.gamma=-0.3 must be >= 0
--guide {"name":"branch","q_max":Infinity} | guide.q_max=inf must be >= 0 and finite
--guide {"name":"branch","tau":NaN} | guide.tau=nan must be finite
--guide {"name":"token","sigma_upper":-1} | guide.sigma_upper=-1 must be >= 0
--guide {"name":"random","eps_upper":2} | guide.eps_upper=2 must be in [0, 1] (a token probability)
--guide {"name":"token","decay":0} | guide.decay=0 must be in (0, 1]
--guide {"name":"branch","q_min":1.3,"q_max":1.1} | guide: q_min=1.3 > q_max=1.1: make q_min <= q_max
--sage_gamma 0.3 | sage_gamma is retired: it is the argument gamma of the guide node, guide: {name: branch, gamma:
--kl_estimator k2 | kl_estimator is retired: name the KL term in its node, kl_term: {name: <name>
"""


@pytest.mark.parametrize("flags, expected", [line.split(" | ") for line in RLVR_CASES.strip().splitlines()])
def test_rlvr_bad_input_is_one_line_before_loading(
    flags, expected, sft_dir, tmp_path, capsys, no_model_loads
):
    line = _one_line_error(
        capsys, ["rlvr", TINY_GRPO, "--sft_dir", str(sft_dir), "--output_root", str(tmp_path), *flags.split()]
    )
    assert line.startswith("error: ") and expected in line, line
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("betaa: 0.1\n", "unknown key 'betaa': did you mean 'beta'?"),
        ("beta: [0.1]\n", "beta: [0.1] is not a number"),
        ("max_steps: 2.5\n", "max_steps: 2.5 is not an integer"),
        ("max_steps: ten\n", "max_steps: 'ten' is not an integer"),  # not "e.g. --max_steps ten"
        ("learning_rate: fast\n", "learning_rate: 'fast' is not a number; e.g. learning_rate: 5e-06"),
        ("bf16: 'yes please'\n", "bf16: 'yes please' is not true or false"),
        (
            "completely_unrelated_key: 1\n",
            "unknown key 'completely_unrelated_key': not a field of sage-unsloth rlvr",
        ),
    ],
)
def test_rlvr_bad_yaml_is_one_line(yaml_text, expected, sft_dir, tmp_path, capsys, no_model_loads):
    from pathlib import Path

    config = tmp_path / "typo.yaml"
    config.write_text(f"base: {Path(TINY_GRPO).resolve()}\n{yaml_text}")
    line = _one_line_error(
        capsys, ["rlvr", str(config), "--sft_dir", str(sft_dir), "--output_root", str(tmp_path / "out")]
    )
    assert expected in line, line


def test_sft_nonexistent_model_is_one_line(tmp_path, capsys, no_model_loads):
    line = _one_line_error(capsys, sft_argv("/nonexistent/m", tmp_path / "out"))
    assert "model_name_or_path='/nonexistent/m' is neither an existing folder nor a hub id" in line


def test_sft_negative_learning_rate_is_one_line(tiny_model_dir, tmp_path, capsys, no_model_loads):
    line = _one_line_error(capsys, sft_argv(tiny_model_dir, tmp_path / "out", "--learning_rate", "-1"))
    assert "learning_rate=-1.0 must be > 0" in line


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--lora_r", "0"], "lora_r=0 must be >= 1 (the LoRA rank)"),
        (["--lora_alpha", "-16"], "lora_alpha=-16 must be > 0"),
        (["--lora_dropout", "1"], "lora_dropout=1.0 must be in [0, 1)"),
        (["--per_device_train_batch_size", "0"], "per_device_train_batch_size=0 must be >= 1"),
        (["--save_strategy", "steps", "--save_steps", "0"], "save_steps=0.0 must be > 0"),
        (["--logging_steps", "-1"], "logging_steps=-1.0 must be > 0"),
        (["--learning_rate", "inf"], "learning_rate=inf must be > 0 and finite"),
    ],
)
def test_sft_trainer_and_lora_fields_are_one_line(
    extra, expected, tiny_model_dir, tmp_path, capsys, no_model_loads
):
    line = _one_line_error(capsys, sft_argv(tiny_model_dir, tmp_path / "out", *extra))
    assert line.startswith("error: ") and expected in line, line
    assert not (tmp_path / "out").exists()


def test_offline_hub_id_not_in_the_cache_is_refused_when_the_run_is_planned(monkeypatch, tmp_path):
    from sage_unsloth.config.args import check_hub_model_cached, check_model_name_or_path

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_model_name_or_path("Qwen/Qwen2.5-Math-7B")  # plausible: parsing accepts it
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache"):
        check_hub_model_cached("Qwen/Qwen2.5-Math-7B")
    for bad in ("Qwen2.5-Math-7B", "org/name/extra", "./missing", "~/missing"):
        with pytest.raises(ConfigError, match="neither an existing folder nor a hub id"):
            check_model_name_or_path(bad)
    check_model_name_or_path(str(tmp_path))  # an existing folder, whatever its name


def test_config_refusals_do_not_depend_on_the_machine(monkeypatch, tmp_path):
    """k2 / forward / dynamic sampling / token q in the loss under backend=unsloth are refused on CPU too."""
    from sage_unsloth.rlvr import config as rlvr_config

    common = {
        "output_dir": str(tmp_path),
        "report_to": "none",
        "bf16": False,
        "use_cpu": True,
        "backend": "unsloth",
    }
    for cuda in (False, True):
        monkeypatch.setattr(rlvr_config, "_cuda_available", lambda cuda=cuda: cuda)
        for bad in (
            {"kl_term": "k2"},
            {"kl_term": "forward"},
            {"dynamic_sampling": True},
            {"guide": "token", "sage_q_source": "loss"},
        ):
            with pytest.raises(ConfigError, match="backend=trl"):
                rlvr_config.SageGRPOConfig(**common, **bad)
    ok = rlvr_config.SageGRPOConfig(**{**common, "backend": "trl"}, kl_term="k2")
    assert ok.kl_term == {"name": "k2"}
    assert rlvr_config.SageGRPOConfig(**common, beta=0.0).beta == 0.0  # beta 0 (no KL) stays allowed


def test_rlvr_help_is_short_and_kit_first(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["rlvr", "--help"])
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert stopped.value.code == 0 and lines[0] == "usage: sage-unsloth rlvr CONFIG.yaml [--key value ...]"
    assert len(lines) < 150
    assert lines[3].lstrip().startswith("--guide")  # the kit's fields first
    assert "--beta FLOAT" in out and "--sft_dir" in out and "--per_device_train_batch_size" in out
    assert "--adam_beta1" not in out and "--help-all" in lines[-1]
    with pytest.raises(SystemExit):
        cli.main(["rlvr", "--help-all"])
    full = capsys.readouterr().out
    assert (
        full.startswith("usage: sage-unsloth rlvr")
        and "--adam_beta1" in full
        and len(full.splitlines()) > 500
    )


def test_help_after_a_config_shows_its_values(capsys):
    with pytest.raises(SystemExit):
        cli.main(["rlvr", "configs/rlvr/qwen2.5-math-7b/grpo_nokl.yaml", "--help"])
    out = capsys.readouterr().out
    beta = next(line for line in out.splitlines() if line.lstrip().startswith("--beta "))
    assert "(default: 0.0)" in beta


@pytest.mark.parametrize("ks", [["1,8"], ["1", "8"], ["1,", "8"]])
def test_list_flags_take_commas_or_spaces(ks):
    from sage_unsloth.eval.run import parse_args

    cfg = parse_args(["configs/eval/tiny-cpu.yaml", "--checkpoints", "a/b", "--ks", *ks, "--n", "8"])
    assert cfg.ks == [1, 8] and cfg.checkpoints == ["a/b"]


def test_yaml_list_may_be_a_comma_string(tmp_path):
    from sage_unsloth.eval.run import parse_args

    config = tmp_path / "e.yaml"
    config.write_text("base: " + str((tmp_path / "..").resolve() / "missing.yaml") + "\n")
    with pytest.raises(ConfigError, match="not found"):
        parse_args([str(config)])
    config.write_text("checkpoints: [a/b]\nks: '1, 4'\n")
    assert parse_args([str(config)]).ks == [1, 4]


# stage -> (its parser, its arguments before the bad one, where it would write): the error comes from parsing
# (the config's __post_init__), before any checkpoint is resolved or loaded and before anything is written
FIELD_CHECKS = {
    "eval": (
        "sage_unsloth.eval.run",
        ["configs/eval/tiny-cpu.yaml", "--checkpoints", "a/b"],
        "--results_dir",
    ),
    "report": ("sage_unsloth.report.config", ["--results", "{tmp}"], "--out"),
}


# stage | the bad flag and value | what its one line says
FIELD_CASES = """
eval | --top_p 0 | top_p=0.0 must be in (0, 1]
eval | --temperature -1 | temperature=-1.0 must be >= 0 (0 = greedy)
eval | --max_tokens 1024 | max_tokens=1024, max_model_len=1024: need 1 <= max_tokens < max_model_len
eval | --limit 0 | limit=0 must be >= 1 (problems per benchmark; null for all)
eval | --grading_workers 0 | grading_workers=0 must be >= 1 (null for one per core)
eval | --gpu_memory_utilization 1.5 | gpu_memory_utilization=1.5 must be in (0, 1] (a fraction)
eval | --problems_per_batch 0 | problems_per_batch=0 must be >= 1
eval | --shard 3/2 | shard
report | --pairs grpo: | --pairs: 'grpo:' names no run on one side
report | --pairs grpo-grpo_branch | is not 'run_a:run_b'
report | --wandb_entity me | wandb_entity is set without wandb_project
report | --pattern_samples_per_problem 0 | pattern_samples_per_problem=0 must be >= 1 (null for all)
report | --resamples 10 | resamples=10 must be >= 100 (bootstrap resamples)
"""


@pytest.mark.parametrize(
    "stage, flag, expected", [line.split(" | ") for line in FIELD_CASES.strip().splitlines()]
)
def test_stage_fields_are_checked_where_the_config_is_built(stage, flag, expected, tmp_path, capsys):
    import importlib

    module, base, out = FIELD_CHECKS[stage]
    argv = [a.format(tmp=tmp_path) for a in base] + flag.split()
    with pytest.raises(ValueError) as caught:
        importlib.import_module(module).parse_args(argv)
    assert expected in str(caught.value) and "\n" not in str(caught.value), caught.value
    line = _one_line_error(capsys, [stage, *argv, out, str(tmp_path / "r")])
    assert expected in line
    assert not (tmp_path / "r").exists()


def test_an_eval_config_without_checkpoints_is_valid_until_it_runs():
    # the notebook configs leave checkpoints to the command line: building them is fine, running is not
    from sage_unsloth.eval.config import EvalConfig, validate

    cfg = EvalConfig(n=8)
    with pytest.raises(ValueError, match="`checkpoints` is empty"):
        validate(cfg)
    assert validate(EvalConfig(checkpoints=["a/b"], n=8)) == [1, 2, 4, 8]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["eval", "configs/eval/tiny-cpu.yaml", "--checkpoints", "a/b"],
            "--output_dir is not a flag of sage-unsloth eval: stage 3 writes its tables to --results_dir",
        ),
        (["report"], "--output_dir is not a flag of sage-unsloth report: stage 4 writes the report to --out"),
    ],
)
def test_stages_without_an_output_dir_refuse_it_naming_theirs(argv, expected, tmp_path, capsys):
    line = _one_line_error(capsys, [*argv, "--output_dir", str(tmp_path / "x")])
    assert expected in line, line
    assert not (tmp_path / "x").exists()


def test_sft_with_nothing_to_train_is_one_line(tiny_model_dir, tmp_path, capsys, no_model_loads):
    argv = sft_argv(tiny_model_dir, tmp_path / "out", "--num_train_epochs", "-1", "--max_steps", "-1")
    assert "max_steps=-1, num_train_epochs=-1.0: nothing to train" in _one_line_error(capsys, argv)
    assert not (tmp_path / "out").exists()


def test_help_shows_each_bool_by_its_own_flag_and_optional_ints_as_int(capsys):
    with pytest.raises(SystemExit):
        cli.main(["sft", "--help"])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "numeric_answers_only" in x)
    assert line.lstrip().startswith("--numeric_answers_only [BOOL]") and "(default: True)" in line
    with pytest.raises(SystemExit):
        cli.main(["eval", "--help"])
    out = capsys.readouterr().out
    assert "--limit INT" in out and "--grading_workers INT" in out and "--temperature FLOAT" in out
    temperature = next(x for x in out.splitlines() if x.lstrip().startswith("--temperature "))
    assert "(default: 0.6)" in temperature
    assert "more fields (from )" not in out and "0 more fields" not in out  # eval has no upstream fields


def test_an_optional_integer_in_a_yaml_is_type_checked_against_its_file(tmp_path):
    from sage_unsloth.eval.run import parse_args

    config = tmp_path / "e.yaml"
    config.write_text("checkpoints: [a/b]\nlimit: 2.5\n")
    with pytest.raises(ConfigError, match=r"e.yaml: limit: 2.5 is not an integer"):
        parse_args([str(config)])
    config.write_text("checkpoints: [a/b]\nlimit: ten\n")
    with pytest.raises(ConfigError, match=r"e.yaml: limit: 'ten' is not an integer"):
        parse_args([str(config)])
    config.write_text("checkpoints: [a/b]\nlimit: none\n")  # TRL's spelling of None, as on the CLI
    assert parse_args([str(config)]).limit is None


def test_the_training_stages_share_their_run_flags(capsys):
    """dry_run, resume, restart and unsloth_without_gpu: one declaration (sage_unsloth/config/training_cli.py), listed by
    both stages' --help with the same text."""
    import dataclasses

    from sage_unsloth.config.training_cli import StageRunArgs
    from sage_unsloth.rlvr.run import RLVRStageArgs
    from sage_unsloth.sft.config import SageSFTConfig

    shared = [f.name for f in dataclasses.fields(StageRunArgs)]
    assert shared == ["dry_run", "resume", "unsloth_without_gpu", "restart"]
    assert issubclass(SageSFTConfig, StageRunArgs) and issubclass(RLVRStageArgs, StageRunArgs)
    helps = {}
    for stage in ("sft", "rlvr"):
        with pytest.raises(SystemExit):
            cli.main([stage, "--help"])
        out = capsys.readouterr().out
        helps[stage] = [
            " ".join(line.split()[2:])
            for line in out.splitlines()
            if line.split()[:1] in ([f"--{n}"] for n in shared)
        ]
        assert len(helps[stage]) == len(shared), out
    assert helps["sft"] == helps["rlvr"]
