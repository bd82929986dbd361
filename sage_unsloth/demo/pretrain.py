"""A few seconds of "pre-training" so the demo's base model knows addition facts, like a real base model.

The kit's SFT stage trains a LoRA adapter (the paper's recipe). A LoRA on a *random* network learns very
slowly: its embeddings, norms and tied output head stay random, so it can barely raise the logit of a
token (measured: loss still ~4.8 after 100 steps, where full fine-tuning is at 0.6). The demo therefore
first gives its random model what a real base model brings: every word of the format and arithmetic.

The corpus is segments in random order, separated by blank lines: a problem with its working out in
plain text (no prompt, no markers, no answer block), written with either strategy at EQUAL rates;
bare addition facts (``27+5=32``); and now and then a piece of the kit's format out of context (a
marker, a solution block with a random number, a line of the system prompt). So the base model knows
both strategies equally well and has seen every token of the format, but never the format applied to a
problem: the SFT stage teaches that, and its data sets the 90/10 prior over the two strategies. Worked
problems come from the SFT pool only, never from the RL or eval problems.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

logger = logging.getLogger(__name__)


def addition_facts(max_left: int = 40, max_right: int = 20) -> list[str]:
    """Every ``x+y=z`` with 0 <= x <= max_left and 0 <= y <= max_right, in both orders."""
    facts = set()
    for x in range(max_left + 1):
        for y in range(max_right + 1):
            facts.add(f"{x}+{y}={x + y}")
            facts.add(f"{y}+{x}={x + y}")
    return sorted(facts)


def format_pieces(rng: random.Random) -> str:
    """One piece of the kit's format, out of context (trains the embeddings of its tokens)."""
    from ..prompts import REASONING_END, REASONING_START, SOLUTION_END, SOLUTION_START, SYSTEM_PROMPT
    from .task import problem_text

    kind = rng.randrange(4)
    if kind == 0:
        return rng.choice([REASONING_START, REASONING_END])
    if kind == 1:
        return f"{SOLUTION_START}{rng.randrange(100)}{SOLUTION_END}"
    if kind == 2:
        return problem_text(tuple(rng.randrange(10) for _ in range(rng.choice((2, 3, 4, 5)))))
    return rng.choice(SYSTEM_PROMPT.splitlines())


def corpus_row(rng: random.Random, facts: list[str], problems: list[tuple[int, ...]], segments: int = 3,
               worked_share: float = 0.5, format_share: float = 0.15) -> str:
    from .task import WORKING, problem_text

    parts = []
    for _ in range(segments):
        draw = rng.random()
        if problems and draw < worked_share:
            numbers = rng.choice(problems)
            parts.append(problem_text(numbers) + "\n" + WORKING[rng.choice("AB")](numbers))
        elif draw < worked_share + format_share:
            parts.append(format_pieces(rng))
        else:
            parts.append("\n".join(rng.choice(facts) for _ in range(3)))
    return "\n\n".join(parts)


def pretrain_base_model(model_dir: str | Path, problems: list[tuple[int, ...]], *, steps: int = 300,
                        batch_size: int = 32, learning_rate: float = 3e-3, seed: int = 0) -> dict:
    """Train every weight of the model in ``model_dir`` on the corpus above; save it back in place.

    Deterministic for a given seed and thread count. Returns a small summary (steps, final loss, seconds).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    facts = addition_facts()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    eos = tokenizer.eos_token_id
    started, loss_value = time.perf_counter(), float("nan")
    for step in range(steps):
        rows = [tokenizer(corpus_row(rng, facts, problems))["input_ids"] + [eos]
                for _ in range(batch_size)]
        width = max(map(len, rows))
        input_ids = torch.tensor([row + [eos] * (width - len(row)) for row in rows])
        labels = torch.tensor([row + [-100] * (width - len(row)) for row in rows])
        warmup = min(1.0, (step + 1) / 20)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * warmup * (1.0 - 0.9 * step / steps)
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if (step + 1) % 50 == 0:
            logger.info("pretrain step %d/%d loss %.4f", step + 1, steps, loss_value)
    model.save_pretrained(model_dir, safe_serialization=True)
    return {"steps": steps, "final_loss": round(loss_value, 4), "seconds": round(time.perf_counter() - started, 1)}
