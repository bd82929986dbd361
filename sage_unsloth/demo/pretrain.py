"""A short full-weight "pre-training" so the demo's base model can add and knows every plan, like a real
base model: ``python -m sage_unsloth.demo.pretrain --out DIR [--steps N] [--seed S] [--draw D] [--low L --high H
--n-eval E --n-rl R]`` builds the random model (sage_unsloth.demo.model) in DIR and trains it in place;
``--from sage_unsloth/demo/bases/draw<D> --out DIR`` copies a committed pre-trained base instead and checks
its sha256 (sage_unsloth/demo/bases/README.md).

The **draw** is the pre-training's own seed (the random initial weights and the corpus order); ``--seed`` is
the data spec's (which problems are held out of the corpus), so every draw pre-trains on the same task.
Draw 0 with seed 0 is the lab's default base. Pre-training is deterministic for a given draw on one CPU type
(any thread count: MKL_CBWR=AUTO,STRICT), but a change of arithmetic (another CPU type's code path, another
torch or MKL) gives other weights and, after 600 steps from random weights, another model: the lab's regime
moved that way once (issue 39). So the lab starts from the committed bases, not from a fresh pre-training.

The kit's SFT stage trains a LoRA adapter (the paper's recipe). A LoRA on a *random* network learns very
slowly: its embeddings, norms and tied output head stay random, so it can barely raise the logit of a
token (measured: loss still ~4.8 after 100 steps, where full fine-tuning is at 0.6). The demo therefore
first gives its random model what a real base model brings.

The corpus is segments in random order, separated by blank lines: a problem followed by its working out
under ``<start_working_out>``, written with one of the five plans chosen UNIFORMLY (no end marker, no
solution block, no system prompt); bare addition facts (``13+6=19``); and now and then a piece of the
kit's format out of context (a marker, a solution block with a random number, a line of the system
prompt). So the base model executes every plan equally well and has seen every token of the format, but
has never closed the working out or answered: the SFT stage teaches that, and its data sets the
prior over the plans (data.DEFAULT_MIX). Worked problems come from the SFT pool only, never from the RL or
eval problems.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path

logger = logging.getLogger(__name__)
SUMMARY_FILE = "PRETRAINED.json"
WEIGHTS_FILE = "model.safetensors"
BASES_DIR = Path(__file__).resolve().parent / "bases"  # committed pre-trained bases, one folder per draw


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def machine() -> dict:
    """Where a base was pre-trained: what its arithmetic depends on (the CPU's instruction set picks MKL's path)."""
    import platform

    import torch

    cpu = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = platform.processor()
    avx512 = "avx512f" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else None
    return {
        "cpu": cpu,
        "avx512": avx512,
        "torch": torch.__version__,
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
    }


def committed_base(draw: int, *, steps: int, spec) -> Path | None:
    """The committed base of ``draw`` when it was pre-trained with these ``steps`` on this data spec (the
    problem split it holds out), else None (the runner then pre-trains)."""
    folder = BASES_DIR / f"draw{draw}"
    summary = folder / SUMMARY_FILE
    if not summary.is_file():
        return None
    made = json.loads(summary.read_text())
    split = {k: getattr(spec, k) for k in ("seed", "low", "high", "n_eval", "n_rl")}
    if made.get("steps") != steps or made.get("draw") != draw or made.get("split") != split:
        return None
    return folder


def copy_committed(base: Path, out: Path) -> dict:
    """Copy a committed base into ``out``; its weights must have the sha256 its PRETRAINED.json records."""
    summary = json.loads((Path(base) / SUMMARY_FILE).read_text())
    expected = summary["sha256"]
    actual = file_sha256(Path(base) / WEIGHTS_FILE)
    if actual != expected:
        raise SystemExit(
            f"error: {base}/{WEIGHTS_FILE}: sha256 {actual[:12]} is not the recorded {expected[:12]}: the committed "
            "base is damaged (git checkout it again) or was replaced without its PRETRAINED.json"
        )
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    return summary


def addition_facts(max_left: int = 40, max_right: int = 20) -> list[str]:
    """Every ``x+y=z`` with 0 <= x <= max_left and 0 <= y <= max_right, in both orders, except the gap
    (task.in_gap)."""
    from .task import in_gap

    facts = set()
    for x in range(max_left + 1):
        for y in range(max_right + 1):
            for u, v in ((x, y), (y, x)):
                if not in_gap(u, v):
                    facts.add(f"{u}+{v}={u + v}")
    return sorted(facts)


def format_pieces(rng: random.Random) -> str:
    """One piece of the kit's format, out of context (trains the embeddings of its tokens)."""
    from ..data.prompts import REASONING_END, REASONING_START, SOLUTION_END, SOLUTION_START, SYSTEM_PROMPT

    kind = rng.randrange(3)
    if kind == 0:
        return rng.choice([REASONING_START, REASONING_END])
    if kind == 1:
        return f"{SOLUTION_START}{rng.randrange(100)}{SOLUTION_END}"
    return rng.choice(SYSTEM_PROMPT.splitlines())


def worked_segment(numbers: tuple[int, ...], strategy: str) -> str:
    from ..data.prompts import REASONING_START
    from .task import problem_text, working

    return f"{problem_text(numbers)}\n\n{REASONING_START}{working(strategy, numbers)}"


def corpus_row(
    rng: random.Random,
    facts: list[str],
    problems: list[tuple[int, ...]],
    segments: int = 3,
    worked_share: float = 0.9,
    format_share: float = 0.05,
) -> str:
    from .task import STRATEGIES, plan_needs_gap

    parts = []
    for _ in range(segments):
        draw = rng.random()
        if problems and draw < worked_share:
            strategy = rng.choice(STRATEGIES)
            numbers = rng.choice(problems)
            while plan_needs_gap(strategy, numbers):  # never show an addition of the gap
                numbers = rng.choice(problems)
            parts.append(worked_segment(numbers, strategy))
        elif draw < worked_share + format_share:
            parts.append(format_pieces(rng))
        else:
            parts.append("\n".join(rng.choice(facts) for _ in range(3)))
    return "\n\n".join(parts)


def pretrain_base_model(
    model_dir: str | Path,
    problems: list[tuple[int, ...]],
    *,
    steps: int = 600,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """Train every weight of the model in ``model_dir`` on the corpus above; save it back in place.

    Deterministic for a given seed (and independent of the thread count: tests/demo/test_demo_steps.py).
    Returns a small summary (steps, final loss, seconds).
    """
    import torch
    from tqdm.auto import tqdm
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
    bar = tqdm(total=steps, desc="pretrain", disable=not progress, mininterval=5.0, ascii=True)
    for step in range(steps):
        rows = [tokenizer(corpus_row(rng, facts, problems))["input_ids"] + [eos] for _ in range(batch_size)]
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
        bar.update(1)
        if (step + 1) % 50 == 0:
            bar.write(f"{{'loss': {loss_value:.4f}, 'step': {step + 1}}}")
    bar.close()
    model.save_pretrained(model_dir, safe_serialization=True)
    return {
        "steps": steps,
        "final_loss": round(loss_value, 4),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    from .data import DemoDataSpec
    from .model import build_demo_model

    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m sage_unsloth.demo.pretrain", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="model folder (created)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0, help="the data spec's seed (the held-out problems)")
    parser.add_argument("--draw", type=int, default=None, help="the pre-training's seed (default: --seed)")
    parser.add_argument("--from", dest="source", default=None, help="copy this committed base instead")
    for name, default in (("low", 5), ("high", 9), ("n-eval", 100), ("n-rl", 200)):
        parser.add_argument(f"--{name}", type=int, default=default, help="the data spec (problems kept out)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    if args.source:
        summary = copy_committed(Path(args.source), out)
        logger.info(
            "copied the committed base %s to %s (sha256 %s)", args.source, out, summary["sha256"][:12]
        )
        return 0
    spec = DemoDataSpec(seed=args.seed, low=args.low, high=args.high, n_eval=args.n_eval, n_rl=args.n_rl)
    draw = args.seed if args.draw is None else args.draw
    build_demo_model(out, seed=draw)
    summary = pretrain_base_model(out, spec.splits()["sft"], steps=args.steps, seed=draw, progress=True)
    summary.update(
        draw=draw,
        split={k: getattr(spec, k) for k in ("seed", "low", "high", "n_eval", "n_rl")},
        sha256=file_sha256(out / WEIGHTS_FILE),
        made_on=machine(),
    )
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    logger.info("pre-trained %s: %s", out, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
