"""Stage 1: LoRA SFT of a base model in the paper's format (TRL SFTTrainer, Unsloth or transformers+peft).

    python -m sage_unsloth.sft CONFIG.yaml [--key value ...]

CONFIG is a YAML over :class:`sage_unsloth.sft.config.SageSFTConfig` (TRL's SFTConfig + kit fields) and
``trl.ModelConfig``; CLI flags override it. Writes ``outputs/<model_short_name>/sft/`` (or ``output_dir``):
the LoRA adapter, the tokenizer with the kit's chat template, checkpoints, ``manifest.json`` (written last:
its presence marks a finished run) and, with ``save_merged: true``, ``merged/`` (16-bit, servable by vLLM).

From Python (e.g. to build a stage-1 output in a test)::

    from sage_unsloth.sft.run import parse_args, run_sft
    sft_args, model_args = parse_args([config_path, "--model_name_or_path", model_dir, "--output_dir", out])
    out_dir = run_sft(sft_args, model_args)
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def parse_args(argv: list[str]):
    """``[CONFIG.yaml, --key, value, ...]`` (or ``--config CONFIG``) -> (SageSFTConfig, ModelConfig)."""
    from ..config.args import parse_stage_args
    from ..config.model_config import SageModelConfig
    from .config import SageSFTConfig

    (sft_args, model_args), _ = parse_stage_args(
        (SageSFTConfig, SageModelConfig), argv, stage="sft", configs_dir="configs/sft/"
    )
    return sft_args, model_args


def _config_record(sft_args, model_args) -> dict[str, Any]:
    return {"sft": sft_args.to_dict(), "model": asdict(model_args)}


@dataclass
class SFTPlan:
    """What a run will do, settled before any model loads: output folder, checkpoint, prepared data."""

    out: Path
    checkpoint: str | None
    data: Any  # sage_unsloth.sft.data.SFTData, or None when the run is already finished
    config_record: dict[str, Any]
    finished: bool = False


def settle_sft(sft_args, model_args, claim=None) -> SFTPlan:
    """Validate the config and settle the output folder and the checkpoint (no data yet: what a dry run shows);
    raises ValueError, FileNotFoundError or FileExistsError with a one-line message, reading nothing big.
    ``claim(output_dir)`` (the stage's folder lock) is called before anything in the folder is read or deleted."""
    from ..runtime.manifest import MANIFEST_NAME

    sft_args.validate(model_args)
    from ..model.loading import check_gpu_setup

    check_gpu_setup(model_args, sft_args, backend=sft_args.backend, fast_inference=False)  # bf16 on a T4
    out = sft_args.resolve_output_dir(model_args)
    from ..config.input_checks import check_output_folder

    check_output_folder(out, "output_dir")  # a file, or not writable: before the data and the model load
    if claim is not None:
        claim(out)
    config_record = _config_record(sft_args, model_args)  # as resolved, before the loader adjusts anything
    if sft_args.resume and (out / MANIFEST_NAME).is_file():
        logger.info("%s already holds a finished SFT run; nothing to resume", out)
        return SFTPlan(out=out, checkpoint=None, data=None, config_record=config_record, finished=True)
    checkpoint = sft_args.resume_checkpoint()
    return SFTPlan(out=out, checkpoint=checkpoint, data=None, config_record=config_record)


def prepare_sft(sft_args, model_args, claim=None) -> SFTPlan:
    """:func:`settle_sft`, then the data prepared; every input error is raised before any model loads."""
    from ..model.loading import load_tokenizer
    from .data import load_raw_dataset, prepare_sft_data

    plan = settle_sft(sft_args, model_args, claim=claim)
    if plan.finished:
        return plan
    out, checkpoint, config_record = plan.out, plan.checkpoint, plan.config_record
    source = sft_args.dataset_path or f"{sft_args.dataset_name}[{sft_args.dataset_split}]"
    raw = load_raw_dataset(
        dataset_name=sft_args.dataset_name,
        dataset_split=sft_args.dataset_split,
        dataset_path=sft_args.dataset_path,
        max_rows=sft_args.dataset_max_rows,
    )
    tokenizer = load_tokenizer(model_args, trust_remote_code=sft_args.trust_remote_code)
    data = prepare_sft_data(
        raw,
        tokenizer,
        max_seq_length=sft_args.max_seq_length,
        source=source,
        max_length_fraction=sft_args.max_length_fraction,
        numeric_answers_only=sft_args.numeric_answers_only,
        strip_think=sft_args.strip_think_tags,
    )
    logger.info(
        "SFT data %s: kept %d of %d rows, dropped %s", source, data.rows_kept, data.rows_in, data.rows_dropped
    )
    return SFTPlan(out=out, checkpoint=checkpoint, data=data, config_record=config_record)


def run_sft(sft_args, model_args, plan: SFTPlan | None = None) -> Path:
    """Train (or resume) and write the stage-1 output folder; returns its path."""
    from ..compat import unsloth_mirrors
    from ..model.loading import model_short_name
    from ..runtime.manifest import write_manifest

    plan = plan or prepare_sft(sft_args, model_args)
    if plan.finished:
        return plan.out
    out, checkpoint, data = plan.out, plan.checkpoint, plan.data
    model, tokenizer = load_sft_model(sft_args, model_args)
    from ..runtime.training_log import LOG_HISTORY_FILE
    from ..runtime.wandb_runs import finish_training_run, start_training_run

    trainer = build_sft_trainer(sft_args, model, tokenizer, data, out)
    short = sft_args.model_short_name or model_short_name(model_args.model_name_or_path)
    wandb_run = start_training_run(  # before train(): the Trainer's W&B callback logs into it
        sft_args.report_to,
        job_type="sft",
        model_short=short,
        variant="sft",
        output_dir=out,
        resume=bool(checkpoint),
        name=sft_args.run_name,
    )
    started = time.time()
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(str(out))  # adapter + tokenizer (chat template included)
    tokenizer.save_pretrained(str(out))

    merged_dir = None
    if sft_args.save_merged:
        merged_dir = save_merged_16bit(
            model,
            tokenizer,
            out,
            backend=sft_args.backend,
            model_args=model_args,
            trust_remote_code=sft_args.trust_remote_code,
        )
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    wandb_record = finish_training_run(wandb_run)
    write_manifest(
        out,
        stage="sft",
        config=plan.config_record,
        seed=sft_args.seed,
        base_model=model_args.model_name_or_path,
        base_model_mirrors=unsloth_mirrors(model_args.model_name_or_path),  # what stage 3 accepts as the base
        adapter=True,
        backend=sft_args.backend,
        model_short_name=short,
        merged=str(merged_dir.relative_to(out)) if merged_dir else None,
        resumed_from=Path(checkpoint).name if checkpoint else None,
        data=data.summary(),
        log_history=LOG_HISTORY_FILE,
        train={
            "global_step": trainer.state.global_step,
            "train_loss": result.training_loss,
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "seconds": round(time.time() - started, 1),
        },
        wandb=wandb_record,  # the W&B run (id, project, entity, group) stage 3 logs this model's results into
    )
    logger.info("SFT output written to %s", out)
    return out


def load_sft_model(sft_args, model_args):
    """(model with its LoRA, tokenizer) for the stage's backend."""
    from ..model.loading import load_for_training

    if sft_args.backend == "unsloth":
        from ..runtime.backend import import_unsloth

        import_unsloth()  # before the trainer is looked up: Unsloth rebinds trl.SFTTrainer
    model, tokenizer = load_for_training(
        model_args,
        backend=sft_args.backend,
        max_seq_length=sft_args.max_seq_length,
        seed=sft_args.seed,
        gradient_checkpointing=sft_args.gradient_checkpointing,
        trust_remote_code=sft_args.trust_remote_code,
    )
    if sft_args.backend == "unsloth":
        # Unsloth set up its own (offloaded) checkpointing in the loader; the Trainer must not redo it.
        sft_args.gradient_checkpointing = False
    return model, tokenizer


def build_sft_trainer(sft_args, model, tokenizer, data, out: Path):
    """The stage's Trainer over the loaded model: the kit's SFT trainer class, streaming its log to ``out``."""
    from ..runtime.log_writer import LogHistoryWriter

    return sft_trainer_class()(
        model=model,
        args=sft_args,
        train_dataset=data.dataset,
        processing_class=tokenizer,
        callbacks=[LogHistoryWriter(out)],
    )


def sft_trainer_class():
    """``trl.SFTTrainer`` looked up now (after import_unsloth it is Unsloth's), with TRL's fused LM head given
    the kit's torch kernel where Triton is missing (sage_unsloth/compat.py, row ``triton_fallback``): the same
    loss, the mean NLL of the labelled tokens, on CPU as on a GPU."""
    from ..compat import current_sft_trainer_class, install_cpu_logprob_fallback
    from ..runtime.checkpoints import CheckpointMixin

    install_cpu_logprob_fallback()
    base = current_sft_trainer_class()
    if base not in _SFT_CLASSES:
        # CheckpointMixin: a checkpoint appears only whole and sane, a resume from the last step's checkpoint trains
        # nothing more, and no step with a non-finite loss or gradient is applied (sage_unsloth/runtime/checkpoints.py).
        _SFT_CLASSES[base] = type(f"Sage{base.__name__}", (CheckpointMixin, base), {})
    return _SFT_CLASSES[base]


_SFT_CLASSES: dict[type, type] = {}


def save_merged_16bit(
    model, tokenizer, out: Path, *, backend: str, model_args, trust_remote_code: bool
) -> Path:
    """Write base + adapter merged to ``out/merged`` (a plain transformers folder vLLM can serve).

    16-bit: bfloat16 unless the model's dtype is float16 or float32 (the tiny CPU model stays float32)."""
    merged = out / "merged"
    if backend == "unsloth":
        # Unsloth dequantizes a 4-bit base before merging; its CPU fallback implements the same method.
        model.save_pretrained_merged(str(merged), tokenizer, save_method="merged_16bit")
    else:
        from ..model.loading import merge_lora_into_base

        # Reload the base unquantized (the training copy may be 4-bit), then merge the saved adapter into it.
        merge_lora_into_base(
            model_args.model_name_or_path,
            out,
            merged,
            tokenizer=tokenizer,
            dtype="bfloat16" if model_args.dtype in (None, "auto", "bfloat16") else model_args.dtype,
            revision=model_args.model_revision,
            trust_remote_code=trust_remote_code,
        )
    return merged


def dry_run(sft_args, model_args, argv: list[str]):
    """Print the resolved config and the plan (output folder, checkpoint, data source); the call that trains is
    then a no-op. An input error after the config is printed is the stage's one line, exit 2."""
    from ..config import dry_run as dry
    from ..runtime.backend import cuda_available

    resolved = dry.resolved_config("sft", (sft_args, model_args), argv)
    dry.show("sft", resolved)
    dry.show_gpu_needs(argv[0] if argv and not argv[0].startswith("-") else None, resolved)
    plan = settle_sft(sft_args, model_args)
    rows = sft_args.dataset_max_rows
    dry.show_plan(
        {
            "output_dir": plan.out,
            "base_model": model_args.model_name_or_path,
            "backend": sft_args.backend
            + ("" if sft_args.backend != "unsloth" or cuda_available() else " (this machine has no GPU)"),
            "data": sft_args.dataset_path or f"{sft_args.dataset_name}[{sft_args.dataset_split}]",
            "rows": rows if rows is not None else "all",
            "steps": sft_args.max_steps
            if sft_args.max_steps > 0
            else f"{sft_args.num_train_epochs} epoch(s)",
            "would": "nothing: the run is finished"
            if plan.finished
            else f"resume from {Path(plan.checkpoint).name}"
            if plan.checkpoint
            else "train from the base model",
        }
    )
    return lambda: None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or {"-h", "--help", "--help-all"} & set(argv):  # after a CONFIG too: help imports no Unsloth
        print(__doc__)
        if not argv:
            return 2
        parse_args(argv)  # prints the kit's fields (--help) or all of them (--help-all) and exits
    from ..config.schema import refuse_bad_input

    if (code := refuse_bad_input("sft", argv)) is not None:  # every bad input, before TRL is imported
        return code
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ..config.args import requested_backend
    from ..config.training_cli import dry_run_requested, refuse_before_parsing, run_training_stage

    if (code := refuse_before_parsing(argv, "configs/sft/")) is not None:  # before Unsloth is imported, below
        return code

    def prepare(settle):
        if requested_backend(argv) == "unsloth" and not dry_run_requested(argv):
            from ..runtime.backend import import_unsloth

            import_unsloth()  # before TRL/transformers are imported, as Unsloth requires
        sft_args, model_args = parse_args(argv)
        if sft_args.dry_run:
            return dry_run(sft_args, model_args, argv)
        plan = prepare_sft(sft_args, model_args, claim=settle)  # every input error here, before a model loads
        return lambda: run_sft(sft_args, model_args, plan)

    return run_training_stage("sft", argv, prepare, resume_flag=("--resume", "true"))


if __name__ == "__main__":
    raise SystemExit(main())
