"""The layout of tests/ (tests/README.md): every test file in the folder of the area it tests, as
scripts/test_layout.py maps it, and each test module's name unique (the folders share one sys.path)."""

import importlib.util
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _layout():
    spec = importlib.util.spec_from_file_location("test_layout_script", REPO / "scripts" / "test_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_test_file_lives_in_the_folder_the_map_gives_it():
    layout = _layout()
    assert layout.unplaced() == []
    assert sorted(p.name for p in (REPO / "tests").glob("*.py")) == ["conftest.py"]  # nothing left flat
    for new in layout.moves().values():
        assert (REPO / new).is_file(), (
            f"{new}: in the map but not in tests/ (remove it from scripts/test_layout.py)"
        )


def test_a_test_file_outside_the_map_is_named(tmp_path, monkeypatch):
    layout = _layout()
    (tmp_path / "tests" / "rlvr").mkdir(parents=True)
    (tmp_path / "tests" / "conftest.py").write_text("")
    (tmp_path / "tests" / "rlvr" / "test_rlvr_trainer.py").write_text("")
    (tmp_path / "tests" / "test_new_feature.py").write_text("")
    monkeypatch.setattr(layout, "REPO", tmp_path)
    assert layout.unplaced() == ["tests/test_new_feature.py"]


def test_each_test_module_name_is_unique():
    names = Counter(p.stem for p in (REPO / "tests").rglob("*.py") if "fixtures" not in p.parts)
    assert [name for name, n in names.items() if n > 1] == []


# The suite's own worker rules (tests/conftest.py worker_group and run_order), on a small suite with the kit's
# hooks, under `make test`'s options (pytest -n 2 --dist loadgroup) and in one process:
# - the tests that read one module-scoped fixture run on one worker, so a trained run is built once. pytest-xdist
#   3.8 groups by renaming the test's node id, which pytest 9.2 no longer honours (pytest-dev/pytest-xdist#1386):
#   every group was then split over the workers silently and its fixture built twice (pytest pinned in pyproject);
# - units that are slow start first; a unit holding a test marked unsloth_in_process runs last in its process,
#   its unmarked tests before its marked one.
LOGGED = """\
import os
from pathlib import Path

import pytest


def ran(name):
    with open(Path(__file__).parent / "ran.txt", "a") as fh:
        fh.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + " " + name + "\\n")
"""
SUITE = {
    "test_free.py": LOGGED
    + """
@pytest.mark.parametrize("i", range(6))
def test_free(i):
    ran("free")
""",
    "test_shared.py": LOGGED
    + """
@pytest.fixture(scope="module")
def trained():
    return "built once"


@pytest.mark.parametrize("i", range(6))
def test_reads_the_module_run(trained, i):
    ran("shared")
""",
    "test_heavy.py": LOGGED
    + """
@pytest.mark.slow
@pytest.mark.parametrize("i", range(2))
def test_heavy(i):
    ran("heavy")
""",
    "test_patched.py": LOGGED
    + """
@pytest.fixture(scope="module")
def trainer():
    return "built once"


@pytest.mark.unsloth_in_process
def test_imports_unsloth(trainer):
    ran("marked")


def test_reads_the_trainer(trainer):
    ran("unmarked-of-marked-module")
""",
}
KIT_HOOKS = f"""\
import importlib.util

_spec = importlib.util.spec_from_file_location("kit_conftest", {str(REPO / "tests" / "conftest.py")!r})
_kit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kit)
pytest_collection_modifyitems, pytest_configure = _kit.pytest_collection_modifyitems, _kit.pytest_configure
"""


def _run_suite(folder, *options) -> list[tuple[str, str]]:
    import subprocess
    import sys

    folder.mkdir()
    (folder / "conftest.py").write_text(KIT_HOOKS)
    for name, text in SUITE.items():
        (folder / name).write_text(text)
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", *options, str(folder)]
    done = subprocess.run(
        [sys.executable, *args], check=False, cwd=folder, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [tuple(line.split()) for line in (folder / "ran.txt").read_text().splitlines()]


def test_the_suite_groups_and_orders_its_units_on_two_workers_and_in_one_process(tmp_path):
    ran = _run_suite(tmp_path / "xdist", "-n", "2", "--dist", "loadgroup")
    assert len(ran) == 16
    shared = {worker for worker, name in ran if name == "shared"}
    assert len(shared) == 1, f"one group ran on {sorted(shared)}"
    for worker in {w for w, _ in ran}:
        names = [name for w, name in ran if w == worker]
        assert names[0] == "heavy", names  # each worker starts with a slow unit
        if "marked" in names:
            assert names[-2:] == ["unmarked-of-marked-module", "marked"], names  # nothing after it
    alone = [name for _, name in _run_suite(tmp_path / "one")]
    assert alone[:2] == ["heavy", "heavy"] and alone[-2:] == ["unmarked-of-marked-module", "marked"]
