"""Named extension points: a config names a registered entry (``branch``) or an import path
(``pkg.module:function``, or ``path/to/file.py:function``) and the kit resolves it, checks the arguments the
config gives it against its signature, and binds them. Every failure is one :class:`ConfigError` line naming
the config field and the fix, raised before any model loads.

    GUIDES = Registry("guide", field="sage_guide", args_field="sage_guide_args", meta={"needs": ()})

    @GUIDES.register("branch", needs=("entropies",), aliases={"gamma": "sage_gamma", "tau": "sage_tau"})
    def branch(signals, *, gamma: float, tau: float): ...

    entry = GUIDES.resolve(cfg.sage_guide)                       # Entry(name, obj, meta)
    args = GUIDES.knobs(entry, cfg, cfg.sage_guide_args)          # <kind>_args over the aliased flat fields
    fn = GUIDES.bind(entry, args)                                 # functools.partial(fn, **args), or Class(**args)

One call shape for every kind: ``fn(inputs, **args)``, ``inputs`` the kind's one frozen record (a guide's
``Signals``, an estimator's ``GroupRewards``, a policy term's ``TokenBatch``, a KL term's ``KLTokens``) and
``args`` the validated ``<kind>_args``. A built-in's knobs also have flat config fields (``sage_gamma``,
``passk_k``, TRL's flags among them): its ``aliases`` metadata maps each keyword to its field, and
:meth:`Registry.knobs` reads the field where ``<kind>_args`` leaves the keyword out; both set to different
values is one line naming both.

``meta`` declares what an entry may say about itself and the defaults. A registered entry gives it at
registration; an entry reached by import path gives it as attributes of the object (``fn.needs = (...)``),
so an out-of-tree plug-in needs no kit import at all. Names are registered once: registering a name twice is
an error (verl's rule), so a plug-in can never silently replace a built-in.
"""

from __future__ import annotations

import dataclasses
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

from sage_unsloth.config_args import ConfigError, suggestion

__all__ = ["Entry", "Registry", "import_object"]

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


class Registry:
    """Entries of one kind, resolved from a config field by name or import path."""

    def __init__(
        self,
        kind: str,
        *,
        field: str,
        args_field: str | None = None,
        meta: dict | None = None,
        inputs: str = "",
        retired: tuple[str, ...] = (),
    ):
        self.kind = kind
        self.inputs = inputs  # the per-call inputs, as a message names them ("signals")
        self.field = field
        self.args_field = args_field or f"{field}_args"
        # ``aliases``: keyword -> the flat config field that also sets it (a built-in's; see knobs)
        self.meta_defaults = {"aliases": None, **(meta or {})}
        self.retired = retired  # parameter names of the kind's earlier call shape: named in the error
        self._entries: dict[str, Entry] = {}

    # -- config fields -----------------------------------------------------------------------------
    def name_help(self, what: str, *, none: bool = False) -> dict:
        """The metadata (``help``) of the dataclass field naming the entry."""
        names = ", ".join((("none",) if none else ()) + self.names())
        return {
            "help": f"{what}: one of {names}, or package.module:function / file.py:function, called as "
            f"fn({self.inputs}, **{self.args_field})."
        }

    def args_help(self) -> dict:
        """The metadata (``help``) of the dataclass field ``<kind>_args``."""
        return {
            "help": f"Keyword arguments of the {self.kind}, a mapping; JSON on the command line. A built-in's are "
            "also flat fields: set either, not both differently (docs/extending.md)."
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

    def aliased_fields(self) -> tuple[str, ...]:
        """The flat config fields the registered entries' keywords alias."""
        return tuple(f for e in self._entries.values() for f in (e.meta["aliases"] or {}).values())

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

    # -- arguments -------------------------------------------------------------------------------------
    def parse_args(self, value) -> dict:
        """The ``<kind>_args`` field as a dict: a YAML mapping, a JSON string from the command line, or None."""
        if value is None or value == "":
            return {}
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ConfigError(
                    f"{self.args_field}={value!r} is not a JSON object ({err.msg}): e.g. --{self.args_field} "
                    "'{\"k\": 2}'"
                ) from None
        if not isinstance(value, dict):
            raise ConfigError(
                f"{self.args_field} must be a mapping of argument names to values, got {type(value).__name__}"
            )
        return dict(value)

    def knobs(self, entry: Entry, cfg, value=None, *, write: bool = False) -> dict:
        """The entry's arguments, checked: ``value`` (the ``<kind>_args`` field) over the flat config fields its
        ``aliases`` name (a built-in's), so ``passk_k: 2`` and ``advantage_estimator_args: {k: 2}`` are one
        run. A keyword set both ways to different values (the flat field off its default) is one line naming
        both. ``write``: set each aliased field a keyword of ``value`` names to its value (the config then
        reads the same either way: TRL's own flags, the manifest)."""
        args = self.parse_args(value)
        given = dict(args)
        for key, flat in (entry.meta.get("aliases") or {}).items():
            current, default = getattr(cfg, flat), _field_default(cfg, flat)
            typed = key in given and default is not None and default is not dataclasses.MISSING
            if typed and (problem := annotation_mismatch(given[key], type(default))):  # the flat field's type
                raise ConfigError(f"{self.args_field}: {self.kind} {entry.name!r} argument {key!r} {problem}")
            if key in given and given[key] != current and current != default:
                raise ConfigError(
                    f"{flat}={current!r} and {self.args_field}: {{{key}: {given[key]!r}}} set one argument of "
                    f"{self.kind} {entry.name!r} two ways: keep one of them"
                )
            args.setdefault(key, current)
        args = self.check_args(entry, args)
        if write:
            for key, flat in (entry.meta.get("aliases") or {}).items():
                if key in given:
                    setattr(cfg, flat, given[key])
        return args

    def settle(self, entry: Entry, cfg) -> dict:
        """At config time: the entry's arguments checked (:meth:`knobs`, each keyword ``<kind>_args`` sets written
        to its flat field) and the ``<kind>_args`` field stored as a plain mapping (None when empty)."""
        value = getattr(cfg, self.args_field, None)
        args = self.knobs(entry, cfg, value, write=True)
        setattr(cfg, self.args_field, self.parse_args(value) or None)
        return args

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
                raise ConfigError(f"{self.args_field}: {self.kind} {entry.name!r} argument {key!r} {problem}")
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return args
        accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        for key in args:
            if key not in accepted:
                known = ", ".join(sorted(accepted)) or "none"
                raise ConfigError(
                    f"{self.args_field}: {self.kind} {entry.name!r} has no argument {key!r}"
                    f"{suggestion(key, accepted)} (it takes: {known})"
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
                f"{self.args_field}: {self.kind} {entry.name!r} needs {', '.join(map(repr, missing))}: "
                f"e.g. {self.args_field}: {{{missing[0]}: ...}}"
            )
        return args

    def _check_inputs(self, entry: Entry, params: list, args: dict) -> None:
        """The function takes its one per-call input positionally (else every call would fail), and is not
        written to the kind's earlier call shape (a required parameter of :attr:`retired`)."""
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not positional and not any(p.kind is p.VAR_POSITIONAL for p in params):
            raise ConfigError(
                f"{self.field}={entry.name!r} takes no positional input; {_a(self.kind)} is called as "
                f"fn({self.inputs or 'inputs'}, **{self.args_field})"
            )
        old = [
            p.name
            for p in params[INPUTS:]
            if p.name in self.retired and p.default is p.empty and p.name not in args
        ]
        if old:
            raise ConfigError(
                f"{self.field}={entry.name!r} takes {', '.join(map(repr, old))}, the earlier call shape: "
                f"{_a(self.kind)} is now called as fn({self.inputs}, **{self.args_field}) with its knobs as keyword "
                "arguments (docs/extending.md)"
            )
        for p in params[INPUTS:]:
            if p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
                raise ConfigError(
                    f"{self.field}={entry.name!r}: parameter {p.name!r} is positional-only without a default, so "
                    f"{self.args_field} cannot set it: make it keyword-capable or give it a default"
                )

    def bind(self, entry: Entry, args: dict | None) -> Callable:
        """A function with ``args`` bound (functools.partial), or an instance of a class built with them; a sealed
        credential (sage_unsloth/credentials.py) is handed over as its value."""
        from sage_unsloth.credentials import unsealed

        args = unsealed(self.check_args(entry, args))
        if inspect.isclass(entry.obj):
            try:
                return entry.obj(**args)
            except (
                TypeError,
                ValueError,
            ) as err:  # the class refused its arguments: say which field holds them
                raise ConfigError(
                    f"{self.args_field}: {self.kind} {entry.name!r} refused its arguments: {err}"
                ) from None
        return functools.partial(entry.obj, **args) if args else entry.obj


def _field_default(cfg, name: str):
    """The dataclass default of ``cfg``'s field ``name`` (a sentinel where it has none)."""
    for item in dataclasses.fields(cfg) if dataclasses.is_dataclass(cfg) else ():
        if item.name == name:
            return item.default
    return dataclasses.MISSING


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
