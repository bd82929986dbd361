# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # SAGE on a free GPU: SFT → GRPO / GRPO + Branch → pass@k → report
#
# This notebook runs the sage-unsloth recipe end to end on one 16 GB GPU, at a small scale:
#
# 1. **SFT**: a rank-8 LoRA teaches the base model the paper's format
#    (`<start_working_out>…<end_working_out><SOLUTION>…</SOLUTION>`), on `unsloth/OpenMathReasoning-mini`;
# 2. **RLVR**: from that adapter, two runs on DAPO-Math: **GRPO** (KL to the SFT model) and **GRPO + Branch**
#    (SAGE: the KL anchor is `q · π_ref`, `q` raised where the policy's token entropy is high);
# 3. **pass@k** of the three checkpoints on a subset of MATH-500 and AMC23, sampled with vLLM;
# 4. **report**: pass@k with bootstrap CIs, paired differences, pass@k curves.
#
# Every stage runs as `python -m sage_unsloth.<stage> CONFIG --key value` in its own process (the exact
# command is printed above its output), so the notebook holds no recipe logic, and each stage gives the GPU
# back before the next starts. The presets are in `configs/` with their memory estimates.
#
# With the default parameters this is a **smoke-scale run**: a few dozen RL steps move a LoRA very little,
# so expect GRPO and GRPO + Branch to be within noise of each other. Raise `STEPS` for a real comparison.

# %% [markdown] tags=["only-colab"]
# **Colab, Qwen2.5-1.5B.** *Runtime → Change runtime type → T4 GPU* (or better; runtime version *Latest*, whose
# driver runs CUDA 13). The T4 has 15 GB usable and no bfloat16,
# so everything runs in float16: SFT and RLVR train a 16-bit LoRA (`configs/sft/qwen2.5-1.5b.yaml` with
# float16 overrides, `configs/rlvr/qwen2.5-1.5b/`), RLVR samples with Unsloth's vLLM engine taking half the
# card, evaluation uses vLLM alone (`configs/eval/notebook-qwen2.5-1.5b.yaml`). A W&B key, if you use one,
# goes in the Colab secrets (key icon) as `WANDB_API_KEY`.

# %% [markdown] tags=["only-kaggle"]
# **Kaggle, Qwen2.5-3B.** *Settings → Accelerator → GPU T4 x2* (the stages use one of them), *Settings →
# Environment → Always use latest environment* (its driver runs CUDA 13), *Settings → Internet → on* (models and
# data come from the Hugging Face Hub). Not the **P100**: the pinned torch 2.13 and vLLM 0.31 are CUDA 13 builds
# with kernels for compute capability 7.5 and newer only, and the P100 is 6.0 (the install cell stops there).
# 3B in 16 bits plus vLLM does not fit 16 GB, so SFT and RLVR train a QLoRA (4-bit base;
# `configs/sft/qwen2.5-3b.yaml` with overrides, `configs/rlvr/qwen2.5-3b/`); evaluation serves the adapters on
# the float16 base with vLLM (`configs/eval/notebook-qwen2.5-3b.yaml`). The kit can also come from a Kaggle
# dataset holding the repository folder (*Add data*), found under `/kaggle/input` without setting anything.
# A W&B key, if you use one, goes in *Add-ons → Secrets* as `WANDB_API_KEY`.

# %% [markdown]
# ## 0. The GPU and its driver
#
# Before anything else: the pinned torch 2.13 and vLLM 0.31 are CUDA 13 builds, which need an NVIDIA driver of at
# least 580. On an older driver (Colab's T4 image has been reported on 550) this cell installs NVIDIA's CUDA
# forward-compatibility package (`cuda-compat-13-0`, made for data-centre GPUs such as the T4), checks in a fresh
# process that CUDA 13 starts through it, and points every stage of this notebook at it; where that cannot work it
# stops with the one thing to do. The code is the kit's `sage_unsloth/doctor/driver.py`, copied here by
# `notebooks/build.py` because the kit is not installed yet (docs/troubleshooting.md, "The NVIDIA driver").

# %% tags=["driver-check"]
# notebooks/build.py writes sage_unsloth/doctor/driver.py here, then runs first_contact()

# %% [markdown]
# ## 1. Parameters
#
# What you set:
#
# - **`REPO_URL`** or **`REPO_DIR`**: where the kit comes from. The kit has no package on PyPI; give the git URL
#   of a repository holding it (it is cloned into `./sage-unsloth`), or upload the repository folder and set
#   `REPO_DIR` to it. Left empty, the folder above this notebook is used when it is a checkout.
# - **`STEPS`**, **`SFT_STEPS`**, **`N_SAMPLES`**, **`PROBLEMS_PER_BENCHMARK`**: the budget (times below are
#   rough estimates, not measurements).
# - **`USE_WANDB`**: log training to Weights & Biases. The key is read from the platform's secrets (or asked
#   for, hidden) and handed to the stages through the environment only: it is never printed or written to disk.
#
# - **`WORKDIR`**, **`USE_DRIVE`**: where everything lands (`outputs/` for adapters and checkpoints, `results/` for
#   pass@k CSVs and the report). Left empty: on Colab your Google Drive (`USE_DRIVE`, it asks once for access),
#   so that a disconnect loses nothing; on Kaggle `/kaggle/working`, kept with the notebook's output.
#
# Running the notebook again with the same `WORKDIR` skips finished stages, continues an interrupted RL run from
# its newest checkpoint and resumes evaluation (section 4b).

# %% tags=["parameters"]
import os

PLATFORM = "colab"  # written by notebooks/build.py: which configs/ presets to use (colab | kaggle)
MODEL = "Qwen/Qwen2.5-1.5B"  # base model, a Hugging Face hub id
SFT_STEPS = 100  # stage 1 optimizer steps, one example each (~5 min, estimate)
STEPS = 30  # stage 2 optimizer steps per RLVR run, 2 prompts x 4 rollouts each (~10-20 min per run)
N_SAMPLES = 8  # stage 3 samples per problem: pass@k for k = 1, 2, 4, 8
PROBLEMS_PER_BENCHMARK = 30  # stage 3 problems taken from each of MATH-500 and AMC23
WORKDIR = ""  # outputs/ and results/ go here; empty: Drive (Colab, USE_DRIVE), /kaggle/working (Kaggle), else ./
USE_DRIVE = True  # Colab: keep WORKDIR on your Google Drive, so that a disconnect loses nothing
REPO_URL = ""  # set it to the git URL of your copy of sage-unsloth (not on PyPI), unless a checkout is found
REPO_DIR = ""  # a checkout; empty: the folder above this notebook, ./sage-unsloth, or a /kaggle/input dataset
INSTALL = True  # pip install the GPU lock (torch, Unsloth, vLLM, bitsandbytes... at tested versions), then the kit
USE_WANDB = False  # log training curves to Weights & Biases
TINY = os.environ.get("SAGE_NOTEBOOK_TINY") == "1"  # CI only: the tiny offline model on CPU

if TINY:  # CI: the whole recipe on CPU in about a minute: tiny random model, 2 steps, 2 problems, no install
    SFT_STEPS, STEPS, N_SAMPLES, PROBLEMS_PER_BENCHMARK = 2, 2, 2, 2
    INSTALL, USE_WANDB = False, False
    WORKDIR = os.environ.get("SAGE_NOTEBOOK_WORKDIR", WORKDIR)

# %% [markdown]
# ## 2. Install
#
# Finds the repository (`REPO_DIR`, the folder above this notebook, `./sage-unsloth`, a dataset under
# `/kaggle/input`) or clones `REPO_URL`. Then, **before installing anything**, checks the GPU: compute capability
# 7.5 or newer (T4, L4, A10, A100, H100...) and an NVIDIA driver of at least 580, which the CUDA 13 builds of the
# pinned torch 2.13 and vLLM 0.31 need; a problem stops the cell with what to change. Then
# `pip install -r requirements/gpu-py3.X-lock.txt` (X: this runtime's Python, 3.11 or 3.12) installs exactly the
# tested set (torch, the torchvision built for it, transformers, TRL, Unsloth, vLLM, bitsandbytes and all they
# need; 3.6 to 4.8 GiB of downloads, docs/install.md), then `pip install --no-deps -e <repo>` the kit, and checks that
# torch and torchvision import as a pair (Colab's own torchvision would not). A read-only folder (a Kaggle dataset) is
# copied to `./sage-unsloth` first. The stages run in fresh processes, so the new packages are used without a
# restart; if the platform still asks for one, restart and run all cells again with `INSTALL = False`.

# %%
import shutil
import subprocess
import sys
from pathlib import Path

kaggle = sorted(Path("/kaggle/input").glob("*")) + sorted(Path("/kaggle/input").glob("*/*"))  # a dataset upload
candidates = [Path(REPO_DIR)] if REPO_DIR else [Path.cwd().parent, Path("sage-unsloth"), *kaggle]
REPO = next((p.resolve() for p in candidates if (p / "pyproject.toml").is_file() and (p / "sage_unsloth").is_dir()),
            None)
if REPO is None and REPO_URL:
    REPO = Path(REPO_DIR or "sage-unsloth").resolve()
    subprocess.run(["git", "clone", "--depth", "1", REPO_URL, str(REPO)], check=True)
if REPO is None:
    raise FileNotFoundError("set REPO_URL (parameters cell) to the git URL of your copy of sage-unsloth, or upload "
                            "the repository folder and set REPO_DIR to it")
sys.path.insert(0, str(REPO))  # this kernel started before the install; the stages' processes need no help
from sage_unsloth.jobs import notebook as nb

if not TINY:
    nb.preflight()  # compute capability >= 7.5 and driver >= 580, or stop here with what to change
if INSTALL and not os.access(REPO, os.W_OK):
    REPO = Path(shutil.copytree(REPO, "sage-unsloth", dirs_exist_ok=True)).resolve()
if INSTALL:
    nb.install(REPO)
print("sage-unsloth from", REPO)

# %% [markdown]
# ## 3. Weights & Biases (optional)
#
# With `USE_WANDB = True` the key is looked up in the Colab / Kaggle secrets as `WANDB_API_KEY`, else asked for
# with a hidden prompt. It is kept in this kernel's environment, which the stage processes inherit; nothing
# prints it and `wandb login` (which would save it to `~/.netrc`) is not used. Runs go to project
# `sage-unsloth` unless `WANDB_PROJECT` is set, in one group per model (`WANDB_RUN_GROUP` to change it): one
# run per training stage (its curves under `train/`), into which stage 3 logs that checkpoint's pass@k
# (`eval/<benchmark>/pass@k`), and a `report` run with the paper's tables beside yours (`report/runs_vs_paper`).
# If this runtime is recycled, the report can be rebuilt from W&B alone:
# `sage-unsloth report --from_wandb ENTITY/sage-unsloth` (docs/stages.md, "W&B").

# %%
if USE_WANDB:
    key = nb.wandb_api_key()
    if key:
        os.environ["WANDB_API_KEY"] = key
    USE_WANDB, key = bool(key), None
print("W&B logging:", "on" if USE_WANDB else "off")

# %% [markdown]
# ## 4. The plan
#
# The exact command of every stage. You can run the same commands in a terminal, or on a bigger GPU with
# the paper's presets (`configs/*/qwen2.5-math-7b*`).

# %%
WORKDIR = nb.work_folder(PLATFORM, WORKDIR, use_drive=USE_DRIVE, tiny=TINY)
recipe = nb.make_recipe(PLATFORM, repo=REPO, workdir=WORKDIR, model=MODEL, steps=STEPS, sft_steps=SFT_STEPS,
                        n_samples=N_SAMPLES, problems_per_benchmark=PROBLEMS_PER_BENCHMARK,
                        report_to="wandb" if USE_WANDB else "none", tiny=TINY)
print(recipe.describe())

# %% [markdown]
# ## 4b. Resuming after a disconnect
#
# Colab and Kaggle end idle or long sessions. Reconnect, keep the same `WORKDIR` (on Colab it is on your Drive unless
# you set another) and run all cells again: a finished stage is skipped, an RL run that stopped part-way continues
# from its newest checkpoint (every `STEPS // 5` steps, at least 5) exactly as if it had not stopped, and
# evaluation samples only the problems it has not written yet. This cell shows where each stage stands.

# %%
print(recipe.progress())

# %% [markdown]
# ## 5. Stage 1: SFT
#
# LoRA r=8 on all attention and MLP projections, the official recipe's learning rate and schedule, cut to
# `SFT_STEPS` steps. Output: `outputs/<model>/sft/` (adapter, tokenizer with the kit's chat template, manifest).

# %%
recipe.run("sft")

# %% [markdown]
# ## 6. Stage 2: RLVR, GRPO and GRPO + Branch
#
# Both runs continue the SFT adapter with the same data, seed and budget; they differ only in `guide`
# (`none` vs `branch`). Reward: 1 when the `<SOLUTION>` answer matches (math-verify), else 0.

# %%
for variant in recipe.variants:
    recipe.run("rlvr", variant)

# %% [markdown]
# ## 7. Stage 3: pass@k on a subset
#
# `N_SAMPLES` completions per problem for `PROBLEMS_PER_BENCHMARK` problems of each benchmark, graded with
# math-verify; unbiased pass@k. One process per checkpoint. Output: `results/<model>/<run>/passk.csv`.

# %%
for run, _ in recipe.eval_runs():
    recipe.run("eval", run)

# %% [markdown]
# ## 8. Stage 4: report
#
# pass@1 and pass@k per run with 95% bootstrap CIs over problems, paired differences (GRPO + Branch − GRPO,
# GRPO − SFT) on the same resampled problems, and pass@k curves. The full report is `results/report.md`.

# %%
recipe.run("report")
nb.show_report(recipe)
print(recipe.wandb_where())

# %% [markdown]
# ## Next
#
# - Keep the results: they are in `WORKDIR` (Colab: on your Drive; Kaggle: under `/kaggle/working`, saved with
#   the notebook's output).
# - A real comparison needs far more RL steps and samples: the paper runs 1000 steps and pass@k up to k = 256
#   on Qwen2.5-Math-7B (`configs/rlvr/qwen2.5-math-7b/`, `configs/eval/qwen2.5-math-7b.yaml`).
