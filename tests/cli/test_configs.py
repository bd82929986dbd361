"""Every YAML under configs/ parses into its stage's config class; the 7B ones hold the paper's values;
``base:`` files merge as documented; method files differ from grpo.yaml in their method's keys only.

The paper's values are written here from the paper and the official SAGE code, not read from the kit's
defaults, so a default that drifts fails here.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from sage_unsloth.config.args import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
# The kit's own config folders. A user's folder anywhere (configs/rlvr/mine/, ~/my-configs/) is theirs: these
# tests check the kit's files only, so adding one never fails the suite (test_guide_plugins.py checks that a
# user's folder works with every stage).
KIT_FOLDERS = (
    "accelerate",
    "demo",
    "eval",
    "report",
    "rlvr/qwen2.5-1.5b",
    "rlvr/qwen2.5-3b",
    "rlvr/qwen2.5-math-7b",
    "rlvr/tiny-cpu",
    "sft",
    "sweep",
)


def kit_yamls(configs: Path) -> list[Path]:
    """The YAML files directly in the kit's folders of ``configs``."""
    return sorted(p for folder in KIT_FOLDERS for p in (configs / folder).glob("*.yaml"))


ALL_YAMLS = [p.relative_to(REPO).as_posix() for p in kit_yamls(CONFIGS)]
PAPER_RLVR = sorted((CONFIGS / "rlvr" / "qwen2.5-math-7b").glob("*.yaml"))
KIT_RLVR_FOLDERS = [CONFIGS / f for f in KIT_FOLDERS if f.startswith("rlvr/")]


def test_kit_yamls_are_every_kit_file_and_no_users(tmp_path):
    """Every kit folder exists and holds configs; a user's folder beside them is not picked up."""
    assert all(
        (CONFIGS / folder).is_dir() and list((CONFIGS / folder).glob("*.yaml")) for folder in KIT_FOLDERS
    )
    (tmp_path / "rlvr" / "mine").mkdir(parents=True)
    (tmp_path / "rlvr" / "mine" / "my_branch.yaml").write_text("guide: branch\n")
    (tmp_path / "rlvr" / "tiny-cpu").mkdir()
    (tmp_path / "rlvr" / "tiny-cpu" / "grpo.yaml").write_text("base: _base.yaml\n")
    assert kit_yamls(tmp_path) == [tmp_path / "rlvr" / "tiny-cpu" / "grpo.yaml"]


def _stage_of(relative: str) -> str:
    """The stage a YAML configures, known from its folder (configs/demo/ holds one per stage)."""
    folder, name = Path(relative).parts[1], Path(relative).stem.lstrip("_")
    if folder == "demo":
        return "rlvr" if name.startswith("grpo") else name
    if folder == "report" and name.startswith("mapping"):
        return "report-mapping"
    return folder


def _parse(relative: str):
    """The stage's own parser on the file (the 7B presets ask for bf16, which this CPU cannot do)."""
    path = str(REPO / relative)
    stage = _stage_of(relative)
    if stage == "rlvr":
        from sage_unsloth.rlvr.run import parse_args

        return parse_args([path, "--bf16", "false"])
    if stage == "sft":
        from sage_unsloth.sft.run import parse_args

        return parse_args([path])
    if stage == "eval":
        from sage_unsloth.eval.run import parse_args

        return parse_args([path])
    if stage == "report":
        from sage_unsloth.report.stage import parse_args

        return parse_args([path])
    if stage == "report-mapping":
        from sage_unsloth.report.paper import load_mapping

        return load_mapping(path)
    if stage == "sweep":
        from sage_unsloth.jobs.sweep import parse_args

        return parse_args([path])
    if stage == "accelerate":
        from accelerate.commands.config.config_args import ClusterConfig

        return ClusterConfig.from_yaml_file(path)
    raise AssertionError(f"{relative}: no stage known for configs/{Path(relative).parts[1]}/")


@pytest.mark.parametrize("relative", ALL_YAMLS)
def test_every_yaml_under_configs_parses_into_its_stage_config(relative):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. the random guide's "no effect on the expected gradient"
        parsed = _parse(relative)
    assert parsed


# ------------------------------------------------------------------------------------------- paper values
# From the paper / official code (README "Stage 2"): beta 0.05 (0 for the no-KL rows), branch
# q = 1 + 0.3 * relu(H - 1.2) clipped to [0.6, 1.4]; token alpha 0.3 -> 0.1, sigma 0.25 -> 0.1; random
# eps 0.1 -> 0, sigma 0.15 -> 0.05; 8 cosine restarts, x0.9 per cycle; 8 rollouts, generation batch 16,
# per-device batch 8, GA 1, temperature 1.0, top_p 1.0, min_p 0.01, epsilon 0.2, lr 5e-6 constant, weight
# decay 0.01, adamw_8bit, 1000 steps, save every 100, seed 3407, stop </SOLUTION>; Qwen2.5-Math-7B's
# 4096-token context.
# The guides' knobs are their arguments' defaults (sage_unsloth/plugins/guides.py), recorded in the resolved node.
PAPER_GUIDE_ARGS = {
    "branch": {"gamma": 0.3, "tau": 1.2, "q_min": 0.6, "q_max": 1.4},
    "token": {
        "alpha_upper": 0.3,
        "alpha_lower": 0.1,
        "sigma_upper": 0.25,
        "sigma_lower": 0.1,
        "norm": "minmax",
        "cycles": 8,
        "decay": 0.9,
        "q_min": 0.6,
        "q_max": 1.4,
    },
    "random": {
        "eps_upper": 0.1,
        "eps_lower": 0.0,
        "sigma_upper": 0.15,
        "sigma_lower": 0.05,
        "cycles": 8,
        "decay": 0.9,
        "q_min": 0.6,
        "q_max": 1.4,
    },
}
PAPER_RLVR_VALUES = {
    "num_generations": 8,
    "generation_batch_size": 16,
    "gradient_accumulation_steps": 1,
    "temperature": 1.0,
    "top_p": 1.0,
    "min_p": 0.01,
    "epsilon": 0.2,
    "learning_rate": 5e-6,
    "lr_scheduler_type": "constant",
    "weight_decay": 0.01,
    "optim": "adamw_8bit",
    "max_steps": 1000,
    "save_steps": 100,
    "seed": 3407,
    "num_iterations": 1,
}
NO_KL = {"grpo_nokl", "bnpo", "dapo", "dapo_full"}  # the paper's "(no KL)" rows; SAGE needs beta > 0
GUIDE = {
    "grpo_branch": "branch",
    "grpo_branch_server": "branch",
    "grpo_branch_reward": "branch",
    "bnpo_branch": "branch",
    "dapo_branch": "branch",
    "dapo_full_branch": "branch",
    "grpo_token": "token",
    "grpo_random": "random",
}


@pytest.mark.parametrize("path", PAPER_RLVR, ids=lambda p: p.stem)
def test_7b_rlvr_configs_hold_the_papers_values(path):
    from sage_unsloth.rlvr.run import parse_args

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args, stage, _, _ = parse_args([str(path), "--bf16", "false"])
    method = path.stem
    for name, value in PAPER_RLVR_VALUES.items():
        assert getattr(args, name) == value, (method, name)
    servers = method.endswith("_server")  # 2 per device x 4 processes = the paper's 8 per step
    assert args.per_device_train_batch_size == (2 if servers else 8)
    assert args.beta == (0.0 if method in NO_KL else 0.05), method
    guide = GUIDE.get(method, "none")
    assert args.guide == {"name": guide, **PAPER_GUIDE_ARGS.get(guide, {"q_min": 0.6, "q_max": 1.4})}, method
    assert args.kl_term == {"name": "forward" if method == "grpo_fkl" else "k3"}
    assert args.use_bias_correction_kl is False  # the paper's TRL 0.23 had no such factor
    assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_max) == (
        "token_truncate",
        2.0,
    )
    assert args.generation_kwargs["stop"] == ["</SOLUTION>"]
    assert stage.max_prompt_length == 1024 and args.max_completion_length == 3072  # 4096 in all
    assert stage.dataset_name == "open-r1/DAPO-Math-17k-Processed" and stage.dataset_config == "en"
    assert args.use_vllm and stage.variant == method
    assert stage.sft_dir == "outputs/qwen2.5-math-7b/sft"


def test_7b_sft_config_holds_the_official_recipe():
    """LoRA r 8 / alpha 16 / dropout 0 on q,k,v,o,gate,up,down (RLVR continues this adapter), 2 epochs,
    lr 2e-4 linear, batch 1, 5 warmup steps, weight decay 0.01, adamw_8bit, seed 3407."""
    relative = "configs/sft/qwen2.5-math-7b.yaml"
    sft_args, model_args = _parse(relative)
    assert (model_args.lora_r, model_args.lora_alpha, model_args.lora_dropout) == (8, 16, 0.0)
    assert sorted(model_args.lora_target_modules) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    assert (sft_args.num_train_epochs, sft_args.learning_rate, sft_args.lr_scheduler_type) == (
        2,
        2e-4,
        "linear",
    )
    assert (sft_args.per_device_train_batch_size, sft_args.warmup_steps, sft_args.weight_decay) == (
        1,
        5,
        0.01,
    )
    assert sft_args.seed == 3407 and sft_args.max_length_fraction == 0.5
    assert (
        load_config(REPO / relative)["optim"] == "adamw_8bit"
    )  # (parsed on CPU it falls back to adamw_torch)


# ------------------------------------------------------------------------------------------- base + overrides
# What each method file changes against its folder's grpo.yaml: the method's keys and nothing else.
METHOD_KEYS = {
    "grpo_nokl": {"beta"},
    "grpo_branch": {"guide"},
    "grpo_token": {"guide"},
    "grpo_random": {"guide"},
    "grpo_fkl": {"kl_term", "backend"},
    "grpo_branch_reward": {"guide", "sage_kl_placement"},
    "bnpo": {"loss_type", "beta"},
    "bnpo_branch": {"loss_type", "guide"},
    "dapo": {"loss_type", "beta", "epsilon_high"},  # (dapo_normalizer generation is the default)
    "dapo_branch": {"loss_type", "guide", "epsilon_high"},
    "dapo_full": {
        "loss_type",
        "beta",
        "epsilon_high",
        "dapo_normalizer",
        "soft_overlong_punish_cache",
        "dynamic_sampling",
        "backend",
    },
    "dapo_full_branch": {
        "loss_type",
        "guide",
        "epsilon_high",
        "dapo_normalizer",
        "soft_overlong_punish_cache",
        "dynamic_sampling",
        "backend",
    },
    "grpo_server": {
        "backend",
        "vllm_mode",
        "vllm_server_host",
        "vllm_server_timeout",  # (steps_per_generation: 16 / 2)
        "vllm_gpu_memory_utilization",
        "per_device_train_batch_size",
        "steps_per_generation",
    },
    "grpo_branch_server": {
        "backend",
        "vllm_mode",
        "vllm_server_host",
        "vllm_server_timeout",
        "vllm_gpu_memory_utilization",
        "per_device_train_batch_size",
        "steps_per_generation",
        "guide",
    },
}
METHOD_KEYS.update(
    {  # the exploration baselines (sage_unsloth/rlvr/exploration.py); a policy term needs TRL's loss
        "grpo_entropy_adv": {"policy_term", "backend"},
        "grpo_high_entropy": {"top_entropy_quantile"},
        "grpo_clip_cov": {"policy_term", "backend"},
        "grpo_kl_cov": {"policy_term", "backend"},
        "grpo_passk": {"advantage_estimator"},  # (k 4 is the default, written out in the file)
        "grpo_ref_reset": {"ref_reset_steps"},
    }
)
# Where a tiny twin needs more keys than its 7B namesake to exercise the method at tiny batch sizes.
TINY_METHOD_KEYS = {
    # 2 micro-batches per generation batch (the 7B's 16 / 8 already has 2): pi_old != pi on the second.
    "grpo_kl_cov": {"policy_term", "per_device_train_batch_size", "steps_per_generation"},
    # 4 rollouts: with k = num_generations = 2 every response would share its group's one subset.
    "grpo_passk": {"advantage_estimator", "num_generations"},
}
NAMED_AFTER_THE_FILE = {"variant", "run_name", "output_dir", "logging_dir"}
METHOD_FILES = sorted(
    p for folder in KIT_RLVR_FOLDERS for p in folder.glob("*.yaml") if p.stem not in ("_base", "grpo")
)


@pytest.mark.parametrize("path", METHOD_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_method_files_change_only_their_methods_keys(path):
    from dataclasses import asdict

    from sage_unsloth.rlvr.run import parse_args

    def fields(p):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args, stage, model, _ = parse_args([str(p), "--bf16", "false"])
        return {**args.to_dict(), **asdict(stage), **asdict(model)}

    method, grpo = fields(path), fields(path.parent / "grpo.yaml")
    differing = {k for k in method if method[k] != grpo[k]} - NAMED_AFTER_THE_FILE
    stack = {"backend"} if grpo["backend"] == "trl" else set()  # tiny-cpu runs TRL's trainer throughout
    keys = TINY_METHOD_KEYS.get(path.stem) if path.parent.name == "tiny-cpu" else None
    assert differing == (keys or METHOD_KEYS[path.stem]) - stack
    assert method["variant"] == path.stem


def test_each_rlvr_folder_shares_one_base_and_method_files_stay_short():
    for folder in KIT_RLVR_FOLDERS:
        assert (folder / "_base.yaml").is_file(), folder
        for path in folder.glob("*.yaml"):
            if path.stem == "_base":
                continue
            keys = [
                line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
            ]
            assert keys[0].startswith("base: "), path
            assert len(keys) <= 7, (path, keys)  # base: + the method's keys


def test_base_chain_merges_top_level_keys_the_file_wins(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "root.yaml").write_text("a: 1\nb: {x: 1, y: 2}\nc: root\nenv: {A: '1'}\n")
    (tmp_path / "sub" / "mid.yaml").write_text("base: ../root.yaml\nc: mid\nd: [1, 2]\nenv: {B: '2'}\n")
    (tmp_path / "sub" / "leaf.yaml").write_text(
        "base: mid.yaml  # relative to this file\nb: {x: 5}\nd: null\n"
    )
    merged = load_config(tmp_path / "sub" / "leaf.yaml")
    # a mapping is replaced whole (b loses y), null overrides, env accumulates down the chain
    assert merged == {"a": 1, "b": {"x": 5}, "c": "mid", "d": None, "env": {"A": "1", "B": "2"}}


@pytest.mark.parametrize(
    "text, error",
    [
        ("base: nope.yaml\n", r"base: nope.yaml not found"),
        ("base: loop.yaml\n", r"base chain comes back"),
        ("- a\n- b\n", r"must be a YAML mapping"),
        ("a: [1\n", r"line 2, column 1: not valid YAML"),
    ],
)
def test_bad_base_or_yaml_is_one_config_error(tmp_path, text, error):
    path = tmp_path / "loop.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error) as caught:
        load_config(path)
    assert "\n" not in str(caught.value)


def test_demo_methods_are_the_method_files_and_each_step_fingerprints_the_whole_chain(tmp_path):
    """The lab's methods are discovered from configs/demo/ (every file with a lab: block, no list): each builds on
    the one base the control builds on, so the methods differ only in what their files show."""
    from sage_unsloth.config.args import config_files
    from sage_unsloth.demo.run import CONTROL, METHODS, DemoBudget, build_steps

    demo = CONFIGS / "demo"
    method_files = sorted(p.stem for p in demo.glob("*.yaml") if "lab" in load_config_keys(p))
    assert len(method_files) > 10 and sorted(m.name for m in METHODS) == method_files
    shared_base = config_files(demo / f"{CONTROL}.yaml")[-1]
    for name in method_files:
        assert config_files(demo / f"{name}.yaml")[-1] == shared_base, name
        if name != CONTROL:  # every other method sets something of its own besides base:, variant: and lab:
            assert set(load_config_keys(demo / f"{name}.yaml")) - {"base", "variant", "lab"}, name
    every = DemoBudget(methods=tuple(m.name for m in METHODS))
    steps = {s.name: s for s in build_steps(every, tmp_path / "w", tmp_path / "r", None)}
    reward_run = next(s for name, s in steps.items() if name.startswith("grpo_branch_reward"))
    assert [p.name for p in reward_run.configs] == [
        "grpo_branch_reward.yaml",
        "grpo_branch.yaml",
        "_grpo_base.yaml",
    ]
    assert "_grpo_base.yaml" in [p.name for p in steps["analysis"].configs]


def load_config_keys(path: Path) -> list[str]:
    """The top-level keys a YAML file itself writes (not its base's)."""
    import yaml

    return list(yaml.safe_load(path.read_text()))


def test_config_files_follow_the_base_chain_and_stop_at_a_loop(tmp_path):
    from sage_unsloth.config.args import config_files

    (tmp_path / "a.yaml").write_text("base: b.yaml\nx: 1\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\ny: 2\n")
    (tmp_path / "c.yaml").write_text("base: sub/d.yaml\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.yaml").write_text("z: 3\n")
    assert [p.name for p in config_files(tmp_path / "a.yaml")] == ["a.yaml", "b.yaml"]
    assert [p.as_posix().split("/")[-2:] for p in config_files(tmp_path / "c.yaml")][-1] == ["sub", "d.yaml"]
