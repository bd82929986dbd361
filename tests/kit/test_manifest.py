"""Manifests: provenance written atomically, credentials never."""

import json
import os
import stat

import pytest

from sage_unsloth.runtime.manifest import (
    atomic_write_text,
    current_umask,
    read_manifest,
    scrub_secrets,
    write_manifest,
)


def test_scrub_secrets_redacts_credentials_but_not_token_counts():
    fake = "hf_" + "a1B2" * 9
    config = {
        "hub_token": "abc",
        "push_to_hub_token": "p",
        "wandb_api_key": "k",
        "token": "t",
        "nested": [{"HF_TOKEN": "x"}],
        "max_tokens": 3072,
        "max_new_tokens": 5,
        "pad_token": "<|endoftext|>",
        "note": f"used {fake}",
        "empty_token": None,
    }
    out = scrub_secrets(config)
    assert (
        out["hub_token"]
        == out["push_to_hub_token"]
        == out["wandb_api_key"]
        == out["token"]
        == out["nested"][0]["HF_TOKEN"]
        == "<redacted>"
    )
    assert out["max_tokens"] == 3072 and out["max_new_tokens"] == 5 and out["pad_token"] == "<|endoftext|>"
    assert fake not in out["note"] and out["empty_token"] is None


def test_write_and_read_manifest(tmp_path):
    path = write_manifest(
        tmp_path / "stage", stage="sft", config={"lr": 2e-4, "hub_token": "secret"}, seed=3, base_model="tiny"
    )
    text = path.read_text()
    assert "secret" not in text
    manifest = read_manifest(tmp_path / "stage", expect_stage="sft")
    assert manifest["seed"] == 3 and manifest["base_model"] == "tiny" and manifest["versions"]["torch"]
    with pytest.raises(ValueError, match="expected 'rlvr'"):
        read_manifest(tmp_path / "stage", expect_stage="rlvr")
    with pytest.raises(FileNotFoundError, match="run the previous stage first"):
        read_manifest(tmp_path / "missing")


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_text(target, json.dumps({"v": 1}))

    with pytest.raises(TypeError):
        atomic_write_text(target, object())  # fails while writing: the old content must survive
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temp file left behind


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_atomic_write_gives_the_mode_of_an_ordinary_file(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        written = atomic_write_text(tmp_path / "passk.csv", "k,v\n")
        (tmp_path / "plain.csv").write_text("k,v\n")  # what open() gives, as the plots beside it get
        assert current_umask() == umask
    finally:
        os.umask(old)
    assert (
        stat.S_IMODE(written.stat().st_mode) == mode == stat.S_IMODE((tmp_path / "plain.csv").stat().st_mode)
    )


def test_atomic_write_syncs_the_file_then_its_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic_write_text(tmp_path / "sub" / "manifest.json", "{}")
    assert synced == [False, True]  # the data, then the folder holding the new name
