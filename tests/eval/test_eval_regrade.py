"""``sage-unsloth regrade``: saved completions graded again with the current grader, no model. A run is
graded, then regraded under a changed rule (the CSVs change by exactly the completions that rule touches),
regraded with the rule restored (the original bytes come back), and regraded twice alike (byte-identical)."""

import json
from pathlib import Path

from test_eval import FORMATS, _config, _run

from sage_unsloth import cli, grading
from sage_unsloth.eval.passk import passk_rows
from sage_unsloth.eval.records import read_chunk


def _csvs(out: Path) -> dict[str, str]:
    return {name: (out / name).read_text() for name in ("per_problem.csv", "passk.csv", "manifest.json")}


def _boxed_only_correct(sampler, problem, seed) -> int:
    """How many of the stub's correct completions of ``problem`` are written with \\boxed{} alone."""
    c = sampler.expected_c(problem, seed)
    return 0 if problem.is_kk else sum(1 for j in range(c) if FORMATS[j % 3].startswith("so \\boxed"))


def test_regrade_follows_the_grader_and_is_byte_identical_without_a_change(
    tmp_path, tiny_model_dir, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the manifest's completions_dir is relative to where the eval ran
    cfg = _config(
        tmp_path,
        tiny_model_dir,
        benchmarks=["amc23", "math500", "kk"],
        limit=4,
        results_dir="results",
        outputs_dir="outputs",
    )
    out, sampler, sets = _run(cfg)
    graded = _csvs(out)

    assert cli.main(["regrade", str(out), "--workers", "1"]) == 0
    once = _csvs(out)
    assert once["per_problem.csv"] == graded["per_problem.csv"] and once["passk.csv"] == graded["passk.csv"]
    assert cli.main(["regrade", str(out), "--workers", "1"]) == 0
    assert _csvs(out) == once  # the same grader twice: every byte, the manifest included

    # A verdict-relevant rule change: a \boxed{} outside the solution block no longer counts as the answer.
    original = grading.extract_answer

    def strict(completion):
        return original(completion) if "<SOLUTION>" in (completion or "") else None

    monkeypatch.setattr(grading, "extract_answer", strict)
    assert cli.main(["regrade", str(out), "--workers", "1"]) == 0
    rows = [line.split(",") for line in (out / "per_problem.csv").read_text().splitlines()[1:]]
    expected = [
        {
            "dataset": p.dataset,
            "problem_id": p.problem_id,
            "n": 4,
            "c": sampler.expected_c(p, cfg.seed) - _boxed_only_correct(sampler, p, cfg.seed),
        }
        for ps in sets.values()
        for p in ps
    ]
    assert [(r[0], r[1], int(r[2]), int(r[3])) for r in rows] == [
        (e["dataset"], e["problem_id"], e["n"], e["c"]) for e in expected
    ]
    assert sum(_boxed_only_correct(sampler, p, cfg.seed) for ps in sets.values() for p in ps) > 0
    passk = [line.split(",") for line in (out / "passk.csv").read_text().splitlines()[1:]]
    assert [(r[0], int(r[1]), float(r[2])) for r in passk] == [
        (r["dataset"], r["k"], float(repr(r["pass_at_k"]))) for r in passk_rows(expected, [1, 2, 4])
    ]
    chunk = next(Path("outputs").rglob("math500/chunk_00000.jsonl.gz"))
    record = read_chunk(chunk)[0]
    assert {c["status"] for c in record["completions"]} <= {"correct", "wrong", "no_answer"}

    monkeypatch.undo()  # the rule restored: the original verdicts come back
    monkeypatch.chdir(tmp_path)
    assert cli.main(["regrade", str(out), "--workers", "1"]) == 0
    back = _csvs(out)
    assert back["per_problem.csv"] == graded["per_problem.csv"] and back["passk.csv"] == graded["passk.csv"]
    manifest = json.loads(back["manifest.json"])
    assert (
        manifest["regraded"]["grader"] == grading.grader_fingerprint()
        and manifest["grading"]["unresolved"] == 0
    )
    assert manifest["created"] == json.loads(graded["manifest.json"])["created"]  # the run's record is kept


def test_regrade_errors_are_one_line(tmp_path, capsys):
    assert cli.main(["regrade", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "does not exist" in err
    # a folder of runs (results/tiny), not one run: say what regrade expects and which runs lie below it
    run = tmp_path / "results" / "tiny" / "grpo"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"stage": "eval"}))
    assert cli.main(["regrade", str(tmp_path / "results" / "tiny")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "run the previous stage" not in err, err
    assert f"{tmp_path / 'results' / 'tiny'} is not an eval run's folder (no manifest.json)" in err, err
    assert f"results/<model>/<run>, as stage 3 writes it (eval runs below it: {run})" in err, err
    assert cli.main(["regrade", str(run), "--workerz", "2"]) == 2  # argparse's own errors: one line too
    err = capsys.readouterr().err.strip()
    assert err == "error: unrecognized arguments: --workerz 2 (sage-unsloth regrade --help lists the flags)"


def test_regrade_flags_use_underscores_and_still_take_the_old_dashes(capsys):
    from sage_unsloth.eval.regrade import parse_args

    args = parse_args(["r", "--completions_dir", "c", "--timeout_s", "2"])
    assert (args.completions_dir, args.timeout_s) == ("c", 2.0) and capsys.readouterr().err == ""
    args = parse_args(["r", "--completions-dir", "c", "--timeout-s=3"])
    assert (args.completions_dir, args.timeout_s) == ("c", 3.0)
    assert capsys.readouterr().err.splitlines() == [
        "sage-unsloth regrade: --completions-dir is deprecated: use --completions_dir",
        "sage-unsloth regrade: --timeout-s is deprecated: use --timeout_s",
    ]


def test_report_names_the_kk_set_and_shows_what_stayed_ungraded(tmp_path, tiny_model_dir, monkeypatch):
    import time

    from sage_unsloth.grading import verify
    from sage_unsloth.report.stage import ReportArguments, build_report

    compare = verify._symbolic_equal

    def slow_compare(candidate, form):  # over any 1 us budget: some completions stay ungraded
        end = time.thread_time() + 0.005
        while time.thread_time() < end:
            pass
        return compare(candidate, form)

    monkeypatch.setattr(verify, "_symbolic_equal", slow_compare)
    cfg = _config(
        tmp_path,
        tiny_model_dir,
        benchmarks=["math500", "kk"],
        limit=2,
        grading_timeout_s=1e-6,
        grading_retry_timeout_s=1e-6,
    )
    out, _, _ = _run(cfg)
    unresolved = json.loads((out / "manifest.json").read_text())["grading"]["unresolved"]
    assert unresolved > 0
    result = build_report(
        ReportArguments(
            results=cfg.results_dir,
            out=str(tmp_path / "report.md"),
            paper_dir=str(Path(__file__).parents[2] / "results" / "paper"),
            resamples=100,
        ),
        console=False,
    )
    text = result.out.read_text()
    assert "## Knights-and-Knaves, Logic-RL split (kk_logicrl; not comparable with kk_official)" in text
    header = next(line for line in text.splitlines() if line.startswith("| run |"))
    row = next(line for line in text.splitlines() if line.startswith(f"| {out.parent.name}/{out.name} |"))
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["ungraded"] == str(unresolved)
