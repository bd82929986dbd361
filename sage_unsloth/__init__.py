"""sage-unsloth: SAGE shaped KL anchors for GRPO-family RLVR on TRL and Unsloth.

Data flows one way: sft -> rlvr -> eval -> report. Each stage reads the previous stage's output folder
and its manifest.json. The SAGE math lives in :mod:`sage_unsloth.plugins.anchor`.
"""

import os

# Bitwise the same CPU results whatever the thread count (and so whatever the machine's load): on CPUs with
# AVX-512 MKL splits a long GEMM's inner dimension across threads (a weight gradient over B x T tokens), so
# training on 1 or 2 threads gave different weights (tests/demo/test_demo_steps.py). MKL's strict conditional
# numerical reproducibility fixes the summation order; it is read before the first MKL call, which is why it is
# set when the kit is imported. No cost measured on the demo's pre-training (5.3 vs 5.5 s CPU, 1 thread).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"
