"""Every metric the kit logs is documented: docs/stages.md's metrics table has a row for each key that the kit
puts into TRL's logs. Three ways a key is found, so a new one cannot slip past:

- in the source: every literal key written to ``compat.metrics(...)`` / a ``log[...]`` list or returned in a
  policy term's ``metrics={...}`` (covers paths a CPU run cannot take, e.g. the vLLM importance ratio);
- at run time: every key the kit's code reads or writes through ``compat.metrics`` during tiny RLVR runs that
  fire the logging paths (a guide in the loss, the reward placement, DAPO's dynamic sampling and overlong
  reward, a policy term);
- in the runs' log_history.jsonl: every key that is not one of TRL's own.

Checked by breaking on purpose: a new ``log["sage/q_new"].append(...)`` in trainer.py fails the source test;
deleting the ``sage/later_boosted`` row fails all three; a key added through ``self.log`` in a callback would
fail the log_history test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "stages.md"
TABLE_MARK = "<!-- metrics table"
# TRL 1.15's own keys (its GRPOTrainer and transformers' Trainer); the kit's reward functions' keys are not
# here (rewards/<name>/... is named by the kit), nor are TRL keys whose value the kit replaces (kl).
TRL_OWN = re.compile(
    r"^(loss|grad_norm|learning_rate|epoch|step|num_tokens|reward|reward_std|frac_reward_zero_std|entropy|kl"
    r"|step_time|total_flos|train_loss|train_runtime|train_samples_per_second|train_steps_per_second"
    r"|completions/[a-z_]+|clip_ratio/[a-z_]+|sampling/importance_sampling_ratio/(min|mean|max))$"
)


def documented_keys() -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    assert TABLE_MARK in text, f"{DOC}: the metrics table (after '{TABLE_MARK}') is missing"
    table = text.split(TABLE_MARK, 1)[1].split("\n\n", 1)[0]
    keys = set()
    for line in table.splitlines():
        match = re.match(r"\| `([^`]+)` \|(.+)\|(.+)\|(.+)\|$", line)
        if not match:
            continue
        what, value_range = match[2].strip(), match[3].strip()
        assert what and value_range, f"{line}: say what the metric is and its range"
        key = match[1]
        alternatives = re.match(r"^(.*)\{([^}]+)\}(.*)$", key)
        if alternatives:
            keys |= {f"{alternatives[1]}{a.strip()}{alternatives[3]}" for a in alternatives[2].split(",")}
        else:
            keys.add(key)
    assert keys, f"{DOC}: no metric rows under the table mark"
    return keys


LITERAL_WRITES = (
    re.compile(r"""metrics\([^)]*\)\s*\[\s*["']([^"']+)["']\s*\]"""),
    re.compile(r"""\b(?:log|metrics|kl_log)\s*\[\s*["']([^"']+)["']\s*\]"""),
)
TERM_METRICS = re.compile(r"metrics\s*=\s*\{(.*?)\}", re.DOTALL)
DICT_KEY = re.compile(r"""["']([^"']+)["']\s*:""")


def source_keys() -> dict[str, str]:
    """{key: file} for every literal metric key in the kit's source."""
    found = {}
    for path in sorted((REPO / "sage_unsloth").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "compat.metrics(" not in text and "TermOutput(" not in text and "_metrics[" not in text:
            continue
        for pattern in LITERAL_WRITES:
            for key in pattern.findall(text):
                found[key] = str(path.relative_to(REPO))
        for block in TERM_METRICS.findall(text):
            for key in DICT_KEY.findall(block):
                found[key] = str(path.relative_to(REPO))
    return found


def test_the_metrics_table_parses_and_covers_the_q_split():
    keys = documented_keys()
    assert {"sage/first_boosted", "sage/later_boosted", "sage/q_first_mean", "sage/q_clipped_frac"} <= keys
    assert {"dynamic_sampling/rounds", "rewards/correctness/mean", "rewards/correctness/std"} <= keys


def test_every_metric_key_in_the_source_is_documented():
    found = source_keys()
    assert {"sage/q_mean", "kl_cov/frac_penalised", "dynamic_sampling/rounds"} <= set(found)  # the scan works
    missing = {k: f for k, f in found.items() if k not in documented_keys()}
    assert not missing, f"document these in {DOC.relative_to(REPO)}'s metrics table: {missing}"


# The logging paths a CPU run can take, one step each: a guide in the loss with DAPO's dynamic sampling and
# overlong reward; the reward placement; a policy term (its metrics go through one loop for every term).
RUNS = ("dapo_full_branch", "grpo_branch_reward", "grpo_kl_cov")


@pytest.fixture(scope="module")
def logged(sft_dir, dapo_sample, tmp_path_factory):
    """(keys the kit touched through compat.metrics, keys in the runs' log_history.jsonl)."""
    from rlvr_scenario import rlvr_argv, text_reward

    from sage_unsloth import compat
    from sage_unsloth.rlvr import reward
    from sage_unsloth.rlvr.run import main
    from sage_unsloth.runtime.training_log import read_log_history

    touched: set[str] = set()
    original = compat.metrics

    class Recording:
        def __init__(self, inner):
            self._inner = inner

        def __getitem__(self, key):
            touched.add(key)
            return self._inner[key]

        def __getattr__(self, name):
            return getattr(self._inner, name)

    in_logs: set[str] = set()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reward, "correctness_reward", text_reward)
        patch.setattr(compat, "metrics", lambda trainer, mode: Recording(original(trainer, mode)))
        for variant in RUNS:
            root = tmp_path_factory.mktemp(variant)
            argv = rlvr_argv(variant, sft_dir, root, dapo_sample, "--max_steps", "1", "--save_strategy", "no")
            assert main(argv) == 0
            (out,) = [p.parent for p in root.rglob("manifest.json")]
            for entry in read_log_history(out):
                in_logs |= set(entry)
    return touched, in_logs


@pytest.mark.slow
def test_every_key_a_tiny_run_logs_through_the_kit_is_documented(logged):
    touched, _ = logged
    # every path fired: the q statistics, the reward placement, dynamic sampling, a policy term
    assert {
        "sage/later_boosted",
        "sage/kl_in_reward",
        "dynamic_sampling/rounds",
        "kl_cov/penalty_mean",
    } <= touched
    missing = sorted(touched - documented_keys())
    assert not missing, f"document these in {DOC.relative_to(REPO)}'s metrics table: {missing}"


@pytest.mark.slow
def test_every_key_in_the_log_history_is_trls_own_or_documented(logged):
    _, in_logs = logged
    assert "rewards/soft_overlong_punishment_reward/mean" in in_logs  # the DAPO run's added reward
    missing = sorted(k for k in in_logs if not TRL_OWN.match(k) and k not in documented_keys())
    assert not missing, f"document these in {DOC.relative_to(REPO)}'s metrics table: {missing}"
