"""The Registry (sage_unsloth/registry.py): names, import paths, argument checks, one-line errors."""

from __future__ import annotations

import textwrap

import pytest

from sage_unsloth.config_args import ConfigError
from sage_unsloth.registry import Registry


def _registry() -> Registry:
    reg = Registry("guide", field="sage_guide", meta={"needs": ()})

    @reg.register("flat", needs=("entropies",))
    def flat(signals, *, scale=1.0, shift):
        return signals * scale + shift

    return reg


def test_resolve_name_and_meta():
    entry = _registry().resolve("flat")
    assert entry.name == "flat" and entry.registered
    assert entry.meta == {"needs": ("entropies",), "aliases": None}  # every kind declares aliases


def test_unknown_name_suggests_and_names_field():
    with pytest.raises(ConfigError, match=r"sage_guide='flot' is unknown: did you mean 'flat'\?"):
        _registry().resolve("flot")


def test_register_twice_refused():
    reg = _registry()
    with pytest.raises(ValueError, match="registered already"):
        reg.add("flat", lambda s: s)
    with pytest.raises(ValueError, match="unknown metadata"):
        reg.add("other", lambda s: s, needz=())


def test_bind_checks_signature():
    reg = _registry()
    entry = reg.resolve("flat")
    assert reg.bind(entry, {"shift": 2.0, "scale": 3.0})(1.0) == 5.0
    with pytest.raises(
        ConfigError, match=r"sage_guide_args: guide 'flat' has no argument 'scal': did you mean 'scale'\?"
    ):
        reg.bind(entry, {"scal": 1.0, "shift": 0.0})
    with pytest.raises(ConfigError, match=r"sage_guide_args: guide 'flat' needs 'shift'"):
        reg.bind(entry, {})


def test_import_path_module_and_file(tmp_path, monkeypatch):
    plugin = tmp_path / "my_guides.py"
    plugin.write_text(
        textwrap.dedent(
            """
            def half(signals, *, k=0.5):
                return signals * k
            half.needs = ("logps",)

            class Counter:
                def __init__(self, start=0):
                    if start < 0:
                        raise ValueError("start must be >= 0")
                    self.n = start
                def __call__(self, signals):
                    self.n += 1
                    return self.n
            """
        )
    )
    reg = _registry()
    by_file = reg.resolve(f"{plugin}:half")
    assert not by_file.registered and by_file.meta == {"needs": ("logps",), "aliases": None}
    assert reg.bind(by_file, {"k": 2.0})(3.0) == 6.0
    monkeypatch.syspath_prepend(str(tmp_path))
    by_module = reg.resolve("my_guides:Counter")
    assert by_module.meta == {"needs": (), "aliases": None}  # no attribute: the declared default
    counter = reg.bind(by_module, {"start": 5})
    assert counter(None) == 6 and counter(None) == 7  # a class keeps state between calls
    with pytest.raises(
        ConfigError, match="sage_guide_args: guide 'my_guides:Counter' refused its arguments: start"
    ):
        reg.bind(by_module, {"start": -1})
    with pytest.raises(ConfigError, match="has no 'hlaf': did you mean 'half'"):
        reg.resolve("my_guides:hlaf")
    with pytest.raises(ConfigError, match="cannot import module 'no_such_mod'"):
        reg.resolve("no_such_mod:f")
    with pytest.raises(ConfigError, match="no file"):
        reg.resolve(f"{tmp_path}/missing.py:f")
