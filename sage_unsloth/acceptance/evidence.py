"""What a stage run of the acceptance check records about the code paths it went through (read by
sage_unsloth/acceptance/checks.py): which Trainer.training_step and inner loop ran and how often (Unsloth's rewrites,
or transformers' own), the trainer's classes, which tokens SFT's loss was on, whether Unsloth's GRPO sequence packing
was used. Instruments only: nothing here changes what runs."""

from __future__ import annotations

import functools

from sage_unsloth import compat

SPAN_ROWS = 2  # rows of the SFT training set whose labelled tokens are recorded


def _counted(function, counts: dict, key: str):
    @functools.wraps(function)
    def counting(*args, **kwargs):
        counts[key] = counts.get(key, 0) + 1
        return function(*args, **kwargs)

    counting._sage_counted = True
    return counting


def record_training(into: dict) -> None:
    """When training begins (the Trainer's on_train_begin, called from inside its inner loop): record the trainer,
    its classes and the inner loop that is running (the calling frame's function: Unsloth's rewrite or transformers'
    own), and count from then on the calls of the training_step transformers' Trainer has (Unsloth's rewrite on a
    GPU happens in its loader, after this process started: so it is looked up here, not at import)."""
    import sys

    from transformers import Trainer
    from transformers.trainer_callback import CallbackHandler

    on_train_begin = CallbackHandler.on_train_begin

    def recording(self, args, state, control):
        frame = sys._getframe(1)
        while frame is not None and not isinstance(frame.f_locals.get("self"), Trainer):
            frame = frame.f_back
        if frame is not None:
            trainer, counts = frame.f_locals["self"], into.setdefault("calls", {})
            into["trainer"] = trainer
            into["classes"] = [klass.__name__ for klass in type(trainer).__mro__[:8]]
            into["functions"] = {
                "training_step": Trainer.training_step.__name__,
                "_inner_training_loop": frame.f_code.co_name,
            }
            counts["_inner_training_loop"] = counts.get("_inner_training_loop", 0) + 1
            if not getattr(Trainer.training_step, "_sage_counted", False):
                Trainer.training_step = _counted(Trainer.training_step, counts, "training_step")
        return on_train_begin(self, args, state, control)

    CallbackHandler.on_train_begin = recording


def labelled_spans(trainer, rows: int = SPAN_ROWS) -> list[dict]:
    """For the first ``rows`` training rows, what the data collator labels: the labelled text, the text before it,
    and whether the labelled tokens are one span ending at the row's last real token."""
    tokenizer = trainer.processing_class
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(rows)])
    spans = []
    for ids, labels, mask in zip(batch["input_ids"], batch["labels"], batch["attention_mask"]):
        trained = (labels != -100).nonzero().flatten().tolist()
        real = mask.nonzero().flatten().tolist()
        spans.append(
            {
                "trained": tokenizer.decode(ids[trained]) if trained else "",
                "before": tokenizer.decode(ids[real[0] : trained[0]]) if trained else "",
                "one_span": trained == list(range(trained[0], trained[-1] + 1)) if trained else False,
                "ends_at_last_token": bool(trained) and trained[-1] == real[-1],
                "labels_are_ids": bool((labels[trained] == ids[trained]).all()) if trained else False,
            }
        )
    return spans


def summary(into: dict, stage: str) -> dict:
    """What the run recorded, as JSON (the trainer object itself left out)."""
    trainer = into.get("trainer")
    out = {key: into[key] for key in ("functions", "calls", "classes") if key in into}
    if trainer is None:
        return out
    if stage == "sft":
        out["labelled"] = labelled_spans(trainer)
    else:
        model = trainer.accelerator.unwrap_model(trainer.model)
        out["seq_packing"] = getattr(model, compat.UNSLOTH_SEQ_PACKING_VERIFIED, None)
    return out
