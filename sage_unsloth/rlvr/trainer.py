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

The KL term (plugins/kl_terms.py: k3, k2, forward, or a plug-in) other than TRL's own k3 is a loss-level term on
TRL's path (TRL's loss + beta * aggregate(term - TRL's k3 term), aggregated exactly as TRL aggregates its loss:
forward always carries the ratio pi / pi_old, k2 its stop-gradient, so each has its KL's gradient whatever
``use_bias_correction_kl`` says) and an error on Unsloth's.

``sage_kl_placement: reward`` moves the sequence-level pseudo-KL into the reward instead: after TRL's rollout,
r~ = r - beta * sum_t [log pi - log pi_ref - log q_t] (rollout policy, no gradient) and the group advantage is
recomputed from r~ by the configured estimator (GRPO's group advantage by default, TRL's formula); TRL's own
beta is set to 0 so its loss has no KL.

The method (guide, advantage estimator, policy term, KL term, placement) is the config's frozen plan
(rlvr/plan.py), which also chooses the steps that run it: plain functions of rlvr/taps.py at TRL's two
interception points, after the rollout and in the loss. This class owns the interception: it names the scoring
calls TRL is about to make, gathers the signals q reads, fills each step record's context, and holds the one q
entry point (:meth:`SageTrainerMixin.sage_q`); DAPO's pieces live in rlvr/dapo.py; DAPO's soft overlong punishment is TRL's own
reward function, added by the factory.

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

from sage_unsloth import compat
from sage_unsloth.compat import (
    install_cpu_logprob_fallback,
    is_unsloth_patched,
    policy_logps_and_entropies,
)
from sage_unsloth.plugins import anchor, guides
from sage_unsloth.rlvr import dapo, taps, unsloth_hooks
from sage_unsloth.rlvr.config import off_policy_q_warning, unsloth_conflict
from sage_unsloth.rlvr.dapo import concat_rollouts, importance_sampling_clipped_fraction
from sage_unsloth.rlvr.resume import ExactResumeMixin
from sage_unsloth.rlvr.taps import LossBatch, Rollout
from sage_unsloth.runtime.checkpoints import CheckpointMixin
from sage_unsloth.runtime.finite_steps import sampling_fault

logger = logging.getLogger(__name__)

__all__ = [
    "SageGRPOTrainer",
    "SageTrainerMixin",
    "concat_rollouts",
    "importance_sampling_clipped_fraction",
    "log_q_metrics",
    "make_sage_trainer_class",
]


# The config field that seeds each noise stream (taps.SEED_STREAMS).
NOISE_SEED_FIELDS = {"guide": "guide_seed", "policy_term": "seed"}

# Above this share of clipped q in a step the trainer warns (once per run): the guide asks for values the clip
# range [sage_q_min, sage_q_max] does not allow.
Q_CLIPPED_WARN_FRAC = 0.1


def _detached(value):
    return value.detach() if torch.is_tensor(value) else value


def _settable_steps(kind: str) -> property:
    """The trainer's steps of one kind (``taps.Steps`` field): the plan's, unless the instance set its own (a test
    inserting a probe ``probe(record)``: ``trainer.rollout_steps = (*trainer.rollout_steps, probe)``)."""

    def get(self):
        return getattr(self.sage_steps, kind)

    def set_own(self, steps):
        self._sage_own_steps[kind] = tuple(steps)

    return property(get, set_own)


# --------------------------------------------------------------------------- the trainer


class SageTrainerMixin:
    """GRPO with the SAGE anchor and the kit's methods, mixed in front of a GRPOTrainer class (see the factory).

    It overrides TRL's two interception points and runs there the steps the plan chose (rlvr/plan.py, taps.py):
    ``_generate_and_score_completions`` (with ``_calculate_rewards`` and the scoring calls of the rollout) and
    ``_compute_loss`` (with the loss forward's scoring call); under Unsloth's patched loss ``compute_loss`` and
    ``get_high_entropy_mask`` (rlvr/unsloth_hooks.py)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.args
        if not hasattr(cfg, "method_plan"):
            raise TypeError(
                f"SAGE trainers need a SageGRPOConfig (sage_unsloth.rlvr.config), got {type(cfg).__name__}"
            )
        self._sage_patched = is_unsloth_patched(type(self))
        plan = self.sage_plan
        # The config checked these for the class it expected (rlvr/config.py); this is the class we got.
        if (conflict := unsloth_conflict(plan, cfg, self._sage_patched)) is not None:
            raise ValueError(conflict)
        # The KL coefficient SAGE uses: in the reward placement TRL's own beta becomes 0 (no KL in its loss,
        # no reference pass of its own) and this one weighs the pseudo-KL in the reward.
        self.sage_beta = self.beta
        if plan.placement == "reward":
            self.beta = 0.0
        if getattr(cfg, "dynamic_sampling", False) and self.accelerator.num_processes != 1:
            raise ValueError(
                "dynamic_sampling drops whole groups, which needs every group on one process: "
                "run on one process or set dynamic_sampling=false"
            )
        # The config warned already for the q source it expected; warn here only when the class we got moved q
        # out of the loss against that expectation.
        q_source = "loss" if self.sage_q_in_loss else "rollout"
        if q_source != plan.expected_q_source and (message := off_policy_q_warning(cfg, q_source)):
            warnings.warn(message, stacklevel=2)
        if plan.guided:
            where = "in the loss" if self.sage_q_in_loss else "at rollout"
            needs = ", ".join(plan.guide_needs) or "nothing"
            logger.info("SAGE guide %s (needs %s): q computed %s", plan.guide.name, needs, where)
        logger.info(
            "method: advantage estimator %s, policy term %s, KL term %s (%s), KL in the %s",
            plan.estimator.name,
            "none" if plan.policy_term is None else plan.policy_term.name,
            plan.kl_term.name,
            "TRL's own k3" if plan.kl_in_trl_loss else "added to TRL's loss",
            plan.placement,
        )
        if cfg.ref_reset_steps:
            from sage_unsloth.rlvr.ref_reset import ReferenceReset

            self.add_callback(ReferenceReset(cfg.ref_reset_steps, cfg.ref_reset_optimizer))
        self._sage_own_steps: dict = {}  # steps an instance set for itself (rollout_steps = ...), by kind
        self._sage_noise = {stream: taps.StepNoise(stream) for stream in taps.SEED_STREAMS}
        self._sage_open_rollout: Rollout | None = None  # the rollout TRL is producing now
        self._sage_open_loss: LossBatch | None = None  # the loss call TRL / Unsloth is computing now
        self.last_rollout: Rollout | None = None  # the last finished rollout (tests, debugging)
        self.sage_forward_passes = 0  # extra no-grad policy forwards this trainer ran for q (for benchmarks)

    # -- the plan ----------------------------------------------------------------------------------------

    @property
    def sage_plan(self):
        """The config's frozen method plan (rlvr/plan.py)."""
        return self.args.method_plan

    @property
    def sage_q_in_loss(self) -> bool:
        """q computed inside the loss from its own forward (no extra pass)? Whenever the guide reads the policy and
        the loss has what it reads: every signal on TRL's trainer, the entropies only under Unsloth's patched one
        (rlvr/unsloth_hooks.py). MethodPlan.q_source is the rule."""
        return self.sage_plan.q_source(unsloth_patched=self._sage_patched) == "loss"

    @property
    def sage_mode(self) -> str:
        return "train" if self.model.training else "eval"

    @property
    def sage_step(self) -> int:
        """The optimizer step being computed (1-based), as a plug-in fault names it."""
        return int(self.state.global_step) + 1

    def sage_noise(self, stream: str, seed: int) -> torch.Generator:
        """The generator of one noise stream, seeded for this draw (taps.step_seed)."""
        step = int(self.state.global_step)
        return self._sage_noise[stream].draw(seed, step, self.accelerator.process_index)

    def _sage_draw(self, stream: str) -> torch.Generator:
        return self.sage_noise(stream, getattr(self.args, NOISE_SEED_FIELDS[stream]))

    # -- the steps ---------------------------------------------------------------------------------------

    @property
    def sage_steps(self) -> taps.Steps:
        """The steps the plan chose for the class this trainer subclasses, read at each interception (a field
        changed on a live config builds a new plan), with any kind an instance set for itself."""
        chosen = self.sage_plan.steps(unsloth_patched=self._sage_patched)
        return chosen._replace(**getattr(self, "_sage_own_steps", {}))

    rollout_steps = _settable_steps("after_each_rollout")
    batch_steps = _settable_steps("after_the_batch")
    loss_steps = _settable_steps("in_the_loss")

    def sage_step_context(self) -> taps.StepContext:
        """What the steps of one rollout or loss call read besides their record (filled once per call): the steps
        never see the trainer (rlvr/taps.py)."""
        mode = self.sage_mode
        return taps.StepContext(
            plan=self.sage_plan,
            mode=mode,
            log=compat.metrics(self, mode),
            kl_coef=self.sage_beta,
            accelerator=self.accelerator,
            q=self.sage_q,
            noise=self._sage_draw,
            step=self.sage_step,
            reward_weights=self.reward_weights,
            num_generations=self.num_generations if mode == "train" else self.num_generations_eval,
            pad_token_id=compat.pad_token_id(self.processing_class),
            unsloth_patched=self._sage_patched,
            trl=self._sage_trl_settings(),
        )

    def _sage_trl_settings(self) -> taps.TrlSettings:
        """TRL's settings the steps read, copied as TRL's own loss reads them at this call."""
        cfg = self.args
        accumulation = getattr(self, "current_gradient_accumulation_steps", None)
        setting = lambda name: getattr(self, name, getattr(cfg, name, None))  # TRL copies some to the trainer
        return taps.TrlSettings(
            aggregation=compat.trl_aggregation(self),
            epsilon_low=setting("epsilon_low"),
            epsilon_high=setting("epsilon_high"),
            importance_sampling_level=setting("importance_sampling_level"),
            use_bias_correction_kl=cfg.use_bias_correction_kl,
            vllm_importance_weights=bool(
                setting("use_vllm") and setting("vllm_importance_sampling_correction")
            ),
            vllm_importance_sampling={
                "mode": setting("vllm_importance_sampling_mode"),
                "clip_min": setting("vllm_importance_sampling_clip_min"),
                "clip_max": setting("vllm_importance_sampling_clip_max"),
            },
            steps_per_generation=cfg.steps_per_generation,
            accumulation_steps=accumulation or cfg.gradient_accumulation_steps,
        )

    # -- q ----------------------------------------------------------------------------------------------

    def _sage_score_with_signals(self, score, model, args: tuple, kwargs: dict):
        """TRL's scorer ``score`` called once; the guide's logit signals computed in the same chunked pass
        (compat.logit_signal_tap). Returns (TRL's result, {signal: (B, C)})."""
        fns = guides.logit_signal_functions(self.sage_plan.guide_needs, self.sage_plan.guide)
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

    def sage_policy_stats(self, output: dict, captured: dict | None):
        """(logps, entropies, {logit signal: values}) of the rollout policy at the completion tokens, TRL layout
        (B, C): from ``captured`` (a pass TRL ran anyway) when it has them, else one no-grad pass of our own."""
        needs = self.sage_plan.guide_needs
        need_entropy, logit_signals = "entropies" in needs, self.sage_plan.logit_signals
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
        batch_size = (
            self.args.per_device_train_batch_size
            if self.sage_mode == "train"
            else self.args.per_device_eval_batch_size
        )
        fns = guides.logit_signal_functions(logit_signals, self.sage_plan.guide)
        if self._sage_patched:
            # Unsloth's scorer returns neither entropies nor logits: the kit's own pass gives both.
            return policy_logps_and_entropies(
                self.model,
                input_ids,
                attention_mask,
                completion_len,
                self.temperature,
                rows_per_chunk=1,
                logit_signals=fns,
            )
        score = super()._get_per_token_logps_and_entropies
        with torch.no_grad():
            (logps, entropies, _), logits = self._sage_score_with_signals(
                score,
                self.model,
                (input_ids, attention_mask, completion_len),
                {"batch_size": batch_size, "compute_entropy": need_entropy},
            )
        return logps, entropies, logits

    def sage_q(
        self, batch: dict, mask: torch.Tensor, *, layout: str, policy: dict, reference: dict | None = None
    ) -> torch.Tensor:
        """The one q entry point: q for ``batch`` (1 on masked tokens) from the signals given, logged.

        ``policy`` holds the policy's logps / entropies / logit signals (the loss's forward, TRL's old-logp pass or
        the kit's own), ``reference`` a captured reference pass (else the batch's ref_per_token_logps is the
        reference). Layout "trl": (B, C), the batch's own signals (old logps, ids) added as the guide needs them;
        "unsloth": Unsloth's left-packed loss layout (B, C + max_left_pad), where only the entropies exist. The
        guide runs on its Signals without gradient, and guides.run_guide checks, clips and masks its q; then
        sage/q_clipped_frac and the q metrics are logged. No guide: q = 1 by definition, not logged (only the
        reward placement's pseudo-KL asks for it)."""
        plan = self.sage_plan
        if not plan.guided:
            return torch.ones_like(mask, dtype=torch.float32)
        if layout == "trl":
            signals = _trl_signals(plan, batch, policy if plan.reads_policy else {}, reference or {})
        else:
            signals = {"entropies": policy["entropies"].detach()}
        bundle = guides.Signals(
            mask=mask,
            step=int(self.state.global_step),
            max_steps=guides.default_max_steps(self.args.max_steps),
            generator=self._sage_draw("guide"),
            rank=self.accelerator.process_index,
            layout=layout,
            **signals,
        )
        q, raw = guides.run_guide(
            plan.guide, plan.guide_fn, bundle, step=self.sage_step, q_min=plan.q_min, q_max=plan.q_max
        )
        self._sage_log_q_clipping(guides.clipped_fraction_counts(raw, mask, plan.q_min, plan.q_max))
        self.sage_log_q(q, mask)
        return q

    def _sage_log_q_clipping(self, counts: torch.Tensor) -> None:
        """sage/q_clipped_frac: the share of completion tokens (all processes) whose raw q was clipped to the guide
        node's [q_min, q_max]; one warning per run when it exceeds Q_CLIPPED_WARN_FRAC, because a guide meant to
        reach a q outside the clip range is otherwise silently flattened."""
        plan = self.sage_plan
        totals = self.accelerator.reduce(counts, reduction="sum")
        fraction = (totals[0] / totals[1].clamp(min=1.0)).item()
        compat.metrics(self, self.sage_mode)["sage/q_clipped_frac"].append(fraction)
        if fraction > Q_CLIPPED_WARN_FRAC and not getattr(self, "_sage_warned_q_clipped", False):
            self._sage_warned_q_clipped = True
            warnings.warn(
                f"guide={plan.guide.name!r}: {fraction:.0%} of the completion tokens' q were clipped to "
                f"[q_min={plan.q_min}, q_max={plan.q_max}] at step {int(self.state.global_step)}; "
                "widen the guide node's q_min / q_max if the guide means those values (sage/q_clipped_frac)",
                stacklevel=2,
            )

    def sage_log_q(self, q: torch.Tensor, mask: torch.Tensor) -> None:
        log_q_metrics(self, q, mask)

    @torch.no_grad()
    def sage_reference_scores(self, output: dict, entropies: bool = False):
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

    # -- interception point 1: after the rollout ---------------------------------------------------------

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        """TRL's scorer. Before TRL runs, the trainer names the scoring calls it is about to make (the loss's one
        forward; the rollout's old-logp and reference passes, compat.trl_rollout_scoring_calls); each call takes
        the next name, and the ones the steps read are recorded (with what the guide needs asked of TRL's pass)."""
        score = super()._get_per_token_logps_and_entropies
        record = self._sage_open_loss or self._sage_open_rollout
        if record is None or not record.scoring_calls:
            return score(model, *args, **kwargs)
        call = record.scoring_calls.pop(0)
        if call == "loss_forward":
            return self._sage_loss_forward(record, score, model, args, kwargs)
        want = record.capture.get(call)
        if want is None:
            return score(model, *args, **kwargs)
        if call == "reference":  # asked for the reference's entropies as well
            kwargs["compute_entropy"] = True
            result = score(model, *args, **kwargs)
            record.reference = {"ref_logps": result[0], "ref_entropies": result[1]}
            return result
        # TRL's old-logp pass of the policy: with the entropies (and the guide's logit signals) the guide reads, so
        # that q needs no forward of its own.
        kwargs["compute_entropy"] = kwargs.get("compute_entropy", False) or want["need_entropy"]
        result, logits = self._sage_score_with_signals(score, model, args, kwargs)
        record.policy = {"logps": result[0], "entropies": result[1], "logits": logits}
        return result

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        from sage_unsloth.rlvr import reward

        reward.take_timeouts()  # count only this batch's pairs
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # Pairs the grader ran out of budget on (scored 0): a policy that learns to stall the grader shows here.
        compat.metrics(self, self.sage_mode)["reward/grading_timeouts"].append(float(reward.take_timeouts()))
        if self._sage_open_rollout is not None:
            self._sage_open_rollout.rewards_per_func = rewards_per_func  # (N all processes, reward funcs)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        if getattr(self.args, "dynamic_sampling", False) and self.model.training:
            batch = Rollout(output=dapo.dynamic_sampling(self, inputs, self.sage_rollout))
        else:
            batch = self.sage_rollout(inputs)
        if self.batch_steps:
            batch.context = self.sage_step_context()
            for step in self.batch_steps:
                step(batch)
        return batch.output

    def sage_rollout(self, inputs) -> Rollout:
        """One TRL rollout, then the steps after each rollout on it."""
        plan = self.sage_plan
        rollout = Rollout(scoring_calls=compat.trl_rollout_scoring_calls(self))
        if not self.sage_q_in_loss:
            # Ask TRL's own scoring passes for what q reads, so that it costs no forward of its own.
            needs = plan.guide_needs
            if (plan.reads_policy or plan.placement == "reward") and not self._sage_patched:
                rollout.capture["old_logps"] = {"need_entropy": "entropies" in needs}
            if "ref_entropies" in needs and plan.placement == "loss":
                rollout.capture["reference"] = {}
        asked_reference = "reference" in rollout.capture and "reference" in rollout.scoring_calls
        self._sage_open_rollout = rollout
        try:
            rollout.output = super()._generate_and_score_completions(inputs)
        except RuntimeError as exc:  # a policy that overflows samples from NaN: the step guard's one line
            if (fault := sampling_fault(self, self.model, exc)) is not None:
                raise fault from exc
            raise
        finally:
            self._sage_open_rollout = None
            rollout.scoring_calls, rollout.capture = [], {}
        if asked_reference:
            rollout.reference = _checked_reference(rollout.output, rollout.reference)
        self._sage_rollout_signals(rollout)
        if self.rollout_steps:
            rollout.context = self.sage_step_context()
            for step in self.rollout_steps:
                step(rollout)
        self.last_rollout = rollout
        return rollout

    def _sage_rollout_signals(self, rollout: Rollout) -> None:
        """What q at rollout reads, in rollout.policy / rollout.reference: for the reward placement the rollout
        policy's signals (its logps make the pseudo-KL) and the kit's own reference pass; for a guide reading the
        policy with q at rollout its signals (TRL's old-logp pass when it ran, else one no-grad pass of the kit's)
        beside TRL's captured reference pass."""
        plan, output = self.sage_plan, rollout.output
        if plan.placement == "reward":
            logps, entropies, logits = self.sage_policy_stats(output, rollout.policy)
            ref, ref_entropies = self.sage_reference_scores(
                output, entropies="ref_entropies" in plan.guide_needs
            )
            rollout.reference = {"ref_logps": ref, "ref_entropies": ref_entropies}
        elif plan.guided and plan.reads_policy and not self.sage_q_in_loss:
            captured = {**rollout.policy, **rollout.reference}
            logps, entropies, logits = self.sage_policy_stats(output, captured)
        else:
            return
        rollout.policy = {"logps": logps, "entropies": entropies, "logits": logits}

    # -- interception point 2: the loss ------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        if not self.loss_steps:
            return super()._compute_loss(model, inputs)
        # The batch is reused across num_iterations: the steps change a copy, never the buffer. TRL's loss scores
        # the policy once, before it reads the advantages or the reference: there the steps run.
        loss = LossBatch(batch=dict(inputs), context=self.sage_step_context(), scoring_calls=["loss_forward"])
        self._sage_open_loss = loss
        try:
            value = super()._compute_loss(model, loss.batch)
        finally:
            self._sage_open_loss = None
        if loss.logged_kl is not None:
            kl_log = compat.metrics(self, self.sage_mode)["kl"]
            if kl_log:  # TRL logged its k3 value; log the KL term actually in the loss instead
                kl_log[-1] = loss.logged_kl
        for added in loss.added:
            value = value + added
        return value

    def _sage_loss_forward(self, loss: LossBatch, score, model, args: tuple, kwargs: dict):
        """The loss's own forward (TRL reads the advantages and the reference only after it): record its
        outputs, with the guide's logit signals from its chunked pass, and run the steps in the loss."""
        if self.sage_q_in_loss:
            result, logits = self._sage_score_with_signals(score, model, args, kwargs)
        else:
            result, logits = score(model, *args, **kwargs), {}
        loss.logps, loss.entropies, loss.logits = result[0], result[1], logits
        for step in self.loss_steps:
            step(loss)
        return result

    def compute_loss(self, model, inputs, *args, **kwargs):
        if not (self._sage_patched and self.sage_q_in_loss and self.beta != 0.0):
            return super().compute_loss(model, inputs, *args, **kwargs)
        return unsloth_hooks.compute_loss_with_q(self, super().compute_loss, model, inputs, args, kwargs)

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float):
        loss = self._sage_open_loss
        if loss is None or loss.layout != "unsloth":
            return super().get_high_entropy_mask(entropies, mask, threshold)
        return unsloth_hooks.entropies_handed_over(
            self, loss, super().get_high_entropy_mask, entropies, mask, threshold
        )


def _trl_signals(plan, batch: dict, policy: dict, reference: dict) -> dict:
    """The guide's signals in TRL's layout (B, C), detached: the policy's from ``policy``, the reference's from
    ``reference`` (a captured pass) or the batch, the rest from the batch (those the guide reads)."""
    needs = plan.guide_needs
    if "ref_entropies" in needs and reference.get("ref_entropies") is None:
        raise RuntimeError(  # the config refuses a guide without a KL anchor (beta 0), so a pass always runs
            f"guide={plan.guide.name!r} needs ref_entropies, but no reference pass ran in this rollout"
        )
    ref_logps = reference.get("ref_logps", batch.get("ref_per_token_logps"))
    return {
        "entropies": _detached(policy.get("entropies")),
        "logps": _detached(policy.get("logps")),
        "ref_logps": _detached(ref_logps) if "ref_logps" in needs else None,
        "ref_entropies": _detached(reference.get("ref_entropies")) if "ref_entropies" in needs else None,
        "old_logps": _detached(batch.get("old_per_token_logps")) if "old_logps" in needs else None,
        "prompt_ids": batch.get("prompt_ids"),
        "completion_ids": batch.get("completion_ids"),
        "logits": policy.get("logits") or {},
    }


def _checked_reference(output: dict, captured: dict) -> dict:
    """The reference logps / entropies captured from TRL's reference pass, checked to be that pass (its logps
    are the batch's ref_per_token_logps), before log q shifts them."""
    ref = output.get("ref_per_token_logps")
    got = captured.get("ref_logps")
    if got is None or captured.get("ref_entropies") is None or ref is None or not torch.equal(got, ref):
        raise RuntimeError(
            "SAGE ref_entropies: the scoring call taken for TRL's reference pass is not the one that produced "
            "ref_per_token_logps; the kit is pinned to trl 1.15.0 (compat.py, old_logps_condition)"
        )
    return {"ref_logps": got, "ref_entropies": captured["ref_entropies"]}


def log_q_metrics(trainer, q: torch.Tensor, mask: torch.Tensor) -> None:
    """sage/q_mean, q_min, q_max, frac_boosted, seq_log_q and the first-token split, over all processes."""
    accelerator = trainer.accelerator
    valid = mask.bool()
    values = q[valid].float()
    count = torch.tensor([values.numel()], device=q.device, dtype=torch.float32)
    stats = torch.stack([values.sum(), (values > 1.0).float().sum()]) if values.numel() else q.new_zeros(2)
    totals = accelerator.reduce(torch.cat([stats.float(), count]), reduction="sum")
    # A rank without completion tokens must not pull the global min / max to its placeholder.
    lo = values.min() if values.numel() else q.new_tensor(float("inf"))
    hi = values.max() if values.numel() else q.new_tensor(float("-inf"))
    n = totals[2].clamp(min=1.0)
    # Mean over completions of the sequence-level log q(y) = sum_t log q_t (what the reward placement adds).
    seq_log_q = (anchor.log_q(q.float()) * mask).sum(-1)
    seq_totals = accelerator.reduce(
        torch.stack([seq_log_q.sum(), q.new_tensor(float(q.size(0)))]).float(), reduction="sum"
    )
    log = compat.metrics(trainer, "train" if trainer.model.training else "eval")
    log["sage/seq_log_q"].append((seq_totals[0] / seq_totals[1].clamp(min=1.0)).item())
    q_min = accelerator.gather(lo.float().reshape(1)).min().item()
    q_max = accelerator.gather(hi.float().reshape(1)).max().item()
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
    split = accelerator.reduce(split, reduction="sum")
    log["sage/q_first_mean"].append((split[0] / split[2].clamp(min=1.0)).item())
    log["sage/first_boosted"].append((split[1] / split[2].clamp(min=1.0)).item())
    log["sage/later_boosted"].append((split[3] / split[4].clamp(min=1.0)).item())


# --------------------------------------------------------------------------- factory

_CLASS_CACHE: dict[type, type] = {}


def make_sage_trainer_class(base: type | None = None) -> type:
    """SageTrainerMixin and the checkpoint mixins over ``base`` (default: whatever ``trl.GRPOTrainer`` is at this
    moment). Three classes of the kit, none overriding a method another overrides (tests/rlvr/test_rlvr_trainer.py)."""
    base = base or compat.current_grpo_trainer_class()
    install_cpu_logprob_fallback()
    if base not in _CLASS_CACHE:
        # ExactResumeMixin saves and restores the state TRL's checkpoints lack (rlvr/resume.py);
        # CheckpointMixin: a checkpoint appears only whole and sane, with the resume state inside, a resume from
        # the last step's checkpoint trains nothing more, and no step with a non-finite loss or gradient is
        # applied (sage_unsloth/runtime/checkpoints.py, runtime/finite_steps.py).
        _CLASS_CACHE[base] = type(
            f"Sage{base.__name__}",
            (SageTrainerMixin, ExactResumeMixin, CheckpointMixin, base),
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
    if is_unsloth_patched(cls):
        compat.check_unsloth_loss(cls)  # every method relies on its code paths (compat.UNSLOTH_LOSS_PATHS)
    config = kwargs.get("args", args[2] if len(args) > 2 else None)
    if config is not None and is_unsloth_patched(cls):
        compat.fill_unsloth_config_fields(config, cls)
    args, kwargs = _with_soft_overlong_punishment(args, kwargs, config)
    return cls(*args, **kwargs)
