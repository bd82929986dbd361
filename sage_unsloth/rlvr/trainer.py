"""GRPO with the SAGE anchor q * pi_ref, on TRL's GRPOTrainer and on Unsloth's patched one.

Both TRL's ``_compute_loss`` and Unsloth's zoo loss read ``ref_per_token_logps`` only inside the k3 KL
term, so replacing it by ``ref + log q`` (q without gradient) *is* the SAGE objective. Where q is computed
(``sage_q_source``):

- ``loss`` (default on TRL's trainer): inside ``_compute_loss``, from the entropies / logps that TRL's own
  loss forward returns, before TRL reads the reference. No extra forward pass, and the official code's
  semantics (current policy) for any num_iterations / steps_per_generation.
- ``rollout`` (needed under Unsloth, whose patched ``compute_loss`` never calls ``_compute_loss`` and whose
  scorer returns no entropies): after ``_generate_and_score_completions``, from one extra no-grad policy
  pass (or from TRL's old-logp pass when it runs anyway), with log q mapped into Unsloth's left-packed
  (B, C + max_left_pad) layout. Equal to ``loss`` when num_iterations == 1 and steps_per_generation ==
  gradient_accumulation_steps.
- The random guide never needs the policy and is always drawn at rollout.

The k2 and forward-KL estimators are not a shifted reference: they are a loss-level term on TRL's path
(TRL's loss + beta * aggregate(estimator - k3), aggregated exactly as TRL aggregates its loss) and an error
on Unsloth's.

The GRPOTrainer base class is looked up when the trainer is built, not when this module is imported:
after ``import unsloth`` on a GPU ``trl.GRPOTrainer`` is Unsloth's patched class, and a class frozen at
import time would silently subclass the unpatched one (plain GRPO under Unsloth's loss would then never
see q).

Contact points (pinned to trl 1.15.0, unsloth / unsloth_zoo 2026.10.9, each tested in
tests/test_rlvr_trainer.py): the batch keys ``prompt_ids/prompt_mask/completion_ids/completion_mask/
ref_per_token_logps/old_per_token_logps``; ``_get_per_token_logps_and_entropies`` returning 3 values;
TRL's loss aggregation per loss_type (re-used by the k2/forward terms); Unsloth's left-packed
(B, C + max_left_pad) reference layout.
"""

from __future__ import annotations

import warnings

import torch

from sage_unsloth import anchor
from sage_unsloth.rlvr.config import LOSS_LEVEL_KL_LOSS_TYPES
from sage_unsloth.rlvr.resume import ExactResumeMixin

__all__ = [
    "SageGRPOTrainer",
    "SageTrainerMixin",
    "aggregate_like_trl",
    "install_cpu_logprob_fallback",
    "is_unsloth_patched",
    "make_sage_trainer_class",
    "prompt_pad_counts",
    "to_unsloth_layout",
]


# --------------------------------------------------------------------------- pure functions


def prompt_pad_counts(prompt_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """k_i: pad tokens in each prompt row (Unsloth's calculate_pad_tokens_in_prompt)."""
    return (prompt_ids == pad_token_id).sum(dim=1)


def to_unsloth_layout(values: torch.Tensor, prompt_ids: torch.Tensor, completion_ids: torch.Tensor,
                      pad_token_id: int, fill: float = 0.0) -> torch.Tensor:
    """Map per-completion-token values (B, C) into Unsloth's scoring layout (B, C + M).

    Unsloth moves every pad token of prompt+completion to the right (a stable sort of the non-pad mask)
    and scores the last C + M columns, M = max pad count of the prompts; row i's completion then starts
    at column M - k_i. We apply the same permutation to the values, so each value stays with its token
    whatever the padding (including a pad-valued EOS inside the completion).
    """
    if values.shape != completion_ids.shape:
        raise ValueError(f"values {tuple(values.shape)} must match completion_ids {tuple(completion_ids.shape)}")
    prompt_len, completion_len = prompt_ids.shape[1], completion_ids.shape[1]
    max_left_pad = int(prompt_pad_counts(prompt_ids, pad_token_id).max().item()) if prompt_len else 0
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    order = torch.argsort((input_ids != pad_token_id).to(torch.int8), dim=1, descending=True, stable=True)
    full = torch.cat([values.new_full((values.shape[0], prompt_len), fill), values], dim=1)
    packed = torch.gather(full, 1, order.to(values.device))
    return packed[:, -(completion_len + max_left_pad):]


def aggregate_like_trl(per_token: torch.Tensor, mask: torch.Tensor, *, loss_type: str, max_completion_length: int,
                       num_items_in_batch: torch.Tensor | None, num_processes: int, accumulation_steps: int,
                       steps_per_generation: int, training: bool) -> torch.Tensor:
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
    raise ValueError(f"loss-level KL terms support loss_type in {LOSS_LEVEL_KL_LOSS_TYPES}, got {loss_type!r}")


class TorchChunkedLogProb:
    """Plain-torch stand-in for TRL 1.15's Triton ``ChunkedLogProbFunction`` (same ``apply`` signature).

    TRL 1.15's GRPOTrainer scores every sequence through a fused LM head whose kernel is Triton-only;
    without Triton (CPU machines) ``trl.trainer.utils._ChunkedLogProbFunction`` is None and scoring
    fails. This computes the same per-token fields with ordinary autograd, materialising the logits.
    """

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
              logit_scale=1.0, outputs=("entropy",)):
        logits = torch.nn.functional.linear(hidden.float(), weight.float(), None if bias is None else bias.float())
        logits = logits * logit_scale
        if final_logit_softcapping is not None:
            logits = final_logit_softcapping * torch.tanh(logits / final_logit_softcapping)
        logits = logits / temperature
        log_probs_all = torch.log_softmax(logits, dim=-1)
        log_probs = log_probs_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs_all.exp() * log_probs_all).sum(-1) if "entropy" in outputs else None
        with torch.no_grad():
            log_sum_sq = torch.logsumexp(2 * log_probs_all, -1) if "log_sum_sq_probs" in outputs else None
            mean_logits = logits.mean(-1) if "mean_logits" in outputs else None
            is_top1 = (log_probs >= log_probs_all.max(-1).values) if "is_top1" in outputs else None
        return log_probs, entropy, log_sum_sq, mean_logits, is_top1


def install_cpu_logprob_fallback() -> bool:
    """Give TRL's fused LM head a torch kernel when Triton is missing; True if it was installed."""
    import trl.trainer.utils as trl_utils

    if getattr(trl_utils, "_ChunkedLogProbFunction", None) is None:
        trl_utils._ChunkedLogProbFunction = TorchChunkedLogProb
        return True
    return False


_UNSLOTH_PACKAGES = ("unsloth", "unsloth_zoo", "unsloth_compiled_cache")


def is_unsloth_patched(cls: type) -> bool:
    """True when ``cls`` derives from Unsloth's rewritten GRPOTrainer (unsloth_compiled_cache)."""
    # Its module is "unsloth_compiled_cache.UnslothGRPOTrainer" or, with the cache on sys.path,
    # "UnslothGRPOTrainer"; the class is named UnslothGRPOTrainer over _UnslothGRPOTrainer.
    return any((klass.__module__ or "").split(".")[0] in _UNSLOTH_PACKAGES or klass.__name__.startswith("Unsloth")
               for klass in cls.__mro__ if klass is not SageTrainerMixin)


@torch.no_grad()
def policy_logps_and_entropies(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int,
                               temperature: float, rows_per_chunk: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain no-grad forward: token logps and entropies (B, C) at temperature ``temperature``.

    Used under Unsloth, whose scorer never returns entropies. If the (patched) model returns hidden
    states instead of logits, the output head is applied here.
    """
    logps, entropies = [], []
    head = model.get_output_embeddings()
    for start in range(0, input_ids.size(0), rows_per_chunk):
        ids = input_ids[start:start + rows_per_chunk]
        out = model(input_ids=ids, attention_mask=attention_mask[start:start + rows_per_chunk],
                    logits_to_keep=completion_len + 1, use_cache=False)
        outputs = out.logits[:, -(completion_len + 1):-1, :]
        tokens = ids[:, -completion_len:]
        row_logps, row_entropies = [], []
        # Position chunks keep the fp32 log-softmax at (rows, 1024, vocab) however long the completions are.
        for pos in range(0, completion_len, 1024):
            logits = outputs[:, pos:pos + 1024]
            if head is not None and logits.shape[-1] == head.weight.shape[1] != head.weight.shape[0]:
                logits = head(logits)  # Unsloth returned hidden states
            log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
            row_logps.append(log_probs.gather(-1, tokens[:, pos:pos + 1024].unsqueeze(-1)).squeeze(-1))
            row_entropies.append(-(log_probs.exp() * log_probs).sum(-1))
        logps.append(torch.cat(row_logps, 1))
        entropies.append(torch.cat(row_entropies, 1))
    return torch.cat(logps), torch.cat(entropies)


# --------------------------------------------------------------------------- trainer mixin


class SageTrainerMixin:
    """Put the SAGE guide into GRPO's KL anchor. Mix in front of a GRPOTrainer class (see the factory)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.args
        if not hasattr(cfg, "sage_guide"):
            raise TypeError(f"SAGE trainers need a SageGRPOConfig (sage_unsloth.rlvr.config), got {type(cfg).__name__}")
        self._sage_patched = is_unsloth_patched(type(self))
        if self._sage_patched and cfg.kl_estimator != "k3":
            raise ValueError(
                f"kl_estimator={cfg.kl_estimator!r} is not a shifted reference and Unsloth's patched loss only "
                "reads the reference: use backend=trl (TRL's loss) or kl_estimator=k3"
            )
        if not self.sage_q_in_loss and cfg.sage_guide in ("branch", "token") and (
                self.num_iterations != 1 or cfg.steps_per_generation != cfg.gradient_accumulation_steps):
            warnings.warn(f"SAGE {cfg.sage_guide} q is computed from the rollout policy, not the in-loss policy as "
                          "in the official code (num_iterations != 1 or steps_per_generation != "
                          "gradient_accumulation_steps)", stacklevel=2)
        self._sage_schedule = None
        if cfg.sage_guide in ("token", "random"):
            max_steps = max(1, int(self.args.max_steps if self.args.max_steps > 0 else 1000))
            upper, lower, s_up, s_low = (
                (cfg.sage_alpha_upper, cfg.sage_alpha_lower, cfg.sage_sigma_upper, cfg.sage_sigma_lower)
                if cfg.sage_guide == "token"
                else (cfg.sage_eps_upper, cfg.sage_eps_lower, cfg.sage_random_sigma_upper,
                      cfg.sage_random_sigma_lower)
            )
            self._sage_schedule = anchor.CosineSchedule(max_steps, upper, lower, s_up, s_low,
                                                        cycles=cfg.sage_schedule_cycles,
                                                        decay=cfg.sage_schedule_decay)
        self._sage_generator = torch.Generator(device="cpu")
        self._sage_last_step, self._sage_calls_in_step = -1, 0
        self._sage_capture = None  # set while we want to see the next logps call's outputs
        self.sage_forward_passes = 0  # extra no-grad policy forwards this trainer ran for q (for benchmarks)

    # -- q ----------------------------------------------------------------------------------------------

    @property
    def sage_q_in_loss(self) -> bool:
        """Branch/token q computed inside TRL's loss from its own forward (no extra pass)?"""
        source = self.args.sage_q_source
        if source == "loss" and self._sage_patched:
            raise ValueError("sage_q_source='loss' needs TRL's loss; Unsloth's patched loss never calls it: "
                             "use sage_q_source=rollout or auto")
        in_loss = source == "loss" or (source == "auto" and not self._sage_patched)
        return in_loss and self.args.sage_guide in ("branch", "token")

    def _sage_old_logps_forward_planned(self) -> bool:
        """TRL 1.15's condition for scoring old_per_token_logps in _generate_and_score_completions."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self.args.gradient_accumulation_steps % generate_every != 0 or bool(
            self.use_vllm and getattr(self, "vllm_importance_sampling_correction", False)
        )

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        capture = self._sage_capture
        if capture is not None and not self._sage_patched:
            # The first scoring call of the rollout is TRL's old-logp pass of the policy: ask it for the
            # entropies too, so the branch guide needs no extra forward.
            self._sage_capture = None
            kwargs["compute_entropy"] = kwargs.get("compute_entropy", False) or capture["need_entropy"]
            result = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
            capture["logps"], capture["entropies"] = result[0], result[1]
            return result
        return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

    def _sage_guide_step(self) -> int:
        step = int(self.state.global_step)
        if step != self._sage_last_step:
            self._sage_last_step, self._sage_calls_in_step = step, 0
        else:
            self._sage_calls_in_step += 1
        # Seeded from (seed, step, call, process): reproducible and identical after a resume.
        seed = (self.args.guide_seed * 1_000_003 + step * 1009 + self._sage_calls_in_step * 7
                + self.accelerator.process_index)
        self._sage_generator.manual_seed(seed)
        return step

    def _sage_rollout_stats(self, output: dict, captured: dict | None, need_entropy: bool):
        """(logps, entropies) of the rollout policy at the completion tokens, TRL layout (B, C)."""
        if captured and captured.get("logps") is not None and (captured.get("entropies") is not None
                                                              or not need_entropy):
            return captured["logps"], captured.get("entropies")
        prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        completion_len = completion_ids.size(1)
        self.sage_forward_passes += 1
        mode = "train" if self.model.training else "eval"
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        if self._sage_patched:
            return policy_logps_and_entropies(self.model, input_ids, attention_mask, completion_len,
                                              self.temperature, rows_per_chunk=1)
        with torch.no_grad():
            logps, entropies, _ = super()._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, completion_len, batch_size=batch_size,
                compute_entropy=need_entropy,
            )
        return logps, entropies

    def sage_compute_q(self, output: dict, captured: dict | None = None) -> torch.Tensor:
        """q (B, C) in TRL's layout for this batch; 1 on masked tokens. ``captured`` may hold the policy's
        logps / entropies already computed by a forward TRL ran anyway."""
        cfg = self.args
        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        bounds = {"q_min": cfg.sage_q_min, "q_max": cfg.sage_q_max}
        if cfg.sage_guide == "none":
            return torch.ones_like(mask, dtype=torch.float32)
        step = self._sage_guide_step()
        if cfg.sage_guide == "branch":
            _, entropies = self._sage_rollout_stats(output, captured, need_entropy=True)
            return anchor.branch_guide(entropies, mask, gamma=cfg.sage_gamma, tau=cfg.sage_tau, **bounds)
        value, sigma = self._sage_schedule(step)
        if cfg.sage_guide == "token":
            logps, _ = self._sage_rollout_stats(output, captured, need_entropy=False)
            return anchor.token_guide(logps, mask, alpha=value, sigma=sigma, norm=cfg.sage_token_norm,
                                      generator=self._sage_generator, **bounds)
        return anchor.random_guide(mask, eps=value, sigma=sigma, generator=self._sage_generator, **bounds)

    def _sage_log_q_metrics(self, q: torch.Tensor, mask: torch.Tensor) -> None:
        mode = "train" if self.model.training else "eval"
        valid = mask.bool()
        values = q[valid].float()
        count = torch.tensor([values.numel()], device=q.device, dtype=torch.float32)
        stats = torch.stack([values.sum(), (values > 1.0).float().sum()]) if values.numel() else q.new_zeros(2)
        totals = self.accelerator.reduce(torch.cat([stats.float(), count]), reduction="sum")
        # A rank without completion tokens must not pull the global min / max to its placeholder.
        lo = values.min() if values.numel() else q.new_tensor(float("inf"))
        hi = values.max() if values.numel() else q.new_tensor(float("-inf"))
        n = totals[2].clamp(min=1.0)
        q_min = self.accelerator.gather(lo.float().reshape(1)).min().item()
        q_max = self.accelerator.gather(hi.float().reshape(1)).max().item()
        self._metrics[mode]["sage/q_mean"].append((totals[0] / n).item())
        self._metrics[mode]["sage/frac_boosted"].append((totals[1] / n).item())
        self._metrics[mode]["sage/q_min"].append(q_min if totals[2] > 0 else 1.0)
        self._metrics[mode]["sage/q_max"].append(q_max if totals[2] > 0 else 1.0)

    def _shift_reference(self, output: dict, q: torch.Tensor) -> None:
        """ref_per_token_logps <- ref + log q, in whichever layout the scorer produced."""
        ref = output.get("ref_per_token_logps")
        if ref is None:
            return
        log_q = anchor.log_q(q).to(ref.dtype)
        completion_len = output["completion_ids"].size(1)
        if ref.shape == log_q.shape and not ("max_left_pad" in output and self._sage_patched):
            output["ref_per_token_logps"] = ref + log_q
            return
        pad_id = self.processing_class.pad_token_id if hasattr(self.processing_class, "pad_token_id") \
            else self.processing_class.tokenizer.pad_token_id
        mapped = to_unsloth_layout(log_q, output["prompt_ids"], output["completion_ids"], pad_id)
        if mapped.shape != ref.shape:
            raise RuntimeError(
                f"SAGE cannot place log q: ref_per_token_logps has shape {tuple(ref.shape)}, expected (B, C)="
                f"{tuple(log_q.shape)} (TRL) or (B, C + max_left_pad)={tuple(mapped.shape)} (Unsloth); "
                f"completion length {completion_len}. Check the pinned trl/unsloth versions."
            )
        output["ref_per_token_logps"] = ref + mapped.to(ref.device)

    def _generate_and_score_completions(self, inputs):
        guide = self.args.sage_guide
        if self.sage_q_in_loss:  # q is computed in _compute_loss from the loss forward's own outputs
            return super()._generate_and_score_completions(inputs)
        captured = None
        if guide in ("branch", "token") and not self._sage_patched and self._sage_old_logps_forward_planned():
            captured = {"need_entropy": guide == "branch"}
            self._sage_capture = captured
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._sage_capture = None
        q = self.sage_compute_q(output, captured)
        mask = output["completion_mask"] * output["tool_mask"] if "tool_mask" in output else output["completion_mask"]
        self._sage_log_q_metrics(q, mask)
        if guide != "none" and self.beta != 0.0:
            self._shift_reference(output, q)
        return output

    # -- loss-level KL estimators (TRL path only) -----------------------------------------------------

    def _compute_loss(self, model, inputs):
        estimator = self.args.kl_estimator
        q_in_loss = self.sage_q_in_loss
        if not q_in_loss and (estimator == "k3" or self.beta == 0.0):
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)  # the batch is reused across num_iterations: shift a copy, never the buffer
        captured = {}
        original = super()._get_per_token_logps_and_entropies

        def capture_logps(*a, **kw):
            result = original(*a, **kw)
            if "logps" not in captured:  # the loss's own forward: TRL reads the reference only after it
                captured["logps"] = result[0]
                if q_in_loss:
                    self._sage_shift_in_loss(inputs, result[0], result[1])
            return result

        self._get_per_token_logps_and_entropies = capture_logps  # instance attribute: this call only
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            del self._get_per_token_logps_and_entropies
        if estimator == "k3" or self.beta == 0.0:
            return loss
        return loss + self._sage_kl_correction(inputs, captured["logps"])

    def _sage_shift_in_loss(self, inputs: dict, logps: torch.Tensor, entropies: torch.Tensor | None) -> None:
        """The official code's order: q from the current policy's entropies / logps, no gradient."""
        stats = {"logps": logps.detach(), "entropies": None if entropies is None else entropies.detach()}
        q = self.sage_compute_q(inputs, stats)
        mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
        self._sage_log_q_metrics(q, mask)
        if self.beta != 0.0 and inputs.get("ref_per_token_logps") is not None:
            inputs["ref_per_token_logps"] = inputs["ref_per_token_logps"] + anchor.log_q(q).to(logps.dtype)

    def _sage_kl_correction(self, inputs: dict, logps: torch.Tensor) -> torch.Tensor:
        """beta * agg(kl_estimator - k3): swaps TRL's k3 term for k2 / forward, leaving the rest of its loss."""
        ref = inputs["ref_per_token_logps"]  # already shifted by log q
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        if self.args.kl_estimator == "k2":
            wanted = anchor.shaped_kl(logps, ref, 0.0, estimator="k2")
        else:
            wanted = anchor.forward_kl(logps, ref)
        k3 = anchor.shaped_kl(logps, ref, 0.0, estimator="k3")
        difference = wanted - k3
        if self.args.use_bias_correction_kl:
            old = inputs.get("old_per_token_logps")
            old = logps.detach() if old is None else old
            log_ratio = logps - old
            if self.importance_sampling_level == "sequence":
                log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
            difference = difference * torch.exp(log_ratio)
        training = self.model.training
        correction = self.beta * aggregate_like_trl(
            difference, mask, loss_type=self.loss_type, max_completion_length=self.max_completion_length,
            num_items_in_batch=inputs.get("num_items_in_batch"), num_processes=self.accelerator.num_processes,
            accumulation_steps=self.current_gradient_accumulation_steps,
            steps_per_generation=self.args.steps_per_generation, training=training,
        )
        mode = "train" if training else "eval"
        kl_log = self._metrics[mode]["kl"]
        if kl_log:  # TRL logged the k3 value; log the estimator actually in the loss instead
            kl_log.pop()
            totals = self.accelerator.reduce(torch.stack([(wanted.detach() * mask).sum(), mask.sum().float()]),
                                             reduction="sum")
            kl_log.append((totals[0] / totals[1].clamp(min=1.0)).item())
        return correction


# --------------------------------------------------------------------------- factory

_CLASS_CACHE: dict[type, type] = {}


def _current_grpo_trainer_base() -> type:
    import trl  # looked up now: after `import unsloth` this is Unsloth's patched GRPOTrainer

    return trl.GRPOTrainer


def make_sage_trainer_class(base: type | None = None) -> type:
    """SageTrainerMixin (and the exact-resume state, rlvr/resume.py) over ``base`` (default: whatever
    ``trl.GRPOTrainer`` is at this moment)."""
    base = base or _current_grpo_trainer_base()
    install_cpu_logprob_fallback()
    if base not in _CLASS_CACHE:
        _CLASS_CACHE[base] = type(f"Sage{base.__name__}", (SageTrainerMixin, ExactResumeMixin, base),
                                  {"__module__": __name__})
    return _CLASS_CACHE[base]


def _fill_unsloth_config_fields(args, base: type) -> None:
    """Unsloth's patched trainer reads fields only its own GRPOConfig declares; give ours their defaults."""
    import dataclasses
    import sys

    import trl

    # The patched trainer's own module defines UnslothGRPOConfig (trl.GRPOConfig is rebound only by the full
    # `import unsloth` patching on a GPU).
    config_cls = None
    for klass in base.__mro__:
        config_cls = getattr(sys.modules.get(klass.__module__), "UnslothGRPOConfig", None)
        if config_cls is not None:
            break
    config_cls = config_cls or trl.GRPOConfig
    if not dataclasses.is_dataclass(config_cls):
        return
    for f in dataclasses.fields(config_cls):
        if not hasattr(args, f.name):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            setattr(args, f.name, default)


def SageGRPOTrainer(*args, **kwargs):
    """Build a SAGE GRPO trainer over the GRPOTrainer class current at call time (TRL's or Unsloth's)."""
    cls = make_sage_trainer_class()
    config = kwargs.get("args", args[2] if len(args) > 2 else None)
    if config is not None and is_unsloth_patched(cls):
        _fill_unsloth_config_fields(config, cls)
    return cls(*args, **kwargs)

