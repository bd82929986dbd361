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

The KL term (rlvr/kl_terms.py: k3, k2, forward, or a plug-in) other than TRL's own k3 is a loss-level term on
TRL's path (TRL's loss + beta * aggregate(term - TRL's k3 term), aggregated exactly as TRL aggregates its loss:
forward always carries the ratio pi / pi_old, k2 its stop-gradient, so each has its KL's gradient whatever
``use_bias_correction_kl`` says) and an error on Unsloth's.

``sage_kl_placement: reward`` moves the sequence-level pseudo-KL into the reward instead: after TRL's rollout,
r~ = r - beta * sum_t [log pi - log pi_ref - log q_t] (rollout policy, no gradient) and the group advantage is
recomputed from r~ (TRL's formula, ``group_advantages``); TRL's own beta is set to 0 so its loss has no KL.

DAPO's pieces live in rlvr/dapo.py (dynamic sampling, TRL 0.23's "dapo" normaliser, the vLLM importance-sampling
clipped fraction); DAPO's soft overlong punishment is TRL's own reward function, added by the factory.

The GRPOTrainer base class is looked up when the trainer is built, not when this module is imported:
after ``import unsloth`` on a GPU ``trl.GRPOTrainer`` is Unsloth's patched class, and a class frozen at
import time would silently subclass the unpatched one (plain GRPO under Unsloth's loss would then never
see q).

Every TRL / Unsloth internal this module touches (the GRPOTrainer methods it overrides, the attributes and
batch keys it reads, Unsloth's class names and layout, the CPU kernel) is named, pinned and tested in
sage_unsloth/compat.py; this module keeps the SAGE logic.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import nullcontext

import torch

from sage_unsloth import anchor, compat, guides
from sage_unsloth.checkpoints import AtomicCheckpointMixin
from sage_unsloth.compat import (
    group_advantages,
    install_cpu_logprob_fallback,
    is_unsloth_patched,
    policy_logps_and_entropies,
    to_unsloth_layout,
)
from sage_unsloth.rlvr import dapo
from sage_unsloth.rlvr.config import off_policy_q_warning, unsloth_conflict
from sage_unsloth.rlvr.dapo import concat_rollouts, importance_sampling_clipped_fraction
from sage_unsloth.rlvr.exploration import ExplorationMixin
from sage_unsloth.rlvr.kl_terms import KL_TERMS, KLTokens
from sage_unsloth.rlvr.resume import ExactResumeMixin
from sage_unsloth.rlvr.unsloth_hooks import InUnslothLossBranchQ

logger = logging.getLogger(__name__)

__all__ = [
    "SageGRPOTrainer",
    "SageTrainerMixin",
    "concat_rollouts",
    "guide_noise_seed",
    "importance_sampling_clipped_fraction",
    "make_sage_trainer_class",
]


# Above this share of clipped q in a step the trainer warns (once per run): the guide asks for values the clip
# range [sage_q_min, sage_q_max] does not allow.
Q_CLIPPED_WARN_FRAC = 0.1

# --------------------------------------------------------------------------- pure functions


def guide_noise_seed(seed: int, step: int, call: int, process: int) -> int:
    """Seed of the token / random guide noise for one q computation: the call-th of optimizer step ``step`` on
    process ``process``. A pure function of these, so a resumed run draws exactly the same noise."""
    return seed * 1_000_003 + step * 1009 + call * 7 + process


def _detached(value):
    return value.detach() if torch.is_tensor(value) else value


# --------------------------------------------------------------------------- trainer mixin


class SageTrainerMixin:
    """Put the SAGE guide into GRPO's KL anchor. Mix in front of a GRPOTrainer class (see the factory)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.args
        if not hasattr(cfg, "sage_guide"):
            raise TypeError(
                f"SAGE trainers need a SageGRPOConfig (sage_unsloth.rlvr.config), got {type(cfg).__name__}"
            )
        self._sage_patched = is_unsloth_patched(type(self))
        # The config checked these for the class it expected (rlvr/config.py); this is the class we got.
        if (conflict := unsloth_conflict(cfg, self._sage_patched)) is not None:
            raise ValueError(conflict)
        self.sage_placement = getattr(cfg, "sage_kl_placement", "loss")
        # The KL coefficient SAGE uses: in the reward placement TRL's own beta becomes 0 (no KL in its loss,
        # no reference pass of its own) and this one weighs the pseudo-KL in the reward.
        self.sage_beta = self.beta
        if self.sage_placement == "reward":
            self.beta = 0.0
        if getattr(cfg, "dynamic_sampling", False) and self.accelerator.num_processes != 1:
            raise ValueError(
                "dynamic_sampling drops whole groups, which needs every group on one process: "
                "run on one process or set dynamic_sampling=false"
            )
        self._sage_rewards_per_func = (
            None  # the last rollout's rewards (TRL's _calculate_rewards), all processes
        )
        # The config warned already when it expected q at rollout; warn here only when the class we got moved q
        # out of the loss against that expectation.
        q_source = "loss" if self.sage_q_in_loss else "rollout"
        if q_source != cfg.expected_q_source and (message := off_policy_q_warning(cfg, q_source)):
            warnings.warn(message, stacklevel=2)
        entry, needs, _ = self.sage_guide()
        if not (entry.registered and entry.name == "none"):
            where = "in the loss" if self.sage_q_in_loss else "at rollout"
            logger.info(
                "SAGE guide %s (needs %s): q computed %s", entry.name, ", ".join(needs) or "nothing", where
            )
        self._sage_generator = torch.Generator(device="cpu")
        self._sage_last_step, self._sage_calls_in_step = -1, 0
        self._sage_capture = None  # set while we want to see the next logps call's outputs
        self._sage_ref_capture = None  # set while we want the entropies of TRL's reference pass too
        self.sage_forward_passes = 0  # extra no-grad policy forwards this trainer ran for q (for benchmarks)

    # -- q ----------------------------------------------------------------------------------------------

    def sage_guide(self):
        """(entry, needs, callable) of the configured guide, rebuilt only when sage_guide / its args change."""
        cfg = self.args
        key = (cfg.sage_guide, repr(getattr(cfg, "sage_guide_args", None)))
        cached = getattr(self, "_sage_guide_cache", None)
        if cached is None or cached[0] != key:
            entry, needs = guides.resolve_guide(cfg)
            cached = self._sage_guide_cache = (key, entry, needs, guides.build_guide(cfg))
        return cached[1:]

    @property
    def sage_guide_needs(self) -> tuple[str, ...]:
        return self.sage_guide()[1]

    @property
    def sage_q_in_loss(self) -> bool:
        """q computed inside the loss from its own forward (no extra pass)? Whenever the guide reads the policy and
        the loss has what it reads: every signal on TRL's trainer, the entropies only under Unsloth's patched one
        (sage_unsloth/rlvr/unsloth_hooks.py). guides.q_source is the rule."""
        source = guides.q_source(
            self.sage_guide_needs, requested=self.args.sage_q_source, unsloth_patched=self._sage_patched
        )
        # The reward placement needs q when the reward is computed, i.e. at rollout.
        return source == "loss" and self.sage_placement == "loss"

    def _sage_old_logps_forward_planned(self) -> bool:
        """Will TRL's rollout score old_per_token_logps (a policy pass whose entropies q can reuse)?"""
        return compat.trl_scores_old_logps(self)

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        ref_capture = self._sage_ref_capture
        if ref_capture is not None:
            if ref_capture["skip"]:
                ref_capture["skip"] -= (
                    1  # TRL's old-logp pass comes first (compat.trl_reference_scoring_index)
                )
            else:
                # TRL's reference pass: the same call, asked for the reference's entropies as well.
                self._sage_ref_capture = None
                kwargs["compute_entropy"] = True
                result = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
                ref_capture["ref_logps"], ref_capture["ref_entropies"] = result[0], result[1]
                return result
        capture = self._sage_capture
        if capture is not None and not self._sage_patched:
            # The first scoring call of the rollout is TRL's old-logp pass of the policy: ask it for the
            # entropies (and the guide's logit signals) too, so the guide needs no extra forward.
            self._sage_capture = None
            kwargs["compute_entropy"] = kwargs.get("compute_entropy", False) or capture["need_entropy"]
            result, logits = self._sage_score_with_signals(
                super()._get_per_token_logps_and_entropies, model, args, kwargs
            )
            capture["logps"], capture["entropies"], capture["logits"] = result[0], result[1], logits
            return result
        return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

    def _sage_score_with_signals(self, score, model, args: tuple, kwargs: dict):
        """TRL's scorer ``score`` called once; the guide's logit signals computed in the same chunked pass
        (compat.logit_signal_tap). Returns (TRL's result, {signal: (B, C)})."""
        fns = guides.logit_signal_functions(self.sage_guide_needs)
        if not fns:
            return score(model, *args, **kwargs), {}
        names = ("input_ids", "attention_mask", "logits_to_keep")
        bound = dict(zip(names, args)) | {k: kwargs[k] for k in names if k in kwargs}
        tapped: dict = {}
        with compat.logit_signal_tap(
            fns, bound["input_ids"], bound["attention_mask"], bound["logits_to_keep"], tapped
        ):
            result = score(model, *args, **kwargs)
        compat.check_tap_alignment(tapped, result[0])
        return result, tapped

    def _sage_guide_step(self) -> int:
        step = int(self.state.global_step)
        if step != self._sage_last_step:
            self._sage_last_step, self._sage_calls_in_step = step, 0
        else:
            self._sage_calls_in_step += 1
        self._sage_generator.manual_seed(
            guide_noise_seed(
                self.args.guide_seed, step, self._sage_calls_in_step, self.accelerator.process_index
            )
        )
        return step

    def _sage_rollout_stats(self, output: dict, captured: dict | None, need_entropy: bool, logit_signals=()):
        """(logps, entropies, {logit signal: values}) of the rollout policy at the completion tokens, TRL layout
        (B, C): from ``captured`` (a pass TRL ran anyway) when it has them, else one no-grad pass of our own."""
        if (
            captured
            and captured.get("logps") is not None
            and (captured.get("entropies") is not None or not need_entropy)
            and all(name in (captured.get("logits") or {}) for name in logit_signals)
        ):
            return captured["logps"], captured.get("entropies"), captured.get("logits") or {}
        prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        completion_len = completion_ids.size(1)
        self.sage_forward_passes += 1
        mode = "train" if self.model.training else "eval"
        batch_size = (
            self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        )
        fns = {name: guides.LOGIT_SIGNALS.resolve(name).obj for name in logit_signals}
        if self._sage_patched:
            # Unsloth's scorer returns neither entropies nor logits: the kit's own pass gives both.
            logps, entropies, logits = policy_logps_and_entropies(
                self.model,
                input_ids,
                attention_mask,
                completion_len,
                self.temperature,
                rows_per_chunk=1,
                logit_signals=fns,
            )
            return logps, entropies, logits
        score = super()._get_per_token_logps_and_entropies
        with torch.no_grad():
            (logps, entropies, _), logits = self._sage_score_with_signals(
                score,
                self.model,
                (input_ids, attention_mask, completion_len),
                {"batch_size": batch_size, "compute_entropy": need_entropy},
            )
        return logps, entropies, logits

    def sage_compute_q(self, output: dict, captured: dict | None = None) -> torch.Tensor:
        """q (B, C) in TRL's layout for this batch; 1 on masked tokens. ``captured`` may hold the policy's
        logps / entropies / logit signals already computed by a forward TRL ran anyway (or the loss's own)."""
        mask = compat.loss_mask(output)
        entry, needs, guide = self.sage_guide()
        if entry.registered and entry.name == "none":
            return torch.ones_like(mask, dtype=torch.float32)
        step = self._sage_guide_step()
        if "ref_entropies" in needs and (captured or {}).get("ref_entropies") is None:
            raise RuntimeError(  # the config refuses a guide without a KL anchor (beta 0), so a pass always runs
                f"sage_guide={entry.name!r} needs ref_entropies, but no reference pass ran in this rollout"
            )
        stats = {}
        logit_signals = guides.logit_signal_names(needs)
        if any(n in guides.POLICY_SIGNALS for n in needs) or logit_signals:
            logps, entropies, logits = self._sage_rollout_stats(
                output, captured, need_entropy="entropies" in needs, logit_signals=logit_signals
            )
            stats = {"logps": logps, "entropies": entropies, "logits": logits}
        return self._sage_q_from(entry, guide, mask, step, output, stats, captured)

    def _sage_q_from(self, entry, guide, mask, step, output, stats, captured) -> torch.Tensor:
        """Run the guide on its Signals (no gradient) and let guides.finalise_q check, clip and mask its q."""
        extra = captured or {}
        return self._sage_run_guide(
            entry,
            guide,
            mask,
            step,
            layout="trl",
            entropies=_detached(stats.get("entropies")),
            logps=_detached(stats.get("logps")),
            ref_logps=_detached(extra.get("ref_logps", output.get("ref_per_token_logps")))
            if "ref_logps" in entry.meta["needs"]
            else None,
            ref_entropies=_detached(extra.get("ref_entropies"))
            if "ref_entropies" in entry.meta["needs"]
            else None,
            old_logps=_detached(output.get("old_per_token_logps"))
            if "old_logps" in entry.meta["needs"]
            else None,
            prompt_ids=output.get("prompt_ids"),
            completion_ids=output.get("completion_ids"),
            logits=stats.get("logits") or {},
        )

    def _sage_run_guide(self, entry, guide, mask, step, *, layout: str, **signals) -> torch.Tensor:
        """The guide on its Signals (the per-step fields filled here, the per-layout ones given), no gradient,
        then guides.finalise_q's checks, clipping and masking: one path for the TRL and Unsloth layouts."""
        cfg = self.args
        bundle = guides.Signals(
            mask=mask,
            step=step,
            max_steps=guides.default_max_steps(cfg.max_steps),
            generator=self._sage_generator,
            rank=self.accelerator.process_index,
            layout=layout,
            **signals,
        )
        with torch.no_grad():
            raw = guide(bundle)
        q = guides.finalise_q(raw, bundle, name=entry.name, q_min=cfg.sage_q_min, q_max=cfg.sage_q_max)
        self._sage_log_q_clipping(guides.clipped_fraction_counts(raw, mask, cfg.sage_q_min, cfg.sage_q_max))
        return q

    def _sage_log_q_clipping(self, counts: torch.Tensor) -> None:
        """sage/q_clipped_frac: the share of completion tokens (all processes) whose raw q was clipped to
        [sage_q_min, sage_q_max]; one warning per run when it exceeds Q_CLIPPED_WARN_FRAC, because a guide
        meant to reach a q outside the clip range is otherwise silently flattened."""
        cfg = self.args
        totals = self.accelerator.reduce(counts, reduction="sum")
        fraction = (totals[0] / totals[1].clamp(min=1.0)).item()
        mode = "train" if self.model.training else "eval"
        compat.metrics(self, mode)["sage/q_clipped_frac"].append(fraction)
        if fraction > Q_CLIPPED_WARN_FRAC and not getattr(self, "_sage_warned_q_clipped", False):
            self._sage_warned_q_clipped = True
            warnings.warn(
                f"sage_guide={cfg.sage_guide!r}: {fraction:.0%} of the completion tokens' q were clipped to "
                f"[sage_q_min={cfg.sage_q_min}, sage_q_max={cfg.sage_q_max}] at step {int(self.state.global_step)}; "
                "widen sage_q_min / sage_q_max if the guide means those values (sage/q_clipped_frac)",
                stacklevel=2,
            )

    def _sage_log_q_metrics(self, q: torch.Tensor, mask: torch.Tensor) -> None:
        mode = "train" if self.model.training else "eval"
        valid = mask.bool()
        values = q[valid].float()
        count = torch.tensor([values.numel()], device=q.device, dtype=torch.float32)
        stats = (
            torch.stack([values.sum(), (values > 1.0).float().sum()]) if values.numel() else q.new_zeros(2)
        )
        totals = self.accelerator.reduce(torch.cat([stats.float(), count]), reduction="sum")
        # A rank without completion tokens must not pull the global min / max to its placeholder.
        lo = values.min() if values.numel() else q.new_tensor(float("inf"))
        hi = values.max() if values.numel() else q.new_tensor(float("-inf"))
        n = totals[2].clamp(min=1.0)
        # Mean over completions of the sequence-level log q(y) = sum_t log q_t (what the reward placement adds).
        seq_log_q = (anchor.log_q(q.float()) * mask).sum(-1)
        seq_totals = self.accelerator.reduce(
            torch.stack([seq_log_q.sum(), q.new_tensor(float(q.size(0)))]).float(), reduction="sum"
        )
        log = compat.metrics(self, mode)
        log["sage/seq_log_q"].append((seq_totals[0] / seq_totals[1].clamp(min=1.0)).item())
        q_min = self.accelerator.gather(lo.float().reshape(1)).min().item()
        q_max = self.accelerator.gather(hi.float().reshape(1)).max().item()
        log["sage/q_mean"].append((totals[0] / n).item())
        log["sage/frac_boosted"].append((totals[1] / n).item())
        log["sage/q_min"].append(q_min if totals[2] > 0 else 1.0)
        log["sage/q_max"].append(q_max if totals[2] > 0 else 1.0)
        # The first completion token apart (a task whose first token is its plan, like the demo's, has its
        # branch point there): mean q there, and the share of first and of later tokens with q > 1.
        first = valid[:, 0]
        later = valid.clone()
        later[:, 0] = False
        split = torch.stack(
            [
                q[:, 0][first].float().sum(),
                (q[:, 0][first] > 1.0).float().sum(),
                first.float().sum(),
                (q[later] > 1.0).float().sum(),
                later.float().sum(),
            ]
        )
        split = self.accelerator.reduce(split, reduction="sum")
        log["sage/q_first_mean"].append((split[0] / split[2].clamp(min=1.0)).item())
        log["sage/first_boosted"].append((split[1] / split[2].clamp(min=1.0)).item())
        log["sage/later_boosted"].append((split[3] / split[4].clamp(min=1.0)).item())

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
        pad_id = compat.pad_token_id(self.processing_class)
        mapped = to_unsloth_layout(log_q, output["prompt_ids"], output["completion_ids"], pad_id)
        if mapped.shape != ref.shape:
            raise RuntimeError(
                f"SAGE cannot place log q: ref_per_token_logps has shape {tuple(ref.shape)}, expected (B, C)="
                f"{tuple(log_q.shape)} (TRL) or (B, C + max_left_pad)={tuple(mapped.shape)} (Unsloth); "
                f"completion length {completion_len}. Check the pinned trl/unsloth versions."
            )
        output["ref_per_token_logps"] = ref + mapped.to(ref.device)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        from sage_unsloth.rlvr import reward

        reward.take_timeouts()  # count only this batch's pairs
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        mode = "train" if self.model.training else "eval"
        # Pairs the grader ran out of budget on (scored 0): a policy that learns to stall the grader shows here.
        compat.metrics(self, mode)["reward/grading_timeouts"].append(float(reward.take_timeouts()))
        self._sage_rewards_per_func = (
            rewards_per_func  # (N all processes, reward funcs): placement, dynamic sampling
        )
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        if getattr(self.args, "dynamic_sampling", False) and self.model.training:
            output = self._sage_dynamic_sampling(inputs)
        else:
            output = self._sage_rollout(inputs)
        self._sage_log_importance_sampling(output)
        self._sage_official_dapo_normaliser(output)
        return output

    def _sage_rollout(self, inputs):
        """One TRL rollout with the anchor's q in place (shifted reference, or the pseudo-KL in the reward)."""
        entry, needs, _ = self.sage_guide()
        if self.sage_q_in_loss:  # q is computed in _compute_loss from the loss forward's own outputs
            return super()._generate_and_score_completions(inputs)
        captured = None
        reads_policy = any(n in guides.POLICY_SIGNALS for n in needs) or guides.logit_signal_names(needs)
        need_stats = reads_policy or self.sage_placement == "reward"
        if need_stats and not self._sage_patched and self._sage_old_logps_forward_planned():
            captured = {"need_entropy": "entropies" in needs}
            self._sage_capture = captured
        ref_captured = None
        ref_index = compat.trl_reference_scoring_index(self)
        if "ref_entropies" in needs and self.sage_placement == "loss" and ref_index is not None:
            ref_captured = {"skip": ref_index}
            self._sage_ref_capture = ref_captured
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._sage_capture = self._sage_ref_capture = None
        if ref_captured is not None:
            captured = {**(captured or {}), **self._sage_checked_reference(output, ref_captured)}
        if self.sage_placement == "reward":
            self._sage_kl_in_reward(output, captured)
            return output
        q = self.sage_compute_q(output, captured)
        mask = compat.loss_mask(output)
        self._sage_log_q_metrics(q, mask)
        if not (entry.registered and entry.name == "none") and self.beta != 0.0:
            self._shift_reference(output, q)
        return output

    # -- the pseudo-KL in the reward (sage_kl_placement: reward) ----------------------------------------

    @staticmethod
    def _sage_checked_reference(output: dict, ref_captured: dict) -> dict:
        """The reference logps / entropies captured from TRL's reference pass, checked to be that pass (its logps
        are the batch's ref_per_token_logps), before log q shifts them."""
        ref = output.get("ref_per_token_logps")
        got = ref_captured.get("ref_logps")
        if (
            got is None
            or ref_captured.get("ref_entropies") is None
            or ref is None
            or not torch.equal(got, ref)
        ):
            raise RuntimeError(
                "SAGE ref_entropies: the scoring call taken for TRL's reference pass is not the one that produced "
                "ref_per_token_logps; the kit is pinned to trl 1.15.0 (compat.py, old_logps_condition)"
            )
        return {"ref_logps": got, "ref_entropies": ref_captured["ref_entropies"]}

    def _sage_reference_logps(self, output: dict) -> torch.Tensor:
        """log pi_ref at the completion tokens (B, C), scored as TRL scores its reference."""
        return self._sage_reference_scores(output)[0]

    @torch.no_grad()
    def _sage_reference_scores(self, output: dict, entropies: bool = False):
        """(log pi_ref, H_ref or None) at the completion tokens (B, C), scored as TRL scores its reference."""
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        completion_len = output["completion_ids"].size(1)
        if self.ref_model is not None:
            model, context = self.ref_model, nullcontext()
        else:
            unwrapped = self.accelerator.unwrap_model(self.model)
            ref_adapter = compat.REF_ADAPTER if compat.REF_ADAPTER in unwrapped.peft_config else None
            context = compat.use_adapter(unwrapped, ref_adapter)
            model = self.model
        with context:
            if self._sage_patched:
                logps, ent = policy_logps_and_entropies(
                    model, input_ids, attention_mask, completion_len, self.temperature, rows_per_chunk=1
                )
                return logps, (ent if entropies else None)
            logps, ent, _ = super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                completion_len,
                batch_size=self.args.per_device_train_batch_size,
                compute_entropy=entropies,
            )
        return logps, ent

    def _sage_kl_in_reward(self, output: dict, captured: dict | None) -> None:
        """r~ = r - beta * sum_t [log pi - log pi_ref - log q_t] (rollout policy, no gradient), then TRL's group
        advantage of r~ replaces the batch's advantages."""
        if self._sage_rewards_per_func is None:
            raise RuntimeError(
                "sage_kl_placement=reward found no rewards from _calculate_rewards: check the pinned "
                "trl/unsloth versions"
            )
        mask = compat.loss_mask(output)
        _, needs, _ = self.sage_guide()
        logit_signals = guides.logit_signal_names(needs)
        logps, entropies, logits = self._sage_rollout_stats(
            output, captured, need_entropy="entropies" in needs, logit_signals=logit_signals
        )
        stats = {"logps": logps, "entropies": entropies, "logits": logits}
        # TRL's own reference pass is off here (its beta is 0): a guide reading the reference gets the kit's, which
        # the pseudo-KL needs anyway (with the entropies of the same pass for ref_entropies: no extra pass).
        ref = ref_entropies = None
        if any(n in guides.REFERENCE_SIGNALS for n in needs):
            ref, ref_entropies = self._sage_reference_scores(output, entropies="ref_entropies" in needs)
        q = self.sage_compute_q(output, {**stats, "ref_logps": ref, "ref_entropies": ref_entropies})
        self._sage_log_q_metrics(q, mask)
        if ref is None:
            ref = self._sage_reference_logps(output)
        seq_kl = anchor.sequence_pseudo_kl(logps.float(), ref.float(), anchor.log_q(q).to(logps.device), mask)
        all_seq_kl = self.accelerator.gather(seq_kl)
        rewards_per_func = self._sage_rewards_per_func
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(
            dim=1
        )
        rewards[unscorable] = torch.nan
        shaped = rewards - self.sage_beta * all_seq_kl.to(rewards.device)
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        # the shaped reward feeds whichever estimator the config chose (GRPO's group advantage by default)
        estimator = getattr(self, "_advantage_fn", None)
        advantages = (
            group_advantages(shaped, num_generations, self.scale_rewards)
            if estimator is None
            else estimator(shaped, num_generations, self.args)
        )
        rows = output["completion_ids"].size(0)
        start = self.accelerator.process_index * rows
        output["advantages"] = advantages[start : start + rows].to(output["advantages"].device)
        compat.metrics(self, mode)["sage/kl_in_reward"].append(
            (self.sage_beta * all_seq_kl.float().mean()).item()
        )

    # -- DAPO pieces (rlvr/dapo.py) ----------------------------------------------------------------------

    def _sage_dynamic_sampling(self, inputs):
        return dapo.dynamic_sampling(self, inputs)

    def _sage_official_dapo_normaliser(self, output: dict) -> None:
        dapo.official_normaliser(self, output)

    def _sage_log_importance_sampling(self, output: dict) -> None:
        dapo.log_importance_sampling(self, output)

    # -- loss-level KL estimators (TRL path only) -----------------------------------------------------

    def sage_kl_term(self):
        """(entry, callable) of the configured KL term (rlvr/kl_terms.py), its kl_term_args bound; rebuilt only
        when kl_estimator / kl_term_args change."""
        cfg = self.args
        key = (cfg.kl_estimator, repr(getattr(cfg, "kl_term_args", None)))
        cached = getattr(self, "_sage_kl_term_cache", None)
        if cached is None or cached[0] != key:
            entry = KL_TERMS.resolve(cfg.kl_estimator)
            bound = KL_TERMS.bind(entry, KL_TERMS.parse_args(getattr(cfg, "kl_term_args", None)))
            cached = self._sage_kl_term_cache = (key, entry, bound)
        return cached[1:]

    def _compute_loss(self, model, inputs):
        in_trl_loss = self.sage_kl_term()[0].meta["shifted_reference"] or self.beta == 0.0
        q_in_loss = self.sage_q_in_loss
        if not q_in_loss and in_trl_loss:
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)  # the batch is reused across num_iterations: shift a copy, never the buffer
        captured = {}
        original = super()._get_per_token_logps_and_entropies

        def capture_logps(model, *a, **kw):
            if "logps" in captured:
                return original(model, *a, **kw)
            # the loss's own forward (TRL reads the reference only after it); the guide's logit signals come
            # from its chunked pass
            if q_in_loss:
                result, logits = self._sage_score_with_signals(original, model, a, kw)
            else:
                result, logits = original(model, *a, **kw), {}
            captured["logps"] = result[0]
            if q_in_loss:
                self._sage_shift_in_loss(inputs, result[0], result[1], logits)
            return result

        self._get_per_token_logps_and_entropies = capture_logps  # instance attribute: this call only
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            del self._get_per_token_logps_and_entropies
        if in_trl_loss:
            return loss
        return loss + self._sage_kl_correction(inputs, captured["logps"])

    def _sage_shift_in_loss(
        self, inputs: dict, logps: torch.Tensor, entropies: torch.Tensor | None, logits: dict | None = None
    ) -> None:
        """The official code's order: q from the current policy's entropies / logps, no gradient."""
        stats = {
            "logps": logps.detach(),
            "entropies": None if entropies is None else entropies.detach(),
            "logits": logits or {},
        }
        q = self.sage_compute_q(inputs, stats)
        mask = compat.loss_mask(inputs)
        self._sage_log_q_metrics(q, mask)
        if self.beta != 0.0 and inputs.get("ref_per_token_logps") is not None:
            inputs["ref_per_token_logps"] = inputs["ref_per_token_logps"] + anchor.log_q(q).to(logps.dtype)

    def _sage_kl_correction(self, inputs: dict, logps: torch.Tensor) -> torch.Tensor:
        """beta * agg(term - TRL's k3 term): swaps TRL's k3 for the KL term's own (rlvr/kl_terms.py),
        leaving the rest of TRL's loss as it is."""
        ref = inputs["ref_per_token_logps"]  # already shifted by log q
        mask = compat.loss_mask(inputs)
        old = inputs.get("old_per_token_logps")
        kl = self.sage_kl_term()[1](
            KLTokens(logps=logps, ref_logps=ref, old_logps=old, ratio=self.args.use_bias_correction_kl)
        )
        wanted = kl.term
        # What TRL put in its loss: k3, times its importance weight (token or sequence level) if asked.
        trl_term = anchor.shaped_kl(logps, ref, 0.0, estimator="k3")
        if self.args.use_bias_correction_kl:
            log_ratio = logps - (logps.detach() if old is None else old)
            if self.importance_sampling_level == "sequence":
                log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
            trl_term = trl_term * torch.exp(log_ratio)
        training = self.model.training
        correction = self.beta * compat.aggregate_like_trainer(self, wanted - trl_term, mask, inputs)
        mode = "train" if training else "eval"
        kl_log = compat.metrics(self, mode)["kl"]
        if (
            kl_log
        ):  # TRL logged the k3 value; log the estimator actually in the loss instead (its plain value)
            kl_log.pop()
            value = kl.value.detach()
            totals = self.accelerator.reduce(
                torch.stack([(value * mask).sum(), mask.sum().float()]), reduction="sum"
            )
            kl_log.append((totals[0] / totals[1].clamp(min=1.0)).item())
        return correction


# --------------------------------------------------------------------------- factory

_CLASS_CACHE: dict[type, type] = {}


def make_sage_trainer_class(base: type | None = None) -> type:
    """SageTrainerMixin (and the exact-resume state, rlvr/resume.py) over ``base`` (default: whatever
    ``trl.GRPOTrainer`` is at this moment)."""
    base = base or compat.current_grpo_trainer_class()
    install_cpu_logprob_fallback()
    if base not in _CLASS_CACHE:
        # Under Unsloth's patched loss, branch q comes from the entropies that loss computes (unsloth_hooks);
        # ExactResumeMixin saves and restores the state TRL's checkpoints lack (rlvr/resume.py);
        # ExplorationMixin runs the exploration baselines inside SAGE's hooks (rlvr/exploration.py);
        # NoStepPastMaxStepsMixin: a resume from the last step's checkpoint trains nothing more;
        # AtomicCheckpointMixin: a checkpoint appears only whole (sage_unsloth/checkpoints.py).
        hooks = (InUnslothLossBranchQ,) if is_unsloth_patched(base) else ()
        _CLASS_CACHE[base] = type(
            f"Sage{base.__name__}",
            (
                SageTrainerMixin,
                *hooks,
                ExplorationMixin,
                AtomicCheckpointMixin,  # outside ExactResumeMixin: its resume state goes to the staging folder too
                ExactResumeMixin,
                compat.NoStepPastMaxStepsMixin,
                base,
            ),
            {"__module__": __name__},
        )
    return _CLASS_CACHE[base]


def _with_soft_overlong_punishment(args: tuple, kwargs: dict, config) -> tuple[tuple, dict]:
    """DAPO's soft overlong punishment as TRL's own reward function, after the task reward(s)."""
    cache = getattr(config, "soft_overlong_punish_cache", 0) if config is not None else 0
    if not cache:
        return args, kwargs
    from trl.rewards import get_soft_overlong_punishment

    punishment = get_soft_overlong_punishment(
        max_completion_len=config.max_completion_length, soft_punish_cache=cache
    )
    if "reward_funcs" in kwargs:
        funcs = kwargs["reward_funcs"]
        kwargs = {**kwargs, "reward_funcs": [*(funcs if isinstance(funcs, list) else [funcs]), punishment]}
    else:
        funcs = args[1]
        args = (args[0], [*(funcs if isinstance(funcs, list) else [funcs]), punishment], *args[2:])
    return args, kwargs


def SageGRPOTrainer(*args, **kwargs):
    """Build a SAGE GRPO trainer over the GRPOTrainer class current at call time (TRL's or Unsloth's)."""
    cls = make_sage_trainer_class()
    config = kwargs.get("args", args[2] if len(args) > 2 else None)
    if config is not None and is_unsloth_patched(cls):
        compat.fill_unsloth_config_fields(config, cls)
    args, kwargs = _with_soft_overlong_punishment(args, kwargs, config)
    return cls(*args, **kwargs)
