"""Stage 3's W&B logging (sage_unsloth/eval/wandb_log.py) with the real wandb client, offline: what each checkpoint's
row holds, read back from the offline run files with wandb's own reader (compat.wandb_transaction_log) and the
table files it names, against the CSVs and manifest the stage wrote; a new eval run for a base model, the training
run resumed by id for a checkpoint a stage of the kit trained. No model: the stub sampler of test_eval drives the
real pipeline."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from test_eval import StubSampler

from sage_unsloth import compat
from sage_unsloth.eval import sampling
from sage_unsloth.eval.run import EvalConfig, evaluate_checkpoint, prepare
from sage_unsloth.eval.sampling import Checkpoint
from sage_unsloth.eval.wandb_log import log_checkpoint_results
from sage_unsloth.runtime.manifest import write_manifest

pytestmark = pytest.mark.slow  # each case starts wandb's service process


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline into ``tmp_path/wandb`` (its staging and cache too), and no model: prompts are not rendered."""
    import wandb

    wandb.teardown()  # an earlier in-process run leaves wandb's settings behind
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_GROUP"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(sampling, "load_tokenizer", lambda *a: None)
    monkeypatch.setattr(
        sampling, "render_prompts", lambda tokenizer, problems, template, limit=None: [[1]] * len(problems)
    )
    model = tmp_path / "tinybase"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return tmp_path, model


def _evaluate(tmp_path, model, **over):
    cfg = EvalConfig(
        checkpoints=[str(model)],
        benchmarks=["aime24", "aime25", "amc23", "math500"],
        limit=3,
        n=4,
        problems_per_batch=2,
        seed=5,
        grading_workers=1,
        results_dir=str(tmp_path / "results"),
        outputs_dir=str(tmp_path / "outputs"),
    )
    cfg = replace(cfg, **over)
    ks, checkpoints, sets = prepare(cfg)
    sampler = StubSampler(cfg, [p for ps in sets.values() for p in ps])
    return cfg, checkpoints[0], evaluate_checkpoint(cfg, checkpoints[0], sets, ks, sampler=sampler)


def _records(folder: Path) -> list[dict]:
    (log_file,) = folder.glob("run-*.wandb")
    return compat.wandb_transaction_log(log_file)


def _logged_table(folder: Path, item: dict, key: str) -> pd.DataFrame:
    assert item[f"{key}._type"] == "table-file", key
    table = json.loads((folder / "files" / item[f"{key}.path"]).read_text())
    return pd.DataFrame(table["data"], columns=table["columns"])


def _check_row_against_the_csvs(folder: Path, item: dict, results: Path) -> None:
    """Every pass@k of passk.csv in its dataset's table and the headline keys, per_problem.csv whole, the manifest
    and the grading summary: equal to what the stage wrote (floats exactly)."""
    passk = pd.read_csv(results / "passk.csv")
    for dataset, rows in passk.groupby("dataset"):
        logged = _logged_table(folder, item, f"eval/{dataset}/pass@k")
        assert list(logged.columns) == ["k", "pass@k", "n_problems", "n_samples"]
        assert logged["k"].tolist() == rows["k"].tolist()
        assert logged["pass@k"].tolist() == rows["pass_at_k"].tolist()
        assert logged["n_problems"].tolist() == rows["n_problems"].tolist()
        assert logged["n_samples"].tolist() == rows["n_samples"].tolist()
        for k in (rows["k"].min(), rows["k"].max()):
            assert item[f"eval/{dataset}/pass@{k}"] == rows.loc[rows["k"] == k, "pass_at_k"].item()
        assert f"eval/{dataset}/pass@2" not in item  # only the headline ks (1 and the largest) as scalars
    assert set(passk["dataset"]) == {"aime24", "aime25", "aime", "amc23", "math500", "avg_paper"}
    per_problem = pd.read_csv(results / "per_problem.csv", dtype={"problem_id": str})
    logged = _logged_table(folder, item, "eval/per_problem")
    pd.testing.assert_frame_equal(logged.astype({"problem_id": str}), per_problem, check_exact=True)
    manifest = json.loads((results / "manifest.json").read_text())
    logged_manifest = json.loads(_logged_table(folder, item, "eval/manifest")["manifest.json"].item())
    assert logged_manifest == {k: v for k, v in manifest.items() if k != "wandb"}
    for name, value in manifest["grading"].items():
        if isinstance(value, (int, float)):
            assert item[f"eval/grading/{name}"] == value, name


def test_a_base_model_s_results_go_to_a_new_eval_run_of_its_group(offline):
    tmp_path, model = offline
    _, _, results = _evaluate(tmp_path, model, report_to="wandb")
    record = json.loads((results / "manifest.json").read_text())["wandb"]
    assert (record["job_type"], record["group"], record["name"]) == ("eval", "tinybase", "tinybase/base")
    assert record["project"] == "sage-unsloth" and record["mode"] == "offline"
    folder = Path(record["folder"])
    records = _records(folder)
    (head,) = [r["run"] for r in records if r["type"] == "run"]
    assert (head["run_id"], head["run_group"], head["job_type"]) == (record["id"], "tinybase", "eval")
    assert head["config"]["update"]["eval"]["n"] == 4  # a new run's config: the evaluation's
    (item,) = [r["history"]["item"] for r in records if r["type"] == "history"]
    _check_row_against_the_csvs(folder, item, results)
    assert "train/global_step" not in item  # no training step behind a base model


def test_a_trained_checkpoint_s_results_go_into_its_training_run_resumed_by_id(offline):
    import wandb

    tmp_path, model = offline
    _, _, results = _evaluate(tmp_path, model)  # report_to none: nothing logged
    assert not (tmp_path / "wandb").exists() and "wandb" not in json.loads(
        (results / "manifest.json").read_text()
    )
    training = wandb.init(project="proj", group="grp", job_type="rlvr", name="tinybase/grpo")
    training.log({"train/reward": 0.5, "train/global_step": 7})
    trained = {"id": training.id, "project": "proj", "entity": None, "group": "grp", "job_type": "rlvr"}
    first_folder = Path(training.dir).parent
    training.finish()
    stage = tmp_path / "outputs" / "tinybase" / "grpo"
    write_manifest(stage, stage="rlvr", config={}, global_step=7, wandb=trained)
    checkpoint = Checkpoint(str(stage), "tinybase", "base", str(model))
    record = log_checkpoint_results(
        EvalConfig(checkpoints=[str(stage)], report_to="wandb"), checkpoint, results
    )
    assert record["id"] == trained["id"] and record["group"] == "grp" and record["project"] == "proj"
    second_folder = Path(record["folder"])
    # offline: a second folder; W&B adds -1, -2, ... when the run is resumed within the same second
    assert second_folder != first_folder and re.search(rf"-{trained['id']}(-\d+)?$", second_folder.name)
    records = _records(second_folder)
    (head,) = [r["run"] for r in records if r["type"] == "run"]
    assert head["run_id"] == trained["id"] and head.get("resume") and head["job_type"] == "rlvr"
    (item,) = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert item["train/global_step"] == 7  # on the training run's x-axis, at the checkpoint's step
    _check_row_against_the_csvs(second_folder, item, results)
    first = [r["history"]["item"] for r in _records(first_folder) if r["type"] == "history"]
    assert [row["train/reward"] for row in first] == [0.5]  # the training segment is left as it was
