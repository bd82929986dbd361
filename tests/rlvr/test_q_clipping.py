"""q clipping is visible: the share of completion tokens whose raw q the kit clips to the guide node's [q_min, q_max] is
logged as sage/q_clipped_frac and, above 10%, warned about once per run. A guide meant to reach q = 2.0 under the
default q_max = 1.4 is the case a new user hit: every token silently got 1.4.

The fraction's reference is counted here by hand from the definition (raw q < q_min or > q_max, on the mask)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from sage_unsloth.plugins import guides

REPO = Path(__file__).resolve().parents[2]


def test_clipped_counts_by_hand():
    raw = torch.tensor([[0.5, 0.6, 1.0, 1.4, 1.5], [2.0, 0.1, 9.0, 1.2, 1.3]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float32)
    # on the mask: 0.5 (low), 1.5 (high), 2.0 (high), 0.1 (low) are outside [0.6, 1.4]; 0.6 and 1.4 are the bounds;
    # 9.0 is off the mask and does not count
    counts = guides.clipped_fraction_counts(raw, mask, 0.6, 1.4)
    assert counts.tolist() == [4.0, 7.0]
    assert guides.clipped_fraction_counts(raw, torch.zeros_like(mask), 0.6, 1.4).tolist() == [0.0, 0.0]


GUIDE = '''
import torch

def twice(signals):
    """q = 2.0 on every token: beyond the default q_max of 1.4."""
    return torch.full_like(signals.mask, 2.0, dtype=torch.float32)
'''


def _run(tmp_path, sft_dir, dapo_sample, name: str, node: str):
    from sage_unsloth.rlvr.run import main

    mine = tmp_path / name
    mine.mkdir()
    (mine / "twice.py").write_text(GUIDE)
    config = mine / "twice.yaml"
    config.write_text(
        f"base: {REPO / 'configs' / 'rlvr' / 'tiny-cpu' / '_base.yaml'}\n"
        f"guide: {{name: {mine / 'twice.py'}:twice{node}}}\nmax_steps: 2\nsave_strategy: 'no'\n"
    )
    argv = [str(config), "--sft_dir", str(sft_dir), "--output_root", str(mine / "out")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv, "--dataset_path", str(dapo_sample)]) == 0
    clipping = [w for w in caught if "were clipped to" in str(w.message)]
    logs = [
        json.loads(line) for line in next((mine / "out").rglob("log_history.jsonl")).read_text().splitlines()
    ]
    return [e["sage/q_clipped_frac"] for e in logs if "sage/q_clipped_frac" in e], logs, clipping


def test_a_guide_asking_for_q_2_is_clipped_visibly(tmp_path, sft_dir, dapo_sample, varied_reward):
    fractions, logs, clipping = _run(tmp_path, sft_dir, dapo_sample, "default", "")
    assert fractions == [1.0, 1.0]  # every completion token's 2.0 became 1.4, at both steps
    assert [e["sage/q_max"] for e in logs if "sage/q_max" in e] == pytest.approx([1.4, 1.4])
    assert len(clipping) == 1  # once per run, not once per step
    assert "q_max=1.4" in str(clipping[0].message)

    fractions, logs, clipping = _run(tmp_path, sft_dir, dapo_sample, "wide", ", q_max: 2.0")
    assert fractions == [0.0, 0.0] and not clipping
    assert [e["sage/q_max"] for e in logs if "sage/q_max" in e] == pytest.approx([2.0, 2.0])
