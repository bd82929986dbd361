"""Sharded evaluation (sage_unsloth/eval/shard.py): 2 shards sample disjoint chunks that together are the
run's, their chunk files are the single process's, and the CSVs (written by the shard completing the set,
or by a merge run that samples nothing) equal the single process's byte for byte."""

from dataclasses import replace
from pathlib import Path

import pytest
from test_eval import StubSampler, _config, _main_error, _run

from sage_unsloth.eval.run import evaluate_checkpoint, prepare
from sage_unsloth.eval.shard import chunk_keys, parse_shard, select_shard

CSVS = ("per_problem.csv", "passk.csv")


def _chunks(cfg) -> dict[str, bytes]:
    root = Path(cfg.outputs_dir)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("chunk_*.jsonl.gz"))}


class NoSampling(StubSampler):
    def generate(self, prompts, seeds):
        raise AssertionError("a merge run sampled")


def test_two_shards_equal_one_process(tmp_path, tiny_model_dir):
    single_out, _, _ = _run(_config(tmp_path / "single", tiny_model_dir))
    single_chunks = _chunks(_config(tmp_path / "single", tiny_model_dir))
    assert len(single_chunks) == 15  # 5 benchmarks x 3 chunks of 2 problems

    base = _config(tmp_path / "sharded", tiny_model_dir)
    out0, sampler0, _ = _run(replace(base, shard="0/2"))
    first = _chunks(base)
    assert not any((out0 / name).exists() for name in CSVS)  # shard 1's chunks are missing: no CSVs yet
    out1, sampler1, _ = _run(replace(base, shard="1/2"))
    both = _chunks(base)
    second = {k: v for k, v in both.items() if k not in first}
    assert sampler0.calls == len(first) == 8 and sampler1.calls == len(second) == 7  # disjoint, balanced
    assert both == single_chunks  # together the run, file for file and byte for byte
    assert out1 == tmp_path / "sharded" / single_out.relative_to(tmp_path / "single")
    for name in CSVS:  # written by the shard that completed the set
        assert (out1 / name).read_bytes() == (single_out / name).read_bytes(), name

    for name in CSVS:
        (out1 / name).unlink()
    ks, checkpoints, sets = prepare(base)
    merged = evaluate_checkpoint(
        base, checkpoints[0], sets, ks, sampler=NoSampling(base, [p for ps in sets.values() for p in ps])
    )
    for name in CSVS:  # the merge run: no --shard, every chunk on disk, nothing sampled
        assert (merged / name).read_bytes() == (single_out / name).read_bytes(), name


def test_shards_cover_every_chunk_once_whatever_is_already_done():
    keys = chunk_keys({"a": list(range(5)), "b": list(range(4))}, problems_per_batch=2)
    assert keys == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    pending = [(name, index, None) for name, index in keys]
    for count in (1, 2, 3, 7):
        shards = [select_shard(pending, keys, f"{i}/{count}") for i in range(count)]
        assert sorted(c for s in shards for c in s) == sorted(pending)
    # A shard started after others finished some chunks still takes only its own positions.
    assert select_shard(pending[1:], keys, "0/2") == [("a", 2, None), ("b", 1, None)]
    assert select_shard(pending, keys, None) == pending
    assert parse_shard(" 1 / 4 ") == (1, 4) and parse_shard("") is None
    with pytest.raises(ValueError, match="shard="):
        parse_shard("-1/2")


@pytest.mark.parametrize("spec", ["2/2", "1/0", "a/b", "1", "1/2/3"])
def test_a_bad_shard_is_a_one_line_error(spec, tmp_path, capsys, tiny_model_dir):
    with pytest.raises(ValueError, match="shard="):
        parse_shard(spec)
    err = _main_error(
        capsys,
        [
            "--checkpoints",
            str(tiny_model_dir),
            "--shard",
            spec,
            "--results_dir",
            str(tmp_path / "r"),
            "--outputs_dir",
            str(tmp_path / "o"),
        ],
    )
    assert "shard=" in err
