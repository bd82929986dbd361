"""A prompt longer than the model reads is one line before any generation, in ``sample`` and in stage 3
(sage_unsloth/eval/sampling.py, ``render_prompts``' limit): max_model_len - max_tokens tokens. Main 0298207 passed
a 10 MB prompt to the sampler, which ran out of memory minutes later, and stage 3 had no check either."""

import json

import pytest

from sage_unsloth import cli

REPO_CONFIG = "configs/eval/tiny-cpu.yaml"


@pytest.fixture
def no_sampler(monkeypatch):
    from sage_unsloth.eval import sampling

    def refuse(*args, **kwargs):
        raise AssertionError("a sampler was built: the model would load")

    monkeypatch.setattr(sampling, "make_sampler", refuse)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in "\n".join(err), err
    return lines[0]


@pytest.mark.parametrize("size", ["10 MB", "over by tokens"])
def test_sample_refuses_a_prompt_longer_than_the_model_reads(size, sft_dir, tmp_path, no_sampler, capsys):
    prompts = tmp_path / "p.jsonl"
    text = "x " * 5_000_000 if size == "10 MB" else "1 + " * 3000  # ~6,000 tokens: over 4096 - 8
    prompts.write_text(json.dumps({"problem": "What is it?"}) + "\n" + json.dumps({"problem": text}) + "\n")
    argv = [str(sft_dir), "--prompts", str(prompts), "--backend", "hf", "--max_tokens", "8", "--limit", "0"]
    assert cli.main(["sample", *argv]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: prompts/1: the prompt is ") and "max_model_len - max_tokens" in line, line
    assert ("characters" if size == "10 MB" else "tokens;") in line, line


def test_stage_3_refuses_before_the_engine_starts(sft_dir, tmp_path, no_sampler, capsys, monkeypatch):
    from conftest import REPO_ROOT

    monkeypatch.chdir(REPO_ROOT)
    argv = ["eval", REPO_CONFIG, "--checkpoints", str(sft_dir), "--benchmarks", "amc23", "--backend", "hf"]
    argv += ["--max_model_len", "48", "--max_tokens", "16", "--limit", "2"]  # amc23's prompts: > 32 tokens
    argv += ["--results_dir", str(tmp_path / "r"), "--outputs_dir", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: amc23/") and "at most 32 tokens" in line, line
    assert not list((tmp_path / "o").rglob("chunk_*"))


def test_a_prompt_that_fits_is_not_refused(sft_dir):
    from transformers import AutoTokenizer

    from sage_unsloth.eval.benchmarks import Problem
    from sage_unsloth.eval.sampling import render_prompts

    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    problem = Problem("mine", "0", "1 + " * 100)
    (ids,) = render_prompts(tokenizer, [problem], "{problem}", limit=10_000)
    assert render_prompts(tokenizer, [problem], "{problem}", limit=len(ids)) == [ids]  # exactly at the limit
    with pytest.raises(
        ValueError, match=f"the prompt is {len(ids)} tokens; the model reads at most {len(ids) - 1}"
    ):
        render_prompts(tokenizer, [problem], "{problem}", limit=len(ids) - 1)
