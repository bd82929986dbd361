"""The kit's one job graph (sage_unsloth/jobs): the done rule (the input fingerprint in a stamp beside complete
outputs) for steps that keep their outputs (the sweep's stages: resume in them, refuse anyone else's) and for
those that do not (the demo lab's: deleted before a rerun), the sweep's jobs planned by it, and keep_going."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from sage_unsloth import jobs
from sage_unsloth.jobs import graph, sweep

REPO = Path(__file__).resolve().parents[2]


def stage_step(tmp_path, name="train", *, config_text="lr: 1", marker="manifest.json", after=(), args=()):
    """A step like a sweep's stage: writes ``<tmp>/<name>/part`` then its done file last; keeps its folder."""
    config = tmp_path / f"{name}.yaml"
    if not config.is_file() or config.read_text() != config_text:
        config.write_text(config_text)
    folder = tmp_path / name
    code = (
        f"import pathlib; p = pathlib.Path({str(folder)!r}); p.mkdir(exist_ok=True); "
        f"(p / 'part').write_text((p / 'part').read_text() + '+' if (p / 'part').exists() else 'x'); "
        f"(p / {marker!r}).write_text('{{}}')"
    )
    return jobs.Step(
        name,
        [sys.executable, "-c", code, *args],
        (folder,),
        after=after,
        configs=(config,),
        code=None,
        done_file="manifest.json",
        keep=True,
    )


def run(steps, tmp_path, **kw):
    lines = []
    records = jobs.run_steps(steps, work=tmp_path / "work", jobs=1, threads=1, echo=lines.append, **kw)
    return {r.name: r.status for r in records}, lines


def test_a_kept_step_with_the_same_inputs_is_reused_and_with_other_inputs_is_refused_untouched(tmp_path):
    assert run([stage_step(tmp_path)], tmp_path)[0] == {"train": "ran"}
    stamp = json.loads((tmp_path / "work" / "steps" / "train.json").read_text())
    assert stamp["command"][0] == "-c" and stamp["finished"]  # the command without the interpreter
    assert run([stage_step(tmp_path)], tmp_path)[0] == {"train": "reused"}
    with pytest.raises(ValueError) as caught:  # the config's content changed: never reused, never deleted
        run([stage_step(tmp_path, config_text="lr: 2")], tmp_path)
    message = str(caught.value)
    assert "from other inputs" in message and "delete it" in message and "\n" not in message
    with pytest.raises(ValueError, match=r"was written with -c .*, not by"):  # another command
        run([stage_step(tmp_path, args=("--max_steps", "3"))], tmp_path)
    assert (tmp_path / "train" / "part").read_text() == "x"  # nothing of it was touched


def test_a_half_written_output_is_not_done_and_its_step_continues_in_it(tmp_path):
    step = stage_step(tmp_path)
    run([step], tmp_path)
    (tmp_path / "train" / "manifest.json").unlink()  # killed before its done file: half written
    assert jobs.plan([step], tmp_path / "work" / "steps")[1] == {"train"}
    assert run([step], tmp_path)[0] == {"train": "ran"}
    assert (tmp_path / "train" / "part").read_text() == "x+"  # resumed in its folder, not started afresh


def test_a_step_killed_after_it_started_resumes_and_its_stamp_is_not_done(tmp_path):
    step = stage_step(tmp_path)
    fingerprints, _ = jobs.plan([step], tmp_path / "work" / "steps")
    graph.write_stamp(tmp_path / "work" / "steps", step, fingerprints["train"])  # started, never finished
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "part").write_text("x")
    (tmp_path / "train" / "manifest.json").write_text("{}")  # even with its done file: no finish time
    stamp = jobs.read_stamp(tmp_path / "work" / "steps", "train")
    assert not jobs.is_done(step, stamp, fingerprints["train"])
    assert run([step], tmp_path)[0] == {"train": "ran"}


def test_an_upstream_change_reruns_what_reads_it_and_a_deleted_step_output_is_redone(tmp_path):
    first = jobs.Step("a", [sys.executable, "-c", _write(tmp_path / "a.txt", "1")], (tmp_path / "a.txt",))
    second = stage_step(tmp_path, "b", after=("a",))
    assert run([first, second], tmp_path)[0] == {"a": "ran", "b": "ran"}
    (
        tmp_path / "a.txt"
    ).unlink()  # a's output gone: a reruns with the same inputs, so b runs again in its folder
    assert run([first, second], tmp_path)[0] == {"a": "ran", "b": "ran"}
    changed = jobs.Step("a", [sys.executable, "-c", _write(tmp_path / "a.txt", "2")], (tmp_path / "a.txt",))
    with pytest.raises(ValueError, match="from other inputs"):  # b's inputs changed: its folder is refused
        run([changed, second], tmp_path)


def test_outputs_without_a_stamp_or_with_a_damaged_one_are_refused_for_a_kept_step(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="was written by another driver or by hand"):
        run([stage_step(tmp_path)], tmp_path)
    (tmp_path / "work" / "steps" / "train.json").write_text('{"fingerprint": ')
    with pytest.raises(ValueError, match=r"train.json line 1 is damaged: delete it and .*train, then rerun"):
        run([stage_step(tmp_path)], tmp_path)


def test_a_legacy_sweep_record_of_the_same_command_counts_as_the_same_inputs(tmp_path):
    step = stage_step(tmp_path)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "part").write_text("x")
    (tmp_path / "train" / "manifest.json").write_text("{}")
    stamps = tmp_path / "work" / "steps"
    stamps.mkdir(parents=True)
    (stamps / "train.json").write_text(json.dumps({"command": step.command}))
    assert run([step], tmp_path)[0] == {"train": "reused"}
    (stamps / "train.json").write_text(json.dumps({"command": ["-c", "other"]}))
    with pytest.raises(ValueError, match="was written with -c other"):
        run([step], tmp_path)


def test_a_step_that_does_not_keep_its_outputs_has_half_written_ones_deleted(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "stale").write_text("half")  # no stamp: never done, and not this run's to keep
    code = f"import pathlib; p = pathlib.Path({str(folder)!r}); p.mkdir(); (p / 'new').write_text('1')"
    assert run([jobs.Step("s", [sys.executable, "-c", code], (folder,))], tmp_path)[0] == {"s": "ran"}
    assert sorted(p.name for p in folder.iterdir()) == ["new"]


def test_code_enters_the_fingerprint_only_of_steps_that_name_it(monkeypatch, tmp_path):
    with_code = jobs.Step("a", ["python", "-c", "pass"], (), code=())
    without = jobs.Step("a", ["python", "-c", "pass"], (), code=None)
    before = jobs.fingerprint(with_code, {}), jobs.fingerprint(without, {})
    monkeypatch.setattr(graph, "code_digest", lambda parts: "other code")
    assert jobs.fingerprint(with_code, {}) != before[0] and jobs.fingerprint(without, {}) == before[1]
    # the interpreter is no input: the same command under another Python is the same step
    assert jobs.fingerprint(jobs.Step("a", ["/other/python", "-c", "pass"], (), code=None), {}) == before[1]


def test_keep_going_blocks_only_what_reads_a_failed_step(tmp_path):
    bad = jobs.Step("bad", [sys.executable, "-c", "raise SystemExit(3)"], (tmp_path / "x",))
    reader = jobs.Step("reader", [sys.executable, "-c", "pass"], (tmp_path / "y",), after=("bad",))
    other = jobs.Step("other", [sys.executable, "-c", _write(tmp_path / "z", "1")], (tmp_path / "z",))
    status, lines = run([bad, reader, other], tmp_path, keep_going=True, tag="[t]")
    assert status == {"bad": "failed", "reader": "blocked", "other": "ran"}
    assert any(line.startswith("[t] bad: FAILED (exit 3), see ") for line in lines)
    assert "[t] reader: not run, an input failed" in lines


def _write(path, text):
    return f"import pathlib; pathlib.Path({str(path)!r}).write_text({text!r})"


# ------------------------------------------------------------------------- the sweep's jobs in the same graph
@pytest.fixture
def sweep_plan(tmp_path, monkeypatch):
    """The tiny sweep's jobs against a stand-in SFT folder (nothing trains): (argv, the jobs, the stamps)."""
    monkeypatch.chdir(REPO)
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "manifest.json").write_text(json.dumps({"stage": "sft", "base_model": "tiny/model"}))
    shutil.copytree(REPO / "configs" / "rlvr" / "tiny-cpu", tmp_path / "configs")  # the config and its bases
    config = tmp_path / "configs" / "grpo.yaml"
    argv = ["configs/sweep/tiny-cpu.yaml", "--sft_dir", str(sft), "--configs", str(config), "--seeds", "1"]
    argv += ["--output_root", str(tmp_path / "o"), "--results_dir", str(tmp_path / "r")]
    cfg = sweep.parse_args(argv)
    return cfg, sweep.build_jobs(cfg, sweep.validate(cfg)), tmp_path / "o" / "tiny-cpu" / "steps"


def _finish(job, fingerprints, stamps):
    job.manifest_dir.mkdir(parents=True, exist_ok=True)
    (job.manifest_dir / "manifest.json").write_text("{}")
    graph.write_stamp(stamps, job, fingerprints[job.name], finished="now")


def test_the_sweeps_jobs_are_reused_resumed_or_refused_by_the_one_rule(sweep_plan, tmp_path):
    cfg, steps, stamps = sweep_plan
    assert [j.name for j in steps] == ["eval_sft", "grpo_seed1", "eval_grpo_seed1", "report"]
    assert steps[1].manifest_dir.name == "grpo_seed1"  # layout.run_name
    fingerprints, to_run = jobs.plan(steps, stamps)
    assert to_run == {j.name for j in steps}
    for job in steps:
        _finish(job, fingerprints, stamps)
    assert jobs.plan(steps, stamps)[1] == set()  # every input the same: all reused
    (steps[1].manifest_dir / "manifest.json").unlink()  # the run killed before its manifest: half written
    assert jobs.plan(steps, stamps)[1] == {"grpo_seed1", "eval_grpo_seed1", "report"}
    (steps[1].manifest_dir / "manifest.json").write_text("{}")
    config = Path(cfg.configs[0])
    config.write_text(config.read_text() + "\nlearning_rate: 2.0e-5\n")  # its config changed, same command
    with pytest.raises(ValueError, match=r"grpo_seed1 was written with this command from other inputs"):
        jobs.plan(sweep.build_jobs(cfg, sweep.validate(cfg)), stamps)


def test_one_record_folder_adopts_the_earlier_names(tmp_path):
    """<work>/steps is the one record folder of the job graph (the lab's, a sweep's, a notebook's); a sweep's
    ``jobs/`` or a notebook's ``stages/`` of before is renamed to it, its stamps kept; a dry run only reads it."""
    from sage_unsloth.jobs import stamp_folder

    for earlier in ("jobs", "stages"):
        work = tmp_path / earlier
        (work / earlier).mkdir(parents=True)
        (work / earlier / "train.json").write_text("{}")
        assert stamp_folder(work, adopt=False) == work / earlier and (work / earlier).is_dir()  # read only
        assert stamp_folder(work) == work / "steps" and (work / "steps" / "train.json").is_file()
        assert not (work / earlier).exists()
    fresh = tmp_path / "fresh"
    assert stamp_folder(fresh) == fresh / "steps" and not fresh.exists()  # created by whoever writes a stamp
