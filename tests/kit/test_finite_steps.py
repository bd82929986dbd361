"""The pieces behind 'no non-finite weight is ever written' (issue 41, item 2) and 'a checkpoint is complete when
its contents are sane' (issue 42, item 4), on hand-made tensors and checkpoint folders (no model): the step guard's
diagnosis (sage_unsloth/runtime/finite_steps.py) and the contents check (sage_unsloth/runtime/checkpoint_contents.py). The same
checks on real SFT and RLVR checkpoints, and the resume that skips a bad one: tests/kit/test_checkpoints.py; the guards
in training: tests/kit/test_training_faults.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from sage_unsloth.runtime import checkpoints


def test_the_step_guard_names_what_is_not_finite():
    from sage_unsloth.runtime.finite_steps import gradient_problem, nonfinite_entries

    batch = {
        "a": torch.tensor([1.0, float("nan"), float("inf")]),
        "ids": torch.tensor([1, 2]),
        "b": torch.ones(2),
    }
    assert nonfinite_entries(batch) == ["a (2 of 3, e.g. nan)"]
    assert nonfinite_entries(None) == [] and nonfinite_entries(["not a dict"]) == []
    good, bad, huge = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    good.grad, bad.grad, huge.grad = torch.ones(2), torch.tensor([1.0, float("nan")]), torch.full((2,), 3e38)
    frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    assert gradient_problem([("good", good), ("frozen", frozen)]) is None
    assert gradient_problem([("good", good), ("bad", bad)]) == (
        "1 of 2 trainable tensors have non-finite gradients (first: bad)"
    )
    assert gradient_problem([("huge", huge)]).startswith("the gradient norm overflows float32")


# ------------------------------------------------------------------------------------------------ contents
SHAPES = {"q_proj": ((2, 6), (6, 2)), "v_proj": ((2, 6), (4, 2))}  # (lora_A, lora_B) of each module


def _adapter(seed: int = 0, zero_b: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (a, b) in SHAPES.items():
        prefix = f"base_model.model.layers.0.{module}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(*a, generator=g)
        tensors[f"{prefix}.lora_B.weight"] = torch.zeros(*b) if zero_b else torch.randn(*b, generator=g)
    return tensors


def _optimizer(adapter: dict, moved: bool = True) -> dict:
    state = {
        i: {
            "step": torch.tensor(2.0),
            "exp_avg": (torch.full_like(t, 0.1) if moved else torch.zeros_like(t)),
            "exp_avg_sq": torch.full_like(t, 0.01) if moved else torch.zeros_like(t),
        }
        for i, t in enumerate(adapter.values())
    }
    return {"state": state, "param_groups": [{"lr": 1e-3, "params": list(range(len(adapter)))}]}


def _checkpoint(
    folder: Path, adapter: dict, optimizer: dict | None, step: int = 2, ref: dict | None = None
) -> Path:
    folder.mkdir(parents=True)
    save_file(adapter, str(folder / "adapter_model.safetensors"))
    if ref is not None:
        (folder / "ref").mkdir()
        save_file(ref, str(folder / "ref" / "adapter_model.safetensors"))
    if optimizer is not None:
        torch.save(optimizer, folder / "optimizer.pt")
        torch.save({}, folder / "scheduler.pt")
        torch.save({}, folder / "rng_state.pth")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return folder


def _with(tensors: dict, name_part: str, value: float) -> dict:
    out = {k: v.clone() for k, v in tensors.items()}
    key = next(k for k in out if name_part in k)
    out[key].view(-1)[0] = value
    return out


def _zeroed(tensors: dict, name_part: str, every: bool = False) -> dict:
    out = {k: v.clone() for k, v in tensors.items()}
    for key in [k for k in out if name_part in k][: None if every else 1]:
        out[key].zero_()
    return out


def _nan_moment(optimizer: dict) -> dict:
    optimizer["state"][1]["exp_avg"].view(-1)[0] = float("nan")
    return optimizer


def _foreign(optimizer: dict) -> dict:
    optimizer["param_groups"][0]["params"] = optimizer["param_groups"][0]["params"][:-1]
    del optimizer["state"][len(optimizer["state"]) - 1]
    return optimizer


def _reshaped(optimizer: dict) -> dict:
    optimizer["state"][0]["exp_avg"] = torch.zeros(5, 5)
    return optimizer


CASES = {
    # name: (adapter, optimizer, step, ref) -> the problem (a regex), or None when the checkpoint is sane
    "sane": (lambda a: (a, _optimizer(a), 2, None), None),
    "sane_ref": (lambda a: (a, _optimizer(a), 2, _adapter(1)), None),
    "weights_only": (lambda a: (a, None, 2, None), None),  # save_only_model: no optimizer to check
    "fresh_zero_b": (lambda a: (_adapter(zero_b=True), _optimizer(a, moved=False), 0, None), None),
    "no_signal_zero_b": (lambda a: (_adapter(zero_b=True), _optimizer(a, moved=False), 2, None), None),
    "after_reset": (lambda a: (a, {"state": {}, "param_groups": [{"params": [0, 1, 2, 3]}]}, 2, None), None),
    "nan_adapter": (
        lambda a: (_with(a, "lora_B", float("nan")), _optimizer(a), 2, None),
        r"^adapter_model\.safetensors holds 1 non-finite tensors of 4 \(first: .*lora_B",
    ),
    "inf_adapter": (
        lambda a: (_with(a, "lora_A", float("inf")), _optimizer(a), 2, None),
        r"holds 1 non-finite",
    ),
    "nan_ref": (
        lambda a: (a, _optimizer(a), 2, _with(_adapter(1), "lora_A", float("nan"))),
        r"^ref/adapter_model\.safetensors holds 1 non-finite tensors",
    ),
    "zero_lora_a": (
        lambda a: (_zeroed(a, "lora_A"), _optimizer(a), 2, None),
        r"has an all-zero lora_A tensor",
    ),
    "zero_lora_b": (
        lambda a: (_zeroed(a, "lora_B", every=True), _optimizer(a), 2, None),
        r"every lora_B tensor of adapter_model\.safetensors is zero after 2 steps with non-zero gradients",
    ),
    "nan_optimizer": (
        lambda a: (a, _nan_moment(_optimizer(a)), 2, None),
        r"^optimizer\.pt holds 1 non-finite tensors of 12 \(first: 1\.exp_avg\)",
    ),
    "foreign_optimizer": (
        lambda a: (a, _foreign(_optimizer(a)), 2, None),
        r"^optimizer\.pt lists 3 parameters for an adapter of 4 tensors",
    ),
    "reshaped_optimizer": (
        lambda a: (a, _reshaped(_optimizer(a)), 2, None),
        r"^optimizer\.pt holds a moment of shape \(5, 5\), which no adapter tensor has",
    ),
    "not_an_optimizer": (
        lambda a: (a, {"just": "a dict"}, 2, None),
        r"^optimizer\.pt is not an optimizer state",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_checkpoint_contents(case, tmp_path):
    make, expected = CASES[case]
    adapter, optimizer, step, ref = make(_adapter())
    folder = _checkpoint(tmp_path / "checkpoint-2", adapter, optimizer, step, ref)
    problem = checkpoints.checkpoint_problem(folder)  # the resume rule (its file checks, then the contents)
    if expected is None:
        assert problem is None
    else:
        import re

        from sage_unsloth.runtime.checkpoint_contents import contents_problem

        assert problem is not None and re.search(expected, problem), problem
        assert contents_problem(folder, step) == problem


def test_resume_picks_the_newest_sane_checkpoint_and_names_each_skipped_one_in_one_line(tmp_path, caplog):
    import logging

    adapter = _adapter()
    _checkpoint(tmp_path / "checkpoint-1", adapter, _optimizer(adapter), 1)
    _checkpoint(tmp_path / "checkpoint-2", _with(adapter, "lora_A", float("nan")), _optimizer(adapter), 2)
    _checkpoint(tmp_path / "checkpoint-3", _zeroed(adapter, "lora_B", every=True), _optimizer(adapter), 3)
    with caplog.at_level(logging.WARNING):
        chosen = checkpoints.choose_checkpoint(tmp_path, resume=True, restart=False, resume_flag="--resume")
    assert chosen == tmp_path / "checkpoint-1"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert (
        "checkpoint-3 is incomplete (every lora_B tensor" in lines[0]
        and "resuming from checkpoint-1" in lines[0]
    )
    assert "checkpoint-2 is incomplete (adapter_model.safetensors holds 1 non-finite" in lines[1]


def test_weights_problem_reads_floating_tensors_only():
    from sage_unsloth.runtime.checkpoint_contents import weights_problem

    assert weights_problem({"ids": torch.tensor([1, 2]), "w.lora_A.weight": torch.ones(2)}, "x") is None
    assert weights_problem({"w.lora_A.weight": torch.zeros(2)}, "x") == (
        "x has an all-zero lora_A tensor (w.lora_A.weight): the adapter is degenerate"
    )


def test_the_summed_loss_of_a_checkpoint(tmp_path):
    """train_loss after a resume: the checkpoint's own sum, else each logged mean times the steps it averaged."""
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    history = [{"loss": 0.5, "step": 2}, {"eval_loss": 9.0, "step": 3}, {"loss": 0.25, "step": 4}]
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": history}))
    assert checkpoints.resumed_loss_total(folder) == 0.5 * 2 + 0.25 * 2
    (folder / checkpoints.LOSS_TOTAL_FILE).write_text(json.dumps({"loss_total": 1.4}))
    assert checkpoints.resumed_loss_total(folder) == 1.4
    assert checkpoints.resumed_loss_total(tmp_path / "missing") == 0.0
