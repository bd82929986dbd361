"""sage-unsloth: SAGE shaped KL anchors for GRPO-family RLVR on TRL and Unsloth.

Data flows one way: sft -> rlvr -> eval -> report. Each stage reads the previous stage's output folder
and its manifest.json. The SAGE math lives in :mod:`sage_unsloth.anchor`.
"""

__version__ = "0.1.0"
