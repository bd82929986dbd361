"""Run a script under Unsloth's patching forced onto the CPU, in a child process (Unsloth patches at import)."""

import os
import subprocess
import sys
from pathlib import Path

# A plain transformers model ignores the prefix_seg_info of Unsloth's PrefixGrouper (on by default, off under
# vLLM), which then mis-scores every completion after the first of a group: off, as a GPU run under vLLM has it.
FORCED_UNSLOTH_ENV = {
    "UNSLOTH_ALLOW_CPU": "1",
    "UNSLOTH_COMPILE_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
    "UNSLOTH_GRPO_PREFIX_GROUPER": "0",
}


# The opening of a script run by run_forced_unsloth: Unsloth's generated GRPO trainer forced onto the CPU, the
# tiny model (sys.argv[1]) loaded in float32 with FastLanguageModel's mode switches stubbed out, and a dataset
# of two prompts (a short one and a long one) four times each.
FORCED_TRAINER_PREAMBLE = r"""
import math, os, sys, warnings
warnings.simplefilter("ignore")
from sage_unsloth.runtime.backend import import_unsloth
import_unsloth()
import unsloth.models.rl as unsloth_rl
unsloth_rl._patch_trl_rl_trainers("grpo_trainer")  # private: rewrites TRL's GRPOTrainer as on a GPU
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from sage_unsloth.rlvr.config import SageGRPOConfig
from sage_unsloth.rlvr.trainer import SageGRPOTrainer

model_dir = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
model.for_training = model.for_inference = lambda *a, **k: None  # FastLanguageModel's mode switches
prompts = ["What is 2+3?", "Compute the sum of the first ten odd positive integers, then double it."]
dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts] * 4)
"""


def unsloth_config_fields(output_dir: Path, **fields) -> dict:
    """SageGRPOConfig keyword arguments of a backend=unsloth run configured on this CPU machine, plus ``fields``."""
    return {
        "output_dir": str(output_dir),
        "report_to": "none",
        "backend": "unsloth",
        "bf16": False,
        "use_cpu": True,
        **fields,
    }


def run_forced_unsloth(source: str, name: str, model_dir: Path, tmp_path: Path, timeout: int):
    """Write ``source`` to tmp_path/name and run it on ``model_dir``; it must exit 0 and print CANARY-OK.

    cwd = tmp_path: Unsloth writes its unsloth_compiled_cache/ there, not into the repository."""
    script = tmp_path / name
    script.write_text(source)
    result = subprocess.run(
        [sys.executable, str(script), str(model_dir)],
        cwd=tmp_path,
        env=dict(os.environ, **FORCED_UNSLOTH_ENV),
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0 and "CANARY-OK" in result.stdout, (
        result.stdout[-3000:] + result.stderr[-5000:]
    )
    return result
