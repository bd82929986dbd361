#!/usr/bin/env python
"""Mutation testing of the SAGE math (sage_unsloth/plugins/anchor.py) and the trainer's SAGE methods: each mutant is a
one-token (or one-factor) change to a guide, an estimator or the code that places them; the tests that cover it
must fail. Not part of `make test`: each mutant re-runs a slice of the suite (all 46 and the baseline: about
15 minutes on 2 cores).

    .venv/bin/python scripts/mutants.py            # every mutant, a table, exit 1 if one survives
    .venv/bin/python scripts/mutants.py --list     # the mutants only
    .venv/bin/python scripts/mutants.py -k dapo    # mutants whose name contains "dapo"

Each mutant edits its file in place, runs its tests (pytest -x) and restores the file, also on Ctrl-C; run it in
a clean checkout and nothing else at the same time.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ANCHOR = "sage_unsloth/plugins/anchor.py"
TRAINER = "sage_unsloth/rlvr/trainer.py"
CONFIG = "sage_unsloth/rlvr/config.py"
GUIDES = "sage_unsloth/plugins/guides.py"

GUIDE_TESTS = (
    "tests/rlvr/test_anchor.py",
    "tests/rlvr/test_guides_oracle.py::test_token_guide_in_loss_matches_oracle_with_fixed_generator",
    "tests/rlvr/test_guides_oracle.py::test_random_guide_at_rollout_matches_oracle_with_fixed_generator",
)
MATH_TESTS = ("tests/rlvr/test_anchor.py", "tests/rlvr/test_estimators.py")
TRAINER_ORACLE = (
    "tests/rlvr/test_rlvr_trainer.py::test_loss_and_gradients_match_oracle",
    "tests/rlvr/test_rlvr_trainer.py::test_k2_and_forward_terms_use_anchor_functions",
)
OFF_POLICY = ("tests/rlvr/test_guides_oracle.py",)
PLACEMENT = (
    "tests/rlvr/test_placement.py::test_reward_placement_matches_the_formula",
    "tests/rlvr/test_placement.py::test_group_advantage_contact_point",
)
DAPO = ("tests/rlvr/test_dapo.py",)


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    # --- guides (the two first) ---
    Mutant(
        "token noise sigma*N (no w)",
        ANCHOR,
        "q = 1.0 + alpha * w + sigma * w * noise",
        "q = 1.0 + alpha * w + sigma * noise",
        GUIDE_TESTS,
    ),
    Mutant(
        "random sigma x3",
        ANCHOR,
        "1.0 + sigma * noise, torch.ones(shape)",
        "1.0 + 3 * sigma * noise, torch.ones(shape)",
        GUIDE_TESTS,
    ),
    Mutant(
        "token alpha*w -> sigma*w",
        ANCHOR,
        "q = 1.0 + alpha * w + sigma",
        "q = 1.0 + sigma * w + sigma",
        GUIDE_TESTS,
    ),
    Mutant(
        "token surprisal sign",
        ANCHOR,
        "w = _normalise_rows(-logps, mask, norm)",
        "w = _normalise_rows(logps, mask, norm)",
        GUIDE_TESTS,
    ),
    Mutant(
        "token minmax low percentile",
        ANCHOR,
        "torch.quantile(vals, 0.05)",
        "torch.quantile(vals, 0.5)",
        GUIDE_TESTS,
    ),
    Mutant(
        "token minmax offset",
        ANCHOR,
        "w = (vals - lo) / (hi - lo)",
        "w = (vals - hi) / (hi - lo)",
        GUIDE_TESTS,
    ),
    Mutant("token rank denominator", ANCHOR, "/ max(1, n - 1)", "/ max(1, n)", GUIDE_TESTS),
    Mutant(
        "token zscore centre",
        ANCHOR,
        "torch.sigmoid((vals - vals.mean())",
        "torch.sigmoid((vals + vals.mean())",
        GUIDE_TESTS,
    ),
    Mutant(
        "random chosen side",
        ANCHOR,
        'torch.rand(shape, generator=generator, device="cpu") < eps',
        'torch.rand(shape, generator=generator, device="cpu") > eps',
        GUIDE_TESTS,
    ),
    Mutant(
        "branch threshold sign", ANCHOR, "torch.relu(entropy - tau)", "torch.relu(entropy + tau)", GUIDE_TESTS
    ),
    Mutant(
        "branch no relu",
        ANCHOR,
        "q = 1.0 + gamma * torch.relu(entropy - tau)",
        "q = 1.0 + gamma * (entropy - tau)",
        GUIDE_TESTS,
    ),
    Mutant(
        "branch gamma -> tau",
        ANCHOR,
        "q = 1.0 + gamma * torch.relu",
        "q = 1.0 + tau * torch.relu",
        GUIDE_TESTS,
    ),
    Mutant("guide clamp upper", ANCHOR, ".clamp(q_min, q_max)", ".clamp(q_min, q_min)", GUIDE_TESTS),
    Mutant(
        "guide mask inverted",
        ANCHOR,
        "torch.where(mask.bool(), q, torch.ones_like(q))",
        "torch.where(mask.bool(), torch.ones_like(q), q)",
        GUIDE_TESTS,
    ),
    Mutant(
        "schedule decay per step", ANCHOR, "self.decay ** self.cycle(step)", "self.decay ** step", GUIDE_TESTS
    ),
    Mutant("schedule cos -> sin", ANCHOR, "0.5 * (1.0 + math.cos(", "0.5 * (1.0 + math.sin(", GUIDE_TESTS),
    # --- estimators ---
    Mutant(
        "shaped delta sign of log q",
        ANCHOR,
        "delta = ref_logp + log_q - logp",
        "delta = ref_logp - log_q - logp",
        MATH_TESTS,
    ),
    Mutant(
        "k3 sign",
        ANCHOR,
        "return torch.exp(delta) - delta - 1.0",
        "return torch.exp(delta) + delta - 1.0",
        MATH_TESTS,
    ),
    Mutant("k2 factor", ANCHOR, "return 0.5 * delta.pow(2)", "return delta.pow(2)", MATH_TESTS),
    Mutant("k1 sign", ANCHOR, "return -delta", "return delta", MATH_TESTS),
    Mutant(
        "forward sign",
        ANCHOR,
        "torch.exp(log_u) * log_u - torch.exp(log_u) + 1.0",
        "torch.exp(log_u) * log_u + torch.exp(log_u) + 1.0",
        MATH_TESTS,
    ),
    Mutant("forward u direction", ANCHOR, "log_u = ref_logp - logp", "log_u = logp - ref_logp", MATH_TESTS),
    Mutant(
        "forward without the ratio (issue 12)",
        ANCHOR,
        "return forward_kl(logp, ref_logp) * rho",
        "return forward_kl(logp, ref_logp)",
        MATH_TESTS,
    ),
    Mutant(
        "k2 ratio with gradient",
        ANCHOR,
        'estimator="k2") * rho.detach()',
        'estimator="k2") * rho',
        MATH_TESTS,
    ),
    Mutant(
        "k3 ratio dropped",
        ANCHOR,
        "return value * rho if ratio else value",
        "return value if ratio else value",
        MATH_TESTS,
    ),
    Mutant(
        "pseudo-KL log q sign",
        ANCHOR,
        "(logp.detach() - ref_logp.detach() - log_q) * mask",
        "(logp.detach() - ref_logp.detach() + log_q) * mask",
        MATH_TESTS + PLACEMENT,
    ),
    Mutant(
        "pseudo-KL reference sign",
        ANCHOR,
        "(logp.detach() - ref_logp.detach() - log_q)",
        "(logp.detach() + ref_logp.detach() - log_q)",
        MATH_TESTS,
    ),
    Mutant(
        "guide_effect reverse rule",
        ANCHOR,
        '(estimator == "k3" and ratio)',
        '(estimator == "k3" and not ratio)',
        ("tests/rlvr/test_dapo.py::test_warning_when_a_guide_has_no_effect_in_expectation",),
    ),
    Mutant(
        "guide_effect random rule",
        ANCHOR,
        "math.isclose(q_min + q_max, 2.0)",
        "math.isclose(q_min * q_max, 2.0)",
        ("tests/rlvr/test_dapo.py::test_warning_when_a_guide_has_no_effect_in_expectation",),
    ),
    # --- trainer: where q and the estimators enter TRL's loss ---
    Mutant(
        "rollout shift sign",
        TRAINER,
        'output["ref_per_token_logps"] = ref + log_q\n',
        'output["ref_per_token_logps"] = ref - log_q\n',
        TRAINER_ORACLE,
    ),
    Mutant(
        "in-loss shift sign",
        TRAINER,
        'inputs["ref_per_token_logps"] + anchor.log_q(q)',
        'inputs["ref_per_token_logps"] - anchor.log_q(q)',
        TRAINER_ORACLE,
    ),
    Mutant(
        "branch tau from gamma",
        GUIDES,
        "signals.entropies, signals.mask, gamma=gamma, tau=tau",
        "signals.entropies, signals.mask, gamma=gamma, tau=gamma",
        TRAINER_ORACLE,
    ),
    Mutant(
        "guide q not 1 off the mask",
        GUIDES,
        "return torch.where(valid, q, torch.ones_like(q))",
        "return q",
        ("tests/rlvr/test_guide_plugins.py::test_every_guide_keeps_the_contract",),
    ),
    Mutant(
        "top-2 margin second index",
        GUIDES,
        "return top[..., 0] - top[..., 1]",
        "return top[..., 0] - top[..., 0]",
        ("tests/rlvr/test_guide_plugins.py::test_top2_margin_against_sorted_probabilities",),
    ),
    Mutant(
        "TRL label mask unshifted",
        "sage_unsloth/compat.py",
        "return keep[:, 1:][:, -logits_to_keep:]",
        "return keep[:, :-1][:, -logits_to_keep:]",
        ("tests/rlvr/test_guide_plugins.py::test_trl_label_mask_is_the_scored_positions",),
    ),
    Mutant(
        "estimator correction sign",
        TRAINER,
        "wanted - trl_term, mask",
        "wanted + trl_term, mask",
        TRAINER_ORACLE + OFF_POLICY,
    ),
    Mutant(
        "estimator correction old policy",
        TRAINER,
        "estimator=self.args.kl_estimator, old_logp=old)",
        "estimator=self.args.kl_estimator, old_logp=None)",
        OFF_POLICY,
    ),
    Mutant(
        "aggregation grpo mean",
        TRAINER,
        "mask.sum(-1).clamp(min=1.0)).mean() / accumulation",
        "mask.sum(-1).clamp(min=1.0)).sum() / accumulation",
        TRAINER_ORACLE,
    ),
    Mutant(
        "aggregation dapo rescale",
        TRAINER,
        "normalizer = normalizer * accumulation_steps / steps_per_generation",
        "normalizer = normalizer * steps_per_generation / accumulation_steps",
        OFF_POLICY,
    ),
    Mutant(
        "official dapo normaliser inverted",
        TRAINER,
        "factor = self.args.steps_per_generation / accumulation",
        "factor = accumulation / self.args.steps_per_generation",
        OFF_POLICY,
    ),
    # --- trainer: the reward placement ---
    Mutant(
        "pseudo-KL added to the reward",
        TRAINER,
        "shaped = rewards - self.sage_beta * all_seq_kl",
        "shaped = rewards + self.sage_beta * all_seq_kl",
        PLACEMENT,
    ),
    Mutant(
        "group advantage std",
        TRAINER,
        "advantages = advantages / (std + 1e-4)",
        "advantages = advantages * (std + 1e-4)",
        PLACEMENT,
    ),
    Mutant(
        "group advantage mean",
        TRAINER,
        "advantages = rewards - mean\n",
        "advantages = rewards + mean\n",
        PLACEMENT,
    ),
    # --- trainer: DAPO pieces ---
    Mutant(
        "dynamic sampling keeps flat groups",
        TRAINER,
        "spread.min(dim=1).values) == 0",
        "spread.min(dim=1).values) != 0",
        DAPO,
    ),
    Mutant(
        "rollout concat pads prompts right",
        TRAINER,
        '[extra, v] if side == "left" else [v, extra]',
        '[v, extra] if side == "left" else [v, extra]',
        DAPO,
    ),
    Mutant(
        "IS clipped fraction",
        TRAINER,
        "((ratio < low) | (ratio > high))",
        "((ratio < low) & (ratio > high))",
        DAPO,
    ),
]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _first_failure(output: str) -> str:
    """The first "FAILED <test id>" / "ERROR <test id>" line of pytest's short summary (what killed the mutant)."""
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" ", 1)[1].split(" - ")[0]
    return ""


def run_mutant(mutant: Mutant, timeout: int) -> tuple[str, float]:
    path = REPO / mutant.path
    original = path.read_text()
    if original.count(mutant.old) != 1:
        return f"BAD (pattern found {original.count(mutant.old)} times)", 0.0
    start = time.time()
    try:
        path.write_text(original.replace(mutant.old, mutant.new))
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        outcome = f"killed by {_first_failure(result.stdout)}" if result.returncode != 0 else "SURVIVED"
        if result.returncode not in (0, 1):  # 2+ = pytest could not even run: an invalid mutant, not a kill
            outcome = f"ERROR (pytest exit {result.returncode})"
    except subprocess.TimeoutExpired:
        outcome = "killed (timeout)"
    finally:
        path.write_text(original)
    return outcome, time.time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("-k", default="", help="only mutants whose name contains this")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per mutant")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if args.k.lower() in m.name.lower()]
    if args.list:
        for m in chosen:
            print(f"{m.name:42s} {m.path}: {m.old!r} -> {m.new!r}")
        return 0
    before = {p: _digest(REPO / p) for p in {m.path for m in chosen}}
    tests = sorted({t for m in chosen for t in m.tests})
    baseline = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if baseline.returncode != 0:  # a kill only means something if the unmutated code passes
        print(baseline.stdout[-3000:])
        raise SystemExit("the tests fail without any mutant: fix them first")
    results = []
    for m in chosen:
        outcome, seconds = run_mutant(m, args.timeout)
        results.append((m, outcome))
        print(f"{seconds:5.0f}s  {m.name:40s} {outcome}", flush=True)
    assert before == {p: _digest(REPO / p) for p in before}, "a mutated file was not restored"
    valid = [(m, o) for m, o in results if o.startswith(("killed", "SURVIVED"))]
    killed = sum(o.startswith("killed") for _, o in valid)
    print(
        f"kill rate: {killed}/{len(valid)} valid mutants"
        + (f" ({len(results) - len(valid)} invalid)" if len(valid) != len(results) else "")
    )
    return 0 if killed == len(valid) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
