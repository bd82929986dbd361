"""Stage 1 SFT on the tiny model, CPU only: data rules, template + loss mask, training, outputs, errors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from subprocess_run import run, run_python

from sage_unsloth.data.prompts import CHAT_TEMPLATE, SYSTEM_PROMPT
from sage_unsloth.sft.data import (
    is_numeric_answer,
    load_raw_dataset,
    math500_as_sft_rows,
    prepare_sft_data,
    render_messages,
    strip_think_tags,
    write_jsonl,
)
from sage_unsloth.sft.run import parse_args, run_sft, sft_trainer_class

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = REPO / "configs" / "sft" / "tiny-cpu.yaml"


def short_numeric_rows(benchmark_dir: Path, n: int) -> list[dict]:
    """MATH-500 rows in SFT shape with numeric answers and short solutions (the tiny tokenizer is verbose)."""
    rows = math500_as_sft_rows(
        benchmark_dir / "math500.jsonl", limit=n, numeric_only=True, max_solution_chars=250
    )
    assert len(rows) == n
    return rows


def sft_argv(model_dir, data_path, out_dir, *extra) -> list[str]:
    return [
        str(TINY_CONFIG),
        "--model_name_or_path",
        str(model_dir),
        "--dataset_path",
        str(data_path),
        "--output_dir",
        str(out_dir),
        "--disable_tqdm",
        "true",
        *map(str, extra),
    ]


def build_sft_output(
    tmp_path: Path, tiny_model_dir: Path, benchmark_dir: Path, *extra, n_rows: int = 4
) -> Path:
    """A finished stage-1 output folder on the tiny model in a few seconds (for stage-2 integration tests)."""
    data = write_jsonl(short_numeric_rows(benchmark_dir, n_rows), tmp_path / "sft_rows.jsonl")
    sft_args, model_args = parse_args(sft_argv(tiny_model_dir, data, tmp_path / "sft", *extra))
    return run_sft(sft_args, model_args)


# --- data rules --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, numeric",
    [
        ("42", True),
        (" -3 ", True),
        ("+7", True),
        ("0.5", True),
        (".5", True),
        ("7.", True),
        ("1e-3", True),
        (12, True),
        (27.0, True),
        ("1/2", False),
        ("\\frac{1}{2}", False),
        ("1,000", False),
        ("3\\sqrt{2}", False),
        ("x=2", False),
        ("", False),
        ("inf", False),
        ("nan", False),
        (float("nan"), False),
        (True, False),
        (None, False),
        ("5 cm", False),
        ("--3", False),
    ],
)
def test_numeric_answer_rule(value, numeric):
    assert is_numeric_answer(value) is numeric


def test_think_tags_are_stripped_and_inner_text_kept():
    assert strip_think_tags("<think>\nLet x = 2.</think>\nSo 4.") == "Let x = 2.\nSo 4."
    assert strip_think_tags("no tags ") == "no tags"
    assert render_messages(" P ", strip_think_tags("<think>a</think>"), 3) == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "P"},
        {"role": "assistant", "content": "<start_working_out>a<end_working_out><SOLUTION>3</SOLUTION>"},
    ]


def test_prepare_counts_drop_reasons_and_fingerprint(tiny_model_dir, benchmark_dir, tmp_path):
    from trl import ModelConfig

    from sage_unsloth.model.loading import load_tokenizer

    rows = math500_as_sft_rows(benchmark_dir / "math500.jsonl", limit=30)
    rows[1]["problem"] = "  "
    think = next(
        i
        for i, r in enumerate(rows)
        if i > 1 and is_numeric_answer(r["expected_answer"]) and len(r["generated_solution"]) < 400
    )
    rows[think]["generated_solution"] = "<think>" + rows[think]["generated_solution"] + "</think>"
    raw = load_raw_dataset(
        dataset_name=None, dataset_split="cot", dataset_path=str(write_jsonl(rows, tmp_path / "rows.jsonl"))
    )
    tok = load_tokenizer(ModelConfig(model_name_or_path=str(tiny_model_dir)))
    data = prepare_sft_data(raw, tok, max_seq_length=1024, source="math500")
    non_numeric = sum(not is_numeric_answer(r["expected_answer"]) for i, r in enumerate(rows) if i != 1)
    assert data.rows_in == 30
    assert data.rows_dropped["empty_text"] == 1
    assert data.rows_dropped["non_numeric_answer"] == non_numeric > 0
    assert data.rows_dropped["too_long"] > 0
    assert data.rows_kept + sum(data.rows_dropped.values()) == 30
    assert any(conv[1]["content"] == rows[think]["problem"].strip() for conv in data.dataset["messages"])
    for conv in data.dataset["messages"]:
        assert [m["role"] for m in conv] == ["system", "user", "assistant"]
        assert "<think>" not in conv[2]["content"]
        assert len(tok.apply_chat_template(conv)) <= 512
    again = prepare_sft_data(raw, tok, max_seq_length=1024, source="math500")
    fewer = prepare_sft_data(raw.select(range(29)), tok, max_seq_length=1024, source="math500")
    assert again.fingerprint == data.fingerprint
    assert len({data.fingerprint, fewer.fingerprint}) == 2 or fewer.rows_kept == data.rows_kept


# --- template and loss mask ---------------------------------------------------------------------------------


def test_template_renders_exact_string_and_masks_non_assistant_tokens(tiny_model_dir):
    import datasets
    from trl import ModelConfig

    from sage_unsloth.model.loading import load_for_training
    from sage_unsloth.sft.config import SageSFTConfig

    model, tok = load_for_training(
        ModelConfig(model_name_or_path=str(tiny_model_dir), lora_r=8, lora_alpha=16),
        backend="trl",
        max_seq_length=256,
        seed=0,
    )
    convs = [render_messages("What is 1+1?", "1+1=2", "2"), render_messages("Add 10 and 5.", "10+5", 15)]
    assert tok.apply_chat_template(convs[0], tokenize=False) == (
        SYSTEM_PROMPT + "\n\nWhat is 1+1?\n\n<start_working_out>1+1=2<end_working_out><SOLUTION>2</SOLUTION>"
        "<|endoftext|>"
    )
    assert tok.apply_chat_template(convs[0][:2], tokenize=False, add_generation_prompt=True) == (
        SYSTEM_PROMPT + "\n\nWhat is 1+1?\n\n<start_working_out>"
    )

    args = SageSFTConfig(output_dir="unused", backend="trl", max_seq_length=256, report_to="none")
    trainer = sft_trainer_class()(
        model=model,
        args=args,
        processing_class=tok,
        train_dataset=datasets.Dataset.from_dict({"messages": convs}),
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    expected = [
        "1+1=2<end_working_out><SOLUTION>2</SOLUTION><|endoftext|>",
        "10+5<end_working_out><SOLUTION>15</SOLUTION><|endoftext|>",
    ]
    for ids, labels, mask, want in zip(
        batch["input_ids"], batch["labels"], batch["attention_mask"], expected
    ):
        trained = labels != -100
        assert tok.decode(ids[trained]) == want
        # The trained tokens are one contiguous span at the end of the real tokens; system, problem, the
        # prompt's <start_working_out> and padding all carry -100.
        positions = trained.nonzero().flatten()
        assert positions.tolist() == list(range(positions[0], positions[0] + len(positions)))
        assert positions[-1] == mask.nonzero().max()
        assert tok.decode(ids[: positions[0]]).endswith("What is 1+1?\n\n<start_working_out>") or tok.decode(
            ids[: positions[0]]
        ).endswith("Add 10 and 5.\n\n<start_working_out>")
        assert (labels[trained] == ids[trained]).all()

    # Contact point (trl 1.15, no Triton on CPU): the loss is the mean next-token NLL over the labelled tokens.
    model.train()
    loss = trainer.compute_loss(model, dict(batch))
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    manual = torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100
    )
    torch.testing.assert_close(loss, manual, rtol=1e-4, atol=1e-5)


# --- training, outputs, reload ------------------------------------------------------------------------------


def test_sft_trains_loss_falls_adapter_reloads_and_generates(tmp_path, tiny_model_dir, benchmark_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build_sft_output(
        tmp_path,
        tiny_model_dir,
        benchmark_dir,
        "--max_steps",
        16,
        "--learning_rate",
        "8e-3",
        "--max_seq_length",
        1024,
        "--save_merged",
        "true",
        "--hub_token",
        "hf_NOT_A_REAL_SECRET",
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "sft" and manifest["adapter"] is True and manifest["backend"] == "trl"
    assert manifest["base_model"] == str(tiny_model_dir)
    assert manifest["train"]["global_step"] == 16
    first, last = manifest["train"]["first_loss"], manifest["train"]["last_loss"]
    print("loss", first, "->", last)
    assert last < first - 0.5, (first, last)
    data = manifest["data"]
    assert data["rows_in"] == 4 and data["rows_kept"] + sum(data["rows_dropped"].values()) == 4
    assert data["rows_kept"] >= 3 and len(data["fingerprint"]) == 64
    assert manifest["config"]["sft"]["learning_rate"] == 8e-3 and manifest["config"]["model"]["lora_r"] == 8
    assert "hf_NOT_A_REAL_SECRET" not in (out / "manifest.json").read_text()

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == CHAT_TEMPLATE
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, out).eval()
    trained_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert len(trained_b) == 2 * 7 and all(p.abs().sum() > 0 for p in trained_b)  # B starts at zero
    prompt = tok.apply_chat_template(
        render_messages("What is 2+2?", "x", "4")[:2],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        gen = model.generate(**prompt, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
        merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
        torch.testing.assert_close(merged(**prompt).logits, model(**prompt).logits, rtol=1e-4, atol=1e-4)
    assert gen.shape[1] > prompt["input_ids"].shape[1]


def test_finished_output_is_kept_and_interrupted_run_resumes(tmp_path, tiny_model_dir, benchmark_dir):
    extra = ("--max_steps", 2, "--save_strategy", "steps", "--save_steps", 1)
    out = build_sft_output(tmp_path, tiny_model_dir, benchmark_dir, *extra, n_rows=2)
    with pytest.raises(FileExistsError, match="already holds a finished SFT run"):
        build_sft_output(tmp_path, tiny_model_dir, benchmark_dir, *extra, n_rows=2)
    (out / "manifest.json").unlink()  # as if the run died before finishing
    with pytest.raises(FileExistsError, match="--resume true"):
        build_sft_output(tmp_path, tiny_model_dir, benchmark_dir, *extra, n_rows=2)
    build_sft_output(tmp_path, tiny_model_dir, benchmark_dir, "--max_steps", 3, "--resume", "true", n_rows=2)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed_from"] == "checkpoint-2" and manifest["train"]["global_step"] == 3


RESUME_RUN = (
    "--max_steps",
    3,
    "--save_strategy",
    "steps",
    "--save_steps",
    1,
)  # 4 rows, batch 2: 2 steps an epoch


@pytest.fixture(scope="module")
def uninterrupted_sft(tmp_path_factory, tiny_model_dir, benchmark_dir) -> Path:
    return build_sft_output(
        tmp_path_factory.mktemp("uninterrupted"), tiny_model_dir, benchmark_dir, *RESUME_RUN
    )


@pytest.mark.parametrize("killed_after", [1, 3], ids=["mid-run", "after-the-last-checkpoint"])
def test_resume_stops_at_max_steps_and_equals_the_uninterrupted_run(
    killed_after, uninterrupted_sft, tmp_path, tiny_model_dir
):
    """A run killed after checkpoint-N (nothing else of it is written before the final save) resumes to the
    uninterrupted run's adapter bit for bit; from checkpoint-3 = max_steps it trains nothing more (transformers
    resumed it, in the middle of epoch 2, into a step 4 and a checkpoint-4)."""
    from safetensors.torch import load_file

    killed = tmp_path / "sft"
    for n in range(1, killed_after + 1):
        shutil.copytree(uninterrupted_sft / f"checkpoint-{n}", killed / f"checkpoint-{n}")
    data = uninterrupted_sft.parent / "sft_rows.jsonl"
    run_sft(*parse_args(sft_argv(tiny_model_dir, data, killed, *RESUME_RUN, "--resume", "true")))
    manifest = json.loads((killed / "manifest.json").read_text())
    assert manifest["resumed_from"] == f"checkpoint-{killed_after}" and manifest["train"]["global_step"] == 3
    assert sorted(p.name for p in killed.glob("checkpoint-*")) == [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
    ]
    expected = load_file(uninterrupted_sft / "adapter_model.safetensors")
    resumed = load_file(killed / "adapter_model.safetensors")
    assert expected.keys() == resumed.keys() and all(torch.equal(expected[k], resumed[k]) for k in expected)


# --- errors before any model loads --------------------------------------------------------------------------


def test_missing_fields_give_one_clear_error(tmp_path, tiny_model_dir):
    data = write_jsonl([{"problem": "1+1?", "solution": "2", "answer": "2"}], tmp_path / "bad.jsonl")
    sft_args, model_args = parse_args(sft_argv(tiny_model_dir, data, tmp_path / "out"))
    with pytest.raises(
        ValueError, match=r"dataset_path=\S*bad\.jsonl line 1 has no 'generated_solution', 'expected_answer'"
    ):
        run_sft(sft_args, model_args)
    assert not (tmp_path / "out").exists()


def test_script_reports_input_errors_in_one_line_before_loading(tmp_path, tiny_model_dir):
    data = write_jsonl([{"problem": "1+1?", "answer": "2"}], tmp_path / "bad.jsonl")
    proc = run(
        [str(REPO / "scripts/01_sft.sh"), *sft_argv(tiny_model_dir, data, tmp_path / "out")],
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        (
            f"error: dataset_path={data} line 1 has no 'generated_solution', 'expected_answer' "
            "(SFT rows need problem, generated_solution, expected_answer): fix or remove that line"
        )
    ]
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_ctrl_c_ends_in_one_line_that_says_how_to_resume(
    tmp_path, tiny_model_dir, benchmark_dir, monkeypatch, capsys
):
    from sage_unsloth.sft import run as sft_run

    data = write_jsonl(short_numeric_rows(benchmark_dir, 2), tmp_path / "rows.jsonl")
    out = tmp_path / "out"
    argv = sft_argv(tiny_model_dir, data, out)

    def interrupted(sft_args, model_args, plan):  # Ctrl-C while training, after checkpoint-2 was written
        (out / "checkpoint-2").mkdir(parents=True)
        (out / "checkpoint-2" / "trainer_state.json").write_text("{}")
        raise KeyboardInterrupt

    # what counts as a complete checkpoint is tests/kit/test_checkpoints.py's subject; here checkpoint-2 is one
    from sage_unsloth.runtime import checkpoints

    monkeypatch.setattr(checkpoints, "last_complete_checkpoint", lambda folder: Path(folder) / "checkpoint-2")
    monkeypatch.setattr(sft_run, "run_sft", interrupted)
    assert sft_run.main(argv) == 130
    err = capsys.readouterr().err
    expected = (
        f"sage-unsloth sft: interrupted (Ctrl-C); {out / 'checkpoint-2'} is kept: continue with "
        f"sage-unsloth {' '.join(['sft', *argv, '--resume', 'true'])}"
    )
    assert err.strip().splitlines()[-1] == expected and "Traceback" not in err, err


def test_empty_after_filtering_gives_one_clear_error(tmp_path, tiny_model_dir):
    rows = [
        {"problem": "p", "generated_solution": "s", "expected_answer": "\\frac{1}{2}"},
        {"problem": "q", "generated_solution": "t", "expected_answer": "x+1"},
    ]
    data = write_jsonl(rows, tmp_path / "rows.jsonl")
    sft_args, model_args = parse_args(sft_argv(tiny_model_dir, data, tmp_path / "out"))
    with pytest.raises(
        ValueError, match=r"0 of 2 rows left after filtering \(empty_text=0, non_numeric_answer=2"
    ):
        run_sft(sft_args, model_args)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "override, error",
    [
        (["--backend", "jax"], "backend 'jax' is unknown: use one of unsloth, trl"),
        (["--dataset_path", "/nonexistent.jsonl"], "dataset_path /nonexistent.jsonl does not exist"),
        (["--max_length_fraction", "1.5"], r"max_length_fraction 1.5: must be in \(0, 1\]"),
        (["--model_name_or_path", ""], "model_name_or_path is not set"),
    ],
)
def test_config_errors_name_the_field(tmp_path, tiny_model_dir, override, error):
    data = write_jsonl(
        [{"problem": "p", "generated_solution": "s", "expected_answer": "1"}], tmp_path / "r.jsonl"
    )
    with pytest.raises(
        (ValueError, FileNotFoundError), match=error
    ):  # at parse time or when the run is planned
        sft_args, model_args = parse_args(sft_argv(tiny_model_dir, data, tmp_path / "out") + override)
        run_sft(sft_args, model_args)


def test_official_preset_pins_the_recipe_and_falls_back_on_cpu():
    sft_args, model_args = parse_args([str(REPO / "configs/sft/qwen2.5-math-7b.yaml")])
    assert (sft_args.num_train_epochs, sft_args.learning_rate, sft_args.per_device_train_batch_size) == (
        2,
        2e-4,
        1,
    )
    assert (sft_args.warmup_steps, sft_args.lr_scheduler_type.value, sft_args.weight_decay) == (
        5,
        "linear",
        0.01,
    )
    assert (model_args.lora_r, model_args.lora_alpha, model_args.lora_dropout) == (8, 16, 0.0)
    assert sorted(model_args.lora_target_modules) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    assert sft_args.assistant_only_loss and sft_args.max_length == sft_args.max_seq_length
    assert (sft_args.dataset_name, sft_args.dataset_split) == ("unsloth/OpenMathReasoning-mini", "cot")
    # adamw_8bit is the GPU choice; this machine has no GPU, so the config fell back.
    assert str(sft_args.optim.value if hasattr(sft_args.optim, "value") else sft_args.optim).startswith(
        "adamw_torch"
    )
    assert sft_args.resolve_output_dir(model_args) == Path("outputs/qwen2.5-math-7b/sft")
    assert sft_args.run_name == "qwen2.5-math-7b/sft"


# --- the Unsloth backend (own process: importing Unsloth patches TRL/transformers process-wide) -------------

UNSLOTH_SCRIPT = r"""
import json, sys, torch
from sage_unsloth.sft.run import main
out = sys.argv[1]
assert main(sys.argv[2:]) == 0
from trl import ModelConfig
from safetensors.torch import load_file
from sage_unsloth.model.loading import load_for_training
saved = load_file(out + "/adapter_model.safetensors")
margs = ModelConfig(model_name_or_path=json.load(open(out + "/manifest.json"))["base_model"], dtype="float32")
model, tok = load_for_training(margs, backend="unsloth", max_seq_length=512, seed=0, adapter_path=out)
params = dict(model.named_parameters())
trainable = [n for n, p in params.items() if p.requires_grad]
print(json.dumps({
    "b_nonzero": all(v.abs().sum() > 0 for k, v in saved.items() if "lora_B" in k),
    "n_lora": len(saved),
    "trainable_all_lora": bool(trainable) and all("lora_" in n for n in trainable),
    "reloaded_equal": all(torch.equal(params[k.replace(".weight", ".default.weight")], v) for k, v in saved.items()),
    "template": tok.chat_template == __import__("sage_unsloth.data.prompts").data.prompts.CHAT_TEMPLATE,
    "padding_side": tok.padding_side,
}))
"""


def test_unsloth_backend_trains_on_cpu_and_adapter_continues(tmp_path, tiny_model_dir, benchmark_dir):
    data = write_jsonl(short_numeric_rows(benchmark_dir, 2), tmp_path / "rows.jsonl")
    out = tmp_path / "sft_unsloth"
    argv = sft_argv(
        tiny_model_dir, data, out, "--backend", "unsloth", "--max_steps", 2, "--learning_rate", "5e-3"
    )
    argv += ["--unsloth_without_gpu", "true"]  # on purpose: this tests Unsloth's CPU fallback
    env = {**os.environ, "UNSLOTH_SKIP_TORCHVISION_CHECK": "1", "HF_HUB_OFFLINE": "1"}
    proc = run_python(["-c", UNSLOTH_SCRIPT, str(out), *argv], cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "b_nonzero": True,
        "n_lora": 2 * 2 * 7,
        "trainable_all_lora": True,
        "reloaded_equal": True,
        "template": True,
        "padding_side": "left",
    }
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "unsloth" and manifest["train"]["global_step"] == 2
    assert "Unsloth" in proc.stdout + proc.stderr  # the CPU fallback really ran


def test_a_relative_model_folder_is_recorded_absolute(tmp_path, tiny_model_dir, monkeypatch):
    """Stage 1 records the base model in its manifest and adapter config, which stages 2 and 3 read from any
    working directory: a local folder given relative to stage 1's must be stored as an absolute path."""
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")
    data = write_jsonl(
        [{"problem": "1+1?", "generated_solution": "2", "expected_answer": "2"}], tmp_path / "d.jsonl"
    )
    monkeypatch.chdir(tmp_path)
    sft_args, model_args = parse_args(sft_argv("models/tiny", data, tmp_path / "out"))
    sft_args.validate(model_args)
    assert model_args.model_name_or_path == str((tmp_path / "models" / "tiny").resolve())
