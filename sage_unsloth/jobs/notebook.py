"""What the Colab / Kaggle notebooks (notebooks/sage_recipe.py) call: platform presets, the stage command
lines, running one stage in its own process with live output, and showing the report.

Nothing here trains or evaluates. Every stage runs as ``python -m sage_unsloth.<stage> CONFIG --key value``
in a child process, because Unsloth and vLLM must not share a process (on some CPUs they crash together)
and a T4 cannot hold the training model and the evaluation engine at the same time; a finished child
gives all its GPU memory back. On a GPU the notebook's own kernel never imports torch (on CPU, in CI, it
builds the tiny offline model in-process).

Public API::

    PLATFORMS                          name -> Platform (colab, kaggle, tiny)
    make_recipe(platform, repo=..., workdir=..., model=..., ...) -> Recipe
    work_folder(platform, workdir, use_drive=..., tiny=...) -> WORKDIR (Drive on Colab, /kaggle/working on Kaggle)
    Recipe.command(stage, variant=None) -> argv;  Recipe.run(stage, variant=None);  Recipe.eval_runs()
    Recipe.step(stage, variant=None) -> the training stage as a step of the job graph (sage_unsloth/jobs)
    Recipe.progress() -> where each stage stands (finished, resumes from checkpoint-N, not started)
    run_stage(argv, cwd=..., env=...)  (sage_unsloth/jobs/recipe.py) stream a child's output, raise StageFailed
    gpu_info() -> list[GPU];  platform_problems(gpus) -> [what to do];  preflight() (raises on a problem)
    install(repo)                      pip install -e repo[gpu], then torch / torchvision checked as a pair
    wandb_api_key() -> str (never printed or written);  Recipe.wandb_where() -> where the runs are in W&B
    show_report(recipe)                the comparison table and the pass@k plots
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sage_unsloth.doctor import driver as driver_rules
from sage_unsloth.doctor.env import nvidia_smi
from sage_unsloth.jobs.recipe import StageFailed, run_stage, stage_command
from sage_unsloth.runtime import layout
from sage_unsloth.runtime.manifest import MANIFEST_NAME

__all__ = ["StageFailed", "run_stage"]  # re-exported: notebooks call nb.run_stage / catch nb.StageFailed

STAGES = ("sft", "rlvr", "eval", "report")
DEFAULT_WORKDIR, DRIVE_MOUNT, KAGGLE_WORKING = "sage_run", "/content/drive", "/kaggle/working"
VARIANTS = ("grpo", "grpo_branch")
TINY_MODEL_DIR = "tiny-qwen2"  # folder name = output folder name (outputs/tiny-qwen2/...)


@dataclass(frozen=True)
class Platform:
    """Which configs a notebook uses and the overrides its hardware needs.

    Memory figures are in the config files (estimates, not measurements)."""

    name: str
    model: str  # default MODEL of the generated notebook ("" for tiny: built offline)
    hardware: str
    preset: str  # the configs' name (sft_config, rlvr_configs, eval_config)
    # What the platform's SFT run changes in the preset (the 16 GB presets are float16 already: the T4 has no
    # bfloat16, and with bf16/fp16 both false Unsloth picks fp16 mixed precision for a float16 model).
    sft_overrides: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    needs_gpu: bool = True

    @property
    def sft_config(self) -> str:
        """configs/sft/<preset>.yaml (relative to the repository root, as the other two)."""
        return f"configs/sft/{self.preset}.yaml"

    @property
    def rlvr_configs(self) -> str:
        """configs/rlvr/<preset>: the folder holding grpo.yaml, grpo_branch.yaml."""
        return f"configs/rlvr/{self.preset}"

    @property
    def eval_config(self) -> str:
        return f"configs/eval/notebook-{self.preset}.yaml"


# The T4 (compute capability 7.5): Unsloth's switch that keeps vLLM off its FlashInfer sampler, which vLLM refuses
# below 8.0 (the kit sets it by itself there too; sage_unsloth/compat.py, flashinfer_sampler).
T4_ENV = (("UNSLOTH_VLLM_NO_FLASHINFER", "1"),)
PLATFORMS: dict[str, Platform] = {
    "colab": Platform(
        name="colab",
        model="Qwen/Qwen2.5-1.5B",
        hardware="Colab T4 (16 GB)",
        preset="qwen2.5-1.5b",
        # 16-bit LoRA, the preset as it is (`sage-unsloth doctor configs/sft/qwen2.5-1.5b.yaml --gpu t4`).
        env=T4_ENV,
    ),
    "kaggle": Platform(
        name="kaggle",
        model="Qwen/Qwen2.5-3B",
        hardware="Kaggle T4 x2 (one used, 16 GB)",
        preset="qwen2.5-3b",
        # QLoRA, as stage 2 (configs/rlvr/qwen2.5-3b/ is 4-bit): the SFT adapter is trained on the weights RL uses.
        sft_overrides=("--load_in_4bit", "true"),
        # Unsloth trains on one GPU; with two visible, transformers' Trainer would wrap it in DataParallel.
        env=(("CUDA_VISIBLE_DEVICES", "0"), *T4_ENV),
    ),
    "tiny": Platform(
        name="tiny",
        model="",
        hardware="CPU (CI): tiny random Qwen2, offline",
        preset="tiny-cpu",
        env=(
            ("HF_HUB_OFFLINE", "1"),
            ("HF_DATASETS_OFFLINE", "1"),
            ("WANDB_MODE", "disabled"),
            ("UNSLOTH_SKIP_TORCHVISION_CHECK", "1"),
            ("TOKENIZERS_PARALLELISM", "false"),
        ),
        needs_gpu=False,
    ),
}


# ----------------------------------------------------------------------------------------------- GPU
# The pinned torch 2.13.0 CUDA wheel is built for CUDA 13.0 with kernels for sm_75 and newer (vLLM 0.31's
# likewise); a CUDA 13 runtime needs an NVIDIA driver >= 580, or NVIDIA's forward-compatibility package over an
# older one (sage_unsloth/doctor/driver.py, which the notebooks' first cell runs). The install cell checks both.
MIN_COMPUTE_CAPABILITY = 7.5
MIN_DRIVER = driver_rules.MIN_DRIVER


@dataclass(frozen=True)
class GPU:
    name: str
    memory_mib: int
    compute_capability: float
    driver: str = ""


def gpu_info() -> list[GPU]:
    """The visible NVIDIA GPUs from ``nvidia-smi`` (no torch import in the notebook kernel); [] if none."""
    rows = nvidia_smi("name,memory.total,compute_cap,driver_version")
    return [
        GPU(name, int(float(memory)), float(capability), driver) for name, memory, capability, driver in rows
    ]


def platform_problems(gpus: list[GPU]) -> list[str]:
    """What stops the pinned stack on these GPUs, one line each with what to do (empty: good to go)."""
    if not gpus:
        return [
            (
                "no NVIDIA GPU visible: on Colab choose Runtime > Change runtime type > T4 GPU; on Kaggle "
                "Settings > Accelerator > GPU T4 x2"
            )
        ]
    problems = []
    gpu = gpus[0]
    if gpu.compute_capability < MIN_COMPUTE_CAPABILITY:
        problems.append(
            f"{gpu.name} has compute capability {gpu.compute_capability:g}; torch 2.13's CUDA 13 wheels "
            f"(and vLLM 0.31's) need >= {MIN_COMPUTE_CAPABILITY:g}: on Kaggle choose Settings > "
            "Accelerator > GPU T4 x2 (not P100), on Colab a T4 or better"
        )
    verdict, line = driver_rules.advice(gpu.name, gpu.driver)
    compat_on = driver_rules.COMPAT_DIR in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    if verdict == "update" or (verdict == "compat" and not compat_on):
        problems.append(
            f"NVIDIA driver {gpu.driver} is older than {MIN_DRIVER}, which the CUDA 13 build of torch 2.13 needs: "
            + (
                "run the notebook's first cell (it switches on NVIDIA's forward-compatibility package), or "
                + driver_rules.NEWER_RUNTIME
                if verdict == "compat"
                else line.split(": ")[-1]
            )
        )
    return problems


def preflight() -> list[GPU]:
    """Before installing anything: stop with what to do when the GPU or its driver cannot run the stack."""
    gpus = gpu_info()
    for gpu in gpus:
        print(
            f"GPU {gpu.name}, {gpu.memory_mib} MiB, compute capability {gpu.compute_capability:g}, "
            f"driver {gpu.driver or '?'}"
        )
    problems = platform_problems(gpus)
    if problems:
        raise RuntimeError("this machine cannot run the pinned stack:\n" + "\n".join(problems))
    return gpus


# Unsloth writes and imports its generated trainers under the working directory unless told otherwise; on Google
# Drive every write and import goes over the network (and a disconnect leaves them half-written).
LOCAL_COMPILE_CACHE = "/content/unsloth_compiled_cache"


def on_drive(folder: str | Path) -> bool:
    """Is ``folder`` on the Google Drive mount Colab gives (WORKDIR's default there)?"""
    return Path(os.path.abspath(folder)).is_relative_to(DRIVE_MOUNT)


def work_folder(platform: str, workdir: str = "", *, use_drive: bool = True, tiny: bool = False) -> str:
    """WORKDIR: the one given; else on Colab a folder on Google Drive (mounted here, it asks for access once) when
    ``use_drive``, on Kaggle /kaggle/working (kept with the notebook's output), else ./sage_run. A folder that
    survives a disconnect is what lets a rerun continue (Recipe.run, Recipe.progress)."""
    if workdir:
        return workdir
    if not tiny and platform == "colab" and use_drive:
        try:
            from google.colab import drive  # type: ignore[import-not-found]
        except ImportError:
            return DEFAULT_WORKDIR  # not on Colab
        drive.mount(DRIVE_MOUNT)
        return f"{DRIVE_MOUNT}/MyDrive/{DEFAULT_WORKDIR}"
    if not tiny and platform == "kaggle" and Path(KAGGLE_WORKING).is_dir():
        return f"{KAGGLE_WORKING}/{DEFAULT_WORKDIR}"
    return DEFAULT_WORKDIR


def gpu_lock(repo: Path, python: tuple[int, int] | None = None) -> Path:
    """The GPU lock of this Python (requirements/gpu-py3.X-lock.txt: the [gpu] extra resolved, `make locks`), or
    a one-line error naming the Pythons the kit has locks for."""
    major, minor = python or sys.version_info[:2]
    lock = Path(repo) / "requirements" / f"gpu-py{major}.{minor}-lock.txt"
    if not lock.is_file():
        have = sorted(
            p.name.split("-")[1][2:] for p in (Path(repo) / "requirements").glob("gpu-py*-lock.txt")
        )
        raise RuntimeError(
            f"no GPU lock for Python {major}.{minor}: the kit has locks for Python {', '.join(have) or 'none'} "
            "(requirements/gpu-py3.X-lock.txt); choose a runtime with one of them"
        )
    return lock


def install(repo: Path) -> None:
    """Install exactly the GPU lock of this Python (torch, the torchvision built for it, Unsloth, vLLM,
    bitsandbytes and everything they need, each at its locked version), then the kit itself without
    dependencies, then check in a fresh process that torch and torchvision import as a matching pair."""
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "-r", str(gpu_lock(repo))], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(repo)], check=True)
    probe = (
        "import torch, torchvision; torchvision.ops.nms; "
        "print(torch.__version__, torchvision.__version__, torch.version.cuda)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            "torch / torchvision do not import as a pair after the install: restart the runtime and "
            "run this cell again; last line: " + (done.stderr.strip().splitlines() or ["?"])[-1]
        )
    print("installed torch {}, torchvision {} (CUDA {})".format(*done.stdout.split()))


# ----------------------------------------------------------------------------------------------- recipe
@dataclass
class Recipe:
    """The four stage command lines of one notebook run, all outputs under ``workdir``."""

    platform: Platform
    repo: Path
    workdir: Path
    model: str
    steps: int
    sft_steps: int
    n_samples: int
    problems_per_benchmark: int
    report_to: str = "none"
    variants: tuple[str, ...] = VARIANTS
    sft_data: Path | None = None  # local SFT rows (tiny); None = the config's hub dataset
    rlvr_data: Path | None = None  # local RLVR prompts (tiny)
    extra: dict[str, list[str]] = field(default_factory=dict)  # per-stage extra flags
    gpus: list[GPU] = field(default_factory=list)

    @property
    def model_short(self) -> str:
        from sage_unsloth.model.loading import model_short_name

        return model_short_name(self.model)

    @property
    def outputs(self) -> Path:
        return self.workdir / layout.OUTPUTS

    @property
    def results(self) -> Path:
        return self.workdir / layout.WORKDIR_RESULTS

    @property
    def sft_dir(self) -> Path:
        return layout.sft_dir(self.outputs, self.model_short)

    def rlvr_dir(self, variant: str) -> Path:
        return layout.rlvr_dir(self.outputs, self.model_short, variant)

    def eval_runs(self) -> list[tuple[str, Path]]:
        """(run name, stage folder) of every checkpoint evaluated: the SFT model, then each RLVR variant."""
        return [(layout.SFT_RUN, self.sft_dir), *((v, self.rlvr_dir(v)) for v in self.variants)]

    @property
    def report_md(self) -> Path:
        return layout.report_md(self.results)

    def env(self) -> dict[str, str]:
        from sage_unsloth.compat import UNSLOTH_COMPILE_LOCATION_ENV

        env = dict(os.environ, PYTHONUNBUFFERED="1", **dict(self.platform.env))
        if self.report_to == "wandb":
            from sage_unsloth.runtime.wandb_runs import DEFAULT_PROJECT

            env.setdefault("WANDB_PROJECT", DEFAULT_PROJECT)
        if on_drive(self.workdir):  # the stages run in WORKDIR: keep Unsloth's generated modules off Drive
            env.setdefault(UNSLOTH_COMPILE_LOCATION_ENV, LOCAL_COMPILE_CACHE)
        return env

    def wandb_where(self) -> str:
        """Where this run's numbers are in W&B (the project, the group, each run and what to look at), or that
        W&B is off."""
        if self.report_to != "wandb":
            return "W&B is off (USE_WANDB = False, or no key): everything is in the work folder"
        project = self.env()["WANDB_PROJECT"]
        group = os.environ.get("WANDB_RUN_GROUP") or self.model_short
        runs = ", ".join(f"{self.model_short}/{run}" for run, _ in self.eval_runs())
        return (
            f"W&B project {project}, group {group} (https://wandb.ai, Projects -> {project} -> group by Group): the "
            f"runs {runs}, each with its training curves (train/*) and its pass@k (eval/<benchmark>/pass@k "
            f"tables and curves, eval/<benchmark>/pass@1 in the summary); the run 'report' holds the report's "
            "tables and report/runs_vs_paper, your runs beside the paper's rows (paper/passk)"
        )

    def _config(self, relative: str) -> str:
        return str(self.repo / relative)

    def command(self, stage: str, variant: str | None = None) -> list[str]:
        """``[python, -m, sage_unsloth.<stage>, CONFIG, --key, value, ...]`` for one stage; ``variant`` names
        the RLVR variant (rlvr) or the evaluated run (eval: sft or a variant)."""
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r} is unknown: choose one of {', '.join(STAGES)}")
        if stage == "sft":
            config = self._config(self.platform.sft_config)
            args = [
                *self.platform.sft_overrides,
                "--model_name_or_path",
                self.model,
                "--output_root",
                str(self.outputs),
                "--max_steps",
                str(self.sft_steps),
                "--report_to",
                self.report_to,
            ]
            # Tokenise only what the run can use (the hub split has ~19k rows; about half pass the filters).
            args += (
                ["--dataset_path", str(self.sft_data)]
                if self.sft_data
                else ["--dataset_max_rows", str(max(200, 8 * self.sft_steps))]
            )
        elif stage == "rlvr":
            if variant not in self.variants:
                raise ValueError(f"variant {variant!r}: choose one of {', '.join(self.variants)}")
            config = self._config(f"{self.platform.rlvr_configs}/{variant}.yaml")
            args = [
                "--sft_dir",
                str(self.sft_dir),
                "--output_root",
                str(self.outputs),
                "--max_steps",
                str(self.steps),
                "--report_to",
                self.report_to,
                # Two prompts per optimizer step (generation_batch_size 8, 4 rollouts each).
                "--max_train_rows",
                str(max(64, 2 * self.steps)),
                # A checkpoint every fifth of the run: a session that ends part-way resumes from there.
                "--save_steps",
                str(max(5, self.steps // 5)),
            ]
            if self.rlvr_data:
                args += ["--dataset_path", str(self.rlvr_data)]
        elif stage == "eval":
            runs = dict(self.eval_runs())
            if variant not in runs:
                raise ValueError(f"eval run {variant!r}: choose one of {', '.join(runs)}")
            # One checkpoint per call: each gets its own process (a vLLM engine keeps its memory in-process).
            config = self._config(self.platform.eval_config)
            args = [
                "--checkpoints",
                str(runs[variant]),
                "--n",
                str(self.n_samples),
                "--limit",
                str(self.problems_per_benchmark),
                "--results_dir",
                str(self.results),
                "--outputs_dir",
                str(self.outputs),
                "--report_to",
                self.report_to,  # wandb: into the W&B run that trained the checkpoint
            ]
        else:
            pairs = ",".join(f"{v}:grpo" for v in self.variants if v != "grpo") + ",grpo:sft"
            config = self._config("configs/report/default.yaml")
            args = ["--results", str(self.results), "--pairs", pairs.lstrip(",")]
            if self.report_to == "wandb":  # the report and the paper's tables beside the runs, in their group
                group = os.environ.get("WANDB_RUN_GROUP") or self.model_short
                args += ["--wandb_project", self.env()["WANDB_PROJECT"], "--wandb_group", group]
        return stage_command(stage, config, *args, *self.extra.get(stage, []))

    def output_of(self, stage: str, variant: str | None = None) -> Path | None:
        """The folder whose manifest.json marks the stage finished (None: the stage always reruns)."""
        if stage == "sft":
            return self.sft_dir
        if stage == "rlvr":
            return self.rlvr_dir(variant)
        return None  # eval resumes chunk by chunk by itself; the report is cheap

    def _resumes(self, stage: str, variant: str | None) -> Path | None:
        """The newest complete checkpoint a training stage that stopped part-way continues from (None: none)."""
        from sage_unsloth.runtime.checkpoints import last_complete_checkpoint

        done = self.output_of(stage, variant)
        if done is None or stage == "eval" or (done / MANIFEST_NAME).is_file():
            return None
        return last_complete_checkpoint(done)

    def step(self, stage: str, variant: str | None = None):
        """A training stage as a step of the kit's job graph (sage_unsloth/jobs): done when its stamp in
        ``<workdir>/steps/`` holds its inputs' fingerprint and its folder a manifest; None for eval and report,
        which run every time (an evaluation resumes chunk by chunk by itself; the report is cheap)."""
        from sage_unsloth.config.args import config_files
        from sage_unsloth.jobs import Step

        folder = self.output_of(stage, variant)
        if folder is None:
            return None
        command = self.command(stage, variant)
        name = f"{stage}_{variant}" if variant else stage
        after = (layout.SFT_RUN,) if stage == "rlvr" else ()
        return Step(name, command, (folder,), after=after, configs=config_files(command[3]), code=None,
                    done_file=MANIFEST_NAME, keep=True, kind=stage)  # fmt: skip

    def run(self, stage: str, variant: str | None = None) -> None:
        """Run one stage in this cell, its output streamed; skipped when the job graph says it is done (same
        inputs, manifest written), continued from its newest complete checkpoint when it stopped part-way
        (``--resume true``: the same inputs), refused in one line when its folder holds another command's run."""
        from sage_unsloth.jobs import fingerprint, stamp_folder
        from sage_unsloth.jobs.graph import run_here

        command = self.command(stage, variant)
        resume = ["--resume", "true"] if self._resumes(stage, variant) is not None else []
        start = lambda: run_stage(command + resume, cwd=self.workdir, env=self.env())
        step = self.step(stage, variant)
        if step is None:
            start()
            return
        upstream = {name: fingerprint(self.step(name), {}) for name in step.after}
        run_here(step, fingerprint(step, upstream), stamp_folder(self.workdir), start)

    def progress(self) -> str:
        """Where each stage of this run stands in its work folder: finished, resumes from checkpoint-N, evaluation
        chunks on disk, or not started."""
        lines = [f"work folder {self.workdir}"]
        for stage, variant in [("sft", None), *(("rlvr", v) for v in self.variants)]:
            folder = self.output_of(stage, variant)
            if (folder / MANIFEST_NAME).is_file():
                state = "finished"
            elif (checkpoint := self._resumes(stage, variant)) is not None:
                state = f"stopped part-way: resumes from {checkpoint.name}"
            else:
                state = "not started"
            lines.append(f"{stage} {variant or ''}".rstrip() + f": {state} ({folder})")
        for run, _ in self.eval_runs():
            chunks = list(
                layout.completions_dir(self.outputs, self.model_short, run).glob("*/chunk_*.jsonl.gz")
            )
            passk = (self.results / self.model_short / run / "passk.csv").is_file()
            state = "finished" if passk else f"{len(chunks)} chunks sampled" if chunks else "not started"
            lines.append(f"eval {run}: {state}")
        return "\n".join(lines)

    def describe(self) -> str:
        gpus = ", ".join(f"{g.name} ({g.memory_mib} MiB, sm_{g.compute_capability:g})" for g in self.gpus)
        lines = [
            f"platform {self.platform.name}: {self.platform.hardware}",
            f"GPU {gpus or 'none'}",
            f"model {self.model}",
            f"work folder {self.workdir}",
        ]
        for stage in STAGES:
            variants = {"rlvr": self.variants, "eval": [name for name, _ in self.eval_runs()]}.get(
                stage, (None,)
            )
            for variant in variants:
                lines.append("$ " + shlex.join(["python", *self.command(stage, variant)[1:]]))
        return "\n".join(lines)


def prepare_tiny(workdir: Path, math500: Path, *, sft_rows: int = 8) -> tuple[Path, Path]:
    """CI only: the tiny offline model and a few MATH-500 rows in SFT shape (short numeric ones)."""
    from sage_unsloth.model.tiny import build_tiny_model
    from sage_unsloth.sft.data import math500_as_sft_rows, write_jsonl

    model_dir = workdir / TINY_MODEL_DIR
    if not (model_dir / "config.json").is_file():
        build_tiny_model(model_dir, seed=0)
    rows = math500_as_sft_rows(math500, limit=sft_rows, numeric_only=True, max_solution_chars=250)
    return model_dir, write_jsonl(rows, workdir / "data" / "sft_rows.jsonl")


def make_recipe(
    platform: str,
    *,
    repo: str | Path,
    workdir: str | Path,
    model: str = "",
    steps: int,
    sft_steps: int,
    n_samples: int,
    problems_per_benchmark: int,
    report_to: str = "none",
    tiny: bool = False,
) -> Recipe:
    """Check the parameters and build the recipe. ``tiny`` swaps in the CPU presets, the tiny model
    (built here) and the bundled data files; otherwise a GPU must be visible."""
    if platform not in PLATFORMS or platform == "tiny":
        raise ValueError(f"PLATFORM={platform!r}: use 'colab' or 'kaggle'")
    for name, value in (
        ("STEPS", steps),
        ("SFT_STEPS", sft_steps),
        ("N_SAMPLES", n_samples),
        ("PROBLEMS_PER_BENCHMARK", problems_per_benchmark),
    ):
        if int(value) < 1:
            raise ValueError(f"{name}={value}: must be at least 1")
    if report_to not in ("none", "wandb"):
        raise ValueError(f"report_to={report_to!r}: use 'none' or 'wandb'")
    repo = Path(repo).resolve()
    if not (repo / "pyproject.toml").is_file() or not (repo / "configs").is_dir():
        raise FileNotFoundError(f"REPO_DIR={repo} is not a sage-unsloth checkout: set REPO_DIR or REPO_URL")
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    common = {
        "repo": repo,
        "workdir": workdir,
        "steps": int(steps),
        "sft_steps": int(sft_steps),
        "n_samples": int(n_samples),
        "problems_per_benchmark": int(problems_per_benchmark),
        "report_to": report_to,
    }
    if tiny:
        from sage_unsloth.data import verified_path

        model_dir, sft_rows = prepare_tiny(workdir, verified_path("math500.jsonl"))
        return Recipe(
            platform=PLATFORMS["tiny"],
            model=str(model_dir),
            sft_data=sft_rows,
            rlvr_data=verified_path("dapo_math_sample.jsonl"),
            **common,
        )
    gpus = gpu_info()
    problems = platform_problems(gpus)
    if problems:
        raise RuntimeError(problems[0] if len(problems) == 1 else "; ".join(problems))
    if not model:
        raise ValueError("MODEL is empty: set a hub id such as Qwen/Qwen2.5-1.5B")
    return Recipe(platform=PLATFORMS[platform], model=model, gpus=gpus, **common)


# ----------------------------------------------------------------------------------------------- W&B
def wandb_api_key(name: str = "WANDB_API_KEY") -> str:
    """The W&B key from Colab's or Kaggle's secrets, else a hidden prompt. Returned, never printed or
    written; pass it to the stages through the environment (``wandb.login`` would store it in ~/.netrc)."""
    key = os.environ.get(name, "")
    if not key:
        try:
            from google.colab import userdata  # type: ignore[import-not-found]

            key = userdata.get(name) or ""
        except Exception:  # noqa: BLE001 - not on Colab, or the secret is missing / not granted
            key = ""
    if not key:
        try:
            from kaggle_secrets import UserSecretsClient  # type: ignore[import-not-found]

            key = UserSecretsClient().get_secret(name) or ""
        except Exception:  # noqa: BLE001 - not on Kaggle, or the secret is missing
            key = ""
    if not key:
        import getpass

        key = getpass.getpass(f"{name} (hidden; empty to skip W&B): ").strip()
    return key


# ----------------------------------------------------------------------------------------------- report
def report_tables(recipe: Recipe):
    """From the report stage's CSVs: (one row per run, a "value [CI]" column per dataset and k; the paired
    differences). Formatting only: every number comes from the report stage."""
    import pandas as pd

    assets = recipe.report_md.with_suffix("")
    comparison = pd.read_csv(assets / "comparison.csv")
    k = comparison["k"].map(lambda v: "?" if pd.isna(v) else str(int(v)))
    cell = [
        ("missing" if pd.isna(v) else f"{v:.3f}" + ("" if pd.isna(lo) else f" [{lo:.3f}, {hi:.3f}]"))
        for v, lo, hi in zip(comparison["value"], comparison["ci_low"], comparison["ci_high"])
    ]
    frame = comparison.assign(column=comparison["dataset"] + " pass@" + k, cell=cell)
    table = frame.pivot_table(index="run", columns="column", values="cell", aggfunc="first", sort=False)
    order = [name for name, _ in recipe.eval_runs() if name in table.index]
    table = table.reindex(order + [name for name in table.index if name not in order])
    pairs = pd.read_csv(assets / "pairs.csv")[
        ["run_a", "run_b", "dataset", "metric", "k", "diff", "ci_low", "ci_high"]
    ]
    return table, pairs


def show_report(recipe: Recipe) -> None:
    """Display the pass@k table, the paired differences and the pass@k plots in the notebook."""
    from IPython.display import Image, Markdown, display

    table, pairs = report_tables(recipe)
    display(Markdown(f"**pass@k** with 95% bootstrap CIs over problems (full report: `{recipe.report_md}`)"))
    display(table)
    if not pairs.empty:
        display(Markdown("**Paired differences** (A − B, bootstrap CI over problems)"))
        display(pairs.round(3))
    for png in sorted(recipe.report_md.with_suffix("").glob("*.png")):
        display(Markdown(f"`{png.name}`"))
        display(Image(filename=str(png)))
