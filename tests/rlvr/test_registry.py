"""The Registry (sage_unsloth/plugins/registry.py): names, import paths, nodes, argument checks, one-line errors."""

from __future__ import annotations

import textwrap

import pytest

from sage_unsloth.config.args import ConfigError
from sage_unsloth.plugins.registry import Registry


def _registry() -> Registry:
    reg = Registry("guide", field="guide", meta={"needs": ()})

    @reg.register("flat", needs=("entropies",))
    def flat(signals, *, scale=1.0, shift):
        return signals * scale + shift

    return reg


def test_resolve_name_and_meta():
    entry = _registry().resolve("flat")
    assert entry.name == "flat" and entry.registered
    # every kind declares limits, a check across its arguments, and the TRL fields it reads
    assert entry.meta == {"needs": ("entropies",), "limits": None, "check": None, "trl_fields": None}


def test_unknown_name_suggests_and_names_field():
    with pytest.raises(ConfigError, match=r"guide='flot' is unknown: did you mean 'flat'\?"):
        _registry().resolve("flot")


def test_register_twice_refused():
    reg = _registry()
    with pytest.raises(ValueError, match="registered already"):
        reg.add("flat", lambda s: s)
    with pytest.raises(ValueError, match="unknown metadata"):
        reg.add("other", lambda s: s, needz=())


def test_node_checks_signature_and_fills_defaults():
    reg = _registry()
    node = reg.node({"name": "flat", "shift": 2.0, "scale": 3.0})
    assert reg.bind(node)(1.0) == 5.0
    assert reg.node({"name": "flat", "shift": 2.0}).args == {"scale": 1.0, "shift": 2.0}  # the default filled
    assert reg.node('{"name": "flat", "shift": 2.0}') == reg.node({"name": "flat", "shift": 2.0})
    with pytest.raises(
        ConfigError, match=r"^guide: guide 'flat' has no argument 'scal': did you mean 'scale'\?"
    ):
        reg.node({"name": "flat", "scal": 1.0, "shift": 0.0})
    with pytest.raises(
        ConfigError, match=r"^guide: guide 'flat' needs 'shift': e.g. guide: \{name: flat, shift"
    ):
        reg.node("flat")


def test_kit_args_limits_and_checks():
    """A kind's own keys (the kit reads them, a function receives them only if it names them), an entry's limits
    and a check across arguments, each one line naming the node's key."""
    from sage_unsloth.config.field_rules import Limit

    reg = Registry(
        "guide",
        field="guide",
        kit_args={"cap": (2.0, Limit(gt=0))},
        kit_check=lambda a: "cap too small" if a["cap"] < a.get("scale", 0) else None,
    )
    reg.add("scaled", lambda signals, *, scale=1.0: signals * scale, limits={"scale": Limit(ge=0)})
    reg.add("capped", lambda signals, *, cap: min(signals, cap))
    assert reg.node("scaled").args == {"scale": 1.0, "cap": 2.0} and reg.node("scaled").call_args == {
        "scale": 1.0
    }
    assert reg.bind(reg.node({"name": "capped", "cap": 3.0}))(5.0) == 3.0  # named by the function: passed on
    with pytest.raises(ConfigError, match=r"^guide.scale=-1 must be >= 0$"):
        reg.node({"name": "scaled", "scale": -1})
    with pytest.raises(ConfigError, match=r"^guide.cap=0 must be > 0$"):
        reg.node({"name": "scaled", "cap": 0})
    with pytest.raises(ConfigError, match=r"^guide: cap too small$"):
        reg.node({"name": "scaled", "scale": 3.0})
    with pytest.raises(ConfigError, match=r"^guide.cap must be float, got str 'x'$"):
        reg.node({"name": "scaled", "cap": "x"})


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
    empty = {"limits": None, "check": None, "trl_fields": None}
    assert not by_file.registered and by_file.meta == {"needs": ("logps",), **empty}
    assert reg.bind(reg.node({"name": f"{plugin}:half", "k": 2.0}))(3.0) == 6.0
    monkeypatch.syspath_prepend(str(tmp_path))
    by_module = reg.resolve("my_guides:Counter")
    assert by_module.meta == {"needs": (), **empty}  # no attribute: the declared default
    counter = reg.bind(reg.node({"name": "my_guides:Counter", "start": 5}))
    assert counter(None) == 6 and counter(None) == 7  # a class keeps state between calls
    with pytest.raises(ConfigError, match="guide: guide 'my_guides:Counter' refused its arguments: start"):
        reg.bind(reg.node({"name": "my_guides:Counter", "start": -1}))
    with pytest.raises(ConfigError, match="has no 'hlaf': did you mean 'half'"):
        reg.resolve("my_guides:hlaf")
    with pytest.raises(ConfigError, match="cannot import module 'no_such_mod'"):
        reg.resolve("no_such_mod:f")
    with pytest.raises(ConfigError, match="no file"):
        reg.resolve(f"{tmp_path}/missing.py:f")
