"""Where a guide's entropy threshold sits on a policy's own entropy scale.

``python -m sage_unsloth.demo.entropy_scale --work W --run sft --out R/analysis/entropy_quantiles.csv``
scores up to ``--samples`` eval completions per problem of one run with that run's policy (at the sampling
temperature) and writes the quantiles of the token entropy over every completion token, the branch point
(completion position 0) included, and the quantile each threshold of ``--taus`` falls at.

Why: the paper's branch guide uses tau = 1.2 nats on a 7B model (arXiv 2605.18864). A threshold in nats means
nothing on another model's scale; a quantile does. The "80/20" paper (Wang et al., arXiv 2506.01939, Section 3)
reports for Qwen3-8B chain-of-thought tokens an 80th entropy percentile of 0.672 nats with over half the tokens
below 0.01, so tau = 1.2 sits above the 80th percentile of a model of that scale (the paper prints no higher
percentile). This file gives the lab's side of that mapping.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ..runtime import layout
from ..runtime.manifest import atomic_write_text
from .analysis import MODEL_NAME, _entropy, _prompt_ids, load_policy
from .data import EVAL_FILE
from .strategies import read_completions

QUANTILES = (0.5, 0.8, 0.9, 0.95, 0.99)


def completion_entropies(
    model, tokenizer, problems: dict[str, str], records, temperature: float, per_problem: int
):
    """Entropy of the policy's next-token distribution at every completion token (position 0 first)."""
    import torch

    branch, later = [], []
    with torch.no_grad():
        for record in records:
            prompt = _prompt_ids(tokenizer, problems[record["problem_id"]])
            for completion in record["completions"][:per_problem]:
                tokens = tokenizer(completion["text"], add_special_tokens=False)["input_ids"]
                if not tokens:
                    continue
                ids = torch.tensor([prompt + tokens])
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1, :]  # predicts tokens[0:]
                entropy = _entropy(logits, temperature)[0]
                branch.append(entropy[0].item())
                later.extend(entropy[1:].tolist())
    return np.array(branch), np.array(later)


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m sage_unsloth.demo.entropy_scale",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--work", required=True)
    parser.add_argument("--run", default="sft")
    parser.add_argument("--out", required=True)
    parser.add_argument("--samples", type=int, default=8, help="eval completions per problem")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--taus", default="0.03,0.05,0.2,0.5,1.2")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    work = Path(args.work)
    problems = {
        row["unique_id"]: row["problem"]
        for row in (json.loads(line) for line in (work / "data" / EVAL_FILE).read_text().splitlines())
    }
    records = read_completions(layout.completions_dir(work, MODEL_NAME, args.run), "demo")
    model, tokenizer = load_policy(layout.run_dir(work, MODEL_NAME, args.run))
    branch, later = completion_entropies(model, tokenizer, problems, records, args.temperature, args.samples)
    every = np.concatenate([branch, later])
    rows = [
        {
            "statistic": "tokens",
            "all_tokens": every.size,
            "branch_point": branch.size,
            "later_tokens": later.size,
        }
    ]
    for q in QUANTILES:
        rows.append(
            {
                "statistic": f"p{round(q * 100)}",
                "all_tokens": float(np.quantile(every, q)),
                "branch_point": float(np.quantile(branch, q)),
                "later_tokens": float(np.quantile(later, q)),
            }
        )
    for tau in (float(t) for t in args.taus.split(",")):
        rows.append(
            {
                "statistic": f"share_above_tau_{tau:g}",
                "all_tokens": float((every > tau).mean()),
                "branch_point": float((branch > tau).mean()),
                "later_tokens": float((later > tau).mean()),
            }
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer_rows = ["statistic,all_tokens,branch_point,later_tokens"]
    for row in rows:
        writer_rows.append(
            ",".join(str(row[k]) if not isinstance(row[k], float) else f"{row[k]:.6g}" for k in row)
        )
    atomic_write_text(out, "\n".join(writer_rows) + "\n")
    for line in writer_rows:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
