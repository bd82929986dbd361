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
