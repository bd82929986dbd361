"""What the two training stages (``sage-unsloth sft``, ``sage-unsloth rlvr``) share on the command line.

- :class:`StageRunArgs`: the run-control fields ``resume``, ``restart`` and ``unsloth_without_gpu``, one
  declaration that SageSFTConfig (sage_unsloth/sft/config.py) and RLVRStageArgs (sage_unsloth/rlvr/run.py)
  build on.

Importing this module imports neither torch nor TRL.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StageRunArgs:
    """How a training stage treats its output folder, and whether Unsloth may run without a GPU."""

    resume: bool = field(
        default=False, metadata={"help": "Continue from the newest complete checkpoint in the output folder"}
    )
    unsloth_without_gpu: bool = field(
        default=False,
        metadata={
            "help": "backend=unsloth on a machine without a GPU: run Unsloth's slow CPU fallback anyway"
        },
    )
    restart: bool = field(
        default=False,
        metadata={"help": "Output folder holds only incomplete checkpoints: delete them and start over"},
    )
