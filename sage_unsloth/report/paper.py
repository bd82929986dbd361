"""The paper's published numbers (results/paper/*.csv) and the rule mapping our runs to the paper's rows.

Mapping rule (by name; override per run with a mapping file):
  model: the results/<model>/ folder name, lower-cased, containing "qwen2.5-math-7b" -> Qwen2.5-Math-7B
         (paper k = 256); containing "deepseek-r1-distill-qwen-7b" -> DeepSeek-R1-Distill-Qwen-7B (k = 64).
  method: the results/<model>/<run>/ folder name, lower-cased, "-", "+", " " -> "_", a trailing seed suffix
         removed (sage_unsloth/runtime/layout.py split_run: "_seed<N>", legacy "_s<N>"), then looked up in RUN_METHODS
         below. "sft" maps to the paper's
         "Base" row: for the non-instruct Qwen2.5-Math-7B the kit's RL starts from the SFT model (an
         assumption; the paper's README calls the row "Base Model"). Anything else has no paper row.
Mapping file (YAML or JSON):  runs: {"<model>/<run>" or "<run>": {model: ..., method: ...} or "<method>"}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from sage_unsloth.runtime.layout import split_run

QWEN, DEEPSEEK = "Qwen2.5-Math-7B", "DeepSeek-R1-Distill-Qwen-7B"
MODEL_PATTERNS = (("qwen2.5-math-7b", QWEN), ("deepseek-r1-distill-qwen-7b", DEEPSEEK))
PAPER_K = {QWEN: 256, DEEPSEEK: 64}
RUN_METHODS = {
    "base": "Base",
    "base_model": "Base",
    "sft": "Base",
    "grpo": "GRPO",
    "grpo_branch": "GRPO + Branch",
    "sage_branch": "GRPO + Branch",
    "grpo_sage_branch": "GRPO + Branch",
    "bnpo": "BNPO",
    "bnpo_branch": "BNPO + Branch",
    "dapo": "DAPO",
    "dapo_branch": "DAPO + Branch",
}
# Default paired comparisons, as (method A, method B): A - B is reported.
DEFAULT_METHOD_PAIRS = (
    ("GRPO + Branch", "GRPO"),
    ("BNPO + Branch", "BNPO"),
    ("DAPO + Branch", "DAPO"),
    ("GRPO", "Base"),
    ("GRPO + Branch", "Base"),
)
REPO_PAPER_DIR = Path(__file__).resolve().parents[2] / "results" / "paper"
# results/paper/*.csv: every row has ``source`` (a public address) and ``primary``: True when the number was
# traced to a primary source (the paper, or the authors' repository README, at the place ``citation`` names),
# False when it was not (``note`` starts with "untraced:" and says why). The report marks the latter beside
# the number.
UNTRACED_MARK = "†"
UNTRACED_LEGEND = (
    f"{UNTRACED_MARK} = not traced to a primary source (a partial quote attributed to the paper; "
    "results/paper/*.csv, column primary, says why)"
)


def paper_number(value: float, primary) -> str:
    """A paper value for the report, with the untraced mark when it has no primary source."""
    return f"{value:.3f}" + ("" if bool(primary) else f" {UNTRACED_MARK}")


@dataclass(frozen=True)
class PaperRow:
    model: str | None
    method: str | None

    @property
    def k(self) -> int | None:
        return PAPER_K.get(self.model)


def normalise_run_name(run: str) -> str:
    return split_run(re.sub(r"[-+\s]+", "_", run.strip().lower()), legacy=True)[0]


def paper_model(model_dir: str) -> str | None:
    lowered = model_dir.lower()
    return next((paper for pattern, paper in MODEL_PATTERNS if pattern in lowered), None)


def load_mapping(path: str | Path | None) -> dict[str, dict]:
    if not path:
        return {}
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--mapping {path}: file not found")
    data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, dict):
        raise TypeError(
            f"--mapping {path}: expected a top-level 'runs:' mapping of run -> method or {{model, method}}"
        )
    return {key: (value if isinstance(value, dict) else {"method": value}) for key, value in runs.items()}


def kl_placement(run: str, eval_manifest: dict | None, stage_folder: str | Path | None = None) -> str:
    """Where the run's RL put the pseudo-KL: "loss" (per token, the paper's) or "reward", read from the RLVR
    manifest of the checkpoint the eval stage scored (in ``stage_folder``, default the eval manifest's
    ``checkpoint``); "—" for a run without RL (SFT / base). Without a readable manifest, by name: a run name ending
    in "_reward" is the reward placement, anything else unknown ("?")."""
    from sage_unsloth.runtime.manifest import MANIFEST_NAME

    checkpoint = stage_folder or (eval_manifest or {}).get("checkpoint")
    manifest_file = Path(str(checkpoint)) / MANIFEST_NAME if checkpoint else None
    if manifest_file is not None and manifest_file.is_file():
        try:
            rlvr = json.loads(manifest_file.read_text())
        except (OSError, ValueError):
            rlvr = {}
        if rlvr.get("stage") == "rlvr":  # runs from before the field existed all used the loss placement
            return ((rlvr.get("config") or {}).get("training") or {}).get("sage_kl_placement", "loss")
        if rlvr.get("stage") == "sft":
            return "—"
    name = normalise_run_name(run)
    if name.endswith("_reward"):
        return "reward"
    return "—" if RUN_METHODS.get(name) == "Base" else "?"


def map_run(model_dir: str, run: str, mapping: dict[str, dict] | None = None) -> PaperRow:
    """The paper (model, method) a run corresponds to, by the module's documented rule."""
    mapping = mapping or {}
    override = mapping.get(f"{model_dir}/{run}") or mapping.get(run) or {}
    model = override.get("model", paper_model(model_dir))
    method = override.get("method", RUN_METHODS.get(normalise_run_name(run)))
    return PaperRow(model=model, method=method)


def load_published(paper_dir: str | Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pass@k table, reasoning-pattern table) from results/paper/."""
    paper_dir = Path(paper_dir) if paper_dir else REPO_PAPER_DIR
    passk_path, patterns_path = (
        paper_dir / "published_passk.csv",
        paper_dir / "published_reasoning_patterns.csv",
    )
    if not passk_path.is_file():
        raise FileNotFoundError(
            f"{passk_path} not found: pass --paper-dir pointing at the kit's results/paper"
        )
    passk = pd.read_csv(passk_path)
    patterns = (
        pd.read_csv(patterns_path)
        if patterns_path.is_file()
        else pd.DataFrame(columns=["model", "method", "pattern", "value", "source", "citation", "primary"])
    )
    return passk, patterns


def paper_value(published: pd.DataFrame, row: PaperRow, dataset: str, k: int) -> tuple[float, bool] | None:
    """(value, primary) of the paper's pass@k for the row, or None when the paper has no such number."""
    if row.model is None or row.method is None:
        return None
    hit = published[
        (published["model"] == row.model)
        & (published["method"] == row.method)
        & (published["dataset"] == dataset)
        & (published["k"] == k)
    ]
    if hit.empty:
        return None
    return float(hit["value"].iloc[0]), bool(hit["primary"].iloc[0])
