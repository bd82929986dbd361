"""Records a user can trust (issue 42, items 1, 2, 3 and 5), without training anything.

1. One writer per folder: a training stage's output folder, an evaluation's results folder, a sweep, the demo
   lab and the report each refuse a second writer in one line naming the holder; a crashed holder's lock is
   taken over; a lock from another host is never taken over; two evaluations with different settings never
   replace each other's results.
2. Names stay inside their roots: traversal, absolute paths and shell metacharacters in a run name, a variant,
   a benchmark, a sweep, a model's folder name or a lab method are refused in one line, and nothing is written.
3. No credential in a driver's job arguments (the end-to-end greps over every file a sweep writes are in
   tests/sweep/test_sweep.py and tests/sweep/test_executors.py, on the runs those files make anyway).
5. Damaged files are named (file and line) in one line: manifests, results CSVs, training logs, job records.

The lock holder in these tests is a separate process that takes the lock by the protocol of
sage_unsloth/runtime/folder_lock.py (flock + a JSON record), written here from that protocol, not with the kit's code.
"""

import fcntl
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO_ROOT, TINY_SWEEP

LOCK = ".writer.lock"
HOLDER = textwrap.dedent(
    """
    import fcntl, json, os, socket, sys, time
    folder = sys.argv[1]
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, sys.argv[2]), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": "holder-of-the-lock",
              "started": "2026-01-01T00:00:00"}
    os.write(fd, json.dumps(record).encode())
    print("held", flush=True)
    time.sleep(300)
    """
)


class Holder:
    """A live process holding ``folder``'s lock (``name``: the lock file) until stopped."""

    def __init__(self, folder: Path, name: str = LOCK):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder), name], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline().strip() == "held"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


def one_line(capsys, code, expected_code=2) -> str:
    assert code == expected_code, capsys.readouterr()
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if line.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def fake_sft(tmp_path) -> Path:
    """A stage-1 folder as far as the checks before any model loads read it (manifest and adapter files)."""
    folder = tmp_path / "stage1" / "sft"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(
        json.dumps({"stage": "sft", "base_model": str(tmp_path / "tinybase")})
    )
    (folder / "adapter_config.json").write_text("{}")
    return folder


@pytest.fixture
def no_training(monkeypatch):
    """Stage 2's plan and lock run for real; what would load a model and train is replaced by a no-op that
    records the folder it was given (on today's main the stage would train into a folder another run holds)."""
    from sage_unsloth.rlvr import run as rlvr_run

    trained = []

    class Built:
        def __init__(self, plan):
            self.plan = plan

        def train_and_save(self):
            trained.append(self.plan.output_dir)

    def build_stage(grpo_args, stage, model_args, config_path=None, plan=None):
        return Built(plan)

    monkeypatch.setattr(rlvr_run, "build_stage", build_stage)
    return trained


def rlvr_argv(fake_sft, out: Path, *extra) -> list[str]:
    return [
        str(REPO_ROOT / "configs" / "rlvr" / "tiny-cpu" / "grpo.yaml"),
        "--sft_dir",
        str(fake_sft),
        "--output_dir",
        str(out),
        "--max_seq_length",
        "256",  # no model config to read
        *extra,
    ]


# ------------------------------------------------------------------------------------- 1. one writer per folder
def test_a_second_rlvr_run_into_a_held_folder_stops_in_one_line_naming_the_holder(
    tmp_path, fake_sft, no_training, capsys, monkeypatch
):
    monkeypatch.chdir(REPO_ROOT)
    from sage_unsloth.rlvr.run import main

    out = tmp_path / "runs" / "grpo"
    with Holder(out) as holder:
        line = one_line(capsys, main(rlvr_argv(fake_sft, out)))
    assert f"pid {holder.proc.pid} on host {socket.gethostname()}" in line and "holder-of-the-lock" in line
    assert str(out) in line and "--output_dir" in line
    assert no_training == []  # nothing trained beside the holder
    assert main(rlvr_argv(fake_sft, out)) == 0  # the holder is gone: the folder is free
    assert no_training == [out] and not (out / LOCK).exists()  # released at the end


def test_a_crashed_holders_lock_is_taken_over_and_another_hosts_never(
    tmp_path, fake_sft, no_training, capsys, caplog, monkeypatch
):
    monkeypatch.chdir(REPO_ROOT)
    from sage_unsloth.rlvr.run import main

    out = tmp_path / "grpo"
    holder = Holder(out)
    holder.proc.send_signal(signal.SIGKILL)  # a crash: its record stays, its flock goes with it
    holder.stop()
    assert json.loads((out / LOCK).read_text())["pid"] == holder.proc.pid
    with caplog.at_level("WARNING"):
        assert main(rlvr_argv(fake_sft, out)) == 0
    assert f"taking over the lock of pid {holder.proc.pid}" in caplog.text

    (out / LOCK).write_text(json.dumps({"pid": 1, "host": "node-elsewhere", "started": "then"}))
    line = one_line(capsys, main(rlvr_argv(fake_sft, out)))
    assert "node-elsewhere" in line and "another host" in line and f"delete {out / LOCK}" in line
    assert no_training == [out]


def test_a_second_sft_run_stops_before_loading_anything(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    from sage_unsloth.sft.run import main

    model = tmp_path / "tinybase"
    model.mkdir()
    out = tmp_path / "sft"
    argv = ["configs/sft/tiny-cpu.yaml", "--model_name_or_path", str(model), "--output_dir", str(out)]
    with Holder(out) as holder:
        line = one_line(capsys, main(argv))
    assert f"pid {holder.proc.pid}" in line and "holder-of-the-lock" in line


def test_a_second_sweep_of_the_same_name_stops_before_any_job(tmp_path, fake_sft, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    from sage_unsloth.jobs import sweep

    monkeypatch.setattr(sweep, "run_jobs", lambda *a, **k: {})  # today's main would start the jobs here
    argv = [
        str(TINY_SWEEP),
        "--sft_dir",
        str(fake_sft),
        "--output_root",
        str(tmp_path / "o"),
        "--results_dir",
        str(tmp_path / "r"),
    ]
    with Holder(tmp_path / "o" / "tiny-cpu") as holder:
        line = one_line(capsys, sweep.main(argv))
    assert f"pid {holder.proc.pid}" in line and "--name" in line
    with Holder(tmp_path / "r" / "tiny-cpu"):
        assert "holder-of-the-lock" in one_line(capsys, sweep.main(argv))
    assert not (tmp_path / "r" / "tiny-cpu" / "summary.csv").exists()


def test_a_second_lab_into_the_same_folders_stops_before_any_step(tmp_path, capsys, monkeypatch):
    from sage_unsloth.demo import run as demo

    def ran(*a, **k):
        raise RuntimeError("the steps ran")

    monkeypatch.setattr(demo, "run_steps", ran)
    argv = [
        "--quick",
        "--work-dir",
        str(tmp_path / "w"),
        "--results-dir",
        str(tmp_path / "r"),
        "--reference",
        "",
    ]
    with Holder(tmp_path / "w") as holder:
        line = one_line(capsys, demo.main(argv))
    assert f"pid {holder.proc.pid}" in line and "--work-dir" in line
    (tmp_path / "w" / "kept.txt").write_text("a finished step's output")
    with Holder(tmp_path / "r"):
        one_line(capsys, demo.main([*argv, "--fresh"]))
    assert (tmp_path / "w" / "kept.txt").is_file()  # --fresh deletes nothing before both folders are held


def write_results(results: Path) -> None:
    run = results / "tiny" / "sft"
    run.mkdir(parents=True)
    (run / "passk.csv").write_text(
        "dataset,k,pass_at_k,n_problems,n_samples\namc23,1,0.5,2,4\namc23,2,0.75,2,4\n"
    )
    (run / "per_problem.csv").write_text(
        "dataset,problem_id,n,c,mean_completion_tokens\namc23,0,2,1,3.0\namc23,1,2,1,3.0\n"
    )


def test_a_second_report_into_the_same_place_stops_in_one_line(tmp_path, capsys):
    from sage_unsloth.report.run import main

    write_results(tmp_path / "res")
    argv = ["--results", str(tmp_path / "res"), "--resamples", "100"]
    with Holder(tmp_path / "res" / "report") as holder:
        line = one_line(capsys, main(argv))
    assert f"pid {holder.proc.pid}" in line and "--out" in line
    assert not (tmp_path / "res" / "report.md").exists()


def test_the_lock_module_follows_the_protocol_and_shards_of_one_run_share_a_folder(tmp_path):
    from sage_unsloth.runtime.folder_lock import FolderLock

    folder = tmp_path / "f"
    with FolderLock(folder) as lock:
        record = json.loads((folder / LOCK).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname() and record["command"]
        fd = os.open(folder / LOCK, os.O_RDONLY)  # the flock is held: another process could not take it
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
        assert lock.held
    assert not folder.exists()  # it wrote nothing: no folder is left behind
    with Holder(folder, ".writer.shard-0-of-2.lock"):
        with FolderLock(folder, shard=(1, 2)):  # the other shard of the same run
            pass
        for shard in (None, (0, 2), (1, 3)):  # the same shard, an unsharded writer, another split
            with pytest.raises(ValueError, match="holder-of-the-lock"):
                FolderLock(folder, shard=shard).acquire()


def test_a_free_flock_is_taken_over_whatever_pid_its_record_names(
    tmp_path, fake_sft, no_training, caplog, monkeypatch
):
    """A crash leaves the record; its pid is then reused by an unrelated live process (here: a sleeper). The
    flock is free, so the folder is free (main 0298207: 'being written by pid N', exit 2)."""
    monkeypatch.chdir(REPO_ROOT)
    from sage_unsloth.rlvr.run import main
    from sage_unsloth.runtime.folder_lock import FolderLock

    out = tmp_path / "grpo"
    out.mkdir()
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        record = {"pid": unrelated.pid, "host": socket.gethostname(), "command": "crashed", "started": "then"}
        (out / LOCK).write_text(json.dumps(record))
        with caplog.at_level("WARNING"):
            assert main(rlvr_argv(fake_sft, out)) == 0
        assert no_training == [out] and f"taking over the lock of pid {unrelated.pid}" in caplog.text
        (out / LOCK).write_text(json.dumps(record))
        with FolderLock(out) as lock:  # the module itself, and live_owner, read it the same way
            assert lock.held
    finally:
        unrelated.kill()
        unrelated.wait()


@pytest.mark.parametrize("refusal", ["under a file", "a name too long"])
def test_an_output_folder_that_cannot_be_made_is_one_line(refusal, tmp_path, fake_sft, capsys, monkeypatch):
    """mkdir refused (here by a file on the path, or a name longer than the file system allows; on a cluster by
    permissions or a read-only mount): each stage says so in one line (main 0298207: a traceback)."""
    from sage_unsloth.report.run import main as report
    from sage_unsloth.runtime.folder_lock import FolderLock
    from sage_unsloth.sft.run import main as sft

    (tmp_path / "a_file").write_text("")
    bad = tmp_path / "a_file" / "x" if refusal == "under a file" else tmp_path / ("n" * 300) / "x"
    write_results(tmp_path / "res")
    line = one_line(capsys, report(["--results", str(tmp_path / "res"), "--out", str(bad / "report.md")]))
    assert str(bad / "report") in line and "cannot create" in line and "--out" in line, line
    monkeypatch.chdir(REPO_ROOT)
    model = tmp_path / "tinybase"
    model.mkdir()
    argv = ["configs/sft/tiny-cpu.yaml", "--model_name_or_path", str(model), "--output_dir", str(bad)]
    line = one_line(capsys, sft(argv))
    assert "output_dir" in line and ("cannot create" in line or "is a file" in line), line
    with pytest.raises(ValueError, match="cannot create this folder") as refused:
        FolderLock(bad, fix="choose another folder").acquire()
    assert "\n" not in str(refused.value)


# ---------------------------------------------------------------------------- 2. names stay inside their roots
BAD_NAMES = [
    "../../../escaped",
    "..",
    "a/b",
    "ABSOLUTE",  # replaced by an absolute path inside tmp_path (the test must not write outside it)
    "x; touch pwned",
    "$(touch pwned)",
    "`touch pwned`",
    "a b",
    "x|y",
    "",
    "run.",  # Windows drops a trailing dot: run. and run are one folder there
    "CON",  # device names Windows reserves, in any case, with an extension too
    "nul.json",
    "Com1",
]


def _bad(name: str, tmp_path: Path) -> str:
    return str(tmp_path / "abs_escape") if name == "ABSOLUTE" else name


def _nothing_escaped(tmp_path: Path, roots: Path) -> None:
    """Nothing was written outside ``roots`` and nothing ran: no escaped, pwned or abs_escape path anywhere."""
    found = [p for p in tmp_path.rglob("*") if p.name in ("escaped", "pwned", "abs_escape", "x|y")]
    assert not found, found
    outside = [p for p in tmp_path.iterdir() if p.name not in (roots.name, "stage1", "tinybase")]
    assert not outside, outside


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_eval_run_name_that_is_not_one_folder_name_is_refused(name, tmp_path, capsys, monkeypatch):
    from sage_unsloth.eval.run import main

    monkeypatch.chdir(tmp_path)
    roots = tmp_path / "roots" / "a" / "b" / "c"
    argv = ["--checkpoints", "Qwen/none", "--run_name", _bad(name, tmp_path)]
    argv += ["--results_dir", str(roots / "r"), "--outputs_dir", str(roots / "o")]
    line = one_line(capsys, main(argv))
    assert "run_name=" in line and "cannot name a folder" in line
    _nothing_escaped(tmp_path, tmp_path / "roots")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_benchmark_name_that_is_not_one_folder_name_is_refused(name, tmp_path, monkeypatch):
    from sage_unsloth.eval import benchmarks

    data = tmp_path / "mine.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n')
    with pytest.raises(ValueError, match="cannot name a folder|write it as name="):
        benchmarks.with_local_benchmarks([f"{_bad(name, tmp_path)}={data}"])
    assert _bad(name, tmp_path) not in benchmarks.BENCHMARKS


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_rlvr_variant_that_is_not_one_folder_name_is_refused(
    name, tmp_path, fake_sft, no_training, capsys, monkeypatch
):
    from sage_unsloth.rlvr.run import main

    monkeypatch.chdir(REPO_ROOT)
    roots = tmp_path / "roots" / "a" / "b" / "c"
    argv = rlvr_argv(fake_sft, roots, "--variant", _bad(name, tmp_path))
    argv.remove("--output_dir")
    argv.remove(str(roots))
    line = one_line(capsys, main([*argv, "--output_root", str(roots)]))
    assert "variant=" in line and "cannot name a folder" in line
    assert no_training == []
    _nothing_escaped(tmp_path, tmp_path / "roots")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_sweep_name_that_is_not_one_folder_name_is_refused(name, tmp_path, fake_sft, capsys, monkeypatch):
    from sage_unsloth.jobs import sweep

    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setattr(sweep, "run_jobs", lambda *a, **k: {})
    roots = tmp_path / "roots" / "a" / "b" / "c"
    argv = [str(TINY_SWEEP), "--sft_dir", str(fake_sft), "--name", _bad(name, tmp_path)]
    line = one_line(
        capsys, sweep.main([*argv, "--output_root", str(roots / "o"), "--results_dir", str(roots / "r")])
    )
    assert "name=" in line and "cannot name a folder" in line
    _nothing_escaped(tmp_path, tmp_path / "roots")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_sft_model_folder_name_that_is_not_one_folder_name_is_refused(name, tmp_path, capsys, monkeypatch):
    from sage_unsloth.sft.run import main

    monkeypatch.chdir(REPO_ROOT)
    model = tmp_path / "tinybase"
    model.mkdir()
    roots = tmp_path / "roots" / "a" / "b" / "c"
    argv = ["configs/sft/tiny-cpu.yaml", "--model_name_or_path", str(model), "--output_root", str(roots)]
    line = one_line(capsys, main([*argv, "--model_short_name", _bad(name, tmp_path)]))
    assert "model_short_name=" in line and "cannot name a folder" in line
    _nothing_escaped(tmp_path, tmp_path / "roots")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_lab_method_name_that_is_not_one_folder_name_is_refused(name, tmp_path):
    from sage_unsloth.demo import run as demo

    method = demo.Method(_bad(name, tmp_path), "mine", source=str(tmp_path / "mine.yaml"))
    with pytest.raises(ValueError, match="cannot name a method"):
        demo.check_new_methods([method], taken=())


def test_the_name_rule_keeps_the_names_the_kit_makes():
    from sage_unsloth.runtime.layout import check_name

    for name in (
        "sft",
        "grpo_branch_seed3407",
        "qwen2.5-math-7b",
        "grpo_branch-tau0.3-gamma2",
        "kk_logicrl",
        "a=b+c",
    ):
        assert check_name(name, "x") == name
    for name in ("CONSOLE", "com10", "LPT", "run.1", "nul_results", "a.b.c"):
        assert check_name(name, "x") == name
    for name in ("x" * 129, "-x", ".hidden", "x\n", "é", "run.", "a..", "CON", "aux", "PRN.txt", "LPT9.log"):
        with pytest.raises(ValueError, match="cannot name a folder"):
            check_name(name, "x")


# ------------------------------------------------------------------------------- 3. no credential in a job's args
SECRET = "hf_SecretValueThatMustNotBeWritten123456"


def test_a_credential_flag_of_a_sweep_leaves_every_job_command_for_the_environment(tmp_path, monkeypatch):
    from sage_unsloth.jobs.sweep import SweepConfig, build_jobs

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = SweepConfig(
        configs=["configs/rlvr/tiny-cpu/grpo.yaml"],
        sft_dir=str(tmp_path),
        rlvr_args=f"--max_steps 2 --hub_token {SECRET}",
        eval_args=f"--limit 2 --wandb-api-key={SECRET}x",
    )
    assert cfg.rlvr_args == "--max_steps 2" and cfg.eval_args == "--limit 2"
    assert os.environ["HF_TOKEN"] == SECRET and os.environ["WANDB_API_KEY"] == SECRET + "x"
    for job in build_jobs(cfg, "tiny"):
        assert SECRET not in " ".join(job.command), job.name


def test_the_redaction_reaches_flags_inside_one_argument():
    from sage_unsloth.runtime.credentials import redact_argv

    argv = [
        "--rlvr_args",
        f"--max_steps 2 --hub_token {SECRET}",
        f"--eval_args=--api_key={SECRET}",
        "--seed",
        "1",
    ]
    redacted = redact_argv(argv)
    assert (
        SECRET not in " ".join(redacted)
        and "--max_steps 2" in redacted[1]
        and redacted[3:] == ["--seed", "1"]
    )
    plain = [
        "--output_dir=/tmp/a--b",
        "main(['--results',",
        "x--y",
    ]  # "--" inside one word: kept, no recursion
    assert redact_argv(plain) == plain


def test_a_ray_task_carries_the_path_of_the_credentials_not_the_credentials(tmp_path, monkeypatch):
    """What Ray serialises for a task (its arguments) holds no credential; the job still gets it, from a file
    only the user can read, which the driver removes when it ends."""
    from sage_unsloth.jobs.executors import Task, make_executor
    from sage_unsloth.jobs.executors.command import run_command

    submitted = []

    class FakeRay:
        def is_initialized(self):
            return True

        def remote(self, **_):
            def wrap(fn):
                class Remote:
                    def options(self, **_):
                        return self

                    def remote(self, *args):
                        submitted.append(args)
                        return args

                return Remote()

            return wrap

    monkeypatch.setitem(sys.modules, "ray", FakeRay())
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("WANDB_API_KEY", SECRET + "w")
    executor = make_executor("ray", {"address": "auto"}, tmp_path / "ray")
    check = "import os, sys; sys.exit(0 if os.environ.get('HF_TOKEN', '')[::-1] == sys.argv[1] else 3)"
    task = Task("job", [sys.executable, "-c", check, SECRET[::-1]], tmp_path / "job.log")
    executor.submit([task])
    (args,) = submitted
    assert SECRET.encode() not in pickle.dumps(args)
    path = Path(task.env["SAGE_CREDENTIALS_FILE"])
    assert path.stat().st_mode & 0o077 == 0 and path.parent.stat().st_mode & 0o077 == 0
    monkeypatch.delenv("HF_TOKEN")  # the worker's own environment lacks it
    assert run_command(*args) == 0  # the job got it from the file
    executor.close()
    assert not path.exists() and not path.parent.exists()


# ------------------------------------------------------------------------------ 5. damaged files, named in one line
@pytest.mark.parametrize(
    "content, needle",
    [
        (b"", "is empty"),
        (b"\x00\x01\x02PK\x03\x04binary", "is binary"),
        (b"dataset,k,pass_at_k\n\xff\xfeamc23,1,0.5\n", "not valid UTF-8"),
        (b"dataset,k,pass_at_k\namc23,1,0.5\namc23,one,0.5\n", "line 3"),
        (b'dataset,k,pass_at_k\n"amc23,1,0.5\n', "passk.csv"),
    ],
)
def test_a_damaged_passk_csv_is_named_in_one_line(content, needle, tmp_path, capsys):
    from sage_unsloth.report.run import main

    write_results(tmp_path / "res")
    passk = tmp_path / "res" / "tiny" / "sft" / "passk.csv"
    passk.write_bytes(content)
    line = one_line(capsys, main(["--results", str(tmp_path / "res")]))
    assert str(passk) in line and needle in line


@pytest.mark.parametrize(
    "content, needle",
    [(b"", "line 1"), (b'{"stage": "sft",\n  "base_model": }', "line 2"), (b"\xff\xfe{}", "not valid UTF-8")],
)
def test_a_damaged_manifest_is_named_with_its_line(content, needle, tmp_path, fake_sft, capsys, monkeypatch):
    from sage_unsloth.eval.run import main

    (fake_sft / "manifest.json").write_bytes(content)
    monkeypatch.chdir(tmp_path)
    line = one_line(
        capsys, main(["--checkpoints", str(fake_sft), "--results_dir", "r", "--outputs_dir", "o"])
    )
    assert str(fake_sft / "manifest.json") in line and needle in line


def test_a_damaged_training_log_and_job_record_are_named(tmp_path):
    from sage_unsloth.jobs import Step, plan
    from sage_unsloth.runtime.training_log import read_log_history

    log = tmp_path / "log_history.jsonl"
    log.write_bytes(b'{"step": 1}\n\xff\xfe{"step": 2}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"log_history.jsonl:2: not valid UTF-8"):
        read_log_history(log)
    record = tmp_path / "jobs" / "grpo_seed1.json"  # a sweep job's stamp (sage_unsloth/jobs)
    record.parent.mkdir()
    record.write_text('{"command": ["sage_unsloth.rlvr", ')
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "adapter_config.json").write_text("{}")
    step = Step(
        "grpo_seed1", ["python", "-m", "sage_unsloth.rlvr"], (tmp_path / "run",), code=None, keep=True
    )
    with pytest.raises(ValueError, match=r"grpo_seed1.json line 1 is damaged"):
        plan([step], tmp_path / "jobs")


# ------------------------------------------------------ 5. eval: corrupt chunks, stale temp files, sampling.json, disk
CSVS = ("per_problem.csv", "passk.csv")


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, mtime=0)


def _flip_a_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x5A]) + data[middle + 1 :]


DAMAGE = {
    "a flipped byte": _flip_a_byte,
    "torn": lambda data: data[:20],
    "JSON arrays": lambda data: _gzip(b"[1, 2]\n[3]\n"),
    "records without completions": lambda data: _gzip(b'{"problem_id": "0", "n": 4, "c": 1}\n'),
    "invalid UTF-8": lambda data: _gzip(b'{"problem_id": "\xff\xfe"}\n'),
    "empty": lambda data: _gzip(b""),
}


def _eval(tmp_path, tiny_model_dir, **over):
    from test_eval import _config

    return _config(
        tmp_path, tiny_model_dir, benchmarks=["amc23"], limit=4, grading_workers=1, backend="hf", **over
    )


def _completions(cfg) -> Path:
    from sage_unsloth.eval.run import prepare
    from sage_unsloth.runtime import layout

    _, checkpoints, _ = prepare(cfg)
    return layout.completions_dir(cfg.outputs_dir, checkpoints[0].model, checkpoints[0].run)


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_corrupt_chunk_is_named_set_aside_and_sampled_again(damage, tmp_path, tiny_model_dir, caplog):
    from test_eval import _run

    from sage_unsloth.eval.run import check_completions_folder, prepare

    cfg = _eval(tmp_path, tiny_model_dir)  # two chunks of two problems
    out, _, _ = _run(cfg)
    before = {name: (out / name).read_text() for name in CSVS}
    chunk = _completions(cfg) / "amc23" / "chunk_00000.jsonl.gz"
    original = chunk.read_bytes()
    chunk.write_bytes(DAMAGE[damage](original))
    damaged = chunk.read_bytes()
    check_completions_folder(cfg, prepare(cfg)[1][0])  # the CLI's check before the run: not an error
    with caplog.at_level("WARNING"):
        out, sampler, _ = _run(cfg)
    assert sampler.calls == 1  # only the damaged chunk
    assert chunk.with_name(chunk.name + ".corrupt").read_bytes() == damaged  # kept for a look
    assert chunk.read_bytes() == original  # sampled again, the same bytes
    assert {name: (out / name).read_text() for name in CSVS} == before
    warning = next(r.getMessage() for r in caplog.records if "set aside" in r.getMessage())
    assert str(chunk) in warning and "\n" not in warning
    assert any(why in warning for why in ("line 1 is", "not a whole gzip", "holds no record"))


def test_stale_temporary_files_are_removed_on_the_next_run(tmp_path, tiny_model_dir):
    from test_eval import _run

    cfg = _eval(tmp_path, tiny_model_dir)
    out, _, _ = _run(cfg)
    completions = _completions(cfg)
    stale = [
        completions / "amc23" / ".chunk_00001.jsonl.gz.999999.tmp",  # a chunk write killed before its rename
        completions / ".sampling.json.k2j3h4.tmp",
        out / ".passk.csv.x8y9z0.tmp",
    ]
    for path in stale:
        path.write_bytes(b"half a file")
    _, sampler, _ = _run(cfg)
    assert sampler.calls == 0 and not [p for p in stale if p.exists()]


def test_a_damaged_sampling_json_is_rebuilt_from_the_settings_the_chunks_record(
    tmp_path, tiny_model_dir, caplog
):
    from test_eval import _run

    from sage_unsloth.eval.records import read_chunk, write_chunk

    cfg = _eval(tmp_path, tiny_model_dir)
    out, _, _ = _run(cfg)
    before = {name: (out / name).read_text() for name in CSVS}
    sampling = _completions(cfg) / "sampling.json"
    settings = sampling.read_text()
    sampling.write_bytes(b"\x00\x13garbage{")
    with caplog.at_level("WARNING"):
        _, sampler, _ = _run(cfg)
    assert sampler.calls == 0  # every chunk names this run's settings: all kept
    assert str(sampling) in caplog.text and "rebuilt" in caplog.text
    assert sampling.read_text() == settings

    old = (
        _completions(cfg) / "amc23" / "chunk_00001.jsonl.gz"
    )  # a chunk written before records named settings
    write_chunk(old, [{k: v for k, v in r.items() if k != "sampling"} for r in read_chunk(old)])
    sampling.write_text("[]")
    _, sampler, _ = _run(cfg)
    assert sampler.calls == 1 and old.with_name(old.name + ".corrupt").is_file()
    assert {name: (out / name).read_text() for name in CSVS} == before


def test_two_evaluations_never_replace_each_others_results(tmp_path, tiny_model_dir, capsys, monkeypatch):
    from dataclasses import replace

    from test_eval import _argv, _no_model, _run

    from sage_unsloth.eval.run import main
    from sage_unsloth.runtime import layout

    cfg = _eval(tmp_path, tiny_model_dir)
    out, _, _ = _run(cfg)
    before = {name: (out / name).read_text() for name in CSVS}
    other_outputs = str(tmp_path / "other-outputs")
    for other, needles in (
        (replace(cfg, seed=12, outputs_dir=other_outputs), ("seed=11", "seed=12")),
        (replace(cfg, outputs_dir=other_outputs), (str(_completions(cfg)), other_outputs)),
        (replace(cfg, n=6, outputs_dir=other_outputs), ("n=4", "n=6")),
    ):
        with pytest.raises(ValueError, match="another evaluation") as caught:
            _run(other)
        assert "\n" not in str(caught.value) and all(n in str(caught.value) for n in needles)
    _no_model(monkeypatch)
    line = one_line(capsys, main(_argv(replace(cfg, seed=12, outputs_dir=other_outputs))))
    assert "another evaluation" in line and "seed=11" in line and "run_name" in line
    assert {name: (out / name).read_text() for name in CSVS} == before  # nothing replaced
    with Holder(out) as holder:  # a second writer of the same evaluation while the first runs
        line = one_line(capsys, main(_argv(cfg)))
    assert f"pid {holder.proc.pid}" in line and str(layout.results_dir(cfg.results_dir, "", "")) in line


def test_a_full_disk_during_eval_is_one_line_leaves_no_temp_file_and_a_rerun_continues(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    import errno

    from test_eval import StubSampler, _argv, _run

    from sage_unsloth.eval.run import main, prepare

    reference, _, _ = _run(_eval(tmp_path / "reference", tiny_model_dir))
    cfg = _eval(tmp_path / "full", tiny_model_dir)
    problems = [p for ps in prepare(cfg)[2].values() for p in ps]
    monkeypatch.setattr(
        "sage_unsloth.eval.sampling.make_sampler", lambda checkpoint, c: StubSampler(c, problems)
    )
    real_fsync = os.fsync

    def full_disk(fd):  # the second chunk's write finds the disk full
        if ".chunk_00001" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    completions = _completions(cfg)
    line = one_line(capsys, main(_argv(cfg)))
    assert "no room" in line and str(completions) in line and "same command" in line
    assert not list(tmp_path.rglob("*.tmp")) and (completions / "amc23" / "chunk_00000.jsonl.gz").is_file()
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert main(_argv(cfg)) == 0
    out = tmp_path / "full" / reference.relative_to(tmp_path / "reference")
    assert {n: (out / n).read_text() for n in CSVS} == {n: (reference / n).read_text() for n in CSVS}
