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


# The suite's own worker rule (tests/conftest.py worker_group): under `make test` (pytest -n 2 --dist loadgroup)
# the tests that read one module-scoped fixture run on one worker, so a trained run is built once. pytest-xdist
# 3.8 groups by renaming the test's node id, which pytest 9.2 no longer honours (pytest-dev/pytest-xdist#1386):
# every group was then split over the workers silently and its fixture built twice (pytest pinned in pyproject).
SHARED_MODULE = """\
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def trained():
    return "built once"


@pytest.mark.parametrize("i", range(6))
def test_reads_the_module_run(trained, i):
    with open(Path(__file__).parent / "grouped.txt", "a") as fh:
        fh.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_free(i):  # work for the other worker
    pass
"""
KIT_HOOK = f"""\
import importlib.util

_spec = importlib.util.spec_from_file_location("kit_conftest", {str(REPO / "tests" / "conftest.py")!r})
_kit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kit)
pytest_collection_modifyitems = _kit.pytest_collection_modifyitems
"""


def test_tests_sharing_a_module_fixture_run_on_one_worker(tmp_path):
    import subprocess
    import sys

    (tmp_path / "conftest.py").write_text(KIT_HOOK)
    (tmp_path / "test_shared.py").write_text(SHARED_MODULE)
    args = ["-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", str(tmp_path)]
    done = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    grouped = (tmp_path / "grouped.txt").read_text().split()
    assert len(grouped) == 6 and len(set(grouped)) == 1, f"one group ran on {sorted(set(grouped))}"
