"""Evaluation orchestration without a real model: a stub sampler with known correct counts drives the real
pipeline (prompts, grading pool, chunk files, CSVs, manifest, resume), plus config/checkpoint errors."""

import gzip
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sage_unsloth import grading
from sage_unsloth.eval import run as eval_run
from sage_unsloth.eval.benchmarks import load_benchmark
from sage_unsloth.eval.gradepool import INLINE_THRESHOLD, GradingPool
from sage_unsloth.eval.records import read_chunk
from sage_unsloth.eval.run import FAIL_AFTER_ENV, EvalConfig, evaluate_checkpoint, prepare
from sage_unsloth.eval.sampling import Sample, problem_seed, resolve_checkpoint
from sage_unsloth.grading import extract_answer, verify_answer
from sage_unsloth.runtime.manifest import write_manifest

FORMATS = ("<SOLUTION>{}</SOLUTION>", "so \\boxed{{{}}}", "<SOLUTION> {} ")


class StubSampler:
    """Problem i (by seed) gets ``c_i = seed % (n + 1)`` correct samples in varied formats, the rest wrong."""

    def __init__(self, cfg, problems):
        self.n = cfg.n
        self.by_seed = {problem_seed(cfg.seed, p.dataset, p.problem_id): p for p in problems}
        self.calls = 0

    def expected_c(self, problem, seed_base):
        return problem_seed(seed_base, problem.dataset, problem.problem_id) % (self.n + 1)

    def generate(self, prompts, seeds):
        self.calls += 1
        out = []
        for seed in seeds:
            problem = self.by_seed[seed]
            c = seed % (self.n + 1)
            if problem.is_kk:
                right = "\n".join(
                    f"{name} is a {'knight' if k else 'knave'}"
                    for name, k in zip(problem.kk_names, problem.kk_solution)
                )
                texts = [f"<SOLUTION>{right}</SOLUTION>"] * c + ["<SOLUTION>nobody</SOLUTION>"] * (self.n - c)
            else:
                texts = [FORMATS[j % 3].format(problem.gold) for j in range(c)]
                texts += [f"<SOLUTION>{problem.gold} + 1</SOLUTION>" for _ in range(self.n - c)]
            out.append([Sample(t, len(t) // 4) for t in texts])
        return out


def _config(tmp_path, tiny_model_dir, **over):
    cfg = EvalConfig(
        checkpoints=[str(tiny_model_dir)],
        benchmarks=["aime24", "aime25", "amc23", "math500", "kk"],
        limit=5,
        n=4,
        problems_per_batch=2,
        seed=11,
        grading_workers=2,
        results_dir=str(tmp_path / "results"),
        outputs_dir=str(tmp_path / "outputs"),
    )
    return replace(cfg, **over)


def _run(cfg, fail_after=None):
    ks, checkpoints, sets = prepare(cfg)
    sampler = StubSampler(cfg, [p for ps in sets.values() for p in ps])
    if fail_after:
        os.environ[FAIL_AFTER_ENV] = str(fail_after)
    try:
        out = evaluate_checkpoint(cfg, checkpoints[0], sets, ks, sampler=sampler)
    finally:
        os.environ.pop(FAIL_AFTER_ENV, None)
    return out, sampler, sets


def test_pipeline_counts_correct_samples_and_writes_the_contract(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir)
    out, sampler, sets = _run(cfg)
    assert out == tmp_path / "results" / Path(tiny_model_dir).name / "base"
    lines = (out / "per_problem.csv").read_text().splitlines()
    assert lines[0] == "dataset,problem_id,n,c,mean_completion_tokens"
    counts = {tuple(line.split(",")[:2]): int(line.split(",")[3]) for line in lines[1:]}
    expected = {
        (p.dataset, p.problem_id): sampler.expected_c(p, cfg.seed) for ps in sets.values() for p in ps
    }
    assert counts == expected and len(counts) == 25
    assert 0 < sum(counts.values()) < 25 * 4
    passk = (out / "passk.csv").read_text().splitlines()
    assert passk[0] == "dataset,k,pass_at_k,n_problems,n_samples"
    datasets = {line.split(",")[0] for line in passk[1:]}
    # The bundled K&K set is named by its variant; the pooled AIME and the paper average are unaffected.
    assert datasets == {"aime24", "aime25", "aime", "amc23", "math500", "kk_logicrl", "avg_paper"}
    assert [line.split(",")[3] for line in passk[1:] if line.startswith("aime,")] == [
        "10"
    ] * 3  # 5 + 5 problems
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "eval" and manifest["sampling"]["n"] == 4 and manifest["ks"] == [1, 2, 4]
    assert manifest["datasets"] == ["aime24", "aime25", "amc23", "math500", "kk_logicrl"]
    grading_stats = manifest["grading"]
    assert grading_stats["unresolved"] == 0 and grading_stats["grader"] == grading.grader_fingerprint()
    assert grading_stats["budget_s"] == grading.DEFAULT_TIMEOUT_S
    assert not list(out.rglob("*.jsonl*"))  # completions never go into results/
    chunk = (
        tmp_path
        / "outputs"
        / Path(tiny_model_dir).name
        / "eval"
        / "base"
        / "math500"
        / "chunk_00000.jsonl.gz"
    )
    with gzip.open(chunk, "rt") as fh:
        record = json.loads(fh.readline())
    assert len(record["completions"]) == 4 and record["c"] == sum(c["correct"] for c in record["completions"])
    # Auditable: the gold, what the grader read and its status are kept with every completion.
    assert record["gold"] == sets["math500"][0].gold and record["grader"] == grading.grader_fingerprint()
    assert {(c["answer"], c["status"]) for c in record["completions"]} <= {
        (sets["math500"][0].gold, "correct"),
        (f"{sets['math500'][0].gold} + 1", "wrong"),
    }


def test_killed_run_resumes_to_identical_csvs(tmp_path, tiny_model_dir):
    full, _, _ = _run(_config(tmp_path / "a", tiny_model_dir))
    cfg = _config(tmp_path / "b", tiny_model_dir)
    with pytest.raises(RuntimeError, match="injected"):
        _run(cfg, fail_after=3)
    assert not (Path(cfg.results_dir)).exists()
    chunks = sorted(Path(cfg.outputs_dir).rglob("chunk_*.jsonl.gz"))
    assert len(chunks) == 3
    chunks[-1].write_bytes(
        chunks[-1].read_bytes()[:20]
    )  # a torn file (e.g. disk full) is redone, not trusted
    resumed, sampler, _ = _run(cfg)
    assert sampler.calls == 15 - 2  # 3 chunks per set x 5 sets, minus the 2 intact ones
    for name in ("per_problem.csv", "passk.csv"):
        assert (resumed / name).read_text() == (full / name).read_text()
    _, sampler, _ = _run(cfg)
    assert sampler.calls == 0


def test_changed_sampling_settings_do_not_mix_with_old_completions(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, benchmarks=["amc23"], limit=2)
    _run(cfg)
    with pytest.raises(ValueError, match="other settings"):
        _run(replace(cfg, temperature=1.0))


def test_a_run_that_stopped_before_its_first_chunk_does_not_block_a_changed_rerun(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, benchmarks=["amc23"], limit=2)
    ks, checkpoints, sets = prepare(cfg)

    class Crash(StubSampler):
        def generate(self, prompts, seeds):
            raise ModuleNotFoundError(
                "no vllm here"
            )  # what a missing engine did before any chunk was written

    with pytest.raises(ModuleNotFoundError):
        evaluate_checkpoint(
            cfg, checkpoints[0], sets, ks, sampler=Crash(cfg, [p for ps in sets.values() for p in ps])
        )
    folder = tmp_path / "outputs" / checkpoints[0].model / "eval" / checkpoints[0].run
    assert (folder / "sampling.json").is_file() and not list(folder.glob("*/chunk_*"))
    changed = replace(cfg, temperature=1.0)
    eval_run.check_completions_folder(changed, checkpoints[0])  # no chunk: nothing to mix, no error
    _run(changed)
    with pytest.raises(ValueError, match="other settings"):  # now there are chunks sampled at 1.0
        eval_run.check_completions_folder(cfg, checkpoints[0])


def test_the_cli_refuses_a_mixed_folder_and_a_missing_vllm_in_one_line(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    cfg = _config(tmp_path, tiny_model_dir, benchmarks=["amc23"], limit=2)
    _run(cfg)
    common = ["--results_dir", cfg.results_dir, "--outputs_dir", cfg.outputs_dir, "--limit", "2"]
    argv = [
        "--checkpoints",
        str(tiny_model_dir),
        "--benchmarks",
        "amc23",
        "--n",
        "4",
        "--seed",
        "11",
        *common,
    ]
    argv += ["--problems_per_batch", "2", "--backend", "hf"]
    assert "other settings" in _main_error(capsys, [*argv, "--temperature", "1.0"])
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        "importlib.util.find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    err = _main_error(capsys, [*argv[:-2], "--backend", "vllm", "--run_name", "fresh"])
    assert (
        "vllm is not installed" in err and ".venv-eval/bin/sage-unsloth eval" in err and "--backend hf" in err
    )
    assert not list((tmp_path / "outputs").rglob("fresh"))


def _main_error(capsys, argv):
    assert eval_run.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    return err


def test_clear_one_line_errors_before_any_model_loads(tmp_path, capsys, tiny_model_dir, monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("sage_unsloth.eval.sampling.make_sampler", no_model)
    common = ["--results_dir", str(tmp_path / "r"), "--outputs_dir", str(tmp_path / "o")]
    err = _main_error(
        capsys, ["--checkpoints", str(tiny_model_dir), "--benchmarks", "aime24", "gsm8k", *common]
    )
    assert "benchmarks='gsm8k' is unknown" in err
    err = _main_error(capsys, ["--checkpoints", str(tiny_model_dir), "--n", "4", "--ks", "1", "8", *common])
    assert "k=[8]" in err and "n=4" in err
    err = _main_error(capsys, ["--checkpoints", str(tmp_path / "outputs" / "nope" / "sft"), *common])
    assert "checkpoint" in err and "nope" in err
    err = _main_error(capsys, ["--checkpoints", "no-such-org/no-such-model", *common])
    assert "HF_HUB_OFFLINE" in err
    err = _main_error(capsys, ["--checkpoints", str(tiny_model_dir), "--source", "web", *common])
    assert "source='web'" in err
    err = _main_error(capsys, ["--checkpoints", str(tiny_model_dir), "--source", "local", *common])
    assert "data_dir" in err
    err = _main_error(capsys, [str(tmp_path / "missing.yaml")])
    assert "config file" in err
    assert not (tmp_path / "r").exists()


def test_ctrl_c_ends_in_one_line_that_says_how_to_continue(tmp_path, capsys, tiny_model_dir, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_run, "evaluate_checkpoint", interrupted)
    argv = ["--checkpoints", str(tiny_model_dir), "--benchmarks", "amc23", "--backend", "hf"]
    argv += ["--results_dir", str(tmp_path / "r"), "--outputs_dir", str(tmp_path / "o")]
    assert eval_run.main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sage-unsloth eval: interrupted (Ctrl-C); ")
    assert err[0].endswith("to continue: sage-unsloth eval " + " ".join(argv)), err


def test_stage_folders_resolve_to_base_plus_adapter(tmp_path, tiny_model_dir):
    sft = tmp_path / "outputs" / "tiny" / "sft"
    sft.mkdir(parents=True)
    (sft / "adapter_config.json").write_text(json.dumps({"r": 8}))
    write_manifest(sft, stage="sft", config={}, base_model=str(tiny_model_dir), model_short_name="tiny")
    ckpt = resolve_checkpoint(str(sft))
    assert (ckpt.model, ckpt.run, ckpt.base_model, ckpt.adapter_dir) == (
        "tiny",
        "sft",
        str(tiny_model_dir),
        str(sft),
    )
    rlvr = tmp_path / "outputs" / "tiny" / "grpo_branch"
    (rlvr / "policy").mkdir(parents=True)
    (rlvr / "policy" / "adapter_config.json").write_text(json.dumps({"r": 8}))
    write_manifest(
        rlvr,
        stage="rlvr",
        config={},
        base_model=str(tiny_model_dir),
        model_short_name="tiny",
        variant="grpo_branch",
    )
    ckpt = resolve_checkpoint(str(rlvr))
    assert (ckpt.run, ckpt.adapter_dir, ckpt.tokenizer_dir) == (
        "grpo_branch",
        str(rlvr / "policy"),
        str(rlvr),
    )
    write_manifest(rlvr, stage="report", config={})
    with pytest.raises(ValueError, match="'sft' or 'rlvr'"):
        resolve_checkpoint(str(rlvr))


def test_bundled_benchmarks_load_offline_with_normalised_golds(benchmark_dir):
    sizes = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "minerva": 272, "kk": 500}
    for name, size in sizes.items():
        problems = load_benchmark(name)  # default source: the bundled files, no data_dir, no hub
        assert len(problems) == size and len({p.problem_id for p in problems}) == size
        assert problems == load_benchmark(name, benchmark_dir, source="local")
    assert {p.dataset for p in load_benchmark("kk")} == {"kk_logicrl"}  # the bundled set is Logic-RL's split
    assert load_benchmark("amc23", limit=1)[0].gold == "27"
    assert load_benchmark("minerva", limit=1)[0].gold == "1.6"
    kk = load_benchmark("kk", limit=1)[0]
    assert (
        kk.is_kk and kk.kk_names == ("Amelia", "Penelope", "Evelyn") and kk.kk_solution == (True, True, False)
    )
    with pytest.raises(FileNotFoundError, match="data_dir"):
        load_benchmark("aime24", benchmark_dir / "nowhere")
    with pytest.raises(ValueError, match="source=hub ignores data_dir"):
        load_benchmark("aime24", benchmark_dir, source="hub")


def test_a_changed_bundled_file_fails_its_checksum(tmp_path, monkeypatch):
    from sage_unsloth import data

    copy = tmp_path / "amc23.jsonl"
    copy.write_text(data.BUNDLED["amc23.jsonl"].path.read_text().replace("27.0", "28.0", 1))
    monkeypatch.setitem(data.BUNDLED, "amc23.jsonl", replace(data.BUNDLED["amc23.jsonl"], path=copy))
    monkeypatch.setattr(data, "_VERIFIED", set())
    with pytest.raises(ValueError, match="sha256"):
        load_benchmark("amc23")
    copy.write_text("\n".join(copy.read_text().splitlines()[:-1]))
    with pytest.raises(ValueError, match="39 rows"):
        load_benchmark("amc23")


def test_user_benchmark_files_register_by_name(tmp_path, tiny_model_dir, monkeypatch):
    from sage_unsloth.eval import benchmarks

    built_ins = dict(benchmarks.BENCHMARKS)
    mine = tmp_path / "mine.jsonl"
    mine.write_text(
        "\n".join(json.dumps({"problem": f"{i}+1?", "answer": str(i + 1), "id": i}) for i in range(3))
    )
    cfg = _config(tmp_path, tiny_model_dir, benchmarks=["mine", "amc23"], local_benchmarks=[f"mine={mine}"])
    _, _, sets = prepare(cfg)  # the bundled files still serve amc23; mine comes from its own path
    assert [p.gold for p in sets["mine"]] == ["1", "2", "3"] and len(sets["amc23"]) == 5
    assert benchmarks.BENCHMARKS == built_ins  # the run's own benchmarks live in its view, not the module
    for entry, message in (
        (f"amc23={mine}", "built-in"),
        (f"kk_official={mine}", "built-in"),
        ("mine", "name=path"),
        (f"other={tmp_path / 'nope.jsonl'}", "not found"),
    ):
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            prepare(replace(cfg, local_benchmarks=[entry], benchmarks=["amc23"]))


@pytest.mark.slow
def test_grading_pool_dedups_and_agrees_with_serial_grading():
    problems = load_benchmark("math500", limit=40)
    items = []
    for p in problems:
        items += [(f"<SOLUTION>{p.gold}</SOLUTION>", p.gold)] * 3  # exact repeats: graded once
        items += [
            (f"\\boxed{{{p.gold}}}", p.gold),
            (f"<SOLUTION>{p.gold} + 1</SOLUTION>", p.gold),
            ("no answer", p.gold),
            (f"<SOLUTION>${p.gold}$</SOLUTION>", p.gold),
        ]
    with GradingPool(workers=2) as pool:
        verdicts = [g.correct for g in pool.grade(items)]
        stats = dict(pool.stats)
    assert stats["verified"] >= INLINE_THRESHOLD  # the process-pool path ran
    # per problem: 4 distinct (answer, gold) keys (\boxed{g} and <SOLUTION>g extract alike); golds repeat too
    assert stats["unique_pairs"] <= 40 * 4 and stats["completions"] == len(items) == 40 * 7
    serial = [verify_answer(extract_answer(c), g) for c, g in items]
    assert verdicts == serial
    assert sum(verdicts) >= 40 * 5 - 2 and sum(verdicts) <= 40 * 5


def test_knights_and_knaves_results_name_their_puzzle_set(tmp_path, tiny_model_dir, benchmark_dir):
    from sage_unsloth.eval.benchmarks import kk_variant

    assert load_benchmark("kk_logicrl", limit=2) == load_benchmark("kk", limit=2)
    assert kk_variant("bundled", []) == "kk_logicrl" and kk_variant("hub", []) == "kk_official"
    rows = [json.loads(line) for line in (benchmark_dir / "kk_test.jsonl").read_text().splitlines()[:3]]
    assert kk_variant("local", rows) == "kk_logicrl"  # Logic-RL's rows say data_source: kk_logic
    assert (
        kk_variant("local", [{k: v for k, v in r.items() if k != "data_source"} for r in rows]) == "kk_local"
    )
    other = tmp_path / "mine"
    other.mkdir()
    (other / "kk_test.jsonl").write_text(
        "\n".join(json.dumps({k: v for k, v in r.items() if k != "data_source"}) for r in rows)
    )
    assert {p.dataset for p in load_benchmark("kk", other)} == {"kk_local"}
    with pytest.raises(ValueError, match="kk_official.*needs source=hub"):
        load_benchmark("kk_official")
    with pytest.raises(ValueError, match="kk_logicrl.*not on the hub"):
        load_benchmark("kk_logicrl", source="hub")
    with pytest.raises(ValueError, match="list each set once"):
        prepare(_config(tmp_path, tiny_model_dir, benchmarks=["kk", "kk_logicrl"]))


def test_timeouts_are_retried_at_the_end_and_unresolved_ones_counted(tmp_path, tiny_model_dir, monkeypatch):
    from sage_unsloth.grading import verify

    compare = verify._symbolic_equal

    def slow_compare(candidate, form):  # every symbolic comparison costs 5 ms of CPU more than it does
        end = time.thread_time() + 0.005
        while time.thread_time() < end:
            pass
        return compare(candidate, form)

    # Small chunks are graded in this process, so the slower comparison applies to the run and its retry.
    monkeypatch.setattr(verify, "_symbolic_equal", slow_compare)
    common = {"benchmarks": ["math500"], "limit": 4}
    normal, _, _ = _run(_config(tmp_path / "normal", tiny_model_dir, **common))
    rushed_cfg = _config(tmp_path / "rushed", tiny_model_dir, grading_timeout_s=1e-6, **common)
    rushed, _, _ = _run(rushed_cfg)
    stats = json.loads((rushed / "manifest.json").read_text())["grading"]
    assert stats["timeouts"] > 0 and stats["retried"] > 0 and stats["unresolved"] == 0
    for name in ("per_problem.csv", "passk.csv"):  # the end-of-run retry settles them to the normal verdicts
        assert (rushed / name).read_text() == (normal / name).read_text()
    hopeless, _, _ = _run(
        replace(
            rushed_cfg,
            results_dir=str(tmp_path / "h" / "r"),
            outputs_dir=str(tmp_path / "h" / "o"),
            grading_retry_timeout_s=1e-6,
        )
    )
    stats = json.loads((hopeless / "manifest.json").read_text())["grading"]
    # counted in the manifest (the report shows it); a retried pair can finish between two ticks of the
    # deadline's timer even at 1e-6 s (how fast depends on what this process has cached, so on which tests ran
    # before in it: 3 timeouts, 2 unresolved under pytest-xdist), so not every timeout need stay unresolved
    assert stats["timeouts"] >= stats["unresolved"] > 0
    statuses = [
        c["status"]
        for path in Path(tmp_path / "h" / "o").rglob("chunk_*.jsonl.gz")
        for record in read_chunk(path)
        for c in record["completions"]
    ]
    assert statuses.count("timeout") == stats["unresolved"]


def test_resume_regrades_chunks_of_another_grader_without_resampling(tmp_path, tiny_model_dir, monkeypatch):
    cfg = _config(tmp_path, tiny_model_dir, benchmarks=["amc23", "kk"], limit=4)
    first, _, _ = _run(cfg)
    before = (first / "per_problem.csv").read_text()
    monkeypatch.setattr(grading, "grader_fingerprint", lambda: "a-newer-grader")
    again, sampler, _ = _run(cfg)
    assert sampler.calls == 0  # nothing resampled
    manifest = json.loads((again / "manifest.json").read_text())
    assert manifest["grading"]["regraded_chunks"] == 4 and manifest["grading"]["grader"] == "a-newer-grader"
    assert (again / "per_problem.csv").read_text() == before


# ------------------------------------------------------------------------------------------------ one writer
def _argv(cfg, *extra):
    argv = ["--checkpoints", *cfg.checkpoints, "--benchmarks", *cfg.benchmarks, "--limit", str(cfg.limit)]
    argv += ["--n", str(cfg.n), "--seed", str(cfg.seed), "--problems_per_batch", str(cfg.problems_per_batch)]
    argv += ["--results_dir", cfg.results_dir, "--outputs_dir", cfg.outputs_dir, "--backend", "hf", *extra]
    return argv


def _no_model(monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("sage_unsloth.eval.sampling.make_sampler", no_model)


def test_a_folder_has_one_writer_and_a_dead_writers_lock_is_taken_over(
    tmp_path, tiny_model_dir, capsys, caplog, monkeypatch
):
    import socket
    import subprocess
    import sys

    from sage_unsloth.runtime import layout
    from sage_unsloth.runtime.folder_lock import LOCK_NAME

    cfg = _config(tmp_path, tiny_model_dir, benchmarks=["amc23"], limit=2)
    _, checkpoints, _ = prepare(cfg)
    completions = layout.completions_dir(cfg.outputs_dir, checkpoints[0].model, checkpoints[0].run)
    completions.mkdir(parents=True)
    lock = completions / LOCK_NAME
    hold = (  # a live writer holds the flock (a record alone, naming a live pid, does not: issue 52)
        "import fcntl, json, os, socket, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "os.write(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), 'started': 'then'}).encode())\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    try:
        with monkeypatch.context() as m:
            _no_model(m)
            err = _main_error(capsys, _argv(cfg))
        assert f"pid {holder.pid} on host {socket.gethostname()}" in err and str(completions) in err
        with pytest.raises(ValueError, match=f"pid {holder.pid}"):
            _run(cfg)
        assert not list(completions.rglob("chunk_*")) and not (completions / "sampling.json").exists()
    finally:
        holder.kill()
        holder.wait()
    with caplog.at_level("WARNING"):
        out, _, _ = _run(cfg)  # the holder is dead now: its lock is stale
    assert f"taking over the lock of pid {holder.pid}" in caplog.text
    assert (out / "per_problem.csv").is_file() and not lock.exists()  # released at the end


def test_chunks_sampled_with_other_settings_are_refused(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """The issue's case: a run with seed 11 is killed after one chunk; a second writer with seed 12 rewrote the
    settings file. Resuming with seed 12 must not reuse the seed-11 chunk."""
    from sage_unsloth.runtime import layout

    cfg = _config(tmp_path, tiny_model_dir, benchmarks=["amc23"], limit=4, backend="hf")  # two chunks
    with pytest.raises(RuntimeError):
        _run(cfg, fail_after=1)
    other = replace(cfg, seed=12)
    _, checkpoints, _ = prepare(other)
    completions = layout.completions_dir(cfg.outputs_dir, checkpoints[0].model, checkpoints[0].run)
    (completions / "sampling.json").write_text(
        json.dumps(eval_run.sampling_fingerprint(other, checkpoints[0]), indent=2, sort_keys=True) + "\n"
    )
    with pytest.raises(ValueError) as caught:
        _run(other)
    message = str(caught.value)
    assert "\n" not in message and "seed=11" in message and "seed=12" in message and "chunk_00000" in message
    _no_model(monkeypatch)
    err = _main_error(capsys, _argv(other))
    assert "seed=11" in err and "seed=12" in err
    results = Path(other.results_dir)
    assert not list(results.rglob("per_problem.csv"))  # nothing written from mixed chunks
    err = _main_error(capsys, _argv(replace(cfg, n=5)))  # the settings file is checked too
    assert "other settings" in err and "n=4" in err and "n=5" in err


def test_empty_benchmarks_and_unusable_output_folders_fail_in_one_line(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    _no_model(monkeypatch)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    common = ["--checkpoints", str(tiny_model_dir), "--backend", "hf"]
    out = ["--results_dir", str(tmp_path / "r"), "--outputs_dir", str(tmp_path / "o")]
    err = _main_error(capsys, [*common, "--local_benchmarks", f"mine={empty}", "--benchmarks", "mine", *out])
    assert "'mine' has no problems" in err
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for field in ("results_dir", "outputs_dir"):
        for target in (a_file, a_file / "below"):
            argv = [*common, "--benchmarks", "amc23", "--limit", "1", *out, f"--{field}", str(target)]
            err = _main_error(capsys, argv)
            assert f"{field}=" in err and "is a file" in err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        err = _main_error(
            capsys, [*common, "--benchmarks", "amc23", *out, "--results_dir", str(locked / "r")]
        )
        assert "not writable" in err
