"""Per run: which plans its completions follow, and what the branch guide sees at the branch point.

``python -m sage_unsloth.demo.analysis --work W --results R --runs sft,grpo_seed0,... --branch-config C``
writes into ``R/analysis/``: ``strategies.csv`` and ``strategies.png`` (plan shares per run),
``strategy_problems.npz`` (per-problem plan shares, for the CIs in sage_unsloth.demo.lab) and ``branch.csv``.

The branch point is the first token of the completion (the plan word, see sage_unsloth.demo.task). For each
run's policy (base model + its LoRA adapter) and each RL prompt, one forward pass gives the next-token
distribution at the branch point at the RL sampling temperature; its entropy H gives the branch guide's
q = clip(1 + gamma * relu(H - tau), q_min, q_max), computed by the branch config's guide as training resolves and
runs it (its guide node resolved by sage_unsloth.plugins.guides.resolve_guide, the defaults filled, then called through
guides.run_guide), at the branch config's temperature. Reported: the mean entropy, the share of
prompts with q > 1, the mean q, and the policy's probability of each plan word (its plan prior, without
sampling noise). For contrast, the same for the other completion tokens, scored on up to
``--other-samples`` eval completions per problem. For RL runs that trained with the branch guide, the
training log's ``sage/frac_boosted`` (share of all completion tokens with q > 1) is averaged as well.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
from pathlib import Path

import numpy as np

from ..runtime import layout
from ..runtime.manifest import atomic_write_text
from .data import EVAL_FILE, RL_FILE
from .strategies import (
    LABELS,
    plot_strategies,
    problem_shares,
    read_completions,
    strategy_rows,
    write_strategy_table,
)
from .task import STRATEGIES

MODEL_NAME = "demo-tiny"
ANALYSIS_DIR = "analysis"
CORRECT_SUFFIX, IDS_SUFFIX = "__correct", "__problem_ids"  # extra arrays per run in strategy_problems.npz
BRANCH_COLUMNS = (
    "run",
    "prompts",
    "temperature",
    "gamma",
    "tau",
    "branch_entropy_mean",
    "branch_entropy_min",
    "branch_entropy_max",
    "branch_q_gt1_fraction",
    "branch_q_mean",
    *[f"p_{s}" for s in STRATEGIES],
    "other_tokens",
    "other_entropy_mean",
    "other_q_gt1_fraction",
    "train_frac_boosted_mean",
    "train_q_first_mean",
    "train_q_first_last",
    "train_first_boosted_mean",
    "train_later_boosted_mean",
    "train_reward_first",
    "train_reward_last",
)


def checkpoint_run(run: str) -> str:
    """The stage folder a run's policy lives in: stage 1's for SFT's evaluations (``sft``, ``sft_seed<s>``),
    else the run's own."""
    from ..report.compare import REFERENCE_METHOD, split_run

    return layout.SFT_RUN if split_run(run)[0] == REFERENCE_METHOD else run


def branch_settings(config_path: Path) -> dict:
    """The branch config's temperature and guide as training resolves it (its ``base:`` chain merged, the guide
    node resolved once, the plug-in's defaults filled): its arguments (gamma, tau, q_min, q_max) and, under
    ``guide``, the resolved node, which :func:`_lab_q` runs."""
    from sage_unsloth.config.args import load_config
    from sage_unsloth.plugins import guides

    cfg = load_config(config_path)  # with its base: chain
    node, needs = guides.resolve_guide(cfg.get("guide", "none"))
    if tuple(needs) != ("entropies",):
        raise ValueError(
            f"--branch-config {config_path}: guide {node.name!r} reads {', '.join(needs) or 'no signal'}; the "
            "branch-point analysis scores the policy's entropy alone: name a config whose guide reads entropies "
            "(branch)"
        )
    return {"temperature": float(cfg.get("temperature", 1.0)), **node.args, "guide": node}


def load_policy(run_dir: Path):
    """(model, tokenizer) of a stage output folder: base model with the LoRA adapter merged."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ..eval.sampling import load_tokenizer, resolve_checkpoint

    checkpoint = resolve_checkpoint(str(run_dir))
    model = AutoModelForCausalLM.from_pretrained(checkpoint.base_model, dtype=torch.float32)
    if checkpoint.adapter_dir:
        model = PeftModel.from_pretrained(model, checkpoint.adapter_dir).merge_and_unload()
    return model.eval(), load_tokenizer(checkpoint)


def _prompt_ids(tokenizer, problem: str) -> list[int]:
    from ..data.prompts import prompt_messages

    text = tokenizer.apply_chat_template(prompt_messages(problem), tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _entropy(logits, temperature: float):
    import torch

    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1), log_probs


def _lab_q(entropy, settings: dict):
    """The lab's branch q of each entropy in the 1-D tensor ``entropy`` (every token counted): the branch
    config's guide, run as training runs it (guides.run_guide: the guide, then the clip to its q_min / q_max)."""
    import torch

    from sage_unsloth.plugins import guides

    node = settings["guide"]
    signals = guides.Signals(
        mask=torch.ones_like(entropy)[None, :],
        step=0,
        max_steps=1,
        generator=torch.Generator().manual_seed(0),
        entropies=entropy[None, :],
    )
    q, _ = guides.run_guide(
        node.entry,
        guides.GUIDES.bind(node),
        signals,
        step=None,
        q_min=node.args["q_min"],
        q_max=node.args["q_max"],
    )
    return q[0]


def branch_point_stats(model, tokenizer, problems: list[str], settings: dict) -> dict:
    """Entropy, q and plan probabilities at the branch point, over ``problems``."""
    import torch

    plan_ids = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in STRATEGIES]
    if any(len(ids) != 1 for ids in plan_ids):
        raise ValueError(f"plan words are not single tokens: {dict(zip(STRATEGIES, plan_ids))}")
    entropies, plan_probs = [], []
    with torch.no_grad():
        for start in range(0, len(problems), 64):
            batch = [_prompt_ids(tokenizer, p) for p in problems[start : start + 64]]
            width = max(map(len, batch))
            pad = tokenizer.pad_token_id
            ids = torch.tensor([[pad] * (width - len(b)) + b for b in batch])
            mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch])
            logits = model(input_ids=ids, attention_mask=mask).logits[:, -1, :]
            entropy, log_probs = _entropy(logits, settings["temperature"])
            entropies.append(entropy)
            plan_probs.append(log_probs.exp()[:, [ids_[0] for ids_ in plan_ids]])
    entropy = torch.cat(entropies)
    q = _lab_q(entropy, settings)
    probs = torch.cat(plan_probs).mean(0)
    return {
        "prompts": len(problems),
        "branch_entropy_mean": entropy.mean().item(),
        "branch_entropy_min": entropy.min().item(),
        "branch_entropy_max": entropy.max().item(),
        "branch_q_gt1_fraction": (q > 1.0).float().mean().item(),
        "branch_q_mean": q.mean().item(),
        **{f"p_{s}": probs[i].item() for i, s in enumerate(STRATEGIES)},
    }


def other_token_stats(
    model, tokenizer, problems: dict[str, str], records: list[dict], settings: dict, per_problem: int
) -> dict:
    """Entropy and q at the completion tokens after the branch point, over some eval completions."""
    import torch

    entropies = []
    with torch.no_grad():
        for record in records:
            prompt = _prompt_ids(tokenizer, problems[record["problem_id"]])
            for completion in record["completions"][:per_problem]:
                tokens = tokenizer(completion["text"], add_special_tokens=False)["input_ids"]
                if len(tokens) < 2:
                    continue
                ids = torch.tensor([prompt + tokens])
                logits = model(input_ids=ids).logits[0, len(prompt) : -1, :]  # predicts tokens[1:]
                entropies.append(_entropy(logits, settings["temperature"])[0])
    if not entropies:
        return {"other_tokens": 0, "other_entropy_mean": float("nan"), "other_q_gt1_fraction": float("nan")}
    entropy = torch.cat(entropies)
    q = _lab_q(entropy, settings)
    return {
        "other_tokens": int(entropy.numel()),
        "other_entropy_mean": entropy.mean().item(),
        "other_q_gt1_fraction": (q > 1.0).float().mean().item(),
    }


_LOGGED = re.compile(r"\{[^{}]*'reward'[^{}]*\}")


# logged key -> the column of its mean over training
TRAINING_Q_KEYS = {
    "sage/frac_boosted": "train_frac_boosted_mean",
    "sage/q_first_mean": "train_q_first_mean",
    "sage/first_boosted": "train_first_boosted_mean",
    "sage/later_boosted": "train_later_boosted_mean",
}


# An RL run without a guide trains against q = 1 (the plan runs and logs nothing of q): its q columns by definition.
UNGUIDED_Q = {
    "train_frac_boosted_mean": 0.0,
    "train_q_first_mean": 1.0,
    "train_q_first_last": 1.0,
    "train_first_boosted_mean": 0.0,
    "train_later_boosted_mean": 0.0,
}


def run_is_unguided(work: Path, run: str) -> bool:
    """Did ``run`` train without a guide (its stage-2 manifest's resolved guide node is ``none``)? SFT runs and
    runs without a manifest: no."""
    path = layout.run_dir(work, MODEL_NAME, run) / "manifest.json"
    if not path.is_file():
        return False
    training = json.loads(path.read_text()).get("config", {}).get("training", {})
    return (training.get("guide") or {}).get("name") == "none"


def training_log_stats(log_path: Path, *, unguided: bool = False) -> dict:
    """From an RL step's log (TRL's log dicts): the first / last logged reward and, for guided runs, the means
    over training of sage/frac_boosted, of q at the first completion token (the demo's branch point; also its
    last logged value) and of the shares of first and of later tokens with q > 1 (rlvr/trainer.py logs them).
    ``unguided``: the run trained without a guide, whose q is 1 everywhere (:data:`UNGUIDED_Q`)."""
    out = {column: float("nan") for column in TRAINING_Q_KEYS.values()}
    out.update(
        train_q_first_last=float("nan"), train_reward_first=float("nan"), train_reward_last=float("nan")
    )
    if unguided:
        out.update(UNGUIDED_Q)
    if not log_path.is_file():
        return out
    entries = []
    for match in _LOGGED.finditer(log_path.read_text(errors="replace")):
        values = dict(re.findall(r"'([\w/]+)': '?(-?[\d.]+(?:e-?\d+)?)'?", match.group(0)))
        entries.append({k: float(v) for k, v in values.items()})
    rewards = [e["reward"] for e in entries if "reward" in e]
    if rewards:
        out.update(train_reward_first=rewards[0], train_reward_last=rewards[-1])
    for key, column in TRAINING_Q_KEYS.items():
        logged = [e[key] for e in entries if key in e]
        if logged:
            out[column] = float(np.mean(logged))
            if key == "sage/q_first_mean":
                out["train_q_first_last"] = logged[-1]
    return out


def _write_csv(path: Path, columns, rows: list[dict]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {k: (round(v, 6) if isinstance(v, float) and not math.isnan(v) else v) for k, v in row.items()}
        )
    atomic_write_text(path, buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m sage_unsloth.demo.analysis", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--work", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument(
        "--runs", required=True, help="comma-separated run folders (sft, <method>_seed<s>, ...)"
    )
    parser.add_argument(
        "--branch-config", required=True, help="the GRPO + Branch config (gamma, tau, q bounds)"
    )
    parser.add_argument(
        "--other-samples", type=int, default=4, help="eval completions per problem for the non-branch tokens"
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    work, results = Path(args.work), Path(args.results)
    runs = [r for r in args.runs.split(",") if r]
    settings = branch_settings(Path(args.branch_config))
    rl_problems = [json.loads(line)["prompt"] for line in (work / "data" / RL_FILE).read_text().splitlines()]
    eval_problems = {
        row["unique_id"]: row["problem"]
        for row in (json.loads(line) for line in (work / "data" / EVAL_FILE).read_text().splitlines())
    }
    strategy_table, shares, branch_rows = [], {}, []
    policies, branch_at = {}, {}
    for run in runs:
        records = read_completions(layout.completions_dir(work, MODEL_NAME, run), "demo")
        strategy_table += strategy_rows(run, records)  # raises on an empty run
        shares[run] = problem_shares(records)
        shares[f"{run}{CORRECT_SUFFIX}"] = problem_shares(records, correct_only=True)
        shares[f"{run}{IDS_SUFFIX}"] = np.array([r["problem_id"] for r in records])
        checkpoint = checkpoint_run(run)
        if checkpoint not in policies:  # SFT's per-seed evaluations share one policy: loaded and scored once
            model, tokenizer = load_policy(layout.run_dir(work, MODEL_NAME, checkpoint))
            branch_at[checkpoint] = branch_point_stats(model, tokenizer, rl_problems, settings)
            policies = {checkpoint: (model, tokenizer)}  # the last one only (RL runs are read once)
        model, tokenizer = policies[checkpoint]
        row = {
            "run": run,
            **{k: settings[k] for k in ("temperature", "gamma", "tau")},
            **branch_at[checkpoint],
            **other_token_stats(model, tokenizer, eval_problems, records, settings, args.other_samples),
            **training_log_stats(work / "logs" / f"{run}.log", unguided=run_is_unguided(work, run)),
        }
        branch_rows.append(row)
        print(
            f"{run}: branch-point entropy {row['branch_entropy_mean']:.3f} nats, q > 1 at "
            f"{row['branch_q_gt1_fraction']:.1%} of branch points, {row['other_q_gt1_fraction']:.1%} of other "
            f"tokens; plan prior " + ", ".join(f"{s} {row['p_' + s]:.2f}" for s in STRATEGIES),
            flush=True,
        )
    out = results / ANALYSIS_DIR
    out.mkdir(parents=True, exist_ok=True)
    write_strategy_table(strategy_table, out / "strategies.csv")
    plot_strategies([r for r in strategy_table if r["strategy"] in LABELS], out / "strategies.png")
    np.savez(out / "strategy_problems.npz", **shares)
    _write_csv(out / "branch.csv", BRANCH_COLUMNS, branch_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
