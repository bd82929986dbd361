"""The whole recipe offline on CPU: ``python -m sage_unsloth.demo [--quick] [--seeds 0-2] [--fresh]``.

Steps (each a subprocess; stages 1-4 are the kit's own entry points with the configs in configs/demo/):

- ``model``: the random tiny Qwen2 (sage_unsloth.demo.model), pre-trained on worked problems and
  addition facts (sage_unsloth.demo.pretrain); ``data``: the SFT / RL / eval files (sage_unsloth.demo.data);
- ``sft``: stage 1, LoRA SFT on the five plans at 74/9/5/3/9 (data.DEFAULT_MIX; ``--mix`` to change);
- ``<method>_seed<s>``: stage 2 for every chosen method (``--methods``: :data:`DEFAULT_METHODS` by default,
  ``all`` for every method of :data:`METHODS`, or config files anywhere: ``--methods default,path/to/mine.yaml``;
  ``--grid`` adds knob settings of a method) and training seed (``--seeds 0-2``, ``0,5``, or a count ``3``),
  all from the same SFT adapter with the same budget;
- ``eval_<run>``: stage 3 on the held-out demo problems, ``eval_n`` samples each, with the evaluation's
  sampling seed = the run's training seed; SFT is evaluated once per training seed as ``sft_seed<s>`` (so a
  seed's SFT and RL runs are paired and each seed has its own evaluation noise). The lab reports pass@k up
  to k = ``kmax`` (default eval_n / 4; eval_n >= 4 x kmax is required);
- ``analysis``: plan frequencies per run and the branch point's entropy and q (sage_unsloth.demo.analysis);
- ``report``: stage 4 (pass@k tables, paired differences, support against SFT, plots);
- ``lab``: the comparison across seeds and problems, the comparison with the committed reference run
  (results/demo-reference/), appended to report.md (sage_unsloth.demo.lab).

Independent steps run in parallel (``--jobs``, default: the usable cores). A rerun reuses every step whose
inputs did not change (sage_unsloth/jobs: the one job graph of the kit, fingerprinted stamps); ``--fresh`` deletes this run's
work and results folders first. Timings per step (wall and CPU seconds) go to ``<results>/timings.csv``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ..config.args import config_files, merge_over_base, read_config_file
from ..config.field_rules import PLUGIN_NODES, node_mapping, node_name
from ..config.method_cards import LAB_KEY, MethodCard, demo_cards, demo_configs, read_card, role_holder
from ..jobs import STAMP_DIR, Step, StepRecord, run_steps
from ..jobs.cores import usable_cores
from ..jobs.recipe import stage_command
from ..report.compare import split_run
from ..runtime import layout
from ..runtime.folder_lock import LOCK_NAME, FolderLock
from ..runtime.layout import SFT_RUN
from ..runtime.manifest import atomic_write_json, atomic_write_text
from .data import EVAL_FILE, RL_FILE, SFT_FILE, DemoDataSpec
from .pretrain import committed_base

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = demo_configs()  # configs/demo (SAGE_UNSLOTH_DEMO_CONFIGS: a folder of one's own)
MODEL_NAME = "demo-tiny"
DEMO_BENCHMARK = "demo"
REFERENCE_DIR = REPO_ROOT / "results" / "demo-reference"
# the committed labs that define each draw's regime: a lab compares every run with those made from its draw
REFERENCE_LABS = (REFERENCE_DIR, REPO_ROOT / "results" / "demo-frontier")
METHODS_DIR = "methods"  # <work>/methods/<name>.yaml: the resolved config of a method from a file or a --grid
KIT_BASE_PREFIX = "demo:"  # in a method file outside the kit, base: demo:<file> names configs/demo/<file>
MANIFEST_FILE = "demo_budget.json"  # the results folder's manifest (budget, seeds, n, kmax, methods, commit)


@dataclass(frozen=True)
class Method:
    """One RL method of the lab: a run folder name, its config, a label for tables, the methods it is compared
    with.

    A kit method is a file of configs/demo/ with a ``lab:`` block (sage_unsloth/config/method_cards.py: its label,
    colour, place, pairs and sets). A method from a config file elsewhere (``--methods path/to/mine.yaml``:
    ``source``; its own ``lab:`` block gives its label and pairs) or a knob setting of another method (``--grid``:
    ``overrides`` on top of its config) is written, resolved, to ``<work>/methods/<name>.yaml`` first
    (:func:`materialise`)."""

    name: str
    label: str
    # a YAML outside the kit's methods (absolute path); None: <CONFIG_DIR>/<name>.yaml
    source: str | None = None
    base_method: str | None = None  # --grid: the kit method whose config the overrides apply to
    overrides: tuple[tuple[str, Any], ...] = ()  # --grid: stage-2 keys and values set on top
    compare_with: tuple[tuple[str, float], ...] | None = (
        None  # (B, place) of its pairs; None: SFT, the control
    )

    @property
    def config(self) -> str:
        return f"{self.name}.yaml"

    @property
    def builtin(self) -> bool:
        return self.source is None and not self.overrides

    def config_path(self, work: Path) -> Path:
        """The YAML stage 2 reads for this method."""
        return CONFIG_DIR / self.config if self.builtin else Path(work) / METHODS_DIR / self.config


def method_of_card(card: MethodCard, **fields) -> Method:
    return Method(card.name, card.label, compare_with=card.compare_with, **fields)


# Adding a method = one config with a lab: block in configs/demo/ (then `--methods all` or `--methods a,b` runs it).
METHODS = tuple(method_of_card(card) for card in demo_cards())
METHOD_BY_NAME = {m.name: m for m in METHODS}
CONTROL = role_holder("control").name  # compared with every method that names no pairs of its own
BRANCH_CONFIG = CONFIG_DIR / f"{role_holder('branch').name}.yaml"  # whose tau and gamma the analysis measures
GRID_EXAMPLES = f"{CONTROL}:beta=0.2,0.5 or {BRANCH_CONFIG.stem}:tau=0.3,0.5;q_max=2,3"


def method_set(name: str) -> tuple[str, ...]:
    """The kit methods whose card lists the set ``name`` (``sets: [default]``), in the lab's order."""
    return tuple(c.name for c in demo_cards() if name in c.sets)


# The default `make demo` (one seed; under 10 minutes on an idle 2-core machine); the full lab runs them all.
DEFAULT_METHODS = method_set("default")
GROUPS = {"all": tuple(METHOD_BY_NAME), **{s: method_set(s) for c in demo_cards() for s in c.sets}}


def method_pairs(methods) -> list[tuple[str, str]]:
    """The A - B pairs of ``methods`` (:class:`Method`, in the lab's order): each method's ``compare_with``
    in the places its card gives, then the unplaced ones in method order; a method without pairs of its own (a
    new baseline, a file without a lab: block, a --grid cell) is compared with SFT and with the control."""
    placed = []
    for position, method in enumerate(methods):
        pairs = method.compare_with
        if pairs is None:
            pairs = tuple((b, math.inf) for b in (SFT_RUN, CONTROL) if b != method.name)
        placed += [(place, position, i, method.name, b) for i, (b, place) in enumerate(pairs)]
    return [(a, b) for *_, a, b in sorted(placed)]


def _is_config_path(item: str) -> bool:
    return item.endswith((".yaml", ".yml")) or "/" in item


def file_method(path: Path) -> Method:
    """The method of a YAML config outside the kit, named by the file's stem; its ``lab:`` block, if it has one,
    gives its label and pairs (sage_unsloth/config/method_cards.py)."""
    card = read_card(path)
    if card is None:
        return Method(path.stem, path.stem, source=str(path))
    return method_of_card(card, source=str(path))


def parse_methods(spec: str) -> tuple[tuple[str, ...], tuple[Method, ...]]:
    """``--methods``: items separated by commas, each 'all', the name of a method set (GROUPS: the sets the
    method files' cards list, e.g. 'default', 'baselines'), a name from METHODS, or the path of a YAML config
    anywhere (the method is named by the file's stem). Returns (names: the built-ins in METHODS order, then the
    files in the order given; the methods from files)."""
    items = [n.strip() for n in spec.split(",") if n.strip()]
    builtin: set[str] = set()
    files: list[Method] = []
    unknown = []
    for item in items:
        if item in GROUPS:
            builtin.update(GROUPS[item])
        elif item in METHOD_BY_NAME:
            builtin.add(item)
        elif _is_config_path(item):
            path = Path(item).expanduser().resolve()
            if not path.is_file():
                raise ValueError(f"--methods: no config file {item!r} ({path}): give the path of a YAML file")
            files.append(file_method(path))
        else:
            unknown.append(item)
    if unknown or not items:
        from ..config.args import suggestion

        hint = suggestion(unknown[0], [*GROUPS, *METHOD_BY_NAME]) if unknown else ""
        raise ValueError(
            f"--methods: unknown {unknown or spec!r}{hint}; use {', '.join(repr(g) for g in GROUPS)}, names "
            f"from {', '.join(METHOD_BY_NAME)} or paths of YAML configs (docs/lab.md, 'A method of your own')"
        )
    names = tuple(m.name for m in METHODS if m.name in builtin)
    check_new_methods(files, taken=names)
    return names + tuple(m.name for m in files), tuple(files)


def select_methods(spec: str) -> tuple[str, ...]:
    """The method names ``--methods`` selects (see :func:`parse_methods`)."""
    return parse_methods(spec)[0]


def check_new_methods(methods, *, taken) -> None:
    """Names of methods from files or a --grid: usable as run folder names, and each used once."""
    seen = set(taken)
    for method in methods:
        where = method.source or method.base_method
        if not layout.is_folder_name(method.name) or method.name == SFT_RUN:
            raise ValueError(
                f"--methods {where}: {method.name!r} cannot name a method (letters, digits and _ . + = -, "
                "not 'sft'): rename the file"
            )
        if method.name in METHOD_BY_NAME or method.name in seen:
            raise ValueError(
                f"--methods {where}: the method name {method.name!r} (the file's stem) is taken by "
                f"{'a built-in method' if method.name in METHOD_BY_NAME else 'another method'}: rename the file"
            )
        seen.add(method.name)


# --grid key names: the short names of the guide's knobs (their runs' rows show them under these names); any
# other key is a stage-2 field, or ``node.key`` a plug-in node's argument (``policy_term.ratio``)
GRID_KEYS = {"tau": "guide.tau", "gamma": "guide.gamma", "q_max": "guide.q_max", "q_min": "guide.q_min"}


def parse_grid(spec: str, files: tuple[Method, ...] = ()) -> tuple[Method, ...]:
    """``--grid METHOD:key=v1,v2;key2=v3,...``: one method per combination of the values, each METHOD's config
    (a name from METHODS or a YAML path) with those stage-2 keys set (tau, gamma, q_max, q_min stand for the guide
    node's, guide.tau, ...; ``node.key`` sets a plug-in node's argument). Named ``METHOD-key<v>-key2<v>``, e.g.
    ``<method>-tau0.3-gamma2``."""
    target, sep, body = spec.partition(":")
    target = target.strip()
    hint = f"write METHOD:key=v1,v2;key2=v3, e.g. {GRID_EXAMPLES}"
    if not sep or not target or not body.strip():
        raise ValueError(f"--grid {spec!r}: {hint}")
    if target in METHOD_BY_NAME:
        base = {"base_method": target}
        base_name, base_label = target, METHOD_BY_NAME[target].label
    elif _is_config_path(target):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"--grid {spec!r}: no config file {target!r} ({path})")
        base = {"source": str(path)}
        base_name = base_label = path.stem
    else:
        from ..config.args import suggestion

        raise ValueError(
            f"--grid {spec!r}: {target!r} is neither a method of METHODS nor a YAML path"
            f"{suggestion(target, METHOD_BY_NAME)}; {hint}"
        )
    axes = []
    for part in body.split(";"):
        key, eq, values = part.partition("=")
        key = key.strip()
        values = [v.strip() for v in values.split(",") if v.strip()]
        if not eq or not key or not values or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)?", key):
            raise ValueError(f"--grid {spec!r}: {part.strip()!r} is not key=v1,v2; {hint}")
        if any(axis[0][1] == GRID_KEYS.get(key, key) for axis in axes):
            raise ValueError(f"--grid {spec!r}: {key} is given twice; list its values once, key=v1,v2")
        axes.append([(key, GRID_KEYS.get(key, key), v) for v in values])
    methods = []
    for combo in itertools.product(*axes):
        tag = "-".join(re.sub(r"[^A-Za-z0-9_.+=]", "_", f"{short}{raw}") for short, _, raw in combo)
        methods.append(
            Method(
                f"{base_name}-{tag}",
                f"{base_label} ({', '.join(f'{short} {raw}' for short, _, raw in combo)})",
                overrides=tuple((full, yaml.safe_load(raw)) for _, full, raw in combo),
                **base,
            )
        )
    return tuple(methods)


def parse_seeds(spec: str) -> tuple[int, ...]:
    """``--seeds``: a count (``3``: seeds 0, 1, 2, the old form), a list (``0,1,2``), a range (``10-19``), or
    lists of both (``0-2,7``); returned sorted. One seed s > 0 alone: ``s-s`` or ``s,``."""
    text = spec.strip()
    if re.fullmatch(r"\d+", text):
        return tuple(range(int(text)))
    seeds: list[int] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        span = re.fullmatch(r"(\d+)\s*-\s*(\d+)", item)
        if span and int(span[1]) <= int(span[2]):
            seeds += range(int(span[1]), int(span[2]) + 1)
        elif item.isdigit():
            seeds.append(int(item))
        else:
            raise ValueError(
                f"--seeds {spec!r}: write a count (3: seeds 0-2), a list (0,1,2) or a range (10-19), "
                "seeds >= 0, a range's first seed <= its last"
            )
    duplicates = sorted({s for s in seeds if seeds.count(s) > 1})
    if duplicates or not seeds or max(seeds) >= 2**32:
        raise ValueError(
            f"--seeds {spec!r}: "
            + (f"seed(s) {duplicates} listed twice" if duplicates else "seeds must be in [0, 2**32)")
            + ": list each seed once"
        )
    return tuple(sorted(seeds))


def parse_mix(spec: str) -> tuple[tuple[str, float], ...]:
    """``--mix left=0.8,right=0.08,...``: the SFT plan prior (DemoDataSpec checks the names and the sum)."""
    try:
        pairs = [item.split("=") for item in spec.split(",")]
        return tuple((name.strip(), float(share)) for name, share in pairs)
    except ValueError:
        raise ValueError(
            f"--mix {spec!r}: write plan=share pairs separated by commas, e.g. left=0.8,..."
        ) from None


# The demo code each step runs (its fingerprint hashes these and the kit's top-level modules): editing the
# runner or the report reruns what depends on it, not the pre-training.
DATA_CODE = ("demo/data.py", "demo/task.py")
PRETRAIN_CODE = (*DATA_CODE, "demo/pretrain.py", "demo/model.py")
ANALYSIS_CODE = ("demo/analysis.py", "demo/strategies.py", "demo/task.py", "eval/sampling.py")
LAB_CODE = (
    "demo/lab.py",
    "demo/strategies.py",
    "demo/analysis.py",
    "demo/task.py",
    "demo/dose_response.py",
    "report",
)


@dataclass(frozen=True)
class DemoBudget:
    """What one lab spends: the steps of each stage, the evaluation's problems and samples, the seeds, methods,
    data and draw (written to the results folder's demo_budget.json)."""

    pretrain_steps: int = 600  # the base's pre-training, when it is not copied (sage_unsloth/demo/bases/)
    sft_steps: int = 300  # stage 1
    rl_steps: int = 150  # stage 2, every method and seed
    eval_problems: int = 100  # stage 3: held-out problems ...
    eval_n: int = 64  # ... and samples per problem
    kmax: int = 16  # the largest k the lab reports: eval_n >= 4 x kmax (--kmax; default eval_n / 4)
    seeds: tuple[int, ...] = (0,)  # RL training seeds (each run's evaluation is sampled with its seed)
    methods: tuple[str, ...] = DEFAULT_METHODS  # RL methods (names from METHODS or of `extra`)
    data: DemoDataSpec = field(default_factory=DemoDataSpec)
    bootstrap_resamples: int = 2000
    extra: tuple[Method, ...] = ()  # methods from config files (--methods PATH.yaml) and --grid cells
    # the pre-training + SFT draw: the base's seed and SFT's seed (sage_unsloth/demo/bases/draw<D> when committed)
    draw: int = 0
    pretrain: bool = False  # pre-train the base here even where a committed one exists (--pretrain)


FULL = DemoBudget()
QUICK = DemoBudget(  # the smoke run: a few steps of every stage, and every method
    pretrain_steps=20,
    sft_steps=4,
    rl_steps=2,
    eval_problems=6,  # 6 problems x 8 samples: pass@k up to k = 2
    eval_n=8,
    kmax=2,
    methods=tuple(m.name for m in METHODS),  # test_demo.py: default ones end to end, every file a step
    data=DemoDataSpec(n_eval=6, n_rl=32, n_sft=200),
    bootstrap_resamples=200,
)


def sft_run(seed: int) -> str:
    """The run name of SFT's evaluation for training seed ``seed`` (sampled with that seed)."""
    return layout.run_name(SFT_RUN, seed)


def run_names(budget: DemoBudget) -> list[str]:
    """Every evaluated run: SFT once per training seed, then each method at each seed."""
    return [sft_run(s) for s in budget.seeds] + [
        layout.run_name(m, s) for m in budget.methods for s in budget.seeds
    ]


def lab_methods(budget: DemoBudget) -> list[Method]:
    """The budget's methods: the kit's, then those from files and --grid cells (a name neither knows is a
    method without a card: labelled by its name, compared with SFT and the control)."""
    extra = {m.name: m for m in budget.extra}
    return [METHOD_BY_NAME.get(name) or extra.get(name) or Method(name, name) for name in budget.methods]


def lab_pairs(budget: DemoBudget) -> list[tuple[str, str]]:
    """The pairs of the lab's methods (:func:`method_pairs`) whose two sides both ran."""
    ran = {SFT_RUN, *budget.methods}
    return [(a, b) for a, b in method_pairs(lab_methods(budget)) if a in ran and b in ran]


# --------------------------------------------------------------------------------- methods from files
def _kit_base(path: Path, base) -> Path:
    """Where ``base:`` of the method file at ``path`` points: ``demo:<file>`` is configs/demo/<file>, an
    absolute path is itself, anything else is relative to the file's folder (the kit's rule)."""
    text = str(base)
    if text.startswith(KIT_BASE_PREFIX):
        target = CONFIG_DIR / text[len(KIT_BASE_PREFIX) :]
    else:
        target = Path(text).expanduser()
        target = target if target.is_absolute() else path.parent / target
    if not target.is_file():
        raise ValueError(
            f"{path}: base: {text} not found ({target}): give a path relative to the file's folder, an "
            f"absolute path, or {KIT_BASE_PREFIX}<file> for the kit's configs/demo/<file> (e.g. "
            f"{KIT_BASE_PREFIX}{config_files(CONFIG_DIR / f'{CONTROL}.yaml')[-1].name})"
        )
    return target


def _plugin_path(path: Path, node) -> tuple[Any, list[Path]]:
    """A plug-in node of the YAML at ``path`` whose name is ``file.py:fn``: the file relative to the YAML's folder
    (else to the project, where the stages run), made absolute so that stage 2 finds it from any working
    directory; returned with the file."""
    guide = node_name(node)
    if not isinstance(guide, str) or ":" not in guide:
        return node, []
    resolved, files = _guide_path(path, guide)
    return ({**node_mapping(node), "name": resolved} if files else node), files


def _guide_path(path: Path, guide: str) -> tuple[str, list[Path]]:
    """``file.py:fn`` named in the YAML at ``path``, absolute (see :func:`_plugin_path`)."""
    module, _, fn = guide.partition(":")
    if not (module.endswith(".py") or "/" in module):
        return guide, []  # package.module:function, importable
    file = Path(module).expanduser()
    for candidate in [file] if file.is_absolute() else [path.parent / file, REPO_ROOT / file]:
        if candidate.is_file():
            return f"{candidate.resolve()}:{fn}", [candidate.resolve()]
    raise ValueError(
        f"{path}: {guide}: no file {module!r} next to the YAML ({path.parent / file}): give the plug-in's path "
        "relative to the YAML's folder"
    )


def resolve_method_config(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict, list[Path]]:
    """(the merged stage-2 mapping, every file it read) of a method's YAML: its ``base:`` chain merged as the
    kit merges it (this file's keys win; ``env`` merged key by key), ``base:`` and the plug-in nodes' file paths
    resolved as :func:`_kit_base` and :func:`_plugin_path` say."""
    path = Path(path)
    data = read_config_file(path, chain)  # its errors are ValueErrors (ConfigError): the runner's exit 2
    data.pop(LAB_KEY, None)  # the lab's card, no stage's key
    base = data.pop("base", None)
    files = [path]
    for name in PLUGIN_NODES:
        if name in data:
            data[name], plugin_files = _plugin_path(path, data[name])
            files += plugin_files
    if base is None:
        return data, files
    merged, base_files = resolve_method_config(_kit_base(path, base), (*chain, path.resolve()))
    return merge_over_base(merged, data), files + base_files


def materialise(method: Method, work: Path) -> tuple[Path, tuple[Path, ...]]:
    """(the config stage 2 reads for ``method``, the files it depends on: what its step's fingerprint hashes).
    A built-in method's is configs/demo/<name>.yaml; any other's is written resolved (no base:, absolute guide
    path, variant = its name) to ``<work>/methods/<name>.yaml``."""
    if method.builtin:
        path = CONFIG_DIR / method.config
        return path, config_files(path)
    source = Path(method.source) if method.source else CONFIG_DIR / f"{method.base_method}.yaml"
    data, files = resolve_method_config(source)
    for key, value in method.overrides:
        node, dot, arg = key.partition(".")
        if dot:  # a plug-in node's argument: the node's other keys stay
            data[node] = {**node_mapping(data.get(node, "none")), arg: value}
        else:
            data[key] = value
    data["variant"] = method.name
    target = method.config_path(work)
    set_keys = "".join(f", {k}: {v}" for k, v in method.overrides)
    header = (
        f"# {method.name}: written by sage_unsloth.demo.run from {_rel(source)}{set_keys} (base: chain merged, "
        "guide path resolved); edit the source, not this file\n"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, header + yaml.safe_dump(data, sort_keys=False))
    return target, (target, *dict.fromkeys(f.resolve() for f in files))


def check_stage2_configs(paths: list[str]) -> int:
    """Parse each config as stage 2 will (``python -m sage_unsloth.demo.run --check-configs ...``): the first
    bad one is one line on stderr and exit 2, before the lab trains anything."""
    from ..rlvr.run import parse_args as rlvr_args

    for path in paths:
        try:
            rlvr_args([path])
        except (ValueError, FileNotFoundError) as exc:
            print(f"error: {Path(path).stem} ({path}): {str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
    return 0


def preflight(budget: DemoBudget, work: Path) -> None:
    """Write the configs of the methods from files and --grid cells, and have stage 2's parser check them (one
    subprocess, only when there are such methods): a bad key is a ValueError now, not a failed step later."""
    paths = [materialise(m, work)[0] for m in lab_methods(budget) if not m.builtin]
    if not paths:
        return
    check = subprocess.run(
        [python(), "-m", "sage_unsloth.demo.run", "--check-configs", *map(str, paths)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        lines = (check.stderr or check.stdout).strip().splitlines()
        errors = [line for line in lines if line.startswith("error:")]
        line = (errors or lines or [f"stage 2 refused a config (exit {check.returncode})"])[-1]
        raise ValueError(line.removeprefix("error: "))


def _rel(path: Path) -> str:
    """Paths on command lines relative to the project (the stages run there), so that manifests and the
    report show project paths, not this machine's."""
    try:
        return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(Path(path).resolve())


def python() -> str:
    return sys.executable


def step_env(threads: int) -> dict[str, str]:
    """What every step of the lab runs with over this process's environment: its torch threads, offline hubs."""
    import os

    return {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "SAGE_DEMO_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "UNSLOTH_SKIP_TORCHVISION_CHECK": "1",
        "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }


def data_command(spec: dict[str, Any], out: str | Path, *, python: str | None = None) -> list[str]:
    """The data step's command: write the demo's data files for ``spec`` (a :class:`DemoDataSpec` as a dict) to
    ``out``. Deterministic: the same spec writes the same bytes, so scripts/pilot_lab_work.py rebuilds a committed
    pilot's data with it."""
    spec_json = json.dumps(spec, sort_keys=True)
    return [python or sys.executable, "-m", "sage_unsloth.demo.data", "--out", str(out), "--spec", spec_json]


@dataclass(frozen=True)
class LabFolders:
    """Where one lab's steps read and write: its work and results folders and what lies in them."""

    work: Path
    results: Path

    @property
    def data(self) -> Path:
        return self.work / "data"

    @property
    def model(self) -> Path:
        return self.work / "model" / MODEL_NAME

    @property
    def sft(self) -> Path:
        return layout.sft_dir(self.work, MODEL_NAME)  # the demo's outputs root is its work folder


def model_step(budget: DemoBudget, folders: LabFolders) -> Step:
    """The base model: this draw's committed base copied (every machine starts from the same weights), or
    pre-trained here (``--pretrain``, or no committed base for this budget)."""
    py, spec, out = python(), budget.data, _rel(folders.model)
    base = None if budget.pretrain else committed_base(budget.draw, steps=budget.pretrain_steps, spec=spec)
    if base is not None:
        argv = [py, "-m", "sage_unsloth.demo.pretrain", "--from", _rel(base), "--out", out]
        own = {"configs": tuple(sorted(base.iterdir())), "label": f"the committed base of draw {budget.draw}"}
    else:
        argv = [py, "-m", "sage_unsloth.demo.pretrain", "--out", out]
        argv += ["--steps", str(budget.pretrain_steps), "--seed", str(spec.seed)]
        argv += [] if budget.draw == spec.seed else ["--draw", str(budget.draw)]
        argv += ["--low", str(spec.low), "--high", str(spec.high)]
        argv += ["--n-eval", str(spec.n_eval), "--n-rl", str(spec.n_rl)]
        own = {"label": f"pre-training, {budget.pretrain_steps} steps, draw {budget.draw}"}
    return Step("model", argv, outputs=(folders.model,), code=PRETRAIN_CODE, light=base is not None, **own)


def data_step(budget: DemoBudget, folders: LabFolders) -> Step:
    argv = data_command(asdict(budget.data), _rel(folders.data), python=python())
    return Step("data", argv, outputs=(folders.data,), code=DATA_CODE, light=True)


def kit_stage(stage: str, *flags: str) -> list[str]:
    """The command of a kit stage on its demo config (configs/demo/<stage>.yaml) with ``flags``."""
    return stage_command(stage, _rel(CONFIG_DIR / f"{stage}.yaml"), *flags, python=python())


def sft_step(budget: DemoBudget, folders: LabFolders) -> Step:
    """Stage 1 on the base; a draw's SFT seed is the draw (draw 0: the config's 0)."""
    argv = kit_stage(
        "sft",
        *("--model_name_or_path", _rel(folders.model), "--dataset_path", _rel(folders.data / SFT_FILE)),
        *("--output_dir", _rel(folders.sft), "--max_steps", str(budget.sft_steps)),
        *(["--seed", str(budget.draw)] if budget.draw else []),
    )
    return Step(
        "sft",
        argv,
        outputs=(folders.sft,),
        after=("model", "data"),
        configs=(CONFIG_DIR / "sft.yaml",),
        label=f"stage 1, {budget.sft_steps} steps",
    )


def rl_steps(budget: DemoBudget, folders: LabFolders) -> list[Step]:
    """Stage 2 for every method and training seed, all from the one SFT adapter with the same budget."""
    steps = []
    for method in lab_methods(budget):
        config, config_deps = materialise(method, folders.work)
        for seed in budget.seeds:
            run = layout.run_name(method.name, seed)
            argv = stage_command(
                "rlvr",
                _rel(config),
                *("--sft_dir", _rel(folders.sft), "--output_root", _rel(folders.work), "--variant", run),
                *("--seed", str(seed), "--dataset_path", _rel(folders.data / RL_FILE)),
                *("--max_steps", str(budget.rl_steps)),
                python=python(),
            )
            steps.append(
                Step(
                    run,
                    argv,
                    outputs=(layout.rlvr_dir(folders.work, MODEL_NAME, run),),
                    after=("sft",),
                    configs=config_deps,  # the file and its bases (and a plug-in guide's file)
                    code=("rlvr",),
                    label=f"stage 2, {method.label}, {budget.rl_steps} steps",
                )
            )
    return steps


def eval_steps(budget: DemoBudget, folders: LabFolders) -> list[Step]:
    """Stage 3 of every run on the held-out problems; the evaluation's sampling seed is the training seed, so
    seed s's runs are paired (SFT's evaluations all read stage 1's adapter)."""
    eval_chunk = int(yaml.safe_load((CONFIG_DIR / "eval.yaml").read_text())["problems_per_batch"])
    work, results = folders.work, folders.results
    steps = []
    for run in run_names(budget):
        method, seed = split_run(run)
        trained = "sft" if method == SFT_RUN else run
        completions = layout.completions_dir(work, MODEL_NAME, run)
        argv = kit_stage(
            "eval",
            *("--checkpoints", _rel(layout.run_dir(work, MODEL_NAME, SFT_RUN if method == SFT_RUN else run))),
            *("--run_name", run, "--seed", str(seed), "--results_dir", _rel(results)),
            *(
                "--outputs_dir",
                _rel(work),
                "--local_benchmarks",
                f"{DEMO_BENCHMARK}={_rel(folders.data / EVAL_FILE)}",
            ),
            *(
                "--benchmarks",
                DEMO_BENCHMARK,
                "--n",
                str(budget.eval_n),
                "--limit",
                str(budget.eval_problems),
            ),
        )
        steps.append(
            Step(
                f"eval_{run}",
                argv,
                outputs=(layout.results_dir(results, MODEL_NAME, run), completions),
                after=(trained,),
                configs=(CONFIG_DIR / "eval.yaml",),
                code=("eval",),
                label=f"stage 3, {budget.eval_problems} problems x {budget.eval_n} samples, seed {seed}",
                progress_files=(
                    str(completions / DEMO_BENCHMARK / "chunk_*.jsonl.gz"),
                    -(-budget.eval_problems // eval_chunk),
                ),
            )
        )
    return steps


def lab_inputs(budget: DemoBudget, folders: LabFolders) -> list[str]:
    """What the analysis and the lab both read: the work folder, the results folder and every run's name."""
    return [
        "--work",
        _rel(folders.work),
        "--results",
        _rel(folders.results),
        "--runs",
        ",".join(run_names(budget)),
    ]


def analysis_step(budget: DemoBudget, folders: LabFolders, evals: tuple[str, ...]) -> Step:
    argv = [python(), "-m", "sage_unsloth.demo.analysis", *lab_inputs(budget, folders)]
    return Step(
        "analysis",
        [*argv, "--branch-config", _rel(BRANCH_CONFIG)],
        outputs=(folders.results / "analysis",),
        after=evals,
        configs=config_files(BRANCH_CONFIG),
        code=ANALYSIS_CODE,
        label="plans and branch-point entropy",
    )


def report_step(budget: DemoBudget, folders: LabFolders, evals: tuple[str, ...]) -> Step:
    """Stage 4 on every run, with the lab's pairs at each seed."""
    results = folders.results
    run = layout.run_name
    pairs = ",".join(f"{run(a, s)}:{run(b, s)}" for a, b in lab_pairs(budget) for s in budget.seeds)
    argv = kit_stage(
        "report",
        *("--results", _rel(results), "--out", _rel(layout.report_md(results)), "--pairs", pairs),
        *("--resamples", str(budget.bootstrap_resamples), "--support_reference", sft_run(budget.seeds[0])),
    )
    return Step(
        "report",
        argv,
        outputs=(layout.report_md(results), layout.report_dir(results)),
        after=evals,
        configs=(CONFIG_DIR / "report.yaml",),
        code=("report",),
        label="stage 4",
        light=True,
    )


def smoke_text(budget: DemoBudget) -> str:
    """A budget below the full lab's in any training or evaluation step (--quick): its words, else ''."""
    cut = [
        f"{getattr(budget, name)} {words}"
        for name, words in (("pretrain_steps", "pre-training steps"), ("sft_steps", "SFT steps"),
                            ("rl_steps", "RL steps"), ("eval_problems", "problems"))
        if getattr(budget, name) < getattr(FULL, name) and not (name == "pretrain_steps" and not budget.pretrain)
    ]  # fmt: skip
    return ", ".join(cut)


def lab_step(budget: DemoBudget, folders: LabFolders, references: list[Path] | None) -> Step:
    """The comparison across seeds and problems, and with the draw's references (every run, by method); a smoke
    run is said to be one and compared with nothing."""
    argv = [python(), "-m", "sage_unsloth.demo.lab", *lab_inputs(budget, folders)]
    argv += ["--methods", json.dumps({m.name: m.label for m in lab_methods(budget)})]
    argv += ["--pairs", ",".join(f"{a}:{b}" for a, b in lab_pairs(budget))]
    argv += ["--resamples", str(budget.bootstrap_resamples), "--kmax", str(budget.kmax)]
    argv += ["--branch-config", _rel(BRANCH_CONFIG)]
    reference_files: tuple[Path, ...] = ()
    smoke = smoke_text(budget)
    if smoke:
        argv += ["--smoke", smoke]
    for reference in [] if smoke else (references or []):
        argv += ["--reference", _rel(reference)]
        reference_files += tuple(sorted((reference / "lab").glob("*.csv")))
    return Step(
        "lab",
        argv,
        outputs=(folders.results / "lab",),
        after=("analysis", "report"),
        configs=reference_files,
        code=LAB_CODE,
        label="comparison across seeds and problems",
        light=True,
    )


def build_steps(budget: DemoBudget, work: Path, results: Path, references: list[Path] | None) -> list[Step]:
    """One lab's steps, in order: the base, the data, stage 1, stage 2 per method and seed, stage 3 per run,
    the analysis, stage 4 and the lab."""
    folders = LabFolders(work, results)
    evals = eval_steps(budget, folders)
    after_evals = tuple(s.name for s in evals)
    return [
        model_step(budget, folders),
        data_step(budget, folders),
        sft_step(budget, folders),
        *rl_steps(budget, folders),
        *evals,
        analysis_step(budget, folders, after_evals),
        report_step(budget, folders, after_evals),
        lab_step(budget, folders, references),
    ]


# ------------------------------------------------------------------------------------------------- draws
FRONTIER_DIR = "frontier"  # <results>/frontier/: the lab across draws (sage_unsloth.demo.frontier)
FRONTIER_CODE = (*LAB_CODE, "demo/frontier.py")  # LAB_CODE has report/: its intervals and compare


def reference_draw(folder: Path) -> int:
    """The draw a results folder was made from (its demo_budget.json; folders from before draws: 0)."""
    manifest = Path(folder) / MANIFEST_FILE
    return int(json.loads(manifest.read_text()).get("draw", 0)) if manifest.is_file() else 0


def draw_references(roots: tuple[Path, ...], draw: int, own: Path) -> list[Path]:
    """The labs a draw's lab compares with: every lab under ``roots`` (each root itself and its ``draw<D>``
    folders: a committed multi-draw lab) that was made from this draw, other than the lab's own results."""
    found = []
    for root in roots:
        for candidate in (root, *sorted(Path(root).glob("draw*"))):
            if (
                (candidate / "lab" / "runs.csv").is_file()
                and reference_draw(candidate) == draw
                and candidate.resolve() != Path(own).resolve()
            ):
                found.append(candidate)
    return found


def draw_folders(budget: DemoBudget, draws: tuple[int, ...], work: Path, results: Path):
    """[(the draw's budget, work folder, results folder)]: one draw uses the folders as given; several get
    ``draw<D>/`` inside each."""
    if len(draws) == 1:
        return [(replace(budget, draw=draws[0]), work, results)]
    return [(replace(budget, draw=d), work / f"draw{d}", results / f"draw{d}") for d in draws]


def prefixed(steps: list[Step], prefix: str) -> list[Step]:
    """A draw's steps renamed ``<prefix><name>`` (and their dependencies), so several draws share one graph."""
    return [replace(s, name=prefix + s.name, after=tuple(prefix + a for a in s.after)) for s in steps]


def build_draw_steps(draws, results: Path, roots: tuple[Path, ...], kmax: int) -> list[Step]:
    """Every draw's steps in one graph (prefixed ``draw<D>.`` when there are several), then the frontier step
    that reads the draws' labs (sage_unsloth.demo.frontier)."""
    if len(draws) == 1:
        budget, work, out = draws[0]
        return build_steps(budget, work, out, draw_references(roots, budget.draw, out))
    steps: list[Step] = []
    for budget, work, out in draws:
        prefix = f"draw{budget.draw}."
        steps += prefixed(build_steps(budget, work, out, draw_references(roots, budget.draw, out)), prefix)
    labs = [out for _, _, out in draws]
    argv = [python(), "-m", "sage_unsloth.demo.frontier", "--labs", ",".join(_rel(o) for o in labs)]
    argv += ["--out", _rel(results / FRONTIER_DIR), "--kmax", str(kmax)]
    steps.append(
        Step(
            "frontier",
            argv,
            outputs=(results / FRONTIER_DIR,),
            after=tuple(f"draw{b.draw}.lab" for b, _, _ in draws),
            code=FRONTIER_CODE,
            label="the frontier across draws",
            light=True,
        )
    )
    return steps


def write_timings(results: Path, work: Path, records: list[StepRecord], wall: float) -> dict:
    """timings.csv: every step's own measured wall and CPU seconds (from its stamp when it was reused), and
    a total; the total wall time is this invocation's when every step ran now, else the last complete one."""
    complete_path = work / STAMP_DIR / "_complete_run.json"
    cpu = round(sum(r.cpu_s for r in records), 1)
    if all(r.status == "ran" for r in records):
        atomic_write_json(complete_path, {"wall_s": round(wall, 1), "cpu_s": cpu})
    complete = json.loads(complete_path.read_text()) if complete_path.is_file() else {}
    lines = ["step,status,wall_s,cpu_s,threads,finished"]
    lines += [f"{r.name},{r.status},{r.wall_s},{r.cpu_s},{r.threads},{r.finished}" for r in records]
    lines.append(
        f"total,{'ran' if complete.get('cpu_s') == cpu else 'mixed'},{complete.get('wall_s', '')},{cpu},,"
    )
    atomic_write_text(results / "timings.csv", "\n".join(lines) + "\n")
    return {"wall_s": complete.get("wall_s"), "cpu_s": cpu}


def parse_args(argv: list[str] | None):
    from ..config.args import KitArgumentParser  # no abbreviations: --seed 0-2 is not --seeds; did you mean

    parser = KitArgumentParser(prog="python -m sage_unsloth.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few steps of everything (the CI smoke run)")
    parser.add_argument(
        "--seeds",
        default=None,
        help="RL training seeds: a list 0,1,2, a range 10-19, or a count 3 (= 0-2); default 0",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="delete this run's work and results folders first"
    )
    parser.add_argument(
        "--work-dir", default=None, help="models, data, completions (default outputs/demo[-quick])"
    )
    parser.add_argument(
        "--results-dir", default=None, help="CSVs, report.md, plots (default outputs/results/demo[-quick])"
    )
    parser.add_argument(
        "--reference",
        default=None,
        help="a results folder to compare with, its draw<D> folders too (default: the committed labs, "
        "results/demo-reference and results/demo-frontier, each draw with those of its draw; '' for none)",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, help="steps run in parallel (default: usable cores)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per step (default: idle cores shared among the running steps)",
    )
    parser.add_argument(
        "--methods",
        default=None,
        help=f"RL methods separated by commas: 'all', 'default' ({','.join(DEFAULT_METHODS)}), 'baselines', "
        "names, or paths of YAML configs (named by their stem)",
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        help=f"knob settings as methods, e.g. {GRID_EXAMPLES} (every combination; repeatable)",
    )
    parser.add_argument(
        "--kmax",
        type=int,
        default=None,
        help="the largest k the lab reports; --eval-n must be >= 4 x kmax (default eval-n / 4)",
    )
    parser.add_argument(
        "--executor",
        default="local",
        help="where steps run: local (here), slurm or ray (docs/scaling.md); --jobs caps those in flight",
    )
    parser.add_argument(
        "--executor-settings",
        default="",
        help="the executor's settings as a YAML mapping, e.g. '{partition: gpu, time_min: 120}'",
    )
    parser.add_argument("--check-configs", nargs="+", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--mix", default=None, help="SFT plan prior, e.g. left=0.8,right=0.08,... (default the lab's)"
    )
    parser.add_argument(
        "--draws",
        default=None,
        help="pre-training + SFT draws (the base's and SFT's seed): 0 (default), or several, e.g. 0-2: one "
        "lab per draw in <work>/draw<D> and <results>/draw<D>, then the frontier across them",
    )
    parser.add_argument(
        "--pretrain",
        action="store_true",
        help="pre-train the base here instead of copying the committed one (sage_unsloth/demo/bases/)",
    )
    for name in ("pretrain-steps", "sft-steps", "rl-steps", "eval-n"):
        parser.add_argument(f"--{name}", type=int, default=None, help="override the budget")
    return parser.parse_args(argv)


def budget_from_args(args) -> DemoBudget:
    budget = QUICK if args.quick else FULL
    overrides = {
        key: getattr(args, key)
        for key in ("pretrain_steps", "sft_steps", "rl_steps", "eval_n", "kmax")
        if getattr(args, key) is not None
    }
    if args.eval_n is not None and args.kmax is None:
        overrides["kmax"] = max(1, args.eval_n // 4)
    if args.seeds is not None:
        overrides["seeds"] = parse_seeds(str(args.seeds))
    if args.methods is not None:
        overrides["methods"], overrides["extra"] = parse_methods(args.methods)
    grid = tuple(m for spec in args.grid for m in parse_grid(spec))
    if grid:
        methods = overrides.get("methods", budget.methods)
        check_new_methods(grid, taken=methods)
        overrides["methods"] = (*methods, *(m.name for m in grid))
        overrides["extra"] = (*overrides.get("extra", budget.extra), *grid)
    if args.mix is not None:
        overrides["data"] = replace(budget.data, mix=parse_mix(args.mix))
    if getattr(args, "pretrain", False):
        overrides["pretrain"] = True
    budget = replace(budget, **overrides)
    if min(budget.pretrain_steps, budget.sft_steps, budget.rl_steps, budget.eval_n, len(budget.seeds)) < 1:
        raise ValueError("--pretrain-steps, --sft-steps, --rl-steps, --eval-n and --seeds must be at least 1")
    if budget.kmax < 1 or budget.eval_n < 4 * budget.kmax:
        raise ValueError(
            f"--eval-n {budget.eval_n} with --kmax {budget.kmax}: the lab reports pass@k up to kmax from "
            f"n >= 4 x kmax samples per problem; raise --eval-n to {4 * max(budget.kmax, 1)} or lower --kmax "
            f"to {max(budget.eval_n // 4, 1)} (kmax >= 1, default eval-n / 4)"
        )
    return budget


def config_sha256(budget: DemoBudget, work: Path) -> dict:
    """Per method: the config stage 2 read and the sha256 of every file it depends on (bases, guide files)."""
    out = {}
    for method in lab_methods(budget):
        config, files = materialise(method, work)
        out[method.name] = {
            "config": _rel(config),
            "source": _rel(Path(method.source)) if method.source else None,
            "overrides": dict(method.overrides),
            "sha256": {_rel(f): hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files},
        }
    return out


def write_manifest(
    budget: DemoBudget, work: Path, results: Path, *, finished: dict | None = None, draws: list | None = None
) -> Path:
    """``<results>/demo_budget.json``: the budget (pre-training to bootstrap), the seeds, eval n and kmax, each
    run's evaluation seed, the methods with their config files' sha256, the kit's commit, and once the lab
    finished its wall / CPU time, each method's knob values as its trained runs recorded them and the sha256 of
    the base and the SFT adapter (reproduce.fingerprints). A multi-draw lab's top folder lists its ``draws``."""
    from ..runtime.manifest import git_commit
    from .dose_response import method_knobs
    from .reproduce import fingerprints

    manifest = {
        **asdict(budget),
        "eval_seeds": {run: split_run(run)[1] for run in run_names(budget)},
        "method_configs": config_sha256(budget, work),
        "commit": git_commit(REPO_ROOT),
        "work_dir": _rel(work),
    }
    if draws is not None:
        manifest.update(draw=None, draws=draws)
    if finished is not None:
        manifest["timings"] = finished
        if draws is None:
            manifest["knobs"] = method_knobs(work, MODEL_NAME, run_names(budget))
            manifest["fingerprints"] = fingerprints(work)
    results.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(results / MANIFEST_FILE, json.dumps(manifest, indent=2, default=str) + "\n")


def default_dirs(*, quick: bool) -> tuple[Path, Path]:
    """(work folder, results folder) of a demo run: both inside outputs/, which git ignores."""
    suffix = "-quick" if quick else ""
    return REPO_ROOT / layout.OUTPUTS / f"demo{suffix}", REPO_ROOT / layout.RESULTS / f"demo{suffix}"


def _executor(args, work: Path):
    """``--executor NAME --executor-settings '{...}'`` (sage_unsloth/jobs/executors); bad ones are one line."""
    from ..jobs.executors import make_executor, settings_mapping

    settings = settings_mapping(
        args.executor_settings, "executor-settings"
    )  # as the sweep's executor_settings
    return make_executor(args.executor, settings, work / "executor" / args.executor)


# How the lab's steps run (sage_unsloth/jobs): from the project folder with the lab's environment, and the first
# failure stops the others.
LAB_RUN = {"tag": "[demo]", "env": step_env, "cwd": REPO_ROOT}


def main(argv: list[str] | None = None) -> int:
    with contextlib.ExitStack() as held:  # the work and results folders' locks, held to the last write
        return _main(argv, held)


def _empty_for_fresh(work: Path, results: Path) -> None:
    """--fresh: empty both folders, keeping the locks this run holds and the other folder where it is inside."""
    for folder in (work, results):
        print(f"[demo] --fresh: deleting {_rel(folder)}")
        for path in folder.iterdir():
            if any(f == path or f.is_relative_to(path) for f in (work, results)):
                continue  # the other folder, inside this one: emptied on its own turn
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.name != LOCK_NAME:
                path.unlink()


def _main(argv: list[str] | None, held: contextlib.ExitStack) -> int:
    args = parse_args(argv)
    if args.check_configs:
        return check_stage2_configs(args.check_configs)
    default_work, default_results = default_dirs(quick=args.quick)
    work = Path(args.work_dir or default_work).resolve()
    results = Path(args.results_dir or default_results).resolve()
    try:
        budget = budget_from_args(args)
        executor = _executor(args, work)  # before --fresh deletes anything
        # one lab per folder (sage_unsloth/runtime/folder_lock.py)
        for folder in dict.fromkeys((work, results)):
            held.enter_context(FolderLock(folder, fix="pass another --work-dir and --results-dir"))
        if args.fresh:
            _empty_for_fresh(work, results)
        preflight(budget, work)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    roots = (
        REFERENCE_LABS
        if args.reference is None
        else ((Path(args.reference).resolve(),) if args.reference else ())
    )
    for root in roots:
        if not any((f / "lab" / "runs.csv").is_file() for f in (root, *Path(root).glob("draw*"))):
            print(f"[demo] no reference results in {_rel(root)}: the report will not compare with it")
    print(f"[demo] budget: {json.dumps(asdict(budget), default=str)}", flush=True)
    print(
        f"[demo] evaluation: {budget.eval_n} samples per problem, so the lab reports pass@k up to k = "
        f"{budget.kmax} (n >= 4k){'' if budget.eval_n >= 256 else '; the confirmatory lab: --eval-n 256 (k up to 64)'}",
        flush=True,
    )
    draws = draw_folders(budget, parse_seeds(args.draws) if args.draws else (budget.draw,), work, results)
    started = time.perf_counter()
    try:
        steps = build_draw_steps(draws, results, roots, budget.kmax)
        for draw_budget, draw_work, draw_results in draws:
            write_manifest(draw_budget, draw_work, draw_results)
        records = run_steps(
            steps,
            work=work,
            jobs=args.jobs or usable_cores(),
            threads=args.threads,
            echo=lambda line: print(line, flush=True),
            executor=executor,
            **LAB_RUN,
        )
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (sage_unsloth/runtime/interrupt.py): 130 or 143
        from sage_unsloth.runtime.interrupt import exit_code_of

        print("[demo] interrupted; finished steps are kept (rerun to continue)", file=sys.stderr)
        return exit_code_of(exc)
    finally:
        executor.close()
    elapsed = time.perf_counter() - started
    total = write_timings(results, work, records, elapsed)
    for draw_budget, draw_work, draw_results in draws:
        prefix = f"draw{draw_budget.draw}." if len(draws) > 1 else ""
        own = {"cpu_s": round(sum(r.cpu_s for r in records if r.name.startswith(prefix)), 1)}
        write_manifest(draw_budget, draw_work, draw_results, finished=total if not prefix else own)
        if prefix:
            print(f"[demo] ---- draw {draw_budget.draw} ({_rel(draw_results)})")
        print((draw_results / "lab" / "summary.txt").read_text().rstrip())
    if len(draws) > 1:
        write_manifest(budget, work, results, finished=total, draws=[b.draw for b, _, _ in draws])
        print(f"[demo] ---- the frontier across draws ({_rel(results / FRONTIER_DIR)})")
        print((results / FRONTIER_DIR / "summary.txt").read_text().rstrip())
    done = finished_line(records, elapsed, total)
    print(f"[demo] finished: {done}; report {_rel(results / 'report.md')}")
    return 0


def finished_line(records: list[StepRecord], wall_now: float, total: dict) -> str:
    """What this invocation cost, apart from the steps it reused: a rerun that reuses most steps says how long it
    took itself, and what the reused steps had cost when they ran (``total``: :func:`write_timings`'s)."""
    ran = [r for r in records if r.status == "ran"]
    reused = [r for r in records if r.status == "reused"]
    cpu_ran = sum(r.cpu_s for r in ran)
    if not reused:
        return f"{wall_now:.0f} s wall, {cpu_ran:.0f} s CPU over all steps"
    before = f", the last complete run {total['wall_s']:.0f} s wall" if total.get("wall_s") else ""
    return (
        f"{wall_now:.0f} s wall and {cpu_ran:.0f} s CPU for the {len(ran)} steps that ran; {len(reused)} reused "
        f"from earlier runs ({sum(r.cpu_s for r in reused):.0f} s CPU when they ran{before})"
    )


if __name__ == "__main__":
    raise SystemExit(main())
