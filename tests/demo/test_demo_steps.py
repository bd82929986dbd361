"""The kit's job graph (sage_unsloth/jobs) as the demo lab runs it: fingerprinted stamps, reruns of changed steps
only, failures, CPU time, thread shares, progress."""

import json
import sys

import pytest

from sage_unsloth import jobs as S
from sage_unsloth.jobs import cores
from sage_unsloth.jobs.progress import file_progress, progress_line


def python_step(name, code, *outputs, **kw):
    """A step that runs ``code`` in this interpreter and is done when ``outputs`` exist."""
    return S.Step(name, [sys.executable, "-c", code], outputs=outputs, **kw)


def write_step(name, out, *, text="x", after=(), configs=(), extra_code=""):
    code = f"import pathlib; {extra_code}pathlib.Path({str(out)!r}).write_text({text!r})"
    return python_step(name, code, out, after=after, configs=configs)


def names_ran(records):
    return [r.name for r in records if r.status == "ran"]


def pipeline(tmp_path, config_text="lr: 1", b_text="b"):
    config = tmp_path / "b.yaml"
    config.write_text(config_text)
    return [
        write_step("a", tmp_path / "a.txt"),
        write_step("b", tmp_path / "b.txt", text=b_text, after=("a",), configs=(config,)),
        write_step("c", tmp_path / "c.txt", after=("b",)),
        write_step("d", tmp_path / "d.txt", after=("a",)),
    ]


def run(steps, tmp_path, **kw):
    lines = []
    records = S.run_steps(
        steps, work=tmp_path / "work", jobs=2, threads=1, progress_every=0.5, echo=lines.append, **kw
    )
    return records, lines


def test_a_rerun_reuses_every_step_whose_inputs_did_not_change(tmp_path):
    records, _ = run(pipeline(tmp_path), tmp_path)
    assert names_ran(records) == ["a", "b", "c", "d"]
    stamp = json.loads((tmp_path / "work" / "steps" / "b.json").read_text())
    assert stamp["fingerprint"] == records[1].fingerprint and stamp["wall_s"] >= 0
    again, lines = run(pipeline(tmp_path), tmp_path)
    assert names_ran(again) == [] and all("reused" in line for line in lines)
    assert [r.cpu_s for r in again] == [r.cpu_s for r in records]  # timings read back, not replaced


def test_a_changed_config_or_command_reruns_that_step_and_what_follows_only(tmp_path):
    run(pipeline(tmp_path), tmp_path)
    records, _ = run(pipeline(tmp_path, config_text="lr: 2"), tmp_path)
    assert names_ran(records) == ["b", "c"]
    records, _ = run(pipeline(tmp_path, config_text="lr: 2", b_text="changed"), tmp_path)
    assert names_ran(records) == ["b", "c"] and (tmp_path / "b.txt").read_text() == "changed"


def test_a_missing_output_or_stamp_reruns_the_step(tmp_path):
    run(pipeline(tmp_path), tmp_path)
    (tmp_path / "d.txt").unlink()
    assert names_ran(run(pipeline(tmp_path), tmp_path)[0]) == ["d"]
    (tmp_path / "work" / "steps" / "a.json").unlink()
    assert names_ran(run(pipeline(tmp_path), tmp_path)[0]) == ["a", "b", "c", "d"]


def test_outputs_of_a_rerun_step_are_deleted_before_it_runs(tmp_path):
    folder = tmp_path / "out"
    code = f"import pathlib; p = pathlib.Path({str(folder)!r}); p.mkdir(); (p / 'new').write_text('1')"
    step = python_step("s", code, folder)
    folder.mkdir()
    (folder / "stale").write_text("old")
    run([step], tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["new"]


def test_a_failing_step_stops_the_run_with_its_log_and_a_missing_output_is_a_failure(tmp_path):
    bad = python_step("bad", "print('boom here'); raise SystemExit(3)", tmp_path / "x")
    with pytest.raises(RuntimeError, match=r"(?s)bad failed \(exit 3\).*boom here"):
        run([bad], tmp_path)
    silent = python_step("silent", "pass", tmp_path / "y")
    with pytest.raises(RuntimeError, match="silent failed .no .*y"):
        run([silent], tmp_path)
    assert not (tmp_path / "work" / "steps" / "silent.json").exists()


def test_a_rerun_says_what_it_cost_itself_apart_from_the_reused_steps(tmp_path):
    """A rerun that reused 12 steps and ran 3 in 125 s says 125 s, not the 400 s of the last complete run that
    the timings' total keeps (main 0298207: "finished: 400 s wall, ... over all steps")."""
    from sage_unsloth.demo.run import finished_line, write_timings

    def record(name, status, cpu):
        return S.StepRecord(name, status, wall_s=cpu, cpu_s=cpu, threads=1, finished="t")

    first = [record(f"s{i}", "ran", 25.0) for i in range(15)]
    (tmp_path / "r").mkdir()
    total = write_timings(tmp_path / "r", tmp_path / "w", first, 400.0)
    assert finished_line(first, 400.0, total) == "400 s wall, 375 s CPU over all steps"
    rerun = [record(f"s{i}", "reused", 25.0) for i in range(12)] + [
        record(f"s{i}", "ran", 10.0) for i in (12, 13, 14)
    ]
    total = write_timings(tmp_path / "r", tmp_path / "w", rerun, 125.0)
    assert total["wall_s"] == 400.0  # the timings keep the last complete run's wall time ...
    line = finished_line(rerun, 125.0, total)
    assert line.startswith("125 s wall and 30 s CPU for the 3 steps that ran; 12 reused from earlier runs"), (
        line
    )
    assert line.endswith("(300 s CPU when they ran, the last complete run 400 s wall)"), (
        line
    )  # ... said as such


def test_cpu_time_is_measured_and_threads_reach_the_step(tmp_path):
    out = tmp_path / "threads.txt"
    code = (
        "import os, pathlib, time\nt = time.process_time()\n"
        "while time.process_time() - t < 0.6: pass\n"
        f"pathlib.Path({str(out)!r}).write_text(os.environ['OMP_NUM_THREADS'])"
    )
    busy = python_step("busy", code, out)
    records = S.run_steps([busy], work=tmp_path / "work", jobs=1, threads=3, echo=lambda _: None)
    assert records[0].cpu_s >= 0.5 and records[0].threads == 3 and out.read_text() == "3"


def test_idle_cores_read_the_cpu_time_now_not_the_load_average(monkeypatch):
    # (idle jiffies, total jiffies) before and after the sample: 2 CPUs, 150 of 200 jiffies idle -> 1.5 -> 2
    samples = iter([(1000, 4000), (1150, 4200)])
    monkeypatch.setattr(cores, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    monkeypatch.setattr(cores.os, "getloadavg", lambda: (1.1, 1.0, 1.0))  # the idle VM's load average
    assert cores.idle_cores(interval=0) == 2
    samples = iter([(1000, 4000), (1040, 4200)])  # 20% idle: 0.4 of a core -> still 1 (at least one)
    assert cores.idle_cores(interval=0) == 1
    samples = iter([(1000, 4000), (1200, 4200)])  # all idle, but only 1 usable core (affinity)
    monkeypatch.setattr(cores, "usable_cores", lambda: 1)
    assert cores.idle_cores(interval=0) == 1


def test_idle_cores_fall_back_to_the_load_average_without_proc_stat(monkeypatch):
    def missing():
        raise OSError("no /proc/stat")

    monkeypatch.setattr(cores, "_cpu_times", missing)
    monkeypatch.setattr(cores, "usable_cores", lambda: 4)
    monkeypatch.setattr(cores.os, "getloadavg", lambda: (2.2, 1.0, 1.0))
    assert cores.idle_cores(interval=0) == 2


def test_cpu_times_parse_this_machines_proc_stat():
    idle, total = cores._cpu_times()
    assert 0 <= idle <= total and total > 0


def test_a_light_step_beside_a_heavy_one_takes_no_share_of_the_idle_cores():
    heavy, light = S.Step("model", ["x"], outputs=()), S.Step("data", ["x"], outputs=(), light=True)
    # the pre-training starts beside the data step: it gets both idle cores, the data step one thread
    assert cores.threads_for(heavy, free=2, heavy_waiting=0, heavy_running=0, jobs=2) == 2
    assert cores.threads_for(light, free=2, heavy_waiting=0, heavy_running=1, jobs=2) == 1
    # two heavy steps at once share the cores; jobs caps how many count
    assert cores.threads_for(heavy, free=2, heavy_waiting=3, heavy_running=0, jobs=2) == 1
    assert cores.threads_for(heavy, free=8, heavy_waiting=5, heavy_running=1, jobs=2) == 4
    assert cores.threads_for(heavy, free=1, heavy_waiting=0, heavy_running=1, jobs=2) == 1


def test_the_first_heavy_step_gets_every_idle_core_when_only_light_steps_start_beside_it(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(cores, "idle_cores", lambda: 2)
    seen = {}

    def thread_step(name, **kw):
        out = tmp_path / f"{name}.txt"
        seen[name] = out
        code = f"import os, pathlib; pathlib.Path({str(out)!r}).write_text(os.environ['OMP_NUM_THREADS'])"
        return python_step(name, code, out, **kw)

    steps = [
        thread_step("model"),
        thread_step("data", light=True),
        thread_step("sft", after=("model", "data")),
    ]
    S.run_steps(steps, work=tmp_path / "work", jobs=2, echo=lambda _: None)
    assert {n: p.read_text() for n, p in seen.items()} == {"model": "2", "data": "1", "sft": "2"}


def test_progress_line_reads_the_last_tqdm_bar_and_metrics():
    log = (
        "{'loss': '0.52', 'reward': '0.25'}\n 10%|#  | 20/200 [00:10<01:30,  2.00it/s]\r"
        " 20%|## | 40/200 [00:20<01:20,  1.25s/it]\n{'loss': '0.31', 'reward': '0.5', 'step': 40}\n"
    )
    assert progress_line(log) == "40/200, 0.80 steps/s, ETA 01:20, reward 0.500, loss 0.310"
    assert progress_line("no bar yet") is None
    assert progress_line("Loading weights: 100%|##| 26/26 [00:00<00:00, 9000.00it/s]") is None


def test_file_progress_counts_the_files_written_so_far(tmp_path):
    for i in range(3):
        (tmp_path / f"chunk_{i}.jsonl.gz").write_text("")
    assert (
        file_progress(str(tmp_path / "chunk_*.jsonl.gz"), 10, elapsed=30.0)
        == "3/10 chunks, 0.10 chunks/s, ETA 01:10"
    )
    assert file_progress(str(tmp_path / "none_*"), 10, elapsed=5.0).endswith("ETA ?")


@pytest.mark.slow
def test_pretraining_does_not_depend_on_the_thread_count(tmp_path):
    import hashlib

    import safetensors.torch
    import torch

    from sage_unsloth.demo.data import DemoDataSpec
    from sage_unsloth.demo.model import build_demo_model
    from sage_unsloth.demo.pretrain import pretrain_base_model

    pool = DemoDataSpec().splits()["sft"]
    digests = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            folder = build_demo_model(tmp_path / f"t{threads}")
            pretrain_base_model(folder, pool, steps=3, batch_size=8)
            weights = safetensors.torch.load_file(folder / "model.safetensors")
            digests.append(
                hashlib.sha256(b"".join(weights[k].numpy().tobytes() for k in sorted(weights))).hexdigest()
            )
    finally:
        torch.set_num_threads(before)
    assert digests[0] == digests[1]
