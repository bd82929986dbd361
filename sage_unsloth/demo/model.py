"""The demo's model: the kit's tiny random Qwen2 in its own shape (sage_unsloth.model.tiny: hidden 128, 2 layers,
~0.4M parameters, measured to learn the task in a few hundred CPU steps; wider or deeper models cost 3-5x more per
step on 2 cores), with a tokenizer fitted to the task.

Numbers are tokenized digit by digit (the saved tokenizer loads as Qwen2's, whose pre-tokenizer splits
every digit, like the real Qwen2.5 models), so an addition step is short carry arithmetic over digit
tokens. The extra BPE corpus makes each plan word one token and the evaluator's user template cheap.
Everything is built offline in seconds.
"""

from __future__ import annotations

from pathlib import Path

from ..data.prompts import EVAL_USER_TEMPLATE
from ..model.tiny import build_tiny_model


def demo_corpus() -> list[str]:
    """Text for the tokenizer's BPE merges: every plan word becomes one token (the branch point is one
    token, tests/demo/test_demo_task.py checks it), and the evaluator's user template is cheap."""
    from .task import STRATEGIES, working

    return [working(name, (5, 8, 6, 7)) for name in STRATEGIES] * 4 + [
        EVAL_USER_TEMPLATE.format(problem="What is 5+8+6+7?")
    ] * 8


def build_demo_model(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Write the demo's random model + tokenizer to ``out_dir`` (the tiny model's shape)."""
    return build_tiny_model(out_dir, seed=seed, extra_corpus=demo_corpus())
