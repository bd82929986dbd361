"""The SFT rows the kit ships (the offline stage-1 walk-through) and the one-line error for hub SFT data that
cannot be reached, raised before ``datasets`` retries the hub."""

import json
import os

import pytest

from sage_unsloth import cli
from sage_unsloth.data import SFT_SAMPLE, verified_path
from sage_unsloth.sft import data as sft_data

HUB_ID = "unsloth/OpenMathReasoning-mini"


SAMPLE_MIX = (("left", 0.70), ("right", 0.10), ("pairs", 0.10), ("outer", 0.05), ("middle", 0.05))


def test_the_shipped_sample_is_the_demo_task_written_by_the_kit():
    from sage_unsloth.demo.data import DemoDataSpec, sft_rows
    from sage_unsloth.demo.task import parse_problem

    path = verified_path("sample.jsonl")
    assert path == SFT_SAMPLE and str(path).endswith(sft_data.SHIPPED_SAMPLE)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    # written with the demo's plan prior of the time (70/10/10/5/5); the demo's default prior may move on
    spec = DemoDataSpec(n_sft=48, mix=SAMPLE_MIX)
    expected = [{k: r[k] for k in sft_data.REQUIRED_FIELDS} for r in sft_rows(spec)]
    assert rows == expected
    for row in rows:  # the gold is the sum of the problem's numbers, and the working out ends on it
        assert row["expected_answer"] == str(sum(parse_problem(row["problem"])))
        assert row["generated_solution"].rsplit("=", 1)[1] == row["expected_answer"]
        assert sft_data.is_numeric_answer(row["expected_answer"])


def test_hub_data_offline_without_a_cache_is_one_line_naming_dataset_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError) as caught:
        sft_data.load_raw_dataset(dataset_name=HUB_ID, dataset_split="cot")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"dataset_name={HUB_ID!r} cannot be loaded (offline")
    assert f"--dataset_path {sft_data.SHIPPED_SAMPLE}" in message


def test_an_unreachable_hub_fails_before_datasets_retries(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sft_data, "hub_reachable", lambda timeout_s=3.0: False)
    import datasets

    def no_hub(*args, **kwargs):
        raise AssertionError("datasets.load_dataset was called: its retries take ~28 s without a network")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    with pytest.raises(ValueError, match=r"the hub is unreachable; with a cached copy, set HF_HUB_OFFLINE=1"):
        sft_data.load_raw_dataset(dataset_name=HUB_ID, dataset_split="cot")


def test_hub_reachable_probes_the_endpoint_unless_a_proxy_is_set(monkeypatch):
    from huggingface_hub import constants

    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    assert sft_data.hub_reachable(timeout_s=1.0) is False
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert sft_data.hub_reachable(timeout_s=1.0) is True


def test_sft_cli_without_dataset_path_offline_is_one_line(tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["sft", "configs/sft/tiny-cpu.yaml", "--model_name_or_path", str(tiny_model_dir)]
    argv += ["--dataset_path", "", "--output_dir", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: dataset_name=") and "--dataset_path" in err[0], err
    assert not (tmp_path / "out").exists()
    assert os.environ["HF_HUB_OFFLINE"] == "1"
