"""What one config field may hold, declared beside the field: a numeric interval (:class:`Limit`) or a set of
names (:class:`Names`, optionally plug-ins given as ``package.module:function`` or ``path/to/file.py:function``).

A stage's config classes list theirs in a ``FIELD_RULES`` class variable. ``python -m sage_unsloth.config.schema
--write`` copies them into the committed schema (sage_unsloth/config/stage_schema.json), which the pre-import check
(:mod:`sage_unsloth.config.schema`) reads without importing TRL, so every bad value of a config is reported at
once, before torch is imported. The configs' ``__post_init__`` then check them again: stages 3 and 4, the sweep and
stage 2's own fields through :func:`check_field_rules` (the same words), the TRL-based training configs with their
own worded checks;
tests/cli/test_config_schema.py holds each rule to what the real dataclass refuses, at its bounds.

Stdlib only (no TRL, no torch).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

PLUGIN_HINT = "'package.module:function' or 'path/to/file.py:function'"
# The committed copy of every stage's fields and rules, read by the pre-import check (config/schema.py) and turned
# into the editors' JSON Schemas (config/editor_schema.py); here, below both, so that neither imports the other for it.
SCHEMA = Path(__file__).with_name("stage_schema.json")
TRUE, FALSE = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")  # TRL's string_to_bool


@dataclass(frozen=True)
class Limit:
    """A numeric field's interval: ``ge``/``gt`` below, ``le``/``lt`` above, and finite unless ``finite`` is
    False. ``note`` (what the field is, the paper's value) follows the bound in the message."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    finite: bool = True
    note: str = ""

    def describe(self, value: float = 0.0) -> str:
        """The interval in words; ``and finite`` only for a value that is not (inf, nan)."""
        bounds = self._bounds()
        if not self.finite or math.isfinite(value):
            return bounds or "anything"
        return f"{bounds} and finite" if bounds else "finite"

    def _bounds(self) -> str:
        low = _end(self.ge, "[{}", self.gt, "({}")
        high = _end(self.le, "{}]", self.lt, "{})")
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>=' if self.ge is not None else '>'} {low[1:]}"
        if high:
            return f"{'<=' if self.le is not None else '<'} {high[:-1]}"
        return ""

    def problem(self, name: str, value, extra: tuple[str, ...] = ()) -> str | None:
        """``name=value must be ...`` when ``value`` (a number) is outside, else None (``extra``: unused, as
        :meth:`Names.problem`)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None  # a type error is reported as one
        inside = (
            (not self.finite or math.isfinite(value))
            and (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )
        if inside:
            return None
        return f"{name}={value} must be {self.describe(value)}" + (f" ({self.note})" if self.note else "")

    def as_json(self) -> dict:
        return {"limit": {k: v for k, v in vars(self).items() if v not in (None, "") and k != "finite"}} | (
            {} if self.finite else {"infinite_ok": True}
        )


@dataclass(frozen=True)
class Names:
    """A name field: one of ``names``, or with ``plugins`` an import path of a plug-in (syntax checked here, the
    import later, by the stage). ``also_from``: a list field whose ``name=path`` items add names (eval's
    ``local_benchmarks``). ``node``: a plug-in node, ``{name: ..., <its arguments>}`` (or its JSON text, or a bare
    name), whose ``name`` is checked here and its arguments by the stage (sage_unsloth/plugins/registry.py)."""

    names: tuple[str, ...]
    plugins: bool = False
    also_from: str | None = None
    node: bool = False

    def problem(self, name: str, value, extra: tuple[str, ...] = ()) -> str | None:
        from sage_unsloth.config.args import suggestion

        if self.node:
            value = node_name(value)
        if not isinstance(value, str):
            return None
        known = (*self.names, *extra)
        if value in known:
            return None
        if self.plugins and ":" in value:
            return (
                None
                if plugin_syntax_ok(value)
                else (f"{name}={value!r} is not a registered name nor an import path: use {PLUGIN_HINT}")
            )
        plugins = f", or {PLUGIN_HINT}" if self.plugins else ""
        return (
            f"{name}={value!r} is unknown{suggestion(value, known)} (use one of {', '.join(known)}{plugins})"
        )

    def as_json(self) -> dict:
        out: dict = {"names": list(self.names)}
        if self.plugins:
            out["plugins"] = True
        if self.also_from:
            out["also_from"] = self.also_from
        if self.node:
            out["node"] = True
        return out


# The config fields of stage 2 that hold a plug-in node (sage_unsloth/rlvr/plan.py: one registry each).
PLUGIN_NODES = ("guide", "advantage_estimator", "policy_term", "kl_term")


def node_name(value):
    """The name of a plug-in node: the ``name`` of a mapping or of its JSON text, or the bare name itself; any
    other value as it is (its type is the stage's to report)."""
    if isinstance(value, str) and value.strip().startswith("{"):
        import json

        try:
            value = json.loads(value)
        except ValueError:
            return None  # not JSON: the stage reports it in one line
    if isinstance(value, dict):
        return value.get("name")
    return value.strip() if isinstance(value, str) else value


def node_mapping(value) -> dict:
    """A plug-in node as a mapping ``{name: ..., <its arguments>}`` (from a bare name or its JSON text), for a tool
    that edits one of its keys; a value that is no node comes back as ``{name: value}`` for the stage to refuse."""
    if isinstance(value, str) and value.strip().startswith("{"):
        import json

        try:
            value = json.loads(value)
        except ValueError:
            return {"name": value}
    return dict(value) if isinstance(value, dict) else {"name": value}


def _end(closed: float | None, closed_form: str, open_: float | None, open_form: str) -> str | None:
    """One end of an interval as written: the closed bound if set, else the open one, else None."""
    if closed is not None:
        return closed_form.format(_number(closed))
    return None if open_ is None else open_form.format(_number(open_))


def _number(bound: float) -> str:
    if bound == 2**32:
        return "2**32"  # numpy's seed range
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


def plugin_syntax_ok(spec: str) -> bool:
    """``package.module:function`` or ``some/file.py:function`` (the import itself is the stage's)."""
    module, _, attr = spec.partition(":")
    if not module or not attr.isidentifier():
        return False
    if module.endswith(".py") or "/" in module:
        return True
    return all(part.isidentifier() for part in module.split("."))


def field_rules(cls) -> dict:
    """The FIELD_RULES of ``cls`` and its bases, a subclass's rule replacing its base's."""
    rules: dict = {}
    for base in reversed(cls.__mro__):
        rules.update(vars(base).get("FIELD_RULES", {}))
    return rules


def check_field_rules(cfg, *, later: tuple[str, ...] = ()) -> None:
    """Raise ConfigError for the first field of ``cfg`` outside its rule, in the words of the pre-import check
    (the configs whose single-field checks are their rules call this first in ``__post_init__``); the fields of
    ``later`` are the stage's to check when it runs."""
    from sage_unsloth.config.args import ConfigError

    for name, rule in field_rules(type(cfg)).items():
        if name in later:
            continue
        value = getattr(cfg, name)
        extra = names_in(getattr(cfg, rule.also_from)) if isinstance(rule, Names) and rule.also_from else ()
        for item in value if isinstance(value, list) else [value]:
            if item is not None and (problem := rule.problem(name, item, extra)):
                raise ConfigError(problem)


def rule_from_json(data: dict) -> Limit | Names | None:
    if "limit" in data:
        return Limit(**data["limit"], finite=not data.get("infinite_ok", False))
    if "names" in data:
        return Names(
            tuple(data["names"]), data.get("plugins", False), data.get("also_from"), data.get("node", False)
        )
    return None


def names_in(items, *, separator: str = "=") -> tuple[str, ...]:
    """The names of ``name=path`` items (a list or a comma string), for :attr:`Names.also_from`."""
    if isinstance(items, str):
        items = [i for i in re.split(r"[,\s]+", items) if i]
    return tuple(str(i).partition(separator)[0].strip() for i in items or () if separator in str(i))


# The transformers TrainingArguments fields both training stages check (config_args.check_training_fields).
TRAINING_RULES = {
    "learning_rate": Limit(gt=0),
    "per_device_train_batch_size": Limit(ge=1),
    "gradient_accumulation_steps": Limit(ge=1),
    "warmup_steps": Limit(ge=0),
    "weight_decay": Limit(ge=0),
    "dataloader_num_workers": Limit(ge=0),
    "seed": Limit(ge=0, lt=2**32),
}
