"""Stage 2, RLVR: ``python -m sage_unsloth.rlvr CONFIG [--key value ...] [--resume]``.

Reads stage 1's output folder (``outputs/<model>/sft``: LoRA adapter + tokenizer + manifest), continues
that adapter with GRPO-family RL under the SAGE anchor q * pi_ref, and writes
``outputs/<model>/<variant>/`` or ``--output_dir`` (final adapter, tokenizer, manifest.json; checkpoints every save_steps).

Every input is checked before a model loads: the config classes validate the SAGE/GRPO fields, then
:func:`plan_run` checks the stage-1 folder, the anchor choice, the lengths against the model's context
(read offline from its config.json) and the output folder (fresh run vs ``--resume``).

The anchor pi_ref
-----------------
Under LoRA, TRL's reference is "the policy with its adapter disabled", i.e. the *pre-SFT base* when
the SFT adapter is continued (the official code's behaviour). ``anchor: sft`` (default) anchors to the
SFT model instead, because the KL is meant to keep RL close to the model RL started from. Of the two
ways to get that, this kit keeps a frozen copy of the SFT adapter under the adapter name ``ref``
(TRL 1.15 scores the reference with ``use_adapter(model, "ref")`` whenever that adapter exists):

- it continues the SFT adapter itself, so the final adapter is one LoRA on the original base, which
  evaluation loads like the SFT adapter, and nothing is re-quantised (merging a LoRA into 4-bit
  weights and re-quantising would move the anchor away from the SFT model);
- it costs one extra r=8 adapter in memory and no extra checkpoint on disk (only ``default`` is saved).

``anchor: base`` removes that copy, so TRL falls back to the adapter-disabled base (official code).
TRL adds the ``ref`` copy itself in ``GRPOTrainer.__init__``; Unsloth's patched trainer strips that
code, so :func:`apply_anchor` (run after the trainer is built) makes the result the same on both.
With Unsloth's vLLM (``use_vllm``) the LoRA sync sends every lora_A/lora_B tensor of the model to vLLM,
so the ``ref`` copy is hidden from it during each sync (:func:`hide_adapter_from_vllm_sync`).
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from sage_unsloth.compat import POLICY_ADAPTER, REF_ADAPTER
from sage_unsloth.config.field_rules import Limit, Names
from sage_unsloth.config.training_cli import StageRunArgs
from sage_unsloth.runtime import layout

logger = logging.getLogger(__name__)

ANCHORS = ("sft", "base")


@dataclass
class RLVRStageArgs(StageRunArgs):
    """Stage I/O of RLVR (the training hyper-parameters live in SageGRPOConfig); ``resume``, ``restart`` and
    ``unsloth_without_gpu`` are stage 1's too (sage_unsloth/config/training_cli.py)."""

    FIELD_RULES: ClassVar[dict] = {
        "anchor": Names(ANCHORS),
        **dict.fromkeys(("max_train_rows", "max_prompt_length", "max_seq_length"), Limit(ge=1)),
    }

    sft_dir: str | None = field(
        default=None,
        metadata={
            "help": "Stage-1 output folder (adapter + manifest.json). Default: <output_root>/<model>/sft."
        },
    )
    anchor: str = field(
        default="sft",
        metadata={
            "help": "KL anchor pi_ref: 'sft' (the SFT model; default) or 'base' (pre-SFT base, official code)."
        },
    )
    variant: str | None = field(
        default=None,
        metadata={
            "help": "Run name: output goes to <output_root>/<model>/<variant>/ unless output_dir is given. "
            "Default: the config file's stem."
        },
    )
    output_root: str = field(default=layout.OUTPUTS, metadata={"help": "Root of the stage output folders."})
    dataset_name: str = field(default="open-r1/DAPO-Math-17k-Processed", metadata={"help": "Hub dataset."})
    dataset_config: str | None = field(default="en", metadata={"help": "Hub dataset config."})
    dataset_split: str = field(default="train", metadata={"help": "Hub dataset split."})
    dataset_path: str | None = field(
        default=None,
        metadata={"help": "Local .jsonl/.parquet file overriding dataset_name (flat or verl layout)."},
    )
    max_train_rows: int | None = field(default=None, metadata={"help": "Use only the first N rows."})
    max_prompt_length: int | None = field(
        default=None,
        metadata={
            "help": "Drop prompts longer than this (tokens). Default: context - max_completion_length."
        },
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "Model context in tokens. Default: max_position_embeddings of the model's config.json."
        },
    )

    def __post_init__(self):
        from sage_unsloth.config.args import ConfigError
        from sage_unsloth.config.field_rules import check_field_rules

        check_field_rules(self)  # anchor, the row and length counts: the pre-import check's words
        if self.variant is not None:
            try:
                layout.check_name(self.variant, "variant")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None


@dataclass
class RLVRPlan:
    """Everything resolved and checked before any model loads."""

    base_model: str
    sft_dir: Path
    output_dir: Path
    model_short: str
    variant: str
    context_length: int
    max_prompt_length: int
    resume_from: str | None
    sft_manifest: dict[str, Any]
    finished: str | None = (
        None  # --resume on a run that is done: what to say instead of training (nothing changes)
    )


# ----------------------------------------------------------------------------------------------- parsing
def parse_args(argv: list[str] | None = None):
    """``CONFIG [--key value ...]`` -> (SageGRPOConfig, RLVRStageArgs, ModelConfig, config path or None).

    ``variant`` defaults to the config file's stem; ``output_dir`` defaults to
    ``<output_root>/<model>/<variant>`` (a value given for it is used as is, as stage 1 does).
    """
    from sage_unsloth.config.args import parse_stage_args
    from sage_unsloth.config.model_config import SageModelConfig
    from sage_unsloth.rlvr.config import SageGRPOConfig

    (grpo_args, stage_args, model_args), config_path = parse_stage_args(
        (SageGRPOConfig, RLVRStageArgs, SageModelConfig),
        sys.argv[1:] if argv is None else argv,
        stage="rlvr",
        configs_dir="configs/rlvr/",
    )
    if stage_args.variant is None and config_path:
        stage_args.variant = Path(config_path).stem
    return grpo_args, stage_args, model_args, config_path


def model_context_length(
    model_name_or_path: str, revision: str | None = None, trust_remote_code: bool = False
) -> int:
    """``max_position_embeddings`` from the model's config.json (no weights are read)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(
            model_name_or_path, revision=revision, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(
            f"cannot read the config of {model_name_or_path!r} ({type(exc).__name__}): "
            "download the model or set max_seq_length"
        ) from None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    length = getattr(text_config, "max_position_embeddings", None)
    if not length:
        raise ValueError(f"{model_name_or_path!r} has no max_position_embeddings: set max_seq_length")
    return int(length)


def _resolve_sft(stage: RLVRStageArgs, model_args) -> tuple[Path, dict[str, Any], str]:
    from sage_unsloth.model.loading import check_adapter_base, model_short_name, same_base_model
    from sage_unsloth.runtime.manifest import read_manifest

    if stage.sft_dir:
        sft_dir = Path(stage.sft_dir)
    elif model_args.model_name_or_path:
        sft_dir = layout.sft_dir(stage.output_root, model_short_name(model_args.model_name_or_path))
    else:
        raise ValueError("sft_dir is not set: pass --sft_dir outputs/<model>/sft (stage 1's output folder)")
    if not sft_dir.is_dir():
        raise FileNotFoundError(
            f"sft_dir={sft_dir} does not exist: run stage 1 (scripts/01_sft.sh) first or "
            "point sft_dir to its output folder"
        )
    manifest = read_manifest(sft_dir, expect_stage="sft")
    if not (sft_dir / "adapter_config.json").is_file():
        raise FileNotFoundError(f"sft_dir={sft_dir} has no adapter_config.json: it is not a finished SFT run")
    base = manifest.get("base_model") or ""
    if not base:
        raise ValueError(f"{sft_dir}/manifest.json has no base_model: re-run stage 1")
    # The same model under another name (Unsloth's mirror of a hub id, by Unsloth's own mapper) is accepted.
    if model_args.model_name_or_path and not same_base_model(model_args.model_name_or_path, base):
        raise ValueError(
            f"model_name_or_path={model_args.model_name_or_path!r} but {sft_dir} was trained on "
            f"{base!r}: drop model_name_or_path or point sft_dir to that model's SFT run"
        )
    check_adapter_base(sft_dir, base, "sft_dir")  # the adapter itself (a mirror of the base is the base)
    return sft_dir, manifest, base


def plan_run(
    grpo_args,
    stage: RLVRStageArgs,
    model_args,
    config_path: str | None = None,
    claim=None,
    *,
    for_another_machine: bool = False,
) -> RLVRPlan:
    """Resolve and check every input of the stage; one-line errors, nothing loads a model. ``claim(output_dir)``
    (the stage's folder lock) is called before anything in the output folder is read or deleted.
    ``for_another_machine``: a dry run on a machine without the GPU the config asks for leaves that GPU's own
    checks (vLLM needs one) to it."""
    from sage_unsloth.config.input_checks import check_adapter, check_data_file, check_wandb
    from sage_unsloth.model.loading import check_gpu_setup
    from sage_unsloth.rlvr.resume import logging_alignment_warning

    _check_vllm_mode(grpo_args, on_this_machine=not for_another_machine)
    unsloth_vllm = grpo_args.use_vllm and grpo_args.backend == "unsloth"
    check_gpu_setup(model_args, grpo_args, backend=grpo_args.backend, fast_inference=unsloth_vllm)
    check_wandb(grpo_args.report_to)
    if stage.dataset_path:  # missing, unreadable, empty, truncated, or a row without its fields: one line
        from sage_unsloth.rlvr.data import row_problem

        check_data_file(stage.dataset_path, row_problem=row_problem)
    sft_dir, sft_manifest, base = _resolve_sft(stage, model_args)
    check_adapter(sft_dir, "sft_dir")
    context, max_prompt = _prompt_budget(grpo_args, stage, model_args, base)
    variant, short, output_dir = _output_folder(grpo_args, stage, config_path, base)
    if claim is not None:
        claim(output_dir)
    finished, last = _resume_point(grpo_args, stage, output_dir)
    if grpo_args.backend == "unsloth" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        logger.warning(
            "backend=unsloth on %s processes: not tested by this kit; backend=trl is (docs/scaling.md, "
            "'Under Unsloth')",
            os.environ["WORLD_SIZE"],
        )
    if (alignment := logging_alignment_warning(grpo_args)) is not None:
        logger.warning(alignment)
    return RLVRPlan(
        base_model=base,
        sft_dir=sft_dir,
        output_dir=output_dir,
        model_short=short,
        variant=variant,
        context_length=context,
        max_prompt_length=max_prompt,
        resume_from=str(last) if stage.resume and last else None,
        sft_manifest=sft_manifest,
        finished=finished,
    )


def _check_vllm_mode(grpo_args, *, on_this_machine: bool = True) -> None:
    """vLLM's mode against the backend and (``on_this_machine``) the machine."""
    from sage_unsloth.runtime.backend import cuda_available

    if grpo_args.use_vllm and grpo_args.backend == "unsloth" and grpo_args.vllm_mode == "server":
        raise ValueError(
            "vllm_mode=server needs backend=trl: Unsloth runs its own engine in each process "
            "(it rewrites vllm_mode to colocate)"
        )
    if grpo_args.use_vllm and on_this_machine and not cuda_available():
        raise ValueError("use_vllm=true needs a GPU: pass --use_vllm false on a CPU-only machine")
    if grpo_args.use_vllm and grpo_args.backend == "trl" and grpo_args.vllm_mode != "colocate":
        logger.warning("vllm_mode=%s: a vLLM server must already be running", grpo_args.vllm_mode)


def _prompt_budget(grpo_args, stage: RLVRStageArgs, model_args, base: str) -> tuple[int, int]:
    """(the model's context length, the longest prompt): a completion and a prompt must fit in the context."""
    context = stage.max_seq_length or model_context_length(
        base, model_args.model_revision, bool(grpo_args.trust_remote_code)
    )
    completion = grpo_args.max_completion_length
    if completion is None or completion >= context:
        raise ValueError(
            f"max_completion_length={completion} leaves no room for a prompt in the {context}-token "
            f"context of {base}: lower max_completion_length"
        )
    max_prompt = stage.max_prompt_length or context - completion
    if max_prompt + completion > context:
        raise ValueError(
            f"max_prompt_length={max_prompt} + max_completion_length={completion} exceeds the "
            f"{context}-token context of {base}: lower one of them"
        )
    return context, max_prompt


def _output_folder(grpo_args, stage: RLVRStageArgs, config_path: str | None, base: str):
    """(variant, the model's short name, the output folder): ``--output_dir`` as given, else
    ``<output_root>/<model>/rlvr/<variant>`` (the variant defaults to the config file's stem)."""
    from sage_unsloth.config.input_checks import check_output_folder
    from sage_unsloth.model.loading import model_short_name

    variant = stage.variant or (Path(config_path).stem if config_path else None)
    if not variant:
        raise ValueError("variant is not set: pass --variant NAME (the output subfolder)")
    layout.check_name(variant, "variant")  # also a config file's stem, the default
    short = model_short_name(base)
    output_dir = (
        Path(grpo_args.output_dir)
        if getattr(grpo_args, "output_dir_given", False)
        else layout.rlvr_dir(stage.output_root, short, variant)
    )
    check_output_folder(output_dir, "output_dir")
    return variant, short, output_dir


def _resume_point(grpo_args, stage: RLVRStageArgs, output_dir: Path):
    """(what to say if ``--resume`` names a finished run or None, the checkpoint to resume from or None)."""
    from sage_unsloth.runtime.checkpoints import choose_checkpoint
    from sage_unsloth.runtime.manifest import MANIFEST_NAME

    if not stage.resume and (output_dir / MANIFEST_NAME).is_file():
        raise FileExistsError(
            f"{output_dir} already holds a run: pass --resume to continue it, or choose "
            "another --output_dir (or --variant / --output_root)"
        )
    finished = finished_run(output_dir, grpo_args) if stage.resume else None
    # The newest complete checkpoint (newer incomplete ones skipped with a notice); only incomplete ones: an
    # error naming --restart true, which deletes them (sage_unsloth/runtime/checkpoints.py).
    last = (
        None
        if finished
        else choose_checkpoint(output_dir, resume=stage.resume, restart=stage.restart, resume_flag="--resume")
    )
    if stage.resume and last is None and not finished:
        raise FileNotFoundError(f"--resume: no checkpoint-* folder in {output_dir}: start without --resume")
    return finished, last


def finished_run(output_dir: Path, grpo_args) -> str | None:
    """What to say when ``--resume`` names a run that is done (its manifest is written last, so it marks a finished
    run, and it trained at least the steps asked for), or None: then the run is resumed (a larger max_steps
    continues a finished run)."""
    from sage_unsloth.runtime.manifest import MANIFEST_NAME, read_manifest

    if not (output_dir / MANIFEST_NAME).is_file():
        return None
    done = read_manifest(output_dir).get("global_step")
    if grpo_args.max_steps > 0 and isinstance(done, int) and grpo_args.max_steps > done:
        return None
    return (
        f"{output_dir} holds a finished run (step {done}, {MANIFEST_NAME}): nothing to resume, nothing was "
        f"changed; to train further pass a --max_steps above {done}"
    )


# ----------------------------------------------------------------------------------------------- anchor
def _adapter_params(model, adapter: str):
    marker = f".{adapter}."
    return {n: p for n, p in model.named_parameters() if marker in n}


def apply_anchor(model, anchor: str, *, beta: float) -> None:
    """Make TRL's reference pass score the chosen anchor (see the module docstring).

    ``sft``: a frozen ``ref`` adapter equal to the SFT adapter (made here unless TRL already made it);
    ``base``: no ``ref`` adapter, so the reference is the policy with adapters disabled.
    """
    if anchor not in ANCHORS:
        raise ValueError(f"anchor={anchor!r} is unknown: use one of {', '.join(ANCHORS)}")
    has_ref = REF_ADAPTER in model.peft_config
    if beta == 0.0 or anchor == "base":
        if has_ref:
            model.delete_adapter(REF_ADAPTER)
        model.set_adapter(POLICY_ADAPTER)
        return
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    if not has_ref:
        import torch

        model.add_adapter(REF_ADAPTER, copy.deepcopy(model.peft_config[POLICY_ADAPTER]))
        policy = _adapter_params(model, POLICY_ADAPTER)
        with torch.no_grad():
            for name, param in _adapter_params(model, REF_ADAPTER).items():
                param.copy_(policy[name.replace(f".{REF_ADAPTER}.", f".{POLICY_ADAPTER}.")])
    model.set_adapter(POLICY_ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad_(name in trainable and f".{REF_ADAPTER}." not in name)


def hide_adapter_from_vllm_sync(model) -> None:
    """Wrap Unsloth's ``model.load_lora`` so the vLLM LoRA it builds holds the policy adapter only."""
    from sage_unsloth.compat import hide_adapter_from_unsloth_lora_sync

    hide_adapter_from_unsloth_lora_sync(model, REF_ADAPTER)


# ----------------------------------------------------------------------------------------------- stage
def _build_dataset(stage: RLVRStageArgs, tokenizer, plan: RLVRPlan):
    from sage_unsloth.rlvr.data import build_rlvr_dataset, load_source

    source = load_source(stage.dataset_name, stage.dataset_config, stage.dataset_path, stage.dataset_split)
    return build_rlvr_dataset(
        source, tokenizer, max_prompt_length=plan.max_prompt_length, max_rows=stage.max_train_rows
    )


def resolved_config(grpo_args, stage: RLVRStageArgs, model_args) -> dict[str, Any]:
    return {"training": grpo_args.to_dict(), "stage": asdict(stage), "model": asdict(model_args)}


@dataclass
class RLVRStage:
    """A built stage: the trainer over the loaded model, ready for :meth:`train_and_save`."""

    trainer: Any
    model: Any
    tokenizer: Any
    plan: RLVRPlan
    dataset: Any
    grpo_args: Any
    stage_args: RLVRStageArgs
    model_args: Any

    def train_and_save(self) -> Path:
        from sage_unsloth.compat import unsloth_mirrors
        from sage_unsloth.runtime.manifest import write_manifest
        from sage_unsloth.runtime.training_log import LOG_HISTORY_FILE

        grpo_args, stage, model_args = self.grpo_args, self.stage_args, self.model_args

        if self.plan.resume_from and self.trainer.accelerator.is_main_process:
            # Exact: weights, optimizer, RNG, sampler position and TRL's generation buffer (rlvr/resume.py).
            print(f"resuming from {Path(self.plan.resume_from).name} in {self.plan.output_dir}", flush=True)
        from sage_unsloth.runtime.wandb_runs import finish_training_run, start_training_run

        wandb_run = start_training_run(  # before train(): the Trainer's W&B callback logs into it
            grpo_args.report_to,
            job_type="rlvr",
            model_short=self.plan.model_short,
            variant=self.plan.variant,
            output_dir=self.plan.output_dir,
            resume=bool(self.plan.resume_from),
            name=grpo_args.run_name,
        )
        self.trainer.train(resume_from_checkpoint=self.plan.resume_from)
        out = self.plan.output_dir
        accelerator = self.trainer.accelerator
        accelerator.wait_for_everyone()
        if not accelerator.is_main_process:  # under accelerate launch every rank holds the same policy
            return out
        # Only the policy adapter: the frozen "ref" copy is the SFT adapter, already in sft_dir. Never a non-finite one
        # (the step guard keeps training from making one; this keeps any other cause from writing it).
        from peft import get_peft_model_state_dict

        from sage_unsloth.runtime.checkpoint_contents import weights_problem
        from sage_unsloth.runtime.checkpoints import UnsaneCheckpoint

        wandb_record = finish_training_run(wandb_run)
        policy = get_peft_model_state_dict(self.model, adapter_name=POLICY_ADAPTER)
        if (problem := weights_problem(policy, "the policy adapter")) is not None:
            raise UnsaneCheckpoint(f"the final adapter was not written to {out}: {problem}")
        self.model.save_pretrained(str(out), selected_adapters=[POLICY_ADAPTER])
        self.tokenizer.save_pretrained(str(out))
        lora = self.model.peft_config[POLICY_ADAPTER]
        write_manifest(
            out,
            stage="rlvr",
            config=resolved_config(grpo_args, stage, model_args),
            seed=grpo_args.seed,
            base_model=self.plan.base_model,
            base_model_mirrors=unsloth_mirrors(self.plan.base_model),
            sft_dir=str(self.plan.sft_dir),
            anchor=stage.anchor,
            variant=self.plan.variant,
            model_short_name=self.plan.model_short,
            backend=grpo_args.backend,
            adapter=True,
            lora={
                "r": lora.r,
                "lora_alpha": lora.lora_alpha,
                "target_modules": sorted(lora.target_modules or []),
            },
            resumed_from=Path(self.plan.resume_from).name if self.plan.resume_from else None,
            global_step=self.trainer.state.global_step,
            context_length=self.plan.context_length,
            max_prompt_length=self.plan.max_prompt_length,
            train_prompts=len(self.dataset),
            num_processes=accelerator.num_processes,
            log_history=LOG_HISTORY_FILE,
            wandb=wandb_record,  # the W&B run (id, project, entity, group) stage 3 logs this model's results into
        )
        logger.info("RLVR output written to %s", out)
        return out


def build_stage(
    grpo_args, stage: RLVRStageArgs, model_args, config_path: str | None = None, plan: RLVRPlan | None = None
) -> RLVRStage:
    """Check everything (``plan``: :func:`plan_run`'s result when the caller already has it), load data and
    model, build the SAGE trainer with the chosen anchor."""
    from sage_unsloth.model.loading import load_for_training, load_tokenizer

    plan = plan or plan_run(grpo_args, stage, model_args, config_path)
    if plan.finished:
        raise FileExistsError(plan.finished)
    model_args.model_name_or_path = plan.base_model
    grpo_args.output_dir = str(plan.output_dir)
    if not grpo_args.run_name:
        grpo_args.run_name = f"{plan.model_short}/{plan.variant}"

    # Data before the model: a bad dataset fails in seconds, not after loading 15 GB of weights.
    trust = bool(grpo_args.trust_remote_code)  # trl 1.15's ModelConfig has no such field
    tokenizer = load_tokenizer(model_args, str(plan.sft_dir), trust_remote_code=trust)
    dataset = _build_dataset(stage, tokenizer, plan)
    logger.info(
        "RLVR: %d prompts (<= %d tokens), anchor=%s, output %s",
        len(dataset),
        plan.max_prompt_length,
        stage.anchor,
        plan.output_dir,
    )

    from sage_unsloth import compat

    if compat.is_unsloth_patched(base := compat.current_grpo_trainer_class()):
        compat.check_unsloth_loss(base)  # before 15 GB of weights load; the trainer checks again when built
    unsloth_vllm = grpo_args.backend == "unsloth" and grpo_args.use_vllm
    if unsloth_vllm and stage.anchor == "sft" and grpo_args.beta != 0.0:
        # Folding LoRA into vLLM's weights assumes one adapter; the plain LoRA sync is hidden from "ref".
        from sage_unsloth.compat import UNSLOTH_MERGED_ROLLOUT_ENV

        os.environ[UNSLOTH_MERGED_ROLLOUT_ENV] = "0"
    model, tokenizer = load_for_training(
        model_args,
        backend=grpo_args.backend,
        max_seq_length=plan.max_prompt_length + grpo_args.max_completion_length,
        seed=grpo_args.seed,
        adapter_path=str(plan.sft_dir),
        fast_inference=unsloth_vllm,
        gpu_memory_utilization=grpo_args.vllm_gpu_memory_utilization,
        gradient_checkpointing=bool(grpo_args.gradient_checkpointing),
        trust_remote_code=trust,
    )
    if grpo_args.backend == "unsloth":
        grpo_args.gradient_checkpointing = False  # Unsloth's loader set up its own checkpointing

    from sage_unsloth.rlvr import reward
    from sage_unsloth.rlvr.trainer import SageGRPOTrainer

    if unsloth_vllm:
        # Before the trainer: Unsloth's patched __init__ keeps a reference to model.load_lora.
        hide_adapter_from_vllm_sync(model)
    from sage_unsloth.runtime.log_writer import LogHistoryWriter

    trainer = SageGRPOTrainer(
        model=model,
        reward_funcs=[reward.correctness_reward],
        args=grpo_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[LogHistoryWriter(plan.output_dir)],
    )
    apply_anchor(model, stage.anchor, beta=grpo_args.beta)
    return RLVRStage(
        trainer=trainer,
        model=model,
        tokenizer=tokenizer,
        plan=plan,
        dataset=dataset,
        grpo_args=grpo_args,
        stage_args=stage,
        model_args=model_args,
    )


def run(grpo_args, stage: RLVRStageArgs, model_args, config_path: str | None = None) -> RLVRStage:
    """Run stage 2 end to end; returns the built stage (tests inspect its trainer)."""
    built = build_stage(grpo_args, stage, model_args, config_path)
    built.train_and_save()
    return built


def dry_run(grpo_args, stage: RLVRStageArgs, model_args, config_path: str | None, argv: list[str]):
    """Print the resolved config and the plan (folders, anchor, lengths, the method, the checkpoint it would
    resume); the call that trains is then a no-op. An input error after the config is the stage's one line."""
    from sage_unsloth.config import dry_run as dry
    from sage_unsloth.runtime.backend import cuda_available

    resolved = dry.resolved_config("rlvr", (grpo_args, stage, model_args), argv)
    dry.show("rlvr", resolved)
    # what the config's GPU needs, on a machine without one (whose own checks are then that GPU's)
    elsewhere = dry.show_gpu_needs(config_path, resolved)
    plan = plan_run(grpo_args, stage, model_args, config_path, for_another_machine=elsewhere)
    method = grpo_args.method_plan
    dry.show_plan(
        {
            "output_dir": plan.output_dir,
            "sft_dir": plan.sft_dir,
            "base_model": plan.base_model,
            "backend": grpo_args.backend
            + ("" if grpo_args.backend != "unsloth" or cuda_available() else " (this machine has no GPU)"),
            "anchor": f"{stage.anchor} (pi_ref = {'the SFT model' if stage.anchor == 'sft' else 'the base model'})",
            "guide": method.guide.name
            + (f" (q computed at the {method.expected_q_source})" if method.guided else ""),
            "kl_term": f"{method.kl_term.name}, placement {grpo_args.sage_kl_placement}, beta {grpo_args.beta}",
            "advantage_estimator": method.estimator.name,
            "policy_term": "none" if method.policy_term is None else method.policy_term.name,
            "context": f"{plan.context_length} tokens: prompts <= {plan.max_prompt_length}, completions <= "
            f"{grpo_args.max_completion_length}",
            "steps": grpo_args.max_steps
            if grpo_args.max_steps > 0
            else f"{grpo_args.num_train_epochs} epoch(s)",
            "would": f"resume from {Path(plan.resume_from).name}"
            if plan.resume_from
            else "train from the SFT adapter",
        }
    )
    return lambda: None


def _import_unsloth_early(argv: list[str]) -> None:
    """On a GPU, import Unsloth before TRL's trainer so its patches (GRPOTrainer, kernels) see a clean slate."""
    from sage_unsloth.config.args import requested_backend
    from sage_unsloth.runtime.backend import cuda_available

    if requested_backend(argv) == "unsloth" and cuda_available():
        from sage_unsloth.runtime.backend import import_unsloth

        import_unsloth()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from sage_unsloth.config.schema import refuse_bad_input

    if (code := refuse_bad_input("rlvr", argv)) is not None:  # every bad input, before TRL is imported
        return code
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from sage_unsloth.config.training_cli import dry_run_requested, refuse_before_parsing, run_training_stage

    if (code := refuse_before_parsing(argv, "configs/rlvr/")) is not None:  # as stage 1: before parsing
        return code

    def prepare(settle):
        # Everything here is input checking (config, folders, data, loader and trainer arguments): one line.
        if not dry_run_requested(argv):
            _import_unsloth_early(argv)
        if dry_run_requested(argv):  # on any machine: parsed as on the config's GPU
            from sage_unsloth.config.dry_run import parse_anywhere

            grpo_args, stage, model_args, config_path = parse_anywhere(parse_args, argv)
        else:
            grpo_args, stage, model_args, config_path = parse_args(argv)
        if stage.dry_run:
            return dry_run(grpo_args, stage, model_args, config_path, argv)
        plan = plan_run(grpo_args, stage, model_args, config_path, claim=settle)  # fail fast, no model yet
        if plan.finished:  # nothing loads, nothing is written
            return lambda: print(plan.finished, flush=True)
        return build_stage(grpo_args, stage, model_args, config_path, plan).train_and_save

    return run_training_stage("rlvr", argv, prepare, resume_flag=("--resume",))
