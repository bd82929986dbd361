"""Named extension points: a config names a plug-in in one node, ``guide: {name: branch, gamma: 0.8}``, whose
``name`` is a registered entry (``branch``) or an import path (``pkg.module:function``, or
``path/to/file.py:function``) and whose other keys are its arguments. The kit resolves the name, checks the
arguments against its signature (and the entry's declared limits) and binds them. Every failure is one
:class:`ConfigError` line naming the config field and the fix, raised before any model loads.

    GUIDES = Registry("guide", field="guide", meta={"needs": ()}, kit_args={"q_min": (0.6, Limit(gt=0))})

    @GUIDES.register("branch", needs=("entropies",), limits={"gamma": Limit(ge=0)})
    def branch(signals, *, gamma: float = 0.3, tau: float = 1.2, q_min: float, q_max: float): ...

    node = GUIDES.node(cfg.guide)   # Node(entry, args with the defaults filled, the call's arguments)
    fn = GUIDES.bind(node)          # functools.partial(fn, **node.call_args), or Class(**node.call_args)

A node is a mapping ``{name: ..., <arguments>}``, its JSON text on the command line, or a bare name (no
arguments). One call shape for every kind: ``fn(inputs, **args)``, ``inputs`` the kind's one frozen record (a
guide's ``Signals``, an estimator's ``GroupRewards``, a policy term's ``TokenBatch``, a KL term's ``KLTokens``).
A kind's ``kit_args`` are node keys the kit reads itself (a guide's clip range ``q_min`` / ``q_max``), passed on
to the function only where its signature names them; an entry's ``trl_fields`` are keywords bound from TRL's own
config field of that name (the grpo estimator's ``scale_rewards``, which TRL reads itself), never set in the node.

``meta`` declares what an entry may say about itself and the defaults. A registered entry gives it at
registration; an entry reached by import path gives it as attributes of the object (``fn.needs = (...)``),
so an out-of-tree plug-in needs no kit import at all. Names are registered once: registering a name twice is
an error (verl's rule), so a plug-in can never silently replace a built-in.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import json
import sys
import traceback
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sage_unsloth.config.args import ConfigError, suggestion

__all__ = ["NAME", "Entry", "Node", "Registry", "import_object"]

# Every kind's per-call inputs: one frozen record.
INPUTS = 1


@dataclass(frozen=True)
class Entry:
    """One resolved entry: its name (the registered name or the import path), the object, its metadata."""

    name: str
    obj: Any
    meta: dict = field(default_factory=dict)
    registered: bool = True


def import_object(spec: str, field_name: str) -> Any:
    """The object at ``module.path:attr`` or ``some/file.py:attr`` (relative to the working directory)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            f"{field_name}={spec!r} is not a registered name nor an import path: use 'package.module:function' "
            "or 'path/to/file.py:function'"
        )
    if module_name.endswith(".py") or "/" in module_name:
        path = Path(module_name).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"{field_name}={spec!r}: no file {str(path)!r} (paths are relative to the working directory)"
            )
        key = f"_sage_plugin_{abs(hash(str(path.resolve())))}"
        module = sys.modules.get(key)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(key, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[key] = module
            try:
                loader_spec.loader.exec_module(module)
            except (KeyboardInterrupt, GeneratorExit):
                del sys.modules[key]
                raise
            except (
                BaseException
            ) as err:  # SystemExit too: importing a plug-in never ends the stage in silence
                del sys.modules[key]
                raise ConfigError(f"{field_name}={spec!r}: {import_failure(err, path)}") from err
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):  # the module itself (or its package) is missing
                raise ConfigError(
                    f"{field_name}={spec!r}: cannot import module {module_name!r} ({err}); put its folder on "
                    "PYTHONPATH or name the file ('path/to/file.py:function')"
                ) from None
            raise ConfigError(f"{field_name}={spec!r}: {import_failure(err, None)}") from None
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as err:
            raise ConfigError(f"{field_name}={spec!r}: {import_failure(err, None)}") from err
    try:
        return getattr(module, attr)
    except AttributeError:
        public = [n for n in dir(module) if not n.startswith("_")]
        raise ConfigError(
            f"{field_name}={spec!r}: module {module_name!r} has no {attr!r}{suggestion(attr, public)}"
        ) from None


def annotation_mismatch(value, annotation) -> str | None:
    """Why ``value`` (from YAML or JSON) does not fit the parameter annotation ``annotation``, or None. Plain types
    (bool, int, float, str, list, dict, tuple, None), their unions and Optional, Literal and parametrised
    containers (by their origin) are checked; anything else (a class of the plug-in's, Any) passes. An int fits
    a float; a bool fits neither an int nor a float."""
    if annotation is inspect.Parameter.empty or annotation is typing.Any or isinstance(annotation, str):
        return None
    if _fits(value, annotation):
        return None
    return f"must be {_type_name(annotation)}, got {type(value).__name__} {value!r}"


def _fits(value, annotation) -> bool:
    import types

    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return any(_fits(value, option) for option in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin is not None:
        annotation = origin  # list[int] -> list
    if annotation is None or annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is tuple:
        return isinstance(value, (tuple, list))  # YAML and JSON have lists only
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True  # a typing construct the kit does not read: no claim


def _type_name(annotation) -> str:
    import types

    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_type_name(option) for option in typing.get_args(annotation))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(annotation)))
    if annotation is None or annotation is type(None):
        return "None"
    return getattr(origin or annotation, "__name__", str(annotation))


def import_failure(err: BaseException, path: Path | None) -> str:
    """What went wrong importing a plug-in, with the file and line: 'my_guide.py line 3: SyntaxError: expected
    ':'' or 'importing it raised NameError: ... (my_guide.py:7)'."""
    if isinstance(err, SyntaxError):  # IndentationError and TabError too; the line is the plug-in's own
        where = Path(err.filename).name if err.filename else (path.name if path else "?")
        return f"{where} line {err.lineno}: {type(err).__name__}: {err.msg}"
    if isinstance(err, SystemExit):
        what = f"importing it called sys.exit({err.code!r})"
    else:
        text = str(err).strip().splitlines()
        what = f"importing it raised {type(err).__name__}" + (f": {text[0]}" if text else "")
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if path is not None and Path(f.filename).resolve() == path.resolve()]
    frame = (own or frames[-1:] or [None])[-1]
    return what if frame is None else f"{what} ({Path(frame.filename).name}:{frame.lineno})"


NAME = "name"  # the key of a node that names its entry


@dataclass(frozen=True)
class Node:
    """A config's plug-in node resolved: the entry, its arguments as the config records them (the signature's
    defaults filled, the kit's own keys included) and the arguments the function is called with."""

    entry: Entry
    args: dict
    call_args: dict

    @property
    def name(self) -> str:
        return self.entry.name

    def as_config(self) -> dict:
        """The node as a config holds it after resolution: ``{name: ..., <every argument>}``."""
        return {NAME: self.entry.name, **self.args}


class Registry:
    """Entries of one kind, resolved from a config node by name or import path."""

    def __init__(
        self,
        kind: str,
        *,
        field: str,
        meta: dict | None = None,
        inputs: str = "",
        retired: tuple[str, ...] = (),
        kit_args: dict | None = None,
        kit_check: Callable[[dict], str | None] | None = None,
        example: str = "",
    ):
        self.kind = kind
        self.inputs = inputs  # the per-call inputs, as a message names them ("signals")
        self.field = field
        # ``limits``: keyword -> a field_rules Limit / Names its value must keep; ``check``: args -> problem or
        # None (a rule across arguments); ``trl_fields``: keyword -> TRL's config field it is bound from
        self.meta_defaults = {"limits": None, "check": None, "trl_fields": None, **(meta or {})}
        self.retired = retired  # parameter names of the kind's earlier call shape: named in the error
        self.kit_args = dict(kit_args or {})  # node key -> (default, rule): keys the kit reads itself
        self.kit_check = kit_check  # the kit's own rule across its keys (a guide's q_min <= q_max)
        self.example = example  # a registered name the messages show
        self._entries: dict[str, Entry] = {}

    # -- config fields -----------------------------------------------------------------------------
    def node_help(self, what: str, *, none: bool = False) -> dict:
        """The metadata (``help``) of the dataclass field holding the node."""
        names = ", ".join((("none",) if none else ()) + self.names())
        return {
            "help": f"{what}: a node {{name: ..., <its arguments>}} (JSON on the command line, or a bare name); "
            f"name one of {names}, or package.module:function / file.py:function, called as "
            f"fn({self.inputs}, **arguments) (docs/extending.md)."
        }

    # -- registration ------------------------------------------------------------------------------
    def register(self, name: str, **meta) -> Callable[[Any], Any]:
        """Decorator: register the function or class under ``name`` with ``meta`` (keys declared at init)."""

        def decorate(obj):
            self.add(name, obj, **meta)
            return obj

        return decorate

    def add(self, name: str, obj: Any, **meta) -> None:
        if ":" in name or not name:
            raise ValueError(
                f"{self.kind} name {name!r} must be non-empty and have no ':' (that marks an import path)"
            )
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered already ({self._entries[name].obj!r})")
        unknown = set(meta) - set(self.meta_defaults)
        if unknown:
            raise ValueError(
                f"{self.kind} {name!r}: unknown metadata {sorted(unknown)} (known: {sorted(self.meta_defaults)})"
            )
        self._entries[name] = Entry(name, obj, {**self.meta_defaults, **meta}, registered=True)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    # -- resolution ----------------------------------------------------------------------------------
    def resolve(self, spec: str) -> Entry:
        """The entry named ``spec``, or the object at the import path ``spec`` (meta from its attributes)."""
        if not isinstance(spec, str) or not spec:
            raise ConfigError(
                f"{self.field}={spec!r} must be a {self.kind} name or 'package.module:function'"
            )
        if spec in self._entries:
            return self._entries[spec]
        if ":" not in spec:
            raise ConfigError(
                f"{self.field}={spec!r} is unknown{suggestion(spec, self._entries)} (use one of "
                f"{', '.join(self._entries)}, or 'package.module:function')"
            )
        obj = import_object(spec, self.field)
        if not callable(obj):
            raise ConfigError(f"{self.field}={spec!r} is {type(obj).__name__}, not a function or class")
        same = next((e for e in self._entries.values() if e.obj is obj), None)  # a built-in by its path
        meta = same.meta if same else {key: getattr(obj, key, d) for key, d in self.meta_defaults.items()}
        return Entry(spec, obj, meta, registered=False)

    # -- nodes -----------------------------------------------------------------------------------------
    def read_node(self, value) -> tuple[str, dict]:
        """(name, arguments) of a node: a mapping ``{name: ..., **arguments}``, its JSON text (the command line:
        ``--guide '{"name": "branch", "gamma": 0.8}'``), or a bare name."""
        if isinstance(value, str) and value.strip().startswith("{"):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ConfigError(
                    f"{self.field}={value!r} is not a JSON object ({err.msg}): e.g. --{self.field} "
                    f'\'{{"name": "{self.example}"}}\''
                ) from None
        if isinstance(value, str):
            return value.strip(), {}
        if not isinstance(value, dict):
            raise ConfigError(
                f"{self.field} must be a {self.kind} name or a mapping {{name: ..., <its arguments>}}, got "
                f"{type(value).__name__} {value!r}"
            )
        args = dict(value)
        name = args.pop(NAME, None)
        if not isinstance(name, str) or not name:
            raise ConfigError(
                f"{self.field}: the mapping {value!r} names no {self.kind}: e.g. {self.field}: "
                f"{{name: {self.example}, ...}}"
            )
        return name, args

    def node(self, value, *, trl: dict | None = None) -> Node:
        """The node ``value`` resolved and checked: its entry, its arguments against the signature, the entry's
        ``limits`` and ``check``, the kit's own keys; ``trl``: TRL's config fields an entry's ``trl_fields`` read."""
        name, given = self.read_node(value)
        entry = self.resolve(name)
        trl_fields = entry.meta.get("trl_fields") or {}
        for key in given:
            if key in trl_fields:
                raise ConfigError(
                    f"{self.field}.{key}: {self.kind} {name!r} reads TRL's own field {trl_fields[key]} (TRL uses it "
                    f"too): set {trl_fields[key]}: {given[key]!r} instead"
                )
        kit = {key: given.get(key, default) for key, (default, _) in self.kit_args.items()}
        for key, (default, _) in self.kit_args.items():
            if key in given and (problem := annotation_mismatch(given[key], type(default))):
                raise ConfigError(f"{self.field}.{key} {problem}")
        takes = self._parameters(entry)
        call = {k: v for k, v in given.items() if k not in self.kit_args}
        call |= {k: v for k, v in kit.items() if takes is not None and k in takes}
        call |= {key: (trl or {})[source] for key, source in trl_fields.items()}
        call = self.check_args(entry, call)
        rules = {**{k: rule for k, (_, rule) in self.kit_args.items()}, **(entry.meta.get("limits") or {})}
        filled = {**self._defaults(entry), **call, **kit}
        for key, rule in rules.items():
            if (
                rule is not None
                and key in filled
                and (problem := rule.problem(f"{self.field}.{key}", filled[key]))
            ):
                raise ConfigError(problem)
        for check in (self.kit_check, entry.meta.get("check")):
            if check is not None and (problem := check(filled)):
                raise ConfigError(f"{self.field}: {problem}")
        args = {k: v for k, v in filled.items() if k not in trl_fields}
        return Node(entry, args, {**self._defaults(entry), **call})  # bound with every value it runs with

    def _parameters(self, entry: Entry) -> set[str] | None:
        """The keyword parameters the entry's callable names (None: no signature to read)."""
        try:
            params = list(inspect.signature(entry.obj).parameters.values())
        except (TypeError, ValueError):
            return None
        if not inspect.isclass(entry.obj):
            params = params[INPUTS:]
        return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    def _defaults(self, entry: Entry) -> dict:
        """The entry's keyword parameters that have a default, with it (what a node left out takes)."""
        try:
            params = list(inspect.signature(entry.obj).parameters.values())
        except (TypeError, ValueError):
            return {}
        if not inspect.isclass(entry.obj):
            params = params[INPUTS:]
        return {
            p.name: p.default
            for p in params
            if p.default is not p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }

    def check_args(self, entry: Entry, args: dict | None) -> dict:
        """``args`` checked against the entry's signature: for a function its parameters after its one per-call
        input, for a class its constructor's. Unknown or missing names, or values off their annotation, fail."""
        args = dict(args or {})
        obj = entry.obj
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):  # a builtin without a signature: nothing to check
            return args
        try:
            signature = inspect.signature(obj, eval_str=True)
        except (NameError, AttributeError, ImportError, SyntaxError, TypeError):
            pass  # an annotation that does not resolve: its string is kept, and not type-checked
        params = list(signature.parameters.values())
        if not inspect.isclass(obj):
            self._check_inputs(entry, params, args)
            params = params[INPUTS:]
        for key, value in args.items():
            declared = next((p for p in params if p.name == key), None)
            if declared is not None and (problem := annotation_mismatch(value, declared.annotation)):
                raise ConfigError(f"{self.field}: {self.kind} {entry.name!r} argument {key!r} {problem}")
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return args
        accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        for key in args:
            if key not in accepted:
                known = ", ".join(sorted(accepted | set(self.kit_args))) or "none"
                raise ConfigError(
                    f"{self.field}: {self.kind} {entry.name!r} has no argument {key!r}"
                    f"{suggestion(key, accepted | set(self.kit_args))} (it takes: {known})"
                )
        missing = [
            p.name
            for p in params
            if p.default is p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in args
        ]
        if missing:
            raise ConfigError(
                f"{self.field}: {self.kind} {entry.name!r} needs {', '.join(map(repr, missing))}: "
                f"e.g. {self.field}: {{name: {entry.name}, {missing[0]}: ...}}"
            )
        return args

    def _check_inputs(self, entry: Entry, params: list, args: dict) -> None:
        """The function takes its one per-call input positionally (else every call would fail), and is not
        written to the kind's earlier call shape (a required parameter of :attr:`retired`)."""
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not positional and not any(p.kind is p.VAR_POSITIONAL for p in params):
            raise ConfigError(
                f"{self.field}={entry.name!r} takes no positional input; {_a(self.kind)} is called as "
                f"fn({self.inputs or 'inputs'}, **arguments)"
            )
        old = [
            p.name
            for p in params[INPUTS:]
            if p.name in self.retired and p.default is p.empty and p.name not in args
        ]
        if old:
            raise ConfigError(
                f"{self.field}={entry.name!r} takes {', '.join(map(repr, old))}, the earlier call shape: "
                f"{_a(self.kind)} is now called as fn({self.inputs}, **arguments) with its knobs as keyword "
                "arguments (docs/extending.md)"
            )
        for p in params[INPUTS:]:
            if p.name == NAME and p.kind is not p.VAR_KEYWORD:
                raise ConfigError(
                    f"{self.field}={entry.name!r} has a parameter {NAME!r}, the key that names the plug-in in its "
                    f"node ({self.field}: {{name: ..., <its arguments>}}): rename the parameter"
                )
            if p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
                raise ConfigError(
                    f"{self.field}={entry.name!r}: parameter {p.name!r} is positional-only without a default, so "
                    f"its node cannot set it: make it keyword-capable or give it a default"
                )

    def bind(self, node: Node) -> Callable:
        """A function with the node's call arguments bound (functools.partial), or an instance of a class built
        with them; a sealed credential (sage_unsloth/runtime/credentials.py) is handed over as its value."""
        from sage_unsloth.runtime.credentials import unsealed

        entry, args = node.entry, unsealed(node.call_args)
        if inspect.isclass(entry.obj):
            try:
                return entry.obj(**args)
            except (
                TypeError,
                ValueError,
            ) as err:  # the class refused its arguments: say which field holds them
                raise ConfigError(
                    f"{self.field}: {self.kind} {entry.name!r} refused its arguments: {err}"
                ) from None
        return functools.partial(entry.obj, **args) if args else entry.obj


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
