"""Stage 3's progress from measured rates (sage_unsloth/eval/progress.py): in a log, where a bar draws nothing, a
line per chunk with what is left at the rate this run measured, and at the end what sampling took beside the
backend rule's estimate. Main 0298207 printed nothing in a log, and only the rule's fixed-cost estimate."""

from sage_unsloth import cli
from sage_unsloth.eval.progress import SamplingProgress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_lines_say_what_is_left_at_the_measured_rate():
    clock, lines = Clock(), []
    progress = SamplingProgress(
        100, 20, "tiny/sft", estimate_s=7, lines=True, every_s=10, clock=clock, echo=lines.append
    )
    clock.now = 5.0
    progress.ready()  # 5 s loading the model: not part of the rate
    clock.now = 15.0
    progress.update(10)  # 10 problems in 10 s since ready: 1 s a problem, 70 left
    assert lines == ["stage 3 tiny/sft: 30/100 problems, 15 s, 1.00 s a problem: about 70 s left"]
    clock.now = 16.0
    progress.update(10)  # within 10 s of the last line: none
    assert len(lines) == 1
    clock.now = 45.0
    progress.update(20)  # 40 problems in 40 s: 1 s a problem, 40 left
    assert lines[-1] == "stage 3 tiny/sft: 60/100 problems, 45 s, 1.00 s a problem: about 40 s left"
    clock.now = 60.0
    progress.update(40)  # the last one always says so
    assert lines[-1] == "stage 3 tiny/sft: 100/100 problems, 60 s"
    clock.now = 61.0
    progress.close()
    assert (
        lines[-1]
        == "stage 3 tiny/sft: sampled 80 problems in 61 s (loading 5 s); the backend rule had estimated 7 s"
    )


def test_nothing_sampled_says_nothing_at_the_end():
    lines = []
    progress = SamplingProgress(10, 10, "x", lines=True, clock=Clock(), echo=lines.append)
    progress.close()
    assert lines == []


def test_stage_3_in_a_log_prints_its_progress(sft_dir, tmp_path, capsys, monkeypatch):
    from conftest import REPO_ROOT

    monkeypatch.chdir(REPO_ROOT)
    argv = ["eval", "configs/eval/tiny-cpu.yaml", "--checkpoints", str(sft_dir), "--benchmarks", "amc23"]
    argv += ["--n", "2", "--max_tokens", "4", "--limit", "2", "--problems_per_batch", "1", "--backend", "hf"]
    argv += ["--results_dir", str(tmp_path / "r"), "--outputs_dir", str(tmp_path / "o")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out  # captured: not a terminal, as a log is not
    assert "problems, " in out and "s a problem: about " in out and "/2 problems" in out, out[-3000:]
    assert "sampled 2 problems in " in out, out[-3000:]
