"""Stage 2, RLVR: GRPO with the SAGE shaped anchor q * pi_ref (config + trainer; see run.py for the stage)."""

from sage_unsloth.rlvr.config import SageGRPOConfig

__all__ = ["SageGRPOConfig", "SageGRPOTrainer", "make_sage_trainer_class"]


def __getattr__(name):
    # The trainer module is imported lazily so that `import sage_unsloth.rlvr` never pulls in TRL's trainer
    # before Unsloth had the chance to patch it.
    if name in ("SageGRPOTrainer", "make_sage_trainer_class"):
        from sage_unsloth.rlvr import trainer

        return getattr(trainer, name)
    raise AttributeError(name)
