"""The multi-GPU configs: the accelerate files load with accelerate's own reader, and each vllm_mode=server
RLVR config trains the same method as its single-GPU sibling (only the stack and the per-device batch
differ). The processes themselves are tested in tests/rlvr/test_rlvr_multiprocess.py."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ACCELERATE = REPO / "configs" / "accelerate"
PAPER = REPO / "configs" / "rlvr" / "qwen2.5-math-7b"
STACK_FIELDS = {
    "backend",
    "vllm_mode",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout",
    "vllm_gpu_memory_utilization",
    "per_device_train_batch_size",
    "output_dir",
    "run_name",
    "logging_dir",
    "steps_per_generation",
}  # derived at parse time with 1 process (checked below for 4)


def test_accelerate_configs_load_with_accelerate():
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import DistributedType

    ddp = ClusterConfig.from_yaml_file(str(ACCELERATE / "ddp.yaml"))
    assert ddp.distributed_type == DistributedType.MULTI_GPU and ddp.mixed_precision == "no"
    zero2 = ClusterConfig.from_yaml_file(str(ACCELERATE / "deepspeed_zero2.yaml"))
    assert zero2.distributed_type == DistributedType.DEEPSPEED and zero2.deepspeed_config["zero_stage"] == 2
    assert zero2.mixed_precision == "bf16"
    # left to transformers, which fills "auto" from the RLVR config
    assert not {"gradient_accumulation_steps", "gradient_clipping"} & set(zero2.deepspeed_config)


@pytest.mark.parametrize("method", ["grpo", "grpo_branch"])
def test_server_config_trains_the_method_of_its_single_gpu_sibling(method):
    from sage_unsloth.rlvr.run import parse_args

    server, server_stage, _, _ = parse_args([str(PAPER / f"{method}_server.yaml"), "--bf16", "false"])
    single, single_stage, _, _ = parse_args([str(PAPER / f"{method}.yaml"), "--bf16", "false"])
    assert (server.backend, server.use_vllm, server.vllm_mode) == ("trl", True, "server")
    differing = {k for k, v in server.to_dict().items() if single.to_dict().get(k) != v}
    assert differing <= STACK_FIELDS, differing - STACK_FIELDS
    assert server_stage.variant == f"{method}_server" and server_stage.sft_dir == single_stage.sft_dir
    # 2 per device x 4 processes = the paper's 8 completions per optimizer step, 16 per generation
    assert server.per_device_train_batch_size * 4 == single.per_device_train_batch_size == 8
    assert server.generation_batch_size == single.generation_batch_size == 16
    assert (
        server.generation_batch_size // (server.per_device_train_batch_size * 4)
        == single.steps_per_generation
    )
    header = (PAPER / f"{method}_server.yaml").read_text().split("\n# ---")[0]
    assert "trl vllm-serve --model Qwen/Qwen2.5-Math-7B" in header and "configs/accelerate/ddp.yaml" in header


def test_unsloth_with_a_vllm_server_is_refused_before_loading(sft_dir, tmp_path, dapo_sample, capsys):
    from rlvr_scenario import rlvr_argv

    from sage_unsloth.rlvr.run import main

    argv = rlvr_argv(
        "grpo",
        sft_dir,
        tmp_path,
        dapo_sample,
        "--backend",
        "unsloth",
        "--use_vllm",
        "true",
        "--vllm_mode",
        "server",
        "--unsloth_without_gpu",  # past the no-GPU refusal, which comes first on this CPU machine
        "true",
    )
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: vllm_mode=server needs backend=trl") and "\n" not in err
