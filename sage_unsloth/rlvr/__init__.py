"""Stage 2, RLVR: GRPO with the SAGE shaped anchor q * pi_ref (config + trainer; see run.py for the stage)."""

__all__ = ["SageGRPOConfig", "SageGRPOTrainer", "make_sage_trainer_class"]


def __getattr__(name):
    # Imported lazily: `import sage_unsloth.rlvr` (what `python -m sage_unsloth.rlvr` does first) must not import
    # TRL, so that its input is checked in a second (sage_unsloth/config/schema.py), and must never pull in TRL's
    # trainer before Unsloth had the chance to patch it.
    if name == "SageGRPOConfig":
        from sage_unsloth.rlvr.config import SageGRPOConfig

        return SageGRPOConfig
    if name in ("SageGRPOTrainer", "make_sage_trainer_class"):
        from sage_unsloth.rlvr import trainer

        return getattr(trainer, name)
    raise AttributeError(name)
