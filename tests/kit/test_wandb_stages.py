"""The README's CPU walk-through with ``report_to: wandb`` and the real wandb client offline (WANDB_MODE=offline, no
network): stages 1-4 on the tiny model in this process, with a Hub token flag and a W&B key that no file may hold.

What it checks (sage_unsloth/runtime/wandb_runs.py says what each stage logs, sage_unsloth/report/wandb_read.py how the
report reads it back): each training manifest names its W&B run; the training metrics read back from the offline
run files (wandb's own reader) equal the stage's log_history.jsonl; stage 3 logged each checkpoint into the run that
trained it (resumed by id) and the base model into a new eval run of the group; every pass@k the results folders
hold is recovered from the offline runs; ``report --from_wandb`` on those runs, and on the same runs served by a
stand-in for the W&B API (tests/support/wandb_api_standin.py; no live server), writes the tables and CSVs of the
local report; no credential in any file. Stage 3 samples with a stub (the random tiny model solves nothing, and
equal zeros would prove little): counts that differ per problem and per checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from conftest import HUB_TOKEN, REPO_ROOT, WANDB_KEY, files_holding

from sage_unsloth.eval.sampling import Sample, problem_seed
from sage_unsloth.report import wandb_read
from sage_unsloth.runtime.manifest import read_manifest
from sage_unsloth.runtime.training_log import read_log_history

RUNS = ("base", "sft", "grpo", "grpo_branch")
BENCHMARKS = ("aime24", "aime25", "amc23", "math500")  # the pooled AIME and the paper average too
REPORT_CSVS = ("comparison", "passk_all_k", "pairs", "patterns", "support", "training")


class VariedSampler:
    """Problem p of checkpoint r: ``(seed_p + len(r)) % (n + 1)`` correct answers of n (made with the stage's own
    problem seeds), the rest wrong: pass@k that differs by problem, k and checkpoint."""

    def __init__(self, checkpoint, cfg):
        from sage_unsloth.eval.benchmarks import load_benchmark

        self.n, self.salt = cfg.n, len(checkpoint.run)
        problems = [p for name in cfg.benchmarks for p in load_benchmark(name, limit=cfg.limit)]
        self.by_seed = {problem_seed(cfg.seed, p.dataset, p.problem_id): p for p in problems}

    def generate(self, prompts, seeds):
        out = []
        for seed in seeds:
            gold, c = self.by_seed[seed].gold, (seed + self.salt) % (self.n + 1)
            texts = [f"<SOLUTION>{gold}</SOLUTION>"] * c + [f"<SOLUTION>{gold} + 1</SOLUTION>"] * (self.n - c)
            out.append([Sample(t, 3) for t in texts])
        return out


def _stage(*argv: str) -> None:
    """One stage as ``sage-unsloth STAGE ...`` runs it: W&B records ``sys.argv`` in each run's metadata."""
    import sys

    from sage_unsloth import cli

    sys.argv = ["sage-unsloth", *argv]  # restored by the fixture's monkeypatch
    assert cli.main(list(argv)) == 0, argv


@pytest.fixture(scope="module")
def walkthrough(tiny_model_dir, tmp_path_factory):
    """The walk-through's commands, each stage with report_to wandb, into one folder; W&B offline under it."""
    import wandb

    from sage_unsloth.eval import sampling

    root = tmp_path_factory.mktemp("wandb_walkthrough")
    out, results, wandb_dir = root / "outputs", root / "results", root / "wandb-home"
    with pytest.MonkeyPatch.context() as patch:
        wandb.teardown()  # an earlier in-process run leaves wandb's settings behind
        patch.chdir(REPO_ROOT)  # the walk-through runs from the repository (its configs, its SFT rows)
        for key, value in {
            "WANDB_MODE": "offline",
            "WANDB_DIR": str(wandb_dir),
            "WANDB_SILENT": "true",
            "WANDB_DATA_DIR": str(wandb_dir / "data"),  # wandb's table staging
            "WANDB_CACHE_DIR": str(wandb_dir / "cache"),
            "WANDB_CONFIG_DIR": str(wandb_dir / "config"),
            "WANDB_API_KEY": WANDB_KEY,
        }.items():
            patch.setenv(key, value)
        for key in ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_GROUP", "HF_TOKEN"):
            patch.delenv(key, raising=False)
        patch.setattr(
            "sys.argv", ["sage-unsloth"]
        )  # each stage's command line; it redacts its credential flags
        patch.setattr(sampling, "make_sampler", VariedSampler)
        short = tiny_model_dir.name  # the model's short name: every stage files its runs under it
        sft = out / short / "sft"
        _stage(
            "sft",
            "configs/sft/tiny-cpu.yaml",
            *("--model_name_or_path", str(tiny_model_dir), "--output_dir", str(sft), "--max_steps", "2"),
            *("--report_to", "wandb", "--hub_token", HUB_TOKEN),
        )
        for variant in ("grpo", "grpo_branch"):
            _stage(
                "rlvr",
                f"configs/rlvr/tiny-cpu/{variant}.yaml",
                *("--sft_dir", str(sft), "--output_root", str(out), "--report_to", "wandb"),
                *("--hub_token", HUB_TOKEN),
            )
        checkpoints = {
            "base": tiny_model_dir,
            "sft": sft,
            "grpo": out / short / "grpo",
            "grpo_branch": out / short / "grpo_branch",
        }
        for run, checkpoint in checkpoints.items():
            _stage(
                "eval",
                "configs/eval/tiny-cpu.yaml",
                *("--checkpoints", str(checkpoint), "--results_dir", str(results), "--outputs_dir", str(out)),
                *("--benchmarks", *BENCHMARKS, "--limit", "2", "--backend", "hf", "--report_to", "wandb"),
                *(("--run_name", "base", "--wandb_group", "baseline") if run == "base" else ()),
            )
        yield {"root": root, "out": out, "results": results, "wandb": wandb_dir / "wandb", "model": short}
        wandb.teardown()


def _results_folder(walkthrough, run: str) -> Path:
    return walkthrough["results"] / walkthrough["model"] / run


def test_training_manifests_name_their_wandb_runs(walkthrough):
    runs = {r.record["id"]: r for r in wandb_read.offline_runs(walkthrough["wandb"])}
    for variant, job_type in (("sft", "sft"), ("grpo", "rlvr"), ("grpo_branch", "rlvr")):
        folder = walkthrough["out"] / walkthrough["model"] / variant
        record = read_manifest(folder)["wandb"]
        short = walkthrough["model"]
        assert (record["group"], record["job_type"], record["name"]) == (
            short,
            job_type,
            f"{short}/{variant}",
        )
        assert record["project"] == "sage-unsloth" and record["mode"] == "offline"
        assert json.loads((folder / "wandb_run.json").read_text())["id"] == record["id"]
        logged = runs[record["id"]]
        assert (logged.record["group"], logged.record["job_type"]) == (short, job_type)
        assert logged.config["sage"] == {
            "stage": job_type,
            "model_short_name": short,
            "variant": variant,
            "output_dir": str(folder),
        }


def test_training_metrics_read_back_equal_the_stage_logs(walkthrough):
    """TRL's metrics and the SAGE trainer's sage/* as W&B holds them, against log_history.jsonl, value by value."""
    runs = {r.record["id"]: r for r in wandb_read.offline_runs(walkthrough["wandb"])}
    for variant in ("sft", "grpo", "grpo_branch"):
        folder = walkthrough["out"] / walkthrough["model"] / variant
        local = [e for e in read_log_history(folder) if "train_runtime" not in e]
        logged = wandb_read.log_history(runs[read_manifest(folder)["wandb"]["id"]].rows)
        assert [e["step"] for e in logged] == [e["step"] for e in local] and local
        for mine, theirs in zip(logged, local):
            assert set(mine) == set(theirs), variant
            for key, value in theirs.items():
                assert mine[key] == value or (math.isnan(mine[key]) and math.isnan(value)), (variant, key)
        if variant != "sft":
            assert "reward" in logged[-1] and "kl" in logged[-1]
            # q is computed and logged only where a guide shapes the anchor (plain GRPO's q = 1 is neither)
            assert ("sage/q_mean" in logged[-1]) == (variant == "grpo_branch"), variant


def test_every_pass_at_k_is_recovered_linked_to_its_training_run(walkthrough):
    found = wandb_read.evaluations(wandb_read.offline_runs(walkthrough["wandb"]))
    assert set(found) == {(walkthrough["model"], run) for run in RUNS}
    for (model, run), evaluation in found.items():
        folder = _results_folder(walkthrough, run)
        passk = pd.read_csv(folder / "passk.csv")
        assert set(passk["dataset"]) == {*BENCHMARKS, "aime", "avg_paper"}
        pd.testing.assert_frame_equal(
            evaluation.passk.astype(passk.dtypes.to_dict()), passk, check_exact=True
        )
        per_problem = pd.read_csv(folder / "per_problem.csv", dtype={"problem_id": str})
        logged = evaluation.per_problem.astype({"problem_id": str})
        pd.testing.assert_frame_equal(logged, per_problem, check_exact=True)
        manifest = read_manifest(folder)
        assert evaluation.host.record["id"] == manifest["wandb"]["id"]
        if run == "base":
            assert (evaluation.host.record["job_type"], evaluation.host.record["group"]) == (
                "eval",
                "baseline",
            )
        else:  # logged into the training run, resumed by id: the training manifest's run
            assert (
                manifest["wandb"]["id"]
                == read_manifest(walkthrough["out"] / walkthrough["model"] / run)["wandb"]["id"]
            )
            assert (
                evaluation.host.record["job_type"] in ("sft", "rlvr")
                and len(evaluation.host.record["source"]) == 2
            )
    assert 0 < passk["pass_at_k"].min() and passk["pass_at_k"].nunique() > 5  # the stub gave a signal


def _tables(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("|")]


def _report(walkthrough, name: str, **extra):
    from sage_unsloth.report.stage import build_report, parse_args

    argv = ["configs/report/default.yaml", "--results", str(walkthrough["results"]), "--resamples", "300"]
    argv += ["--out", str(walkthrough["root"] / name / "report.md")] + [a for kv in extra.items() for a in kv]
    return build_report(parse_args(argv), console=False)


@pytest.fixture(scope="module")
def local_report(walkthrough):
    return _report(walkthrough, "local")


@contextlib.contextmanager
def _training_folders_moved(walkthrough):
    """The stage 1-2 folders out of reach while a report reads W&B: its training curves and KL placements must come
    from the W&B runs (the eval manifests still name those folders; the completions stay, for the patterns)."""
    folders = [walkthrough["out"] / walkthrough["model"] / v for v in ("sft", "grpo", "grpo_branch")]
    for folder in folders:
        folder.rename(folder.with_name(f"{folder.name}.away"))
    try:
        yield
    finally:
        for folder in folders:
            folder.with_name(f"{folder.name}.away").rename(folder)


def _same_report(mine, local) -> None:
    assert _tables(mine.markdown) == _tables(local.markdown) and len(_tables(local.markdown)) > 20
    for name in REPORT_CSVS:
        theirs = (local.out.with_suffix("") / f"{name}.csv").read_text()
        assert (mine.out.with_suffix("") / f"{name}.csv").read_text() == theirs, name
    assert "## Training curves" in mine.markdown and "→" in mine.markdown  # the RLVR runs' curves, from W&B


def test_report_from_the_offline_runs_equals_the_local_report(walkthrough, local_report):
    with _training_folders_moved(walkthrough):
        mine = _report(walkthrough, "from-wandb", **{"--from_wandb": str(walkthrough["wandb"])})
    _same_report(mine, local_report)
    into = walkthrough["results"] / "wandb"
    assert sorted(json.loads((into / ".from_wandb.json").read_text())["runs"]) == sorted(
        f"{walkthrough['model']}/{run}" for run in RUNS
    )
    for run in ("grpo", "grpo_branch"):  # the copies of the training runs the report read curves from
        copy = into / walkthrough["model"] / run / "training_run"
        assert read_manifest(copy)["stage"] == "rlvr" and (copy / "log_history.jsonl").is_file()
    # one group only (the base model's eval run is in group "baseline"): its evaluations, the earlier ones replaced
    group = {"--from_wandb": str(walkthrough["wandb"]), "--wandb_group": walkthrough["model"]}
    mine = _report(walkthrough, "from-wandb-group", **group)
    assert (
        not (into / walkthrough["model"] / "base").exists() and (into / walkthrough["model"] / "sft").is_dir()
    )
    assert "/base |" not in mine.markdown and f"{walkthrough['model']}/grpo_branch" in mine.markdown


def test_report_through_the_wandb_api_standin_equals_the_local_report(walkthrough, local_report):
    """The online path: ``--from_wandb ENTITY/PROJECT`` through wandb.Api's documented interface, served by the
    stand-in (tests/support/wandb_api_standin.py) from the same runs; not run against a live server."""
    from wandb_api_standin import StandInApi

    from sage_unsloth.report.stage import build_report, parse_args

    api = StandInApi(walkthrough["wandb"], entity="me", project="sage-unsloth")
    argv = [
        "configs/report/default.yaml",
        "--results",
        str(walkthrough["root"] / "online"),
        "--resamples",
        "300",
    ]
    argv += [
        "--out",
        str(walkthrough["root"] / "online-report" / "report.md"),
        "--from_wandb",
        "me/sage-unsloth",
    ]
    with _training_folders_moved(walkthrough):
        mine = build_report(parse_args(argv), console=False, api=api)
    assert api.calls == [("me/sage-unsloth", {})]
    _same_report(mine, local_report)
    downloaded = list((walkthrough["root"] / "online" / "wandb" / ".wandb-files").rglob("*.table.json"))
    assert downloaded  # the tables came through File.download


def test_the_paper_is_logged_beside_the_runs(walkthrough):
    """``--wandb_project`` with the runs' group: a report run in that group holding the paper's table as it is in
    results/paper/ and the runs-vs-paper table whose run rows are the report's pass@k points with their intervals."""
    mine = _report(
        walkthrough, "logged", **{"--wandb_project": "sage-unsloth", "--wandb_group": walkthrough["model"]}
    )
    (run,) = [r for r in wandb_read.offline_runs(walkthrough["wandb"]) if r.record["job_type"] == "report"]
    assert run.record["group"] == walkthrough["model"] and run.record["project"] == "sage-unsloth"
    (row,) = run.rows
    paper = wandb_read._table(run, row, "paper/passk")
    published = pd.read_csv(REPO_ROOT / "results" / "paper" / "published_passk.csv")
    pd.testing.assert_frame_equal(paper.astype(published.dtypes.to_dict()), published, check_exact=True)
    table = wandb_read._table(run, row, "report/runs_vs_paper")
    curves = pd.read_csv(mine.out.with_suffix("") / "passk_all_k.csv")
    runs = table[table["source"] == "run"].reset_index(drop=True)
    assert runs["series"].tolist() == (curves["model"] + "/" + curves["run"]).tolist()
    for mine_column, theirs in (
        ("k", "k"),
        ("pass_at_k", "value"),
        ("ci_low", "ci_low"),
        ("ci_high", "ci_high"),
    ):
        assert runs[mine_column].astype(float).tolist() == curves[theirs].astype(float).tolist(), mine_column


@pytest.mark.slow  # a wandb run offline
def test_a_resumed_training_stage_continues_its_wandb_run(tmp_path, monkeypatch):
    """``--resume true``: the stage's W&B run is the one its folder's wandb_run.json names (written when the run
    started, so a killed run has it), with its project and group; a fresh start gets a new run, named by the user's
    run_name when there is one."""
    import wandb

    from sage_unsloth.runtime.wandb_runs import finish_training_run, start_training_run

    wandb.teardown()
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("WANDB_RUN_GROUP", "mine")
    folder = tmp_path / "out"
    first = start_training_run(
        "wandb", job_type="rlvr", model_short="m", variant="v", output_dir=folder, resume=False
    )
    record = json.loads((folder / "wandb_run.json").read_text())
    assert (record["id"], record["group"], record["name"]) == (first.id, "mine", "m/v")
    first.finish()  # as a killed run leaves it: no manifest, its wandb_run.json written
    monkeypatch.delenv("WANDB_RUN_GROUP")
    again = start_training_run(
        "wandb", job_type="rlvr", model_short="m", variant="v", output_dir=folder, resume=True
    )
    assert (again.id, again.group) == (record["id"], "mine")
    assert finish_training_run(again)["id"] == record["id"]
    fresh = start_training_run(  # the user's run_name is the run's name
        "wandb", job_type="rlvr", model_short="m", variant="v", output_dir=folder, resume=False, name="my run"
    )
    assert fresh.id != record["id"] and fresh.group == "m" and fresh.name == "my run"
    fresh.finish()
    assert (
        start_training_run(
            "none", job_type="rlvr", model_short="m", variant="v", output_dir=folder, resume=False
        )
        is None
    )


def test_no_credential_in_any_wandb_file(walkthrough):
    """The Hub token (a flag of every training stage) and the W&B key (in the environment) in no file: the offline
    runs' logs, config, metadata, console, wandb's staging and caches, the stages' folders; nor in any record
    wandb's reader decodes from the run files."""
    from sage_unsloth.compat import wandb_transaction_log

    assert files_holding(walkthrough["root"], HUB_TOKEN, WANDB_KEY) == []
    logs = sorted(walkthrough["wandb"].glob("*run-*/run-*.wandb"))
    job_types = []
    for log_file in logs:
        records = wandb_transaction_log(log_file)
        job_types += [r["run"]["job_type"] for r in records if r["type"] == "run"]
        decoded = json.dumps(records)
        assert HUB_TOKEN not in decoded and WANDB_KEY not in decoded, log_file
    # sft, grpo, grpo_branch and their eval segments; the base model's eval run (and the report's, if logged)
    assert sorted(t for t in job_types if t != "report") == [
        "eval",
        "rlvr",
        "rlvr",
        "rlvr",
        "rlvr",
        "sft",
        "sft",
    ]
