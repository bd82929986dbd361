"""The whole recipe offline on CPU: ``python -m sage_unsloth.demo [--quick] [--seeds N] [--fresh]``.

Steps (each a subprocess; stages 1-4 are the kit's own entry points with the configs in configs/demo/):

- ``model``: the random tiny Qwen2 (sage_unsloth.demo.model), pre-trained on worked problems and
  addition facts (sage_unsloth.demo.pretrain); ``data``: the SFT / RL / eval files (sage_unsloth.demo.data);
- ``sft``: stage 1, LoRA SFT on the five plans at 74/9/5/3/9 (data.DEFAULT_MIX; ``--mix`` to change);
- ``<method>_seed<s>``: stage 2 for every chosen method (``--methods``: :data:`DEFAULT_METHODS` by default,
  ``all`` for every method of :data:`METHODS`) and training seed, all from the same SFT adapter with the
  same budget;
- ``eval_<run>``: stage 3 on the held-out demo problems, ``eval_n`` samples each (pass@k up to k = eval_n);
- ``analysis``: plan frequencies per run and the branch point's entropy and q (sage_unsloth.demo.analysis);
- ``report``: stage 4 (pass@k tables, paired differences, support against SFT, plots);
- ``lab``: the comparison across seeds and problems, the comparison with the committed reference run
  (results/demo-reference/), appended to report.md (sage_unsloth.demo.lab).

Independent steps run in parallel (``--jobs``, default: the usable cores). A rerun reuses every step whose
inputs did not change (sage_unsloth.demo.steps: fingerprinted stamps); ``--fresh`` deletes this run's
work and results folders first. Timings per step (wall and CPU seconds) go to ``<results>/timings.csv``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

from .. import layout
from ..config_args import config_files
from ..layout import SFT_RUN
from ..manifest import atomic_write_json, atomic_write_text
from ..recipe import stage_command
from .data import EVAL_FILE, RL_FILE, SFT_FILE, DemoDataSpec
from .steps import REPO_ROOT, STAMP_DIR, Step, StepRecord, python, run_steps, usable_cores

CONFIG_DIR = REPO_ROOT / "configs" / "demo"
MODEL_NAME = "demo-tiny"
DEMO_BENCHMARK = "demo"
REFERENCE_DIR = REPO_ROOT / "results" / "demo-reference"


@dataclass(frozen=True)
class Method:
    """One RL method of the lab: a run folder name, its config in configs/demo/, a label for tables."""

    name: str
    label: str

    @property
    def config(self) -> str:
        return f"{self.name}.yaml"


# Adding a method = one config in configs/demo/<name>.yaml and one line here (then `--methods all` or
# `--methods a,b` runs it).
METHODS = (
    Method("grpo", "GRPO"),
    Method("grpo_nokl", "GRPO, no KL"),
    Method("grpo_fkl", "GRPO, forward KL"),
    Method("grpo_branch", "GRPO + Branch"),
    Method("grpo_reward", "GRPO, KL in the reward"),
    Method("grpo_branch_reward", "GRPO + Branch, KL in the reward"),
    Method("grpo_ref_branch", "GRPO + Branch on the reference entropy"),
    # the exploration baselines (docs/methods.md), each against GRPO and SFT
    Method("grpo_entropy_adv", "GRPO + entropy advantage"),
    Method("grpo_high_entropy", "GRPO, top-20% entropy tokens"),
    Method("grpo_clip_cov", "GRPO + Clip-Cov"),
    Method("grpo_kl_cov", "GRPO + KL-Cov"),
    Method("grpo_passk", "Pass@k Training"),
    Method("grpo_ref_reset", "GRPO + reference reset"),
    # the positive control: GRPO's anchor strength (beta 0: grpo_nokl, 0.05: grpo)
    Method("grpo_beta0.2", "GRPO, beta 0.2"),
    Method("grpo_beta0.5", "GRPO, beta 0.5"),
    Method("grpo_beta1", "GRPO, beta 1"),
    Method("grpo_beta2", "GRPO, beta 2"),
    Method("grpo_ref_branch_b0.05_t0.3_g4_q3", "GRPO + ref_branch, beta 0.05, tau 0.3, gamma 4, q_max 3"),
    Method("grpo_branch_b0.05_t0.03_g0.3_q1.4", "GRPO + branch, beta 0.05, tau 0.03, gamma 0.3, q_max 1.4"),
    Method("grpo_branch_b0.05_t0.3_g4_q3", "GRPO + branch, beta 0.05, tau 0.3, gamma 4, q_max 3"),
    Method("grpo_branch_b0.05_t0.03_g10_q10", "GRPO + branch, beta 0.05, tau 0.03, gamma 10, q_max 10"),
)
# the exploration baselines from the literature (`--methods baselines` runs them beside GRPO)
BASELINES = (
    "grpo_entropy_adv",
    "grpo_high_entropy",
    "grpo_clip_cov",
    "grpo_kl_cov",
    "grpo_passk",
    "grpo_ref_reset",
)
METHOD_BY_NAME = {m.name: m for m in METHODS}
# The default `make demo` (one seed; under 10 minutes on an idle 2-core machine); the full lab runs them all.
DEFAULT_METHODS = ("grpo", "grpo_nokl", "grpo_branch")
# A - B pairs of the comparison (per seed); "sft" is the one SFT model every RL run starts from. A pair is
# reported when both of its methods ran.
PAIRS = (
    ("grpo", "sft"),
    ("grpo_nokl", "sft"),
    ("grpo_fkl", "sft"),
    ("grpo_branch", "sft"),
    ("grpo_reward", "sft"),
    ("grpo_branch_reward", "sft"),
    ("grpo_branch", "grpo"),
    ("grpo_nokl", "grpo"),
    ("grpo_fkl", "grpo"),
    ("grpo_reward", "grpo"),
    ("grpo_branch_reward", "grpo_branch"),
    ("grpo_branch_reward", "grpo_reward"),
    ("grpo_ref_branch", "sft"),
    ("grpo_ref_branch", "grpo"),
    ("grpo_ref_branch", "grpo_branch"),  # the reference's entropy against the policy's
    *((name, "sft") for name in BASELINES),
    *((name, "grpo") for name in BASELINES),
)


def select_methods(spec: str) -> tuple[str, ...]:
    """``--methods``: 'all', 'default', 'baselines' (GRPO and the exploration baselines), or names from METHODS
    separated by commas (in METHODS order)."""
    if spec == "all":
        return tuple(m.name for m in METHODS)
    if spec == "default":
        return DEFAULT_METHODS
    if spec == "baselines":
        return ("grpo", *BASELINES)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in METHOD_BY_NAME]
    if unknown or not names:
        raise ValueError(
            f"--methods: unknown {unknown or spec!r}; use 'all', 'default', 'baselines' or names from "
            f"{', '.join(METHOD_BY_NAME)} (a new one: configs/demo/<name>.yaml and a line in run.METHODS)"
        )
    return tuple(m.name for m in METHODS if m.name in names)


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
    "demo/compare.py",
    "demo/strategies.py",
    "demo/analysis.py",
    "demo/task.py",
    "report",
)


@dataclass(frozen=True)
class DemoBudget:
    pretrain_steps: int = 600
    sft_steps: int = 300
    rl_steps: int = 150
    eval_problems: int = 100
    eval_n: int = 64  # samples per problem = largest k
    seeds: tuple[int, ...] = (0,)  # RL training seeds
    methods: tuple[str, ...] = DEFAULT_METHODS  # RL methods (names from METHODS)
    data: DemoDataSpec = field(default_factory=DemoDataSpec)
    bootstrap_resamples: int = 2000


FULL = DemoBudget()
QUICK = DemoBudget(
    pretrain_steps=20,
    sft_steps=4,
    rl_steps=2,
    eval_problems=6,
    eval_n=4,
    methods=tuple(m.name for m in METHODS),  # the smoke run checks that every method runs
    data=DemoDataSpec(n_eval=6, n_rl=32, n_sft=200),
    bootstrap_resamples=200,
)


def run_names(budget: DemoBudget) -> list[str]:
    """Every evaluated run: sft, then each method at each seed."""
    return [SFT_RUN] + [f"{m}_seed{s}" for m in budget.methods for s in budget.seeds]


def lab_methods(budget: DemoBudget) -> list[Method]:
    return [METHOD_BY_NAME[name] for name in budget.methods]


def lab_pairs(budget: DemoBudget) -> list[tuple[str, str]]:
    """The PAIRS whose two sides both ran; a method PAIRS does not name (a newly added baseline) is compared
    with SFT and with GRPO, so adding one takes no more than its line in METHODS."""
    ran = {SFT_RUN, *budget.methods}
    named = {a for a, _ in PAIRS}
    extra = [(m, b) for m in budget.methods if m not in named for b in (SFT_RUN, "grpo") if b != m]
    return [(a, b) for a, b in (*PAIRS, *extra) if a in ran and b in ran]


def _rel(path: Path) -> str:
    """Paths on command lines relative to the project (the stages run there), so that manifests and the
    report show project paths, not this machine's."""
    try:
        return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(Path(path).resolve())


def build_steps(budget: DemoBudget, work: Path, results: Path, reference: Path | None) -> list[Step]:
    py = python()
    data, model_dir = work / "data", work / "model" / MODEL_NAME
    sft_dir = layout.sft_dir(work, MODEL_NAME)  # the demo's outputs root is its work folder
    spec = budget.data
    # what the analysis and the lab both read: the work folder, the results folder and every run's name
    lab_inputs = ["--work", _rel(work), "--results", _rel(results), "--runs", ",".join(run_names(budget))]
    steps = [
        Step(
            "model",
            [
                py,
                "-m",
                "sage_unsloth.demo.pretrain",
                "--out",
                _rel(model_dir),
                "--steps",
                str(budget.pretrain_steps),
                "--seed",
                str(spec.seed),
                "--low",
                str(spec.low),
                "--high",
                str(spec.high),
                "--n-eval",
                str(spec.n_eval),
                "--n-rl",
                str(spec.n_rl),
            ],
            outputs=(model_dir,),
            code=PRETRAIN_CODE,
            label=f"pre-training, {budget.pretrain_steps} steps",
        ),
        Step(
            "data",
            [
                py,
                "-m",
                "sage_unsloth.demo.data",
                "--out",
                _rel(data),
                "--spec",
                json.dumps(asdict(spec), sort_keys=True),
            ],
            outputs=(data,),
            code=DATA_CODE,
            light=True,
        ),
        Step(
            "sft",
            stage_command(
                "sft",
                _rel(CONFIG_DIR / "sft.yaml"),
                "--model_name_or_path",
                _rel(model_dir),
                "--dataset_path",
                _rel(data / SFT_FILE),
                "--output_dir",
                _rel(sft_dir),
                "--max_steps",
                str(budget.sft_steps),
                python=py,
            ),
            outputs=(sft_dir,),
            after=("model", "data"),
            configs=(CONFIG_DIR / "sft.yaml",),
            label=f"stage 1, {budget.sft_steps} steps",
        ),
    ]
    for method in lab_methods(budget):
        for seed in budget.seeds:
            run = f"{method.name}_seed{seed}"
            steps.append(
                Step(
                    run,
                    stage_command(
                        "rlvr",
                        _rel(CONFIG_DIR / method.config),
                        "--sft_dir",
                        _rel(sft_dir),
                        "--output_root",
                        _rel(work),
                        "--variant",
                        run,
                        "--seed",
                        str(seed),
                        "--dataset_path",
                        _rel(data / RL_FILE),
                        "--max_steps",
                        str(budget.rl_steps),
                        python=py,
                    ),
                    outputs=(layout.rlvr_dir(work, MODEL_NAME, run),),
                    after=("sft",),
                    configs=config_files(CONFIG_DIR / method.config),  # the file and its bases
                    code=("rlvr",),
                    label=f"stage 2, {method.label}, {budget.rl_steps} steps",
                )
            )
    evals = []
    eval_chunk = int(yaml.safe_load((CONFIG_DIR / "eval.yaml").read_text())["problems_per_batch"])
    for run in run_names(budget):
        name = f"eval_{run}"
        run_dir = layout.run_dir(work, MODEL_NAME, run)
        completions = layout.completions_dir(work, MODEL_NAME, run)
        evals.append(name)
        steps.append(
            Step(
                name,
                stage_command(
                    "eval",
                    _rel(CONFIG_DIR / "eval.yaml"),
                    "--checkpoints",
                    _rel(run_dir),
                    "--results_dir",
                    _rel(results),
                    "--outputs_dir",
                    _rel(work),
                    "--local_benchmarks",
                    f"{DEMO_BENCHMARK}={_rel(data / EVAL_FILE)}",
                    "--benchmarks",
                    DEMO_BENCHMARK,
                    "--n",
                    str(budget.eval_n),
                    "--limit",
                    str(budget.eval_problems),
                    python=py,
                ),
                outputs=(layout.results_dir(results, MODEL_NAME, run), completions),
                after=(run,),
                configs=(CONFIG_DIR / "eval.yaml",),
                code=("eval",),
                label=f"stage 3, {budget.eval_problems} problems x {budget.eval_n} samples",
                progress_files=(
                    str(completions / DEMO_BENCHMARK / "chunk_*.jsonl.gz"),
                    -(-budget.eval_problems // eval_chunk),
                ),
            )
        )
    pairs = ",".join(
        f"{a}_seed{s}:{b if b == SFT_RUN else f'{b}_seed{s}'}"
        for a, b in lab_pairs(budget)
        for s in budget.seeds
    )
    steps += [
        Step(
            "analysis",
            [
                py,
                "-m",
                "sage_unsloth.demo.analysis",
                *lab_inputs,
                "--branch-config",
                _rel(CONFIG_DIR / "grpo_branch.yaml"),
            ],
            outputs=(results / "analysis",),
            after=tuple(evals),
            configs=config_files(CONFIG_DIR / "grpo_branch.yaml"),
            code=ANALYSIS_CODE,
            label="plans and branch-point entropy",
        ),
        Step(
            "report",
            stage_command(
                "report",
                _rel(CONFIG_DIR / "report.yaml"),
                "--results",
                _rel(results),
                "--out",
                _rel(layout.report_md(results)),
                "--pairs",
                pairs,
                "--resamples",
                str(budget.bootstrap_resamples),
                "--support_reference",
                SFT_RUN,
                python=py,
            ),
            outputs=(layout.report_md(results), layout.report_dir(results)),
            after=tuple(evals),
            configs=(CONFIG_DIR / "report.yaml",),
            code=("report",),
            label="stage 4",
            light=True,
        ),
    ]
    lab = [
        py,
        "-m",
        "sage_unsloth.demo.lab",
        *lab_inputs,
        "--methods",
        json.dumps({m.name: m.label for m in lab_methods(budget)}),
        "--pairs",
        ",".join(f"{a}:{b}" for a, b in lab_pairs(budget)),
        "--resamples",
        str(budget.bootstrap_resamples),
        "--branch-config",
        _rel(CONFIG_DIR / "grpo_branch.yaml"),
    ]
    reference_files = ()
    if reference is not None and reference.resolve() != results.resolve():
        lab += ["--reference", _rel(reference)]
        reference_files = tuple(sorted((reference / "lab").glob("*.csv")))
    steps.append(
        Step(
            "lab",
            lab,
            outputs=(results / "lab",),
            after=("analysis", "report"),
            configs=reference_files,
            code=LAB_CODE,
            label="comparison across seeds and problems",
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
    parser = argparse.ArgumentParser(prog="python -m sage_unsloth.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few steps of everything (the CI smoke run)")
    parser.add_argument("--seeds", type=int, default=None, help="RL training seeds per method (default 1)")
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
        default=str(REFERENCE_DIR),
        help="results of the run to compare with (default results/demo-reference; '' for none)",
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
        help=f"RL methods: 'all', 'default' ({','.join(DEFAULT_METHODS)}), 'baselines' or names separated by commas",
    )
    parser.add_argument(
        "--mix", default=None, help="SFT plan prior, e.g. left=0.8,right=0.08,... (default the lab's)"
    )
    for name in ("pretrain-steps", "sft-steps", "rl-steps", "eval-n"):
        parser.add_argument(f"--{name}", type=int, default=None, help="override the budget")
    return parser.parse_args(argv)


def budget_from_args(args) -> DemoBudget:
    budget = QUICK if args.quick else FULL
    overrides = {
        key: getattr(args, key)
        for key in ("pretrain_steps", "sft_steps", "rl_steps", "eval_n")
        if getattr(args, key) is not None
    }
    if args.seeds is not None:
        overrides["seeds"] = tuple(range(args.seeds))
    if args.methods is not None:
        overrides["methods"] = select_methods(args.methods)
    if args.mix is not None:
        overrides["data"] = replace(budget.data, mix=parse_mix(args.mix))
    budget = replace(budget, **overrides)
    if min(budget.pretrain_steps, budget.sft_steps, budget.rl_steps, budget.eval_n, len(budget.seeds)) < 1:
        raise ValueError("--pretrain-steps, --sft-steps, --rl-steps, --eval-n and --seeds must be at least 1")
    return budget


def default_dirs(*, quick: bool) -> tuple[Path, Path]:
    """(work folder, results folder) of a demo run: both inside outputs/, which git ignores."""
    suffix = "-quick" if quick else ""
    return REPO_ROOT / layout.OUTPUTS / f"demo{suffix}", REPO_ROOT / layout.RESULTS / f"demo{suffix}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        budget = budget_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    default_work, default_results = default_dirs(quick=args.quick)
    work = Path(args.work_dir or default_work).resolve()
    results = Path(args.results_dir or default_results).resolve()
    reference = Path(args.reference).resolve() if args.reference else None
    if reference is not None and not (reference / "lab" / "runs.csv").is_file():
        print(f"[demo] no reference results in {_rel(reference)}: the report will not compare with one")
        reference = None
    if args.fresh:
        for folder in (work, results):
            if folder.exists():
                print(f"[demo] --fresh: deleting {_rel(folder)}")
                shutil.rmtree(folder)
    print(f"[demo] budget: {json.dumps(asdict(budget))}", flush=True)
    started = time.perf_counter()
    try:
        steps = build_steps(budget, work, results, reference)
        records = run_steps(
            steps,
            work=work,
            jobs=args.jobs or usable_cores(),
            threads=args.threads,
            echo=lambda line: print(line, flush=True),
        )
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("[demo] interrupted; finished steps are kept (rerun to continue)", file=sys.stderr)
        return 130
    atomic_write_text(results / "demo_budget.json", json.dumps(asdict(budget), indent=2) + "\n")
    total = write_timings(results, work, records, time.perf_counter() - started)
    print((results / "lab" / "summary.txt").read_text().rstrip())
    wall = f"{total['wall_s']:.0f} s wall, " if total.get("wall_s") else ""
    print(
        f"[demo] finished: {wall}{total['cpu_s']:.0f} s CPU over all steps; report {_rel(results / 'report.md')}"
    )
    return 0
