"""The Colab / Kaggle notebooks: generated from one source without drift, their GPU presets parse through the
stages' own parsers, the stage runner, and both notebooks executed on CPU (tiny offline model, 2 steps)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from sage_unsloth.jobs import notebook as nb

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"


def _load_build():
    spec = importlib.util.spec_from_file_location("notebooks_build", NOTEBOOKS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()


def _cells(name: str) -> list[dict]:
    return json.loads((NOTEBOOKS / name).read_text())["cells"]


def _source(cell: dict) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


# ----------------------------------------------------------------------------------------------- generation
@pytest.mark.parametrize("platform", sorted(build.TARGETS))
def test_committed_notebook_is_what_the_source_generates(platform):
    committed = (NOTEBOOKS / build.TARGETS[platform]).read_text(encoding="utf-8")
    assert committed == build.build(platform), "run: python notebooks/build.py"


def test_notebooks_differ_only_in_platform_parameters_and_platform_cells():
    colab, kaggle = _cells(build.TARGETS["colab"]), _cells(build.TARGETS["kaggle"])
    params = {
        name: next(_source(c) for c in cells if "parameters" in c["metadata"].get("tags", []))
        for name, cells in (("colab", colab), ("kaggle", kaggle))
    }
    assert 'PLATFORM = "colab"' in params["colab"] and 'MODEL = "Qwen/Qwen2.5-1.5B"' in params["colab"]
    assert 'PLATFORM = "kaggle"' in params["kaggle"] and 'MODEL = "Qwen/Qwen2.5-3B"' in params["kaggle"]
    text = {  # the driver cell is the kit's own code, the same on both platforms (it names both)
        name: "\n".join(_source(c) for c in cells if build.DRIVER_TAG not in c["metadata"].get("tags", []))
        for name, cells in (("colab", colab), ("kaggle", kaggle))
    }
    assert (
        "Runtime → Change runtime type → T4" in text["colab"]
        and "Kaggle" not in text["colab"].split("## 1.")[0]
    )
    assert "GPU T4 x2" in text["kaggle"] and "Runtime → Change runtime type" not in text["kaggle"]
    assert len(colab) == len(kaggle)
    assert sum(_source(a) != _source(b) for a, b in zip(colab, kaggle)) == 2  # platform cell, parameters cell


def test_set_parameter_needs_exactly_one_assignment():
    assert build.set_parameter('A = "x"  # note\nB = 1', "A", "y") == 'A = "y"  # note\nB = 1'
    with pytest.raises(ValueError, match="exactly once"):
        build.set_parameter("B = 1", "A", "y")


def test_notebook_kernel_holds_no_recipe_logic():
    """Code cells call the package; none imports the training / inference stack into the kernel."""
    code = [_source(c) for c in _cells(build.TARGETS["colab"]) if c["cell_type"] == "code"]
    joined = "\n".join(code)
    for module in ("torch", "transformers", "trl", "unsloth", "vllm", "peft"):
        assert f"import {module}" not in joined and f"from {module}" not in joined
    assert 'recipe.run("sft")' in joined and 'recipe.run("rlvr", variant)' in joined
    assert 'recipe.run("eval", run)' in joined and 'recipe.run("report")' in joined
    # the first cell is the kit's driver rules, copied because the kit is not installed yet (tested in
    # tests/doctor/test_driver.py); every other cell is a few calls
    assert code[0] == build.driver_cell_source()
    assert max(len(c.splitlines()) for c in code[1:]) <= 25


# ----------------------------------------------------------------------------------------------- presets
def _recipe(platform: str, tmp_path: Path, gpus=()) -> nb.Recipe:
    return nb.Recipe(
        platform=nb.PLATFORMS[platform],
        repo=REPO,
        workdir=tmp_path,
        model=nb.PLATFORMS[platform].model,
        steps=40,
        sft_steps=100,
        n_samples=8,
        problems_per_benchmark=30,
        gpus=list(gpus),
    )


T4 = nb.GPU("Tesla T4", 15360, 7.5, "580.82.07")
P100 = nb.GPU("Tesla P100-PCIE-16GB", 16384, 6.0, "580.82.07")


@pytest.mark.parametrize(
    "gpus, wanted",
    [
        ([T4], []),
        ([nb.GPU("NVIDIA H100 80GB HBM3", 81559, 9.0, "590.44.01")], []),
        ([T4, T4], []),  # Kaggle's T4 x2: the stages use the first
        ([P100], ["compute capability 6", "GPU T4 x2 (not P100)"]),
        ([nb.GPU("Tesla V100-SXM2-16GB", 16384, 7.0, "580.82.07")], ["compute capability 7", ">= 7.5"]),
        (
            [nb.GPU("Tesla T4", 15360, 7.5, "550.54.15")],
            ["driver 550.54.15 is older than 580", "latest environment"],
        ),
        ([], ["no NVIDIA GPU visible", "T4 GPU"]),
    ],
)
def test_platform_problems_say_what_to_change(gpus, wanted):
    problems = nb.platform_problems(gpus)
    assert len(problems) == (1 if wanted else 0), problems
    for text in wanted:
        assert text in problems[0]


def test_preflight_stops_before_the_install(monkeypatch, capsys):
    monkeypatch.setattr(nb, "gpu_info", lambda: [P100])
    with pytest.raises(RuntimeError, match="compute capability 6"):
        nb.preflight()
    assert (
        "Tesla P100-PCIE-16GB, 16384 MiB, compute capability 6, driver 580.82.07" in capsys.readouterr().out
    )
    monkeypatch.setattr(nb, "gpu_info", lambda: [T4])
    assert nb.preflight() == [T4]


def test_install_cell_checks_the_gpu_before_pip_and_installs_the_gpu_extra():
    cell = next(_source(c) for c in _cells(build.TARGETS["kaggle"]) if "nb.install(REPO)" in _source(c))
    assert cell.index("nb.preflight()") < cell.index("nb.install(REPO)")
    message = cell.split("raise FileNotFoundError(")[1].split(")\n")[0]  # without a checkout: what to set
    assert "set REPO_URL" in message and "REPO_DIR" in message
    assert "/kaggle/input" in cell
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # Colab ships its own torchvision: the [gpu] extra installs the one built for the pinned torch.
    assert "torch==2.13.0" in project["optional-dependencies"]["gpu"]
    assert "torchvision==0.28.0" in project["optional-dependencies"]["gpu"]


def test_the_notebooks_install_the_gpu_lock_of_their_python(monkeypatch, tmp_path):
    """Colab runs Python 3.12, Kaggle 3.11: each installs requirements/gpu-py3.X-lock.txt, then the kit alone."""
    assert nb.gpu_lock(REPO, (3, 12)) == REPO / "requirements" / "gpu-py3.12-lock.txt"
    assert nb.gpu_lock(REPO, (3, 11)).name == "gpu-py3.11-lock.txt"
    with pytest.raises(
        RuntimeError, match=r"no GPU lock for Python 3.10: the kit has locks for Python 3.11, 3.12"
    ):
        nb.gpu_lock(REPO, (3, 10))
    calls = []

    def run(argv, **kwargs):
        calls.append(argv[3:])
        return __import__("subprocess").CompletedProcess(argv, 0, "2.13.0+cu130 0.28.0 13.0\n", "")

    monkeypatch.setattr(nb.subprocess, "run", run)
    nb.install(REPO)
    lock = str(nb.gpu_lock(REPO))
    assert calls[:2] == [["install", "-q", "-r", lock], ["install", "-q", "--no-deps", "-e", str(REPO)]]
    cell = next(_source(c) for c in _cells(build.TARGETS["colab"]) if "## 2. Install" in _source(c))
    assert "requirements/gpu-py3.X-lock.txt" in cell and "--no-deps" in cell


def _first_code_cell(name: str) -> str:
    return next(_source(c) for c in _cells(name) if c["cell_type"] == "code")


class FakeMachine:
    """What the first cell runs, answered: nvidia-smi's rows, apt, and the probe of the forward-compatibility
    libcuda in a fresh process (``probe``: cuInit's result and the driver API version it prints)."""

    def __init__(self, rows: str, probe: str = "0 13000"):
        self.rows, self.probe, self.commands = rows, probe, []

    def __call__(self, command, *args, **kwargs):
        import types

        self.commands.append(command[0] if command[0] != sys.executable else "probe")
        if command[0] == "nvidia-smi":
            return types.SimpleNamespace(returncode=0, stdout=self.rows, stderr="")
        out = self.probe if command[0] == sys.executable else ""
        return types.SimpleNamespace(returncode=0, stdout=out, stderr="")


@pytest.mark.parametrize(
    "rows, probe, wanted",
    [
        ("Tesla T4, 580.82.07\n", "", "runs CUDA 13"),
        ("NVIDIA H100 80GB HBM3, 590.44.01\nNVIDIA H100 80GB HBM3, 590.44.01\n", "", "runs CUDA 13"),
        ("Tesla T4, 550.54.15\n", "0 13000", "CUDA 13 runs through cuda-compat-13-0"),
        ("Tesla T4, 550.54.15\n", "803 12040", "does not load here .cuInit 803"),
        ("NVIDIA GeForce RTX 4090, 550.54.15\n", "", "update the NVIDIA driver to >= 580"),
        ("", "", "no NVIDIA GPU visible"),
    ],
)
def test_first_cell_runs_cuda_13_on_an_old_driver_or_says_the_one_thing(
    monkeypatch, capsys, rows, probe, wanted
):
    """The first code cell, run as the notebook runs it (the machine faked): on a driver older than 580 it installs
    NVIDIA's forward-compatibility package, checks it loads in a fresh process and puts it first on the stages'
    LD_LIBRARY_PATH; where it cannot, it stops with the one thing to do. nb.platform_problems (the install cell)
    then agrees."""
    import subprocess

    code = _first_code_cell(build.TARGETS["kaggle"])
    assert code == _first_code_cell(build.TARGETS["colab"]) and "nvidia-smi" in code
    monkeypatch.delenv("SAGE_NOTEBOOK_TINY", raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/lib64-nvidia")
    machine = FakeMachine(rows, probe)
    monkeypatch.setattr(subprocess, "run", machine)
    if "runs" in wanted:
        exec(code, {})  # noqa: S102 - the notebook's own cell
        assert wanted in capsys.readouterr().out
    else:
        with pytest.raises(RuntimeError, match=wanted):
            exec(code, {})  # noqa: S102
    compat_on = os.environ["LD_LIBRARY_PATH"].startswith("/usr/local/cuda-13.0/compat:")
    assert compat_on is ("cuda-compat" in wanted)
    assert ("apt-get" in machine.commands) is ("550" in rows and "GeForce" not in rows)
    gpus = [nb.GPU(r.split(",")[0], 15360, 7.5, r.split(",")[1].strip()) for r in rows.splitlines()]
    assert bool(nb.platform_problems(gpus)) is ("runs" not in wanted)


def test_unsloths_compile_cache_stays_off_google_drive(monkeypatch, tmp_path):
    """The stages run in WORKDIR; on Drive, Unsloth's generated trainers go to local disk instead
    (UNSLOTH_COMPILE_LOCATION, which unsloth_zoo's compiler reads: tests/kit/test_compat.py)."""
    monkeypatch.delenv("UNSLOTH_COMPILE_LOCATION", raising=False)
    drive = _recipe("colab", Path("/content/drive/MyDrive/sage_run"))
    assert drive.env()["UNSLOTH_COMPILE_LOCATION"] == "/content/unsloth_compiled_cache"
    assert (
        "UNSLOTH_COMPILE_LOCATION" not in _recipe("colab", tmp_path).env()
    )  # local WORKDIR: Unsloth's default
    assert not nb.on_drive("/content/drive-backup") and nb.on_drive("/content/drive")
    monkeypatch.setenv("UNSLOTH_COMPILE_LOCATION", "/mine")
    assert drive.env()["UNSLOTH_COMPILE_LOCATION"] == "/mine"  # the user's choice is kept


def test_a_local_run_writes_into_an_ignored_folder():
    """A notebook run on CPU (no Drive, no Kaggle) writes its work folder beside the notebook: git ignores it, so
    the clone stays clean (main 0298207 left an untracked notebooks/sage_run/)."""
    import subprocess

    repo = Path(build.__file__).resolve().parents[1]
    local = nb.work_folder("local", "", tiny=True)
    assert local == nb.DEFAULT_WORKDIR
    for where in (repo / "notebooks" / local / "stages" / "sft.json", repo / local / "results" / "x.csv"):
        done = subprocess.run(["git", "check-ignore", "-q", str(where)], cwd=repo, check=False)
        assert done.returncode == 0, f"{where.relative_to(repo)} is not ignored"


def test_work_folder_survives_a_disconnect(monkeypatch, tmp_path):
    import sys
    import types

    mounted = []
    colab = types.ModuleType("google.colab")
    colab.drive = types.SimpleNamespace(mount=mounted.append)
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    assert nb.work_folder("colab", "") == "/content/drive/MyDrive/sage_run" and mounted == ["/content/drive"]
    assert nb.work_folder("colab", "", use_drive=False) == "sage_run"
    assert nb.work_folder("colab", "mine") == "mine" and nb.work_folder("colab", "", tiny=True) == "sage_run"
    monkeypatch.setattr(nb, "KAGGLE_WORKING", str(tmp_path))
    assert nb.work_folder("kaggle", "") == f"{tmp_path}/sage_run"
    params = next(
        _source(c) for c in _cells(build.TARGETS["colab"]) if "parameters" in c["metadata"].get("tags", [])
    )
    assert 'WORKDIR = ""' in params and "USE_DRIVE = True" in params


def test_rerun_continues_an_interrupted_stage_from_its_checkpoint(monkeypatch, tmp_path):
    """A session that ended part-way: the same cell run again passes --resume true, and the record still names
    the stage's own command (the folder is not refused as written by another one)."""
    from sage_unsloth.jobs import recipe
    from sage_unsloth.runtime import checkpoints

    started = []
    run = _recipe("colab", tmp_path)
    folder = run.rlvr_dir("grpo")

    def stream(argv, **kw):  # the stage: its manifest, written last
        started.append(argv)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "manifest.json").write_text("{}")
        return 0, []

    monkeypatch.setattr(recipe, "stream", stream)
    run.run("rlvr", "grpo")
    assert "--resume" not in started[-1] and "--save_steps" in started[-1]
    (folder / "manifest.json").unlink()  # what the stopped run left: no manifest, a checkpoint
    (folder / "checkpoint-8").mkdir(parents=True)
    monkeypatch.setattr(checkpoints, "last_complete_checkpoint", lambda out: Path(out) / "checkpoint-8")
    assert "grpo: stopped part-way: resumes from checkpoint-8" in run.progress()
    run.run("rlvr", "grpo")
    assert started[-1][-2:] == ["--resume", "true"] and started[-1][:-2] == started[0]
    assert "sft: not started" in run.progress() and "eval grpo: not started" in run.progress()


@pytest.mark.parametrize("platform", ["colab", "kaggle"])
def test_gpu_preset_commands_parse_with_each_stages_parser(platform, tmp_path):
    gpu = T4
    from sage_unsloth.eval.run import parse_args as eval_parse
    from sage_unsloth.eval.run import validate as eval_validate
    from sage_unsloth.report.stage import parse_args as report_parse
    from sage_unsloth.rlvr.run import parse_args as rlvr_parse
    from sage_unsloth.sft.run import parse_args as sft_parse

    recipe = _recipe(platform, tmp_path, [gpu])
    assert recipe.env()["UNSLOTH_VLLM_NO_FLASHINFER"] == "1"  # the T4's sampler switch
    sft_args, model_args = sft_parse(recipe.command("sft")[3:])
    assert not sft_args.bf16 and not sft_args.fp16  # T4-safe: float16 weights, fp16 mixed precision
    assert model_args.model_name_or_path == nb.PLATFORMS[platform].model and model_args.dtype == "float16"
    assert model_args.load_in_4bit is (platform == "kaggle") and sft_args.max_steps == 100
    assert sft_args.dataset_max_rows == 800 and sft_args.backend == "unsloth"

    for variant in recipe.variants:
        grpo, stage, model, _ = rlvr_parse(recipe.command("rlvr", variant)[3:])
        assert stage.variant == variant and Path(stage.sft_dir) == recipe.sft_dir
        assert grpo.guide["name"] == ("branch" if variant == "grpo_branch" else "none") and grpo.beta == 0.05
        assert grpo.max_steps == 40 and model.dtype == "float16" and not grpo.bf16 and not grpo.fp16
        assert grpo.use_vllm and grpo.backend == "unsloth"
        assert model.load_in_4bit is (platform == "kaggle")
        # Unsloth's batch rule and TRL's generation batch rule hold without adjustment.
        assert (
            grpo.per_device_train_batch_size * grpo.gradient_accumulation_steps
        ) % grpo.num_generations == 0
        assert grpo.generation_batch_size % grpo.num_generations == 0
        assert grpo.steps_per_generation == grpo.gradient_accumulation_steps  # q from the in-loss policy
        assert stage.max_prompt_length + grpo.max_completion_length <= 32768  # Qwen2.5 base context

    for run, folder in recipe.eval_runs():
        cfg = eval_parse(recipe.command("eval", run)[3:])
        assert eval_validate(cfg) == [1, 2, 4, 8] and cfg.checkpoints == [str(folder)]
        assert cfg.limit == 30 and cfg.dtype == "float16" and cfg.backend == "vllm"
    report = report_parse(recipe.command("report")[3:])
    assert report.pairs == "grpo_branch:grpo,grpo:sft" and Path(report.results) == recipe.results


def test_make_recipe_checks_parameters_before_anything_runs(tmp_path):
    common = {
        "repo": REPO,
        "workdir": tmp_path,
        "steps": 2,
        "sft_steps": 2,
        "n_samples": 2,
        "problems_per_benchmark": 2,
    }
    with pytest.raises(ValueError, match="PLATFORM='paperspace'"):
        nb.make_recipe("paperspace", **common)
    with pytest.raises(ValueError, match="STEPS=0"):
        nb.make_recipe("colab", **{**common, "steps": 0})
    with pytest.raises(FileNotFoundError, match="REPO_DIR="):
        nb.make_recipe("colab", **{**common, "repo": tmp_path})
    if not nb.gpu_info():
        with pytest.raises(RuntimeError, match="no NVIDIA GPU"):
            nb.make_recipe("colab", **common)


def test_with_wandb_every_stage_logs_to_it_and_the_notebook_says_where(tmp_path, monkeypatch):
    """USE_WANDB: training and evaluation report to W&B (stage 3 into the runs that trained each checkpoint), the
    report logs itself and the paper's tables into the runs' group; the closing line names project, group, runs."""
    from sage_unsloth.eval.run import parse_args as eval_parse
    from sage_unsloth.report.stage import parse_args as report_parse

    for key in ("WANDB_PROJECT", "WANDB_RUN_GROUP"):
        monkeypatch.delenv(key, raising=False)
    recipe = _recipe("colab", tmp_path, [T4])
    assert eval_parse(recipe.command("eval", "grpo")[3:]).report_to == "none"
    assert report_parse(recipe.command("report")[3:]).wandb_project is None
    assert recipe.wandb_where().startswith("W&B is off")
    recipe.report_to = "wandb"
    monkeypatch.setenv("WANDB_MODE", "offline")  # the stages' key check
    command = recipe.command("rlvr", "grpo")
    assert command[command.index("--report_to") + 1] == "wandb"
    for run, _ in recipe.eval_runs():
        assert eval_parse(recipe.command("eval", run)[3:]).report_to == "wandb"
    report = report_parse(recipe.command("report")[3:])
    assert (report.wandb_project, report.wandb_group) == ("sage-unsloth", recipe.model_short)
    where = recipe.wandb_where()
    assert "project sage-unsloth" in where and f"group {recipe.model_short}" in where
    assert all(f"{recipe.model_short}/{run}" in where for run, _ in recipe.eval_runs())


def test_wandb_key_comes_from_the_environment_and_is_not_printed(monkeypatch, capsys):
    monkeypatch.setenv("WANDB_API_KEY", "secret-123")
    assert nb.wandb_api_key() == "secret-123"
    assert "secret-123" not in capsys.readouterr().out


def test_report_table_has_one_row_per_run_in_recipe_order(tmp_path):
    assets = tmp_path / "results" / "report"
    assets.mkdir(parents=True)
    (assets / "comparison.csv").write_text(
        "model,run,dataset,metric,k,value,ci_low,ci_high\n"
        "m,grpo_branch,math500,pass@1,1,0.25,0.1,0.4\n"
        "m,sft,math500,pass@1,1,0.125,0.0,0.3\n"
        "m,sft,math500,pass@k,8,,,\n"
    )
    (assets / "pairs.csv").write_text(
        "model,run_a,run_b,dataset,metric,k,diff,ci_low,ci_high,n_problems,status\n"
    )
    table, pairs = nb.report_tables(_recipe("colab", tmp_path))
    assert list(table.index) == ["sft", "grpo_branch"] and pairs.empty
    assert table.loc["grpo_branch", "math500 pass@1"] == "0.250 [0.100, 0.400]"
    assert table.loc["sft", "math500 pass@8"] == "missing"


# ----------------------------------------------------------------------------------------------- execution
@pytest.mark.slow
def test_both_notebooks_run_the_recipe_on_cpu_with_the_tiny_model(tmp_path):
    """Colab first (every stage runs), then Kaggle on the same work folder: its training stages are found
    finished and skipped, evaluation resumes, the report is rebuilt. Any failing cell fails the test."""
    import nbformat
    from nbclient import NotebookClient

    workdir = tmp_path / "run"
    env = {
        "SAGE_NOTEBOOK_TINY": "1",
        "SAGE_NOTEBOOK_WORKDIR": str(workdir),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "UNSLOTH_SKIP_TORCHVISION_CHECK": "1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    outputs = {}
    try:
        for platform in ("colab", "kaggle"):
            notebook = nbformat.read(NOTEBOOKS / build.TARGETS[platform], as_version=4)
            NotebookClient(
                notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
            ).execute()
            outputs[platform] = notebook
            if platform == "colab":
                manifests = {p: p.stat().st_mtime_ns for p in (workdir / "outputs").glob("*/*/manifest.json")}
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    runs = workdir / "outputs" / nb.TINY_MODEL_DIR
    assert {p.parent.name for p in manifests} == {"sft", "grpo", "grpo_branch"}
    assert json.loads((runs / "grpo_branch" / "manifest.json").read_text())["global_step"] == 2
    for run in ("sft", "grpo", "grpo_branch"):
        assert (workdir / "results" / nb.TINY_MODEL_DIR / run / "passk.csv").is_file()
    assert (workdir / "results" / "report.md").is_file()
    # The Kaggle run reused the finished training stages instead of training again.
    assert {p: p.stat().st_mtime_ns for p in manifests} == manifests

    def texts(notebook, mime):
        return [
            str(o.get("text", "")) + str(o.get("data", {}).get(mime, ""))
            for c in notebook.cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
        ]

    colab_text = "\n".join(texts(outputs["colab"], "text/plain"))
    assert "python -m sage_unsloth.sft" in colab_text and "python -m sage_unsloth.rlvr" in colab_text
    assert "[skip]" not in colab_text
    assert "\n".join(texts(outputs["kaggle"], "text/plain")).count("[skip]") == 3  # sft, grpo, grpo_branch
    for notebook in outputs.values():
        report_cell = next(c for c in notebook.cells if "nb.show_report(recipe)" in c.source)
        mimes = [m for o in report_cell.outputs for m in o.get("data", {})]
        assert "image/png" in mimes and "text/html" in mimes
        html = "\n".join(texts(notebook, "text/html"))
        assert "grpo_branch" in html and "pass@1" in html
