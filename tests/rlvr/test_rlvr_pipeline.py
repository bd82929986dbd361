"""Stage 2 end to end on the tiny model (CPU): every variant trains, the anchor is the one asked for,
log_history.jsonl holds the sage/* metrics and feeds the report, resume continues step count and optimizer
state, bad configs fail in one line before a model loads, and the manifest is complete and secret-free
(checked on every variant)."""

import json
import os
from pathlib import Path

import pytest
import torch
from rlvr_scenario import LORA_TARGETS, REPO, rlvr_argv
from safetensors.torch import load_file

PAPER_CONFIGS = REPO / "configs" / "rlvr" / "qwen2.5-math-7b"
VARIANTS = [
    "grpo",
    "grpo_nokl",
    "grpo_fkl",
    "grpo_random",
    "grpo_token",
    "grpo_branch",
    "grpo_branch_reward",
    "bnpo",
    "bnpo_branch",
    "dapo",
    "dapo_branch",
    "dapo_full",
    "dapo_full_branch",
]
SECRET = "hf_SECRETSECRETSECRET1234"
pytestmark = pytest.mark.usefixtures("varied_reward")  # conftest: a reward that differs between completions


_argv = rlvr_argv


def _run(*argv):
    from sage_unsloth.rlvr.run import parse_args, run

    return run(*parse_args(list(argv)))


def test_output_dir_is_honoured_and_stage_3_reads_it(sft_dir, dapo_sample, tmp_path):
    """--output_dir is where stage 2 writes (as in stage 1; it used to be ignored for the layout folder), and a
    --resume finds its checkpoints there; stage 3 resolves the folder as the run's output."""
    from sage_unsloth.eval.sampling import resolve_checkpoint

    out, root = tmp_path / "my_run", tmp_path / "root"
    argv = rlvr_argv("grpo", sft_dir, root, dapo_sample, "--output_dir", str(out), "--max_steps", "1")
    built = _run(*argv, "--save_steps", "1")
    assert (
        built.plan.output_dir == out and (out / "manifest.json").is_file() and (out / "checkpoint-1").is_dir()
    )
    assert not root.exists()  # nothing in the layout folder
    (
        out / "manifest.json"
    ).unlink()  # as a run killed in its final save (a finished run has nothing to resume)
    resumed = _run(*argv, "--save_steps", "1", "--resume")  # every step done: only the final outputs again
    assert resumed.plan.resume_from == str(out / "checkpoint-1") and resumed.trainer.state.global_step == 1
    checkpoint = resolve_checkpoint(str(out))
    assert (checkpoint.run, checkpoint.adapter_dir) == ("grpo", str(out))


def _adapter(folder):
    return load_file(str(Path(folder) / "adapter_model.safetensors"))


# ----------------------------------------------------------------------------------------------- variants
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_trains_two_steps_and_moves_its_lora(
    variant, sft_dir, tmp_path, dapo_sample, monkeypatch
):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    built = _run(
        *_argv(variant, sft_dir, tmp_path, dapo_sample, "--save_strategy", "no", "--hub_token", SECRET)
    )
    out = tmp_path / "model" / variant  # tiny model folder is named "model"
    assert built.plan.output_dir == out and built.trainer.state.global_step == 2

    before, after = _adapter(sft_dir), _adapter(out)
    assert before.keys() == after.keys() and len(before) == 2 * 2 * len(LORA_TARGETS)
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(moved) == len(before), f"unchanged LoRA tensors: {sorted(set(before) - set(moved))[:3]}"
    assert not (out / "ref").exists()  # only the policy adapter is saved

    # The paper config of the same name describes the same method (tiny differs only in sizes/stack).
    from sage_unsloth.rlvr.run import parse_args

    paper, _, _, _ = parse_args([str(PAPER_CONFIGS / f"{variant}.yaml"), "--bf16", "false"])
    tiny = built.trainer.args
    for field in (
        "loss_type",
        "beta",
        "guide",  # each plug-in node resolved: every argument, the defaults filled
        "kl_term",
        "advantage_estimator",
        "policy_term",
        "epsilon",
        "epsilon_high",
        "temperature",
        "min_p",
        "use_bias_correction_kl",
        "sage_kl_placement",
        "dapo_normalizer",
        "dynamic_sampling",
        "mask_truncated_completions",
    ):
        assert getattr(paper, field) == getattr(tiny, field), field

    # SFT anchor: a frozen copy of the SFT adapter is the reference while beta > 0; none is needed at beta 0.
    model = built.model
    if tiny.beta > 0:
        refs = {n: p for n, p in model.named_parameters() if ".ref." in n}
        assert refs and not any(p.requires_grad for p in refs.values())
        for name, param in refs.items():
            key = name.replace(".ref.", ".")
            assert torch.equal(param.detach(), before[key]), name
    else:
        assert "ref" not in model.peft_config

    # Manifest: complete, and no secret from the environment or the arguments in it.
    text = (out / "manifest.json").read_text()
    assert SECRET not in text
    manifest = json.loads(text)
    assert manifest["stage"] == "rlvr" and manifest["anchor"] == "sft" and manifest["variant"] == variant
    assert manifest["sft_dir"] == str(sft_dir) and manifest["seed"] == 3407
    assert manifest["base_model"] == built.plan.base_model and manifest["global_step"] == 2
    assert manifest["versions"]["trl"] and manifest["versions"]["torch"] and "git_commit" in manifest
    assert manifest["lora"]["r"] == 8
    assert (
        manifest["config"]["training"]["guide"] == tiny.guide
        and tiny.guide["name"] == tiny.method_plan.guide.name
    )
    assert manifest["config"]["stage"]["sft_dir"] == str(sft_dir)


@pytest.mark.slow
def test_script_fails_in_one_line_on_a_missing_stage1_folder(tmp_path, dapo_sample):
    """scripts/02_rlvr.sh -> python -m sage_unsloth.rlvr -> main(): exit code 2 and a one-line error."""
    import sys

    from subprocess_run import run

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = [str(REPO / "scripts" / "02_rlvr.sh"), *_argv("grpo", tmp_path / "nope", tmp_path, dapo_sample)]
    result = run(["bash", *script], cwd=REPO, env=env, timeout=300)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: sft_dir={tmp_path / 'nope'} does not exist")
    )


def test_paper_configs_pin_the_official_recipe():
    from sage_unsloth.rlvr.run import parse_args

    for variant in VARIANTS:
        args, stage, _, _ = parse_args([str(PAPER_CONFIGS / f"{variant}.yaml"), "--bf16", "false"])
        assert (
            args.learning_rate,
            args.lr_scheduler_type,
            args.num_generations,
            args.generation_batch_size,
            args.per_device_train_batch_size,
            args.max_steps,
            args.save_steps,
            args.seed,
        ) == (5e-6, "constant", 8, 16, 8, 1000, 100, 3407), variant
        assert (args.temperature, args.min_p, args.epsilon, args.guide["q_min"], args.guide["q_max"]) == (
            1.0,
            0.01,
            0.2,
            0.6,
            1.4,
        )
        assert stage.max_prompt_length + args.max_completion_length <= 4096  # Qwen2.5-Math's context
        assert args.generation_kwargs["stop"] == ["</SOLUTION>"] and stage.variant == variant
        assert args.use_vllm and args.vllm_mode == "colocate" and stage.anchor == "sft"
        expected_beta = 0.0 if variant in ("grpo_nokl", "bnpo", "dapo", "dapo_full") else 0.05
        assert args.beta == expected_beta, variant
        # the official code's dapo: epsilon_high = epsilon; the DAPO paper's: clip-higher 0.28; None: symmetric
        dapo_paper = variant.startswith("dapo_full")
        assert args.epsilon_high == (0.28 if dapo_paper else 0.2 if variant.startswith("dapo") else None), (
            variant
        )
        assert (args.dynamic_sampling, args.dapo_normalizer) == (
            dapo_paper,
            "window" if dapo_paper else "generation",
        )
        assert args.sage_kl_placement == ("reward" if variant.endswith("_reward") else "loss"), variant
        # the paper's TRL 0.23 importance-sampling correction under vLLM
        assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_max) == (
            "token_truncate",
            2.0,
        )


# ----------------------------------------------------------------------------------------------- anchor
def _completion_logps(model, batch):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("anchor", ["sft", "base"])
def test_reference_logps_are_the_chosen_anchor(anchor, sft_dir, tiny_model_dir, tmp_path, dapo_sample):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from sage_unsloth.rlvr.run import build_stage, parse_args

    built = build_stage(
        *parse_args(
            _argv("grpo", sft_dir, tmp_path, dapo_sample, "--anchor", anchor, "--save_strategy", "no")
        )
    )
    trainer, batches = built.trainer, []
    generate = trainer._generate_and_score_completions

    def spy(*args, **kwargs):
        batch = generate(*args, **kwargs)
        batches.append({k: v.detach().clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        return batch

    trainer._generate_and_score_completions = spy
    trainer.train()
    batch = batches[-1]  # scored after one optimizer step: the policy has left the SFT model

    def fresh(with_sft):  # PeftModel.from_pretrained injects into its base: one model object each
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        return (PeftModel.from_pretrained(model, str(sft_dir)) if with_sft else model).eval()

    expected = _completion_logps(fresh(anchor == "sft"), batch)
    other = _completion_logps(fresh(anchor != "sft"), batch)
    mask = batch["completion_mask"].bool()
    ref = batch["ref_per_token_logps"]
    assert torch.allclose(ref[mask], expected[mask], atol=1e-5)
    assert (other[mask] - expected[mask]).abs().max() > 1e-3  # SFT and base really differ here
    built.model.eval()
    policy = _completion_logps(built.model, batch)
    assert (policy[mask] - expected[mask]).abs().max() > 1e-5  # and the policy has moved away


def test_ref_adapter_is_hidden_from_a_vllm_lora_sync(sft_dir, tiny_model_dir):
    """Unsloth's vLLM sync builds its LoRA from every lora_A/B tensor of model.state_dict()."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from sage_unsloth.rlvr.run import apply_anchor, hide_adapter_from_vllm_sync

    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(sft_dir), is_trainable=True
    )
    apply_anchor(model, "sft", beta=0.05)  # no trainer made it here (as under Unsloth's patched trainer)
    seen = []
    model.load_lora = lambda *a, **k: seen.append(sorted(k for k in model.state_dict() if ".lora_" in k))
    hide_adapter_from_vllm_sync(model)
    model.load_lora("name", load_tensors=True)
    assert seen[0] and not any(".ref." in k for k in seen[0])
    assert any(".ref." in k for k in model.state_dict())  # restored afterwards
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".default." in n for n in trainable)
    sft = _adapter(sft_dir)
    refs = {n.replace(".ref.", "."): p for n, p in model.named_parameters() if ".ref." in n}
    assert refs.keys() == sft.keys() and all(torch.equal(p.detach(), sft[k]) for k, p in refs.items())


# ----------------------------------------------------------------------------------------------- training log
def test_log_history_holds_sage_metrics_and_feeds_the_report(sft_dir, tmp_path, dapo_sample):
    """The run streams its log to <output>/log_history.jsonl, names it in its manifest, and the report, led
    there by an eval manifest's checkpoint, plots and tabulates it."""
    import shutil

    from PIL import Image

    from sage_unsloth.report.stage import ReportArguments, build_report
    from sage_unsloth.runtime.manifest import write_manifest
    from sage_unsloth.runtime.training_log import read_log_history

    built = _run(
        *_argv(
            "grpo_branch", sft_dir, tmp_path / "out", dapo_sample, "--save_strategy", "no", "--max_steps", "2"
        )
    )
    out = built.plan.output_dir
    assert json.loads((out / "manifest.json").read_text())["log_history"] == "log_history.jsonl"
    lines = read_log_history(out)
    assert lines == json.loads(json.dumps(built.trainer.state.log_history))  # every entry, once, in order
    steps = [line for line in lines if "reward" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for key in ("sage/q_mean", "sage/q_min", "sage/q_max", "sage/frac_boosted", "kl", "entropy", "reward"):
        assert all(key in line for line in steps), (key, sorted(steps[0]))
    q_min, q_mean, q_max = (steps[0][f"sage/{k}"] for k in ("q_min", "q_mean", "q_max"))
    assert 1.0 <= q_min <= q_max <= 1.4 + 1e-6  # branch guide: q in [1, q_max]
    assert q_min - 1e-5 <= q_mean <= q_max + 1e-5

    results = tmp_path / "results"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "report" / "results" / "tiny", results / "tiny")
    write_manifest(results / "tiny" / "grpo_branch", stage="eval", config={"n": 4}, checkpoint=str(out))
    report = build_report(
        ReportArguments(
            results=str(results),
            resamples=100,
            plot_width=500,
            plot_height=400,
            completions=str(tmp_path / "none" / "*.gz"),
        ),
        console=False,
    )
    table = report.training.set_index(["run", "metric"])
    for key in ("reward", "kl", "sage/q_mean", "sage/frac_boosted"):
        assert table.loc[("model/grpo_branch", key), ["first", "last"]].tolist() == [
            steps[0][key],
            steps[1][key],
        ]
    assert table.loc[("model/grpo_branch", "reward"), "points"] == 2
    row = next(line for line in report.markdown.splitlines() if line.startswith("| model/grpo_branch | 2 |"))
    assert f"{steps[0]['reward']:.3f} → {steps[1]['reward']:.3f}" in row
    assert "![training curves](report/training_curves.png)" in report.markdown
    rows_of_panels = -(-report.training["metric"].nunique() // 2)  # one panel per metric, two per row
    assert rows_of_panels >= 4  # reward, reward_std, kl, entropy, 4+ sage/* keys, completion length
    with Image.open(results / "report" / "training_curves.png") as png:
        assert png.size == (500, 220 * rows_of_panels)  # taller than asked: each row of panels stays readable
    assert (results / "report" / "training.csv").read_text().startswith("run,metric,points,first_step")


# ----------------------------------------------------------------------------------------------- resume
def test_resume_continues_step_count_and_optimizer_state(sft_dir, tmp_path, dapo_sample):
    argv = _argv("grpo", sft_dir, tmp_path, dapo_sample, "--save_steps", "2")
    first = _run(*argv, "--max_steps", "2")
    out = first.plan.output_dir
    saved = torch.load(out / "checkpoint-2" / "optimizer.pt", weights_only=False)
    assert {s["step"].item() for s in saved["state"].values()} == {2.0}

    from sage_unsloth.rlvr.run import build_stage, parse_args

    with pytest.raises(FileExistsError, match="--resume"):
        build_stage(*parse_args(argv + ["--max_steps", "4"]))
    built = build_stage(*parse_args(argv + ["--max_steps", "4", "--resume"]))
    trainer, restored = built.trainer, {}
    load = trainer._load_optimizer_and_scheduler

    def spy(checkpoint):
        load(checkpoint)
        restored.update({i: s["exp_avg"].clone() for i, s in enumerate(trainer.optimizer.state.values())})

    trainer._load_optimizer_and_scheduler = spy
    built.train_and_save()
    assert trainer.state.global_step == 4
    assert [e["step"] for e in trainer.state.log_history if "loss" in e] == [1, 2, 3, 4]
    assert len(restored) == len(saved["state"]) > 0
    for i, state in saved["state"].items():
        assert torch.equal(restored[i], state["exp_avg"]) and state["exp_avg"].abs().sum() > 0
    sft = _adapter(sft_dir)  # the anchor is still the SFT adapter, not the checkpoint's policy
    refs = {n.replace(".ref.", "."): p for n, p in built.model.named_parameters() if ".ref." in n}
    assert refs.keys() == sft.keys() and all(torch.equal(p.detach(), sft[k]) for k, p in refs.items())
    resumed = torch.load(out / "checkpoint-4" / "optimizer.pt", weights_only=False)
    assert {s["step"].item() for s in resumed["state"].values()} == {4.0}  # 2 restored + 2 new, not fresh
    assert json.loads((out / "manifest.json").read_text())["resumed_from"] == "checkpoint-2"


# ----------------------------------------------------------------------------------------------- bad configs
BAD = {
    "guide_without_kl": (["--guide", "branch", "--beta", "0"], "beta > 0"),
    "q_bounds": (["--guide", '{"name": "branch", "q_min": 1.3, "q_max": 1.1}'], "q_min=1.3 > q_max=1.1"),
    "unknown_guide": (["--guide", "entropy"], "guide='entropy'"),
    "retired_key": (["--sage_tau", "0.5"], "sage_tau is retired: it is the argument tau of the guide node"),
    "unknown_loss": (["--loss_type", "ppo"], "loss_type"),
    "unknown_anchor": (["--anchor", "init"], "anchor"),
    "missing_stage1": (["--sft_dir", "/nonexistent/sft"], "sft_dir"),
    "completion_beyond_context": (["--max_completion_length", "5000"], "context"),
    "prompt_plus_completion_beyond_context": (["--max_prompt_length", "4090"], "context"),
    "resume_without_checkpoint": (["--resume"], "--resume"),
    "vllm_on_cpu": (["--use_vllm", "true"], "GPU"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_fails_in_one_line_before_any_model_loads(
    case, sft_dir, tmp_path, dapo_sample, monkeypatch, capsys
):
    from sage_unsloth.model import loading as models
    from sage_unsloth.rlvr.run import main

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was validated")

    monkeypatch.setattr(models, "load_for_training", no_loading)
    overrides, needle = BAD[case]
    assert main(_argv("grpo", sft_dir, tmp_path, dapo_sample, *overrides)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and needle in err, err


def test_stage1_folder_without_manifest_is_refused(tmp_path, dapo_sample, capsys):
    from sage_unsloth.rlvr.run import main

    (tmp_path / "sft").mkdir()
    assert main(_argv("grpo", tmp_path / "sft", tmp_path, dapo_sample)) == 2
    assert "manifest.json not found" in capsys.readouterr().err


def test_bad_dataset_is_a_one_line_error_before_the_model_loads(
    sft_dir, tmp_path, dapo_sample, monkeypatch, capsys
):
    from sage_unsloth.model import loading as models
    from sage_unsloth.rlvr.run import main

    monkeypatch.setattr(models, "load_for_training", lambda *a, **k: pytest.fail("model loaded"))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "What is 1+1?", "label": "2"}) + "\n")
    argv = _argv("grpo", sft_dir, tmp_path, dapo_sample)
    argv[argv.index("--dataset_path") + 1] = str(rows)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # datasets' progress bars come before it
    assert err == (
        f"error: dataset_path={rows} line 1 has no gold answer (one of solution, answer, or "
        "'reward_model.ground_truth'): fix or remove that line"
    )


def test_the_cli_plans_the_run_once(sft_dir, tmp_path, dapo_sample, monkeypatch, capsys):
    """main() checks the inputs (plan_run) before the heavy imports and hands that plan to build_stage."""
    from sage_unsloth.model import loading as models
    from sage_unsloth.rlvr import run

    calls = []
    real_plan = run.plan_run
    monkeypatch.setattr(run, "plan_run", lambda *a, **k: calls.append(1) or real_plan(*a, **k))
    monkeypatch.setattr(
        models, "load_for_training", lambda *a, **k: (_ for _ in ()).throw(ValueError("stop here"))
    )
    assert run.main(_argv("grpo", sft_dir, tmp_path, dapo_sample)) == 2
    assert "stop here" in capsys.readouterr().err and calls == [1]
