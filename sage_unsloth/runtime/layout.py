"""The kit's folder names, in one place: every stage and driver builds its paths with these.

::

    <outputs>/<model>/sft/                  stage 1: adapter, tokenizer, manifest.json
    <outputs>/<model>/<variant>/            stage 2: checkpoint-*/, the adapter, manifest.json
    <outputs>/<model>/eval/<run>/           stage 3: sampled completions (<benchmark>/chunk_*.jsonl.gz)
    <results>/<model>/<run>/                stage 3: passk.csv, per_problem.csv, manifest.json
    <results>/report.md, <results>/report/  stage 4

``<model>`` is :func:`sage_unsloth.model.loading.model_short_name` of the base model, ``<run>`` the evaluated run
("sft" for stage 1's model, the variant for an RLVR run). The roots default to ``outputs`` and
``outputs/results`` (relative to the working directory); each stage takes its own root as a flag. A user's
results sit inside ``outputs/``, which git ignores: the committed ``results/`` holds only reference numbers
(``results/paper``, the paper's; ``results/demo-reference``, the demo's reference run).

A run trained or evaluated at a seed is named ``<method>_seed<N>`` (:func:`run_name`; read back by
:func:`split_run`) by every driver: the sweep, the demo lab and the report's colours and paper rows.

Names that become one folder (a run or variant, a model's short name, a benchmark, a sweep, a lab method) are
checked by :func:`check_name` before anything is written: one path component of letters, digits and
``. _ - + =``, starting with a letter or digit, at most 128 characters, portable to every file system the kit's
outputs are copied to: no trailing dot (Windows drops it) and none of the device names Windows reserves (``CON``,
``PRN``, ``AUX``, ``NUL``, ``COM1``-``COM9``, ``LPT1``-``LPT9``, in any case, with or without an extension). So
``../x``, ``/abs``, ``a/b``, ``run.``, ``CON`` and shell metacharacters (spaces, quotes, ``; | & $ * ?``) are
refused with one line, and every folder stays inside the root it was given.
"""

from __future__ import annotations

import re
from pathlib import Path

OUTPUTS = "outputs"
RESULTS = "outputs/results"  # a user's results: inside outputs/, never beside the committed references
REFERENCE_RESULTS = "results"  # committed: paper/ and demo-reference/ only
WORKDIR_RESULTS = "results"  # a notebook's results folder inside its own scratch workdir
SFT_RUN = "sft"  # stage 1's folder name, and the run name its evaluation is reported under
EVAL = "eval"
REPORT_MD = "report.md"
REPORT_DIR = "report"
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]{0,127}")
FOLDER_NAME_RULE = (
    "letters, digits and . _ - + =, starting with a letter or digit, not ending with '.', at most 128 "
    "characters, not a device name Windows reserves (CON, PRN, AUX, NUL, COM1-9, LPT1-9)"
)
RESERVED_NAMES = frozenset(
    ["CON", "PRN", "AUX", "NUL", *(f"{port}{i}" for port in ("COM", "LPT") for i in range(1, 10))]
)


SEED_SUFFIX = "_seed"
_RUN = re.compile(r"^(?P<method>.+)_seed(?P<seed>\d+)$")
# Legacy, read only: sweeps before the one convention named runs <config>_s<N>, and -seed<N> was accepted too.
_LEGACY_RUN = re.compile(r"^(?P<method>.+?)(?:_s|-seed)(?P<seed>\d+)$")


def run_name(method: str, seed: int | None) -> str:
    """The folder name of ``method`` trained (or evaluated) at ``seed``: ``<method>_seed<N>``; the method
    alone without a seed."""
    return method if seed is None else f"{method}{SEED_SUFFIX}{seed}"


def split_run(run: str, *, legacy: bool = False) -> tuple[str, int | None]:
    """(method, seed) of a run name, the inverse of :func:`run_name`: ("grpo", 1) for "grpo_seed1", ("sft", None)
    for "sft". ``legacy``: also read the names folders had before (``grpo_s1``, ``grpo-seed1``), for a report
    over old results; the kit writes none of them."""
    match = _RUN.match(run) or (_LEGACY_RUN.match(run) if legacy else None)
    return (match["method"], int(match["seed"])) if match else (run, None)


def is_folder_name(text: str) -> bool:
    """Whether ``text`` can name one folder on every file system (module docstring)."""
    return (
        FOLDER_NAME.fullmatch(text) is not None
        and not text.endswith(".")
        and text.split(".")[0].upper() not in RESERVED_NAMES
    )


def check_name(value: object, field: str, example: str = "grpo_seed1") -> str:
    """``value`` when it can name one folder (:data:`FOLDER_NAME`), else ValueError naming ``field`` and the
    rule, in one line."""
    text = str(value)
    if not is_folder_name(text):
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ValueError(
            f"{field}={shown!r} cannot name a folder: use one name of {FOLDER_NAME_RULE} (no '/', no '..'), "
            f"e.g. {example}"
        )
    return text


def sft_dir(outputs: str | Path, model: str) -> Path:
    """Stage 1's output folder."""
    return Path(outputs) / model / SFT_RUN


def rlvr_dir(outputs: str | Path, model: str, variant: str) -> Path:
    """Stage 2's output folder for one variant (e.g. grpo_branch, grpo_seed1)."""
    return Path(outputs) / model / variant


def run_dir(outputs: str | Path, model: str, run: str) -> Path:
    """The stage folder of an evaluated run: stage 1's for "sft", stage 2's for a variant."""
    return sft_dir(outputs, model) if run == SFT_RUN else rlvr_dir(outputs, model, run)


def completions_dir(outputs: str | Path, model: str, run: str) -> Path:
    """Stage 3's sampled completions of one run."""
    return Path(outputs) / model / EVAL / run


def results_dir(results: str | Path, model: str, run: str) -> Path:
    """Stage 3's pass@k tables of one run."""
    return Path(results) / model / run


def report_md(results: str | Path) -> Path:
    return Path(results) / REPORT_MD


def report_dir(results: str | Path) -> Path:
    return Path(results) / REPORT_DIR
