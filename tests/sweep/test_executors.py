"""The executors of `sage-unsloth sweep` (sage_unsloth/jobs/executors) with the real libraries on CPU.

submitit's LocalExecutor (``executor_settings: {cluster: local}``: the same submission path as a SLURM cluster, the
jobs run on this machine) and a Ray instance started here run the tiny sweep's GRPO config x its 2 seeds (the
local executor's run of the whole sweep, tests/conftest.py ``tiny_sweep``, is the reference both share). In
the first run one training job is killed with SIGKILL after its first checkpoint: it is reported with its log,
what reads it is not run, the other jobs finish and the command exits 1 naming it. The rerun skips every
finished job, resumes the killed one from its checkpoint, and the summary rows, trained adapters and sampled
completions are the local executor's, byte for byte. Without a cluster: the submitit parameters and sbatch
file of a multi-node job, the accelerate launch each node runs, and one-line errors.
"""

import csv
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    HUB_TOKEN,
    REPO_ROOT,
    TINY_SWEEP,
    WANDB_KEY,
    files_holding,
    sweep_credentials,
    tiny_sweep_argv,
)

from sage_unsloth.jobs import sweep
from sage_unsloth.jobs.executors import EXECUTORS, Task, make_executor, slurm

MULTINODE = REPO_ROOT / "configs" / "accelerate" / "multinode.yaml"
# One config of the tiny sweep's two (both seeds: the summary's mean row is checked too); the other config's
# jobs would repeat what these prove at twice the cost.
ONE_CONFIG = ["--configs", "configs/rlvr/tiny-cpu/grpo.yaml"]
EXECUTOR_ARGS = {
    "slurm": [
        "--executor",
        "slurm",
        "--executor_settings",
        "{cluster: local, cpus_per_job: 1, array_parallelism: 2}",
    ],
    "ray": ["--executor", "ray", "--executor_settings", "{address: local, num_cpus: 2}"],
}


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    sweep_credentials(
        monkeypatch
    )  # a Hub token in rlvr_args, a W&B key in the environment: no file holds them


def _summary(root: Path) -> dict[str, dict]:
    with open(root / "results" / "tiny-cpu" / "summary.csv") as fh:
        return {row.pop("run"): row for row in csv.DictReader(fh) if row.pop("status") is not None}


def _adapter(root: Path, run: str) -> bytes:
    (path,) = (root / "outputs" / "tiny-cpu").glob(f"*/{run}/adapter_model.safetensors")
    return path.read_bytes()


def _completions(root: Path, run: str) -> list[list[str]]:
    from sage_unsloth.eval.records import read_chunk

    (folder,) = (root / "outputs" / "tiny-cpu").glob(f"*/eval/{run}/amc23")
    rows = [row for chunk in sorted(folder.glob("chunk_*.jsonl.gz")) for row in read_chunk(chunk)]
    return [[c["text"] for c in row["completions"]] for row in rows]


def _kill_after_first_checkpoint(run_dir: Path, marker: str, stop: threading.Event, killed: list):
    """SIGKILL the training process writing ``run_dir`` once its checkpoint-1 is complete (a pre-empted or
    OOM-killed job): found by its command line, wherever the executor started it."""
    while not stop.is_set():
        if (run_dir / "checkpoint-1" / "trainer_state.json").is_file():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                variant = argv[argv.index(b"--variant") + 1] if b"--variant" in argv else None
                if variant == run_dir.name.encode() and marker.encode() in b" ".join(argv):
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))
            return
        time.sleep(0.02)


# ------------------------------------------------------------------------------- the tiny sweep end to end
@pytest.mark.slow
@pytest.mark.parametrize("name", ["slurm", "ray"])
def test_executor_runs_the_tiny_sweep_resumes_a_killed_job_and_matches_local(
    name, tiny_sweep, sft_dir, tmp_path, capsys
):
    local_root, _ = tiny_sweep
    argv = tiny_sweep_argv(sft_dir, tmp_path, *ONE_CONFIG, *EXECUTOR_ARGS[name])
    cfg = sweep.parse_args(argv)
    run_dir = sweep.build_jobs(cfg, sweep.validate(cfg))[3].manifest_dir
    assert run_dir.name == "grpo_seed1"
    stop, killed = threading.Event(), []
    watcher = threading.Thread(
        target=_kill_after_first_checkpoint, args=(run_dir, f"{tmp_path}/outputs", stop, killed)
    )
    watcher.start()
    try:
        first = sweep.main(argv)
    finally:
        stop.set()
        watcher.join()
    out, err = capsys.readouterr()
    assert killed, f"the training job was not caught between its checkpoints; the sweep said:\n{out}\n{err}"
    assert first == 1
    log = tmp_path / "outputs" / "tiny-cpu" / "logs" / "grpo_seed1.log"
    assert f"grpo_seed1: FAILED (exit -{int(signal.SIGKILL)}), see {log}" in out
    assert "eval_grpo_seed1: not run, an input failed" in out and "eval_grpo_seed3407: done" in out
    assert "not finished: eval_grpo_seed1, grpo_seed1, report" in err  # the report waits for every evaluation

    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    for job in ("grpo_seed3407", "eval_grpo_seed3407", "eval_sft"):
        assert f"{job}: finished before with the same inputs, reused" in out
    assert "grpo_seed1: started" in out and "report: done" in out
    assert "resuming from checkpoint-" in log.read_text()  # not from step 0
    assert (tmp_path / "results" / "tiny-cpu" / "report.md").is_file()
    ours, local = _summary(tmp_path), _summary(local_root)
    assert sorted(ours) == ["grpo (mean of 2 seeds)", "grpo_seed1", "grpo_seed3407", "sft"]
    assert ours == {run: local[run] for run in ours}  # every run and the mean, number for number
    # the tiny model scores 0 everywhere, so the numbers alone would not tell runs apart: the trained
    # adapters are the local run's byte for byte (the killed run resumed exactly), and so are the samples
    for run in ("grpo_seed3407", "grpo_seed1"):
        assert _adapter(tmp_path, run) == _adapter(local_root, run), run
    for run in ("sft", "grpo_seed3407", "grpo_seed1"):
        assert _completions(tmp_path, run) == _completions(local_root, run), run

    assert sweep.main([*argv, "--rlvr_args", "--max_steps 3"]) == 2  # a folder written with other arguments
    assert "was written with" in capsys.readouterr().err
    # No credential in any file either run wrote: job records, logs, submitit's pickles (slurm/), the runs'
    # training_args.bin, results; nor in Ray's session files (task specs, worker logs) for the ray executor.
    assert files_holding(tmp_path, HUB_TOKEN, WANDB_KEY) == []
    if name == "slurm":
        assert list(
            (tmp_path / "outputs" / "tiny-cpu" / "slurm").rglob("*_submitted.pkl")
        )  # what was grepped
    session = Path("/tmp/ray/session_latest")
    if name == "ray" and session.exists():
        assert files_holding(session.resolve(), HUB_TOKEN, WANDB_KEY) == []


# --------------------------------------------------------------------------------------------- one line
@pytest.mark.parametrize("name, module", [("slurm", "submitit"), ("ray", "ray")])
def test_a_missing_optional_dependency_is_one_line_naming_the_extra(
    name, module, sft_dir, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, module, None)  # import submitit / ray raises ImportError
    assert sweep.main(tiny_sweep_argv(sft_dir, Path("/nonexistent"), "--executor", name)) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: executor: {name} needs {module}, which is not installed: pip install 'sage-unsloth[{name}]' "
        "(or choose executor: local)"
    )


def test_an_executor_that_cannot_start_is_one_line_and_exit_1(sft_dir, tmp_path, monkeypatch, capsys):
    import ray

    def init(**kwargs):
        raise Exception("The current node timed out during startup. This could happen because ...")  # noqa: TRY002

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)  # what Ray 2.60 raises when its raylet is not up within 30 s
    assert sweep.main(tiny_sweep_argv(sft_dir, tmp_path, *EXECUTOR_ARGS["ray"])) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "error: executor ray: could not start Ray here: The current node timed out during startup. "
        + ("This could happen because ...")
    )


@pytest.mark.parametrize(
    "override, needle",
    [
        (["--executor", "pbs"], "executor='pbs' is unknown (use one of local, ray, slurm)"),
        (
            ["--executor", "slurm", "--executor_settings", "{partion: gpu}"],
            "slurm.partion is not a setting of executor slurm; did you mean partition?",
        ),
        (
            ["--executor", "slurm", "--executor_settings", "{time_min: 0}"],
            "slurm.time_min=0: must be an integer >= 1",
        ),
        (["--executor", "ray", "--executor_settings", "[GPU]"], "executor_settings=['GPU']: a mapping"),
        (
            ["--executor", "slurm", "--slurm", "{time_min: 5}"],
            "--slurm is retired: write executor: slurm and its",
        ),
        (
            ["--executor", "ray", "--executor_settings", "{resources: {GPU: x}}"],
            "ray.resources={'GPU': 'x'}: a mapping",
        ),
    ],
)
def test_bad_executor_settings_are_refused_where_the_config_is_built(override, needle):
    with pytest.raises(ValueError) as caught:
        sweep.parse_args([str(TINY_SWEEP), *override])
    assert str(caught.value).startswith(needle) and "\n" not in str(caught.value), caught.value


def test_a_flag_changes_one_setting_and_keeps_the_others(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text(
        f"base: {TINY_SWEEP}\nexecutor: slurm\nexecutor_settings: {{partition: gpu, time_min: 600}}\n"
    )
    cfg = sweep.parse_args([str(config), "--executor_settings", "{time_min: 30}"])
    assert cfg.executor_settings == {"partition": "gpu", "time_min": 30}


def test_the_registry_holds_the_three_executors():
    assert {"local", "slurm", "ray"} <= set(EXECUTORS)
    assert EXECUTORS["local"].uses_local_slots and not EXECUTORS["slurm"].uses_local_slots


# ------------------------------------------------------------------------------------------- multi-node
@pytest.mark.parametrize(
    "nodelist, host",
    [("gpu007", "gpu007"), ("gpu[007-009,012]", "gpu007"), ("a[3,5],b1", "a3"), ("n1,n2", "n1")],
)
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert slurm.first_host(nodelist) == host


def _accelerate_args(argv: list[str]):
    """What accelerate itself makes of a launch command: its parser, its config-file merge, then the
    multi-GPU preparation that fills in what torch.distributed's launcher is given (nnodes, node_rank,
    master_addr, ...)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    at = argv.index("accelerate.commands.launch")
    args = launch_command_parser().parse_args(argv[at + 1 :])
    args, *_ = _validate_launch_command(args)
    prepare_multi_gpu_env(args)
    return args


def test_the_multinode_accelerate_config_is_a_two_node_ddp_config():
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import DistributedType

    config = ClusterConfig.from_yaml_file(str(MULTINODE))
    assert config.distributed_type == DistributedType.MULTI_GPU and config.num_machines >= 2
    assert config.rdzv_backend == "static" and config.mixed_precision == "no"
    assert config.num_processes % config.num_machines == 0


def test_gpus_per_job_above_a_node_is_a_multinode_slurm_job(monkeypatch, tmp_path):
    """16 GPUs a job on nodes of 8: training asks submitit for 2 nodes x 8 GPUs with one task per node,
    each node launches accelerate with its rank and the first node's address; evaluation stays on one."""
    settings = "{partition: gpu, account: lab, gpus_per_node: 8, cpus_per_job: 12, time_min: 600, "
    settings += "array_parallelism: 4, sbatch: {qos: high}}"
    cfg = sweep.parse_args(
        [str(TINY_SWEEP), "--sft_dir", "sft", "--gpus", "auto", "--gpus_per_job", "16"]
        + ["--executor", "slurm", "--executor_settings", settings, "--output_root", str(tmp_path)]
    )
    executor = make_executor("slurm", cfg.executor_settings, tmp_path / "submitit")
    slots = sweep.executor_slots(cfg, executor)
    assert len(slots) == 4 and {s.gpus for s in slots} == {16}
    jobs = {j.name: j for j in sweep.build_jobs(cfg, "tiny")}
    tasks = [
        Task(j, sweep._argv(jobs[j], slots[0], cfg), tmp_path / f"{j}.log", kind=jobs[j].kind, gpus=16)
        for j in ("grpo_seed3407", "grpo_branch_seed3407", "eval_grpo_seed3407")
    ]
    submitted = []

    class Recorder:  # stands in for submitit.AutoExecutor: what would be submitted, and with which parameters
        def __init__(self, params):
            self.params = params

        def batch(self):
            import contextlib

            return contextlib.nullcontext()

        def submit(self, fn, *args):
            submitted.append((self.params, fn, args))
            return object()

    monkeypatch.setattr(executor, "_executor", lambda params, name: Recorder({**params, "name": name}))
    executor.submit(tasks)
    (train, fn1, args1), (_, fn2, _), (evaluate, fn3, _) = submitted
    assert fn1 is fn2 is slurm.run_on_node and fn3 is slurm.run_command
    assert (
        train["name"] == "sage-rlvr" and evaluate["name"] == "sage-eval_grpo_seed3407"
    )  # the 2 runs: an array
    assert (train["nodes"], train["tasks_per_node"], train["gpus_per_node"]) == (2, 1, 8)
    assert (evaluate["nodes"], evaluate["gpus_per_node"]) == (1, 8)
    assert train["slurm_partition"] == "gpu" and train["slurm_account"] == "lab"
    assert train["slurm_additional_parameters"] == {"qos": "high"} and train["slurm_array_parallelism"] == 4

    # the sbatch file submitit writes for it (submitit's SLURM executor, told that srun exists)
    import submitit

    monkeypatch.setattr(submitit.slurm.slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    real = submitit.AutoExecutor(folder=str(tmp_path / "sb"), cluster="slurm")
    real.update_parameters(**train)
    sbatch = real._executor._make_submission_file_text("python -m x", "uid")
    for line in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--cpus-per-task=12", "--time=600",
                 "--partition=gpu", "--account=lab", "--qos=high", "--job-name=sage-rlvr"):  # fmt: skip
        assert f"#SBATCH {line}\n" in sbatch, line

    # on node 1 of the job: SLURM's environment gives the rank, the main node and the port
    task, config, port = args1
    assert config == "configs/accelerate/multinode.yaml" and port is None
    for key, value in {"SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_ID": "4242",
                       "SLURM_JOB_NODELIST": "gpu[007-008]"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    ran = {}
    monkeypatch.setattr(slurm, "run_command", lambda t, argv, log: ran.update(argv=argv, log=log) or 0)
    assert slurm.run_on_node(task, config, port) == 0
    assert ran["log"] == tmp_path / "grpo_seed3407.node1.log"  # node 0 writes the job's own log
    args = _accelerate_args(ran["argv"])
    assert args.multi_gpu and (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", 1, "8")
    endpoint = getattr(args, "rdzv_endpoint", None) or f"{args.master_addr}:{args.master_port}"
    assert endpoint == f"gpu007:{29500 + 4242 % 1000}"
    assert ran["argv"][ran["argv"].index("-m", 3) + 1] == "sage_unsloth.rlvr"  # the same stage command


def test_a_multinode_job_needs_whole_nodes():
    with pytest.raises(ValueError, match=r"gpus_per_job=12 spans nodes of slurm.gpus_per_node=8 GPUs"):
        slurm.check_gpus(slurm.SlurmSettings(gpus_per_node=8), 12)
    slurm.check_gpus(slurm.SlurmSettings(gpus_per_node=8), 16)


# ---------------------------------------------------------------------------------------- the lab's runner
def test_the_lab_runner_runs_its_steps_through_an_executor(tmp_path):
    """The job graph's run_steps (sage_unsloth/jobs), as the lab calls it, with submitit's local executor: steps in dependency order, the
    same stamps (a rerun reuses both), and a failing step is an error naming its log."""
    from sage_unsloth.demo import run as lab
    from sage_unsloth.jobs import Step, run_steps

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    write_a = f"import pathlib; pathlib.Path({str(a)!r}).write_text('1')"
    write_b = f"import pathlib; p = pathlib.Path({str(a)!r}); pathlib.Path({str(b)!r}).write_text(p.read_text() + '2')"
    steps = [
        Step("a", [sys.executable, "-c", write_a], (a,), light=True),
        Step("b", [sys.executable, "-c", write_b], (b,), after=("a",), light=True),
    ]
    args = lab.parse_args(["--executor", "slurm", "--executor-settings", "{cluster: local, cpus_per_job: 1}"])
    executor = lab._executor(args, tmp_path / "work")

    def run(steps, jobs=2):  # as the lab runs its steps, on this executor
        work = tmp_path / "work"
        return run_steps(
            steps, work=work, jobs=jobs, threads=1, echo=lambda line: None, executor=executor, **lab.LAB_RUN
        )

    records = run(steps)
    assert [r.status for r in records] == ["ran", "ran"] and b.read_text() == "12"
    assert list(
        (tmp_path / "work" / "executor" / "slurm").glob("*/*_submitted.pkl")
    )  # it went through submitit
    assert [r.status for r in run(steps)] == ["reused", "reused"]

    failing = [Step("c", [sys.executable, "-c", "raise SystemExit(3)"], (tmp_path / "c.txt",), light=True)]
    with pytest.raises(RuntimeError, match=r"\[demo\] c failed \(exit 3\); last lines of .*c\.log"):
        run(failing, jobs=1)


def test_a_bad_lab_executor_is_one_line(tmp_path):
    from sage_unsloth.demo import run as lab

    with pytest.raises(ValueError, match=r"^executor='pbs' is unknown: choose one of local, ray, slurm$"):
        lab._executor(lab.parse_args(["--executor", "pbs"]), tmp_path)
    with pytest.raises(ValueError, match=r"^executor-settings=\[1\]: a mapping"):
        lab._executor(lab.parse_args(["--executor", "ray", "--executor-settings", "[1]"]), tmp_path)


@pytest.mark.parametrize("jobs", [1, 2])
def test_slurm_on_this_machine_honours_jobs_and_shares_the_cores(jobs, monkeypatch, tmp_path, capsys):
    """Issue 41: `slurm: {cluster: local}` announced 8 CPUs a job and 6 jobs at once on 2 cores, ignoring
    `jobs: 2`. Now the machine's slots bound it as they bound local jobs: `jobs` at once, cores // jobs each
    (OMP_NUM_THREADS of the jobs too); a real cluster keeps its own settings."""
    monkeypatch.setattr(slurm.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(sweep.os, "cpu_count", lambda: 2)
    argv = [str(TINY_SWEEP), "--sft_dir", "sft", "--output_root", str(tmp_path), "--jobs", str(jobs)]
    cfg = sweep.parse_args([*argv, "--executor", "slurm", "--executor_settings", "{cluster: local}"])
    executor = make_executor("slurm", cfg.executor_settings, tmp_path / "submitit")
    slots = sweep.executor_slots(cfg, executor)
    assert len(slots) == jobs and executor.capacity(6) == jobs
    assert f"{2 // jobs} CPUs" in executor.describe()
    assert (
        slurm.job_parameters(executor.settings, Task("x", [], tmp_path / "x.log"))["cpus_per_task"]
        == 2 // jobs
    )
    cluster = sweep.parse_args([*argv, "--executor", "slurm", "--executor_settings", "{partition: cpu}"])
    remote = make_executor("slurm", cluster.executor_settings, tmp_path / "submitit2")
    assert len(sweep.executor_slots(cluster, remote)) == 6 and "8 CPUs" in remote.describe()
