"""The command-line shape shared by every stage: ``CONFIG.yaml [--key value ...]``, and its one error path.

- A leading ``CONFIG`` is TRL's ``--config CONFIG`` (the way the scripts and README call the stages).
- A YAML may build on another: ``base: _base.yaml`` (relative to the file's folder) reads that file first and
  this file's keys replace the base's, top-level key by key (a mapping such as ``generation_kwargs`` is
  replaced whole); a base may have its own base. CLI flags override the merged YAML.
- Every bad input (an unknown key or flag, a value of the wrong type, a value a config's ``__post_init__``
  refuses) is one :class:`ConfigError`: one line naming the field and the fix, with "did you mean ...?"
  for a misspelt key. The stages print it and exit 2, before any model loads.
- ``--help`` lists the kit's own fields; ``--help-all`` the full TRL / transformers list.
- Numeric list flags take ``--ks 1,8`` as well as ``--ks 1 8``.

This module imports neither TRL nor torch at import time: :func:`requested_backend` runs before Unsloth,
which has to be imported before TRL.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from sage_unsloth.config.input_checks import unreadable_line
from sage_unsloth.config.method_cards import (
    LAB_KEY,  # a demo method's card: how the lab shows it, no stage's field
)

BASE_KEY = "base"
ENV_KEY = "env"  # TrlParser's: environment variables set before the dataclasses are built
HELP_ALL = "--help-all"
# Fields of TRL / transformers classes that --help shows next to the kit's own (the ones a user sets first).
ESSENTIAL_UPSTREAM_FIELDS = ("model_name_or_path", "max_steps", "report_to")
# Stages without an ``output_dir`` field: where their outputs go instead (``--output_dir`` is refused with this).
OUTPUT_FLAGS = {
    "eval": "stage 3 writes its tables to --results_dir (results/<model>/<run>) and its completions under "
    "--outputs_dir",
    "report": "stage 4 writes the report to --out (default <results>/report.md)",
}
NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$|^-(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")  # a value, not a flag
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


class ConfigError(ValueError):
    """A bad config key, flag or value: one line naming the field and the fix (the CLI prints it, exit 2)."""


@dataclass(kw_only=True)  # keyword-only: the positional order of the stage classes' own fields stays theirs
class DryRunArgs:
    """``--dry-run``, a field of every stage's config (sage_unsloth/config/dry_run.py prints the plan)."""

    SHORT_HELP: ClassVar[bool] = True  # listed in a stage's short --help, even under an upstream config

    dry_run: bool = field(
        default=False,
        metadata={
            "help": "Print the resolved config and the plan (folders, checkpoint, what would run), check every "
            "input, and exit without loading a model or writing anything"
        },
    )


# --------------------------------------------------------------------------------------------- YAML files
def load_config(path: str | Path) -> dict[str, Any]:
    """The YAML mapping at ``path`` with its ``base:`` chain merged in (this file's keys win)."""
    return _load_config(Path(path), ())


def config_files(path: str | Path) -> tuple[Path, ...]:
    """The YAML at ``path`` and every file of its ``base:`` chain, this file first (what a fingerprint of the
    config must hash: a change to a base changes what the file means)."""
    files, current = [], Path(path)
    while current.resolve() not in {f.resolve() for f in files}:
        files.append(current)
        data = read_config_file(current)
        base = _base_path(current, data.get(BASE_KEY) if isinstance(data, dict) else None)
        if base is None:
            break
        current = base
    return tuple(files)


def _base_path(path: Path, base) -> Path | None:
    """Where the ``base:`` value of the YAML at ``path`` points: relative to that YAML's folder."""
    return None if base is None else path.parent / str(base)


def read_config_file(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping one YAML file writes itself (its ``base:`` key kept), refusing a ``base:`` chain that comes
    back to a file of ``chain`` (the resolved files read so far, the first one first). The file is read within
    sage_unsloth/config/yaml_files.py's bounds (size, aliases, duplicate keys)."""
    import yaml

    from sage_unsloth.config.yaml_files import YamlProblem, read_yaml

    if path.resolve() in chain:
        raise ConfigError(f"{chain[0]}: its base chain comes back to {path}: remove one of the base: lines")
    try:
        data = read_yaml(path)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_line(path, exc)) from None
    except YamlProblem as exc:
        raise ConfigError(str(exc)) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file (not UTF-8): pass a YAML config") from None
    except OSError as exc:
        raise ConfigError(unreadable_line(f"config file {path}", exc)) from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a YAML mapping (key: value lines), not a {type(data).__name__}")
    return data


def yaml_error_line(path: Path, exc) -> str:
    """``PATH, line L, column C: not valid YAML (what the parser expected)``: where PyYAML stopped, 1-based."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None and start is not mark:
        what += f", {context} at line {start.line + 1}, column {start.column + 1}"
    return f"{path}{where}: not valid YAML ({what}): fix the syntax there"


def merge_over_base(merged: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a file's own keys) over ``merged`` (its base's): this file's keys win, ``env`` key by key."""
    env = {**(merged.get(ENV_KEY) or {}), **(data.get(ENV_KEY) or {})}
    merged.update(data)
    if env:
        merged[ENV_KEY] = env
    return merged


def _load_config(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    data = read_config_file(path, chain)
    data.pop(LAB_KEY, None)
    base = data.pop(BASE_KEY, None)
    base_path = _base_path(path, base)
    if base_path is None:
        return data
    if not base_path.is_file():
        raise ConfigError(
            f"{path}: base: {base} not found ({base_path}): give a path relative to the YAML's folder"
        )
    return merge_over_base(_load_config(base_path, (*chain, path.resolve())), data)


def with_config_flag(argv: list[str], configs_dir: str) -> tuple[list[str], str | None]:
    """Turn a leading ``CONFIG`` into ``--config CONFIG``; returns (argv, config path or None).

    A missing file is one clear error naming where the stage's configs live.
    """
    argv = list(argv)
    if not argv or argv[0].startswith("-"):
        return argv, None
    config_path = argv.pop(0)
    if not Path(config_path).is_file():
        raise FileNotFoundError(f"config file {config_path} not found: pass a YAML from {configs_dir}")
    return ["--config", config_path, *argv], config_path


def requested_backend(argv: list[str], default: str = "unsloth") -> str:
    """The ``backend`` named by ``--backend`` or the YAML, read without TRL: Unsloth must be imported first."""
    return requested_value(argv, "backend", default)


def requested_flag(argv: list[str], name: str) -> bool:
    """A bool field given as ``--name [true|false]`` or in the YAML, read without TRL."""
    if f"--{name}" in argv:
        at = argv.index(f"--{name}")
        following = argv[at + 1] if at + 1 < len(argv) else "--"
        return following.startswith("--") or following.lower() in ("true", "1", "yes")
    return str(requested_value(argv, name, "false")).lower() in ("true", "1", "yes")


def requested_value(argv: list[str], name: str, default: str) -> str:
    """The value of field ``name`` from ``--name VALUE`` or the YAML, read without TRL."""
    for i, arg in enumerate(argv):
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    config_path = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else (argv[0] if argv else "")
    if config_path and not config_path.startswith("--") and Path(config_path).is_file():
        try:
            config = load_config(config_path)
        except ConfigError:
            return default  # the parser reports it, in one line
        if config.get(name) is not None:
            return str(config[name])
    return default


# --------------------------------------------------------------------------------------------- checks
def suggestion(name: str, known) -> str:
    """``: did you mean 'x'?`` for the closest known name, or '' when none is close."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f": did you mean {close[0]!r}?" if close else ""


def check_model_name_or_path(value: str | None, field: str = "model_name_or_path") -> None:
    """A model is an existing folder or a hub id ``org/name``: anything else fails here, in one line."""
    if not value or Path(value).expanduser().is_dir():
        return
    if not HUB_ID.match(value) or value.startswith((".", "~")):
        raise ConfigError(
            f"{field}={value!r} is neither an existing folder nor a hub id (org/name): fix the "
            "path, or download the model first"
        )


def check_hub_model_cached(
    value: str | None, field: str = "model_name_or_path", revision: str | None = None
) -> None:
    """With ``HF_HUB_OFFLINE`` set, a hub id must be in the local cache (checked when a run is planned, not
    when a config is parsed: the tests and ``--help`` parse the 7B configs offline)."""
    if not value or Path(value).expanduser().is_dir():
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(value, "config.json", revision=revision), str):
            raise ConfigError(
                f"{field}={value!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is "
                "set: download it (hf download) or pass a local folder"
            )


def _is_steps(strategy) -> bool:
    return str(getattr(strategy, "value", strategy)) == "steps"


def check_training_fields(cfg, *, learning_rate_hint: str) -> None:
    """The transformers ``TrainingArguments`` fields both training stages share, checked in the config's
    ``__post_init__`` (before transformers' own, which lets some of them through to a traceback mid-run)."""
    lr = cfg.learning_rate
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ConfigError(f"learning_rate={lr} must be > 0 and finite ({learning_rate_hint})")
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if (value := getattr(cfg, name)) is None or value < 1:
            raise ConfigError(f"{name}={value} must be >= 1: e.g. {name}: 1")
    for name, example in (("warmup_steps", 0), ("weight_decay", 0.01), ("dataloader_num_workers", 0)):
        value = getattr(cfg, name)
        if value is None or not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name}={value} must be >= 0: e.g. {name}: {example}")
    if cfg.seed is None or not 0 <= cfg.seed < 2**32:  # numpy's seed range, used by transformers' set_seed
        raise ConfigError(f"seed={cfg.seed} must be in [0, 2**32): e.g. seed: 3407")
    for name, strategy in (("logging_steps", "logging_strategy"), ("save_steps", "save_strategy")):
        value = getattr(cfg, name)
        if _is_steps(getattr(cfg, strategy)) and (value is None or not value > 0):
            raise ConfigError(
                f"{name}={value} must be > 0 (a step count, or a fraction < 1 of the run): e.g. {name}: 10, "
                f"or {strategy}: no"
            )


# --------------------------------------------------------------------------------------------- parsers
class KitArgumentParser(argparse.ArgumentParser):
    """argparse for the kit's own commands (demo, doctor, sample, export, ...), with the stages' error contract:
    no abbreviations (``--seed 0-2`` is never read as ``--seeds``), an unknown flag or a bad choice is one
    ``error:`` line with "did you mean", exit 2."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        options = {o for a in self._actions for o in a.option_strings}
        for (
            arg
        ) in args:  # an unknown flag first: what argparse would say instead ("X is required") follows from it
            if arg == "--":
                break
            name = arg.split("=", 1)[0]
            if arg.startswith("-") and name not in options and " " not in arg and not NUMBER.match(arg):
                self.error(
                    f"unknown flag {name}{suggestion(name, options) or f' ({self.prog} --help lists the flags)'}"
                )
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error(f"unknown argument {unknown[0]} ({self.prog} --help lists the arguments)")
        return parsed

    def error(self, message: str):
        choice = re.match(r"argument (\S+?)(?:/\S+)?: invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if choice:
            action = next(a for a in self._actions if choice[1] in a.option_strings or a.dest == choice[1])
            message += suggestion(choice[2], [str(c) for c in action.choices or ()])
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_stage_args(dataclass_types, argv: list[str], *, stage: str, configs_dir: str):
    """``[CONFIG] [--key value ...]`` -> (one instance per dataclass type, config path or None)."""
    argv, config_path = with_config_flag(argv, configs_dir)
    return stage_parser(dataclass_types, stage).parse(argv), config_path


def stage_parser(dataclass_types, stage: str):
    return _stage_parser_class()(dataclass_types, stage)


def _field_kind(action) -> str | None:
    """What a scalar field takes; bool fields are parsed by a ``string_to_bool`` (TRL 1.15 has its own copy
    of transformers' HfArgumentParser, so the function is recognised by name)."""
    name = getattr(action.type, "__name__", "")
    if name == "string_to_bool":
        return "true or false"
    # by name too: TRL wraps the converter of an ``int | None`` field so that "none" parses, and keeps the
    # wrapped type's __name__ (trl/scripts/_hf_argparser.py, _accept_none)
    return {"int": "an integer", "float": "a number"}.get(name)


def _is_instance(value, expected: str) -> bool:
    if expected == "true or false":
        return isinstance(value, bool)
    numeric = (int, float) if expected == "a number" else (int,)
    return isinstance(value, numeric) and not isinstance(value, bool)


def _metavar(action) -> str:
    if _field_kind(action) == "true or false":
        return "BOOL"
    return {"an integer": "INT", "a number": "FLOAT"}.get(_field_kind(action), "TEXT") + (
        " ..." if action.nargs in ("+", "*") else ""
    )


def _own_fields(cls) -> list[str]:
    """The kit's fields of a dataclass, its own first: every field of a plain kit dataclass (RLVRStageArgs);
    of a subclass of an upstream config, those declared in its class body (SageGRPOConfig's SAGE fields and
    pinned defaults) and those of a kit base that asks for it (``SHORT_HELP = True``: StageRunArgs, in
    SageSFTConfig); other kit bases' fields (ExplorationArgs') are listed by --help-all."""
    upstream = any(
        hasattr(b, "__dataclass_fields__") and not b.__module__.startswith("sage_unsloth")
        for b in cls.__mro__[1:]
    )
    shown = [
        b
        for b in cls.__mro__
        if b.__module__.startswith("sage_unsloth")
        and (not upstream or b is cls or vars(b).get("SHORT_HELP", False))
    ]
    names = [name for b in shown for name in vars(b).get("__annotations__", {})]
    return [name for name in dict.fromkeys(names) if name in cls.__dataclass_fields__]


class StageParserMethods:
    """What the kit adds to TRL's ``TrlParser`` (one-line errors, "did you mean", ``base:`` YAMLs and a short
    kit-first --help); mixed in ahead of it by :func:`_stage_parser_class`, which imports TRL on first use."""

    def __init__(self, dataclass_types, stage: str):
        # allow_abbrev=False: a prefix of a field (--max_tok) is an unknown flag with "did you mean", never
        # silently another field
        super().__init__(dataclass_types, prog=f"sage-unsloth {stage}", add_help=False, allow_abbrev=False)
        self.stage = stage
        self.fields = {}  # dest -> its action; a bool's own flag, not the --no_<name> one argparse adds after it
        for action in self._actions:
            self.fields.setdefault(action.dest, action)
        # the dataclass defaults, before a YAML replaces them: what an error's "e.g." shows
        self.field_defaults = {dest: action.default for dest, action in self.fields.items()}
        # argparse reads "-1e-5" as a flag (its matcher knows only -1 and -0.5): e-notation too
        self._negative_number_matcher = NUMBER

    # -- argparse reports here (a bad value, a missing argument): one line instead of usage + exit
    def error(self, message: str):
        match = re.match(
            r"argument (\S+?)(?:/\S+)?: (?:invalid \S+ value: '(.*)'|Truthy value expected: got (.*) "
            r"but expected.*)$",
            message,
        )
        if match:
            flag, value = match.group(1), match.group(2) if match.group(2) is not None else match.group(3)
            action = next(a for a in self._actions if flag in a.option_strings)
            expected = _field_kind(action) or (f"one of {action.choices}" if action.choices else "valid")
            raise ConfigError(f"{flag} {value}: not {expected}{self._example(action.dest, flag + ' ')}")
        raise ConfigError(f"{message} (sage-unsloth {self.stage} --help lists the fields)")

    def kit_fields(self) -> list[str]:
        """The fields the short --help and a dry run show: the kit's own, then the essential upstream ones."""
        kit = [
            name
            for t in self.dataclass_types
            if t.__module__.startswith("sage_unsloth")
            for name in _own_fields(t)
            if name in self.fields  # not a ClassVar (FIELD_RULES, ...)
        ]
        essential = [f for f in ESSENTIAL_UPSTREAM_FIELDS if f in self.fields]
        return list(dict.fromkeys([*kit, *essential]))

    def kit_help(self) -> str:
        import copy

        actions = []
        for name in self.kit_fields():
            if name in self.fields:
                action = copy.copy(self.fields[name])
                action.option_strings = action.option_strings[:1]  # --sage_guide, not also --sage-guide
                action.metavar = _metavar(action)
                action.help = action.help or "(see the stage's config files)"  # so its default is shown
                actions.append(action)
        formatter = argparse.ArgumentDefaultsHelpFormatter(self.prog, max_help_position=34, width=110)
        formatter.add_usage(f"{self.prog} CONFIG.yaml [--key value ...]", [], [])
        formatter.start_section("the kit's fields (a flag overrides the YAML key of the same name)")
        formatter.add_arguments(actions)
        formatter.end_section()
        upstream = sorted(
            {
                b.__name__
                for t in self.dataclass_types
                for b in t.__mro__
                if hasattr(b, "__dataclass_fields__")
                and not b.__name__.startswith("_")
                and not b.__module__.startswith("sage_unsloth")
            }
        )
        others = len({a.dest for a in self._actions} - {a.dest for a in actions})
        if others:
            formatter.add_text(
                f"{others} more fields (from {', '.join(upstream)}): sage-unsloth {self.stage} {HELP_ALL}"
            )
        return formatter.format_help()

    def _retired(self) -> dict[str, str]:
        """old key -> its one line, from each dataclass's RETIRED_FIELDS (a spelling the config no longer takes)."""
        return {
            k: hint for cls in self.dataclass_types for k, hint in getattr(cls, "RETIRED_FIELDS", {}).items()
        }

    def _refuse_retired(self, keys, where: str = "") -> None:
        retired = self._retired()
        for key in keys:
            if key in retired:
                raise ConfigError(f"{where}{retired[key]}")

    def parse(self, argv: list[str]):
        argv = list(argv)
        flags = [a.split("=", 1)[0][2:].replace("-", "_") for a in argv if a.startswith("--")]
        self._refuse_retired(flags, where="--")
        if "--config" in argv:
            at = argv.index("--config")
            if at + 1 >= len(argv):
                raise ConfigError("--config needs a YAML path")
            config_path = argv[at + 1]
            del argv[at : at + 2]
            config = load_config(config_path)
            self._refuse_retired(config, where=f"{config_path}: ")
            for key, value in (config.pop(ENV_KEY, None) or {}).items():
                os.environ[key] = str(value)
            self._check_config(config, config_path)
            self.set_defaults_with_config(**config)
        if HELP_ALL in argv:  # after the YAML: the defaults shown are the config's
            self.print_help()
            raise SystemExit(0)
        if "-h" in argv or "--help" in argv:
            print(self.kit_help())
            raise SystemExit(0)
        argv = self._split_numeric_lists(argv)
        _, unknown = self.parse_known_args(argv)
        flags = [arg for arg in unknown if arg.startswith("--")]
        if unknown:
            name = (flags[0] if flags else unknown[0]).split("=", 1)[0]
            if name == "--output_dir" and self.stage in OUTPUT_FLAGS:
                raise ConfigError(
                    f"--output_dir is not a flag of sage-unsloth {self.stage}: {OUTPUT_FLAGS[self.stage]}"
                )
            options = {o for a in self._actions for o in a.option_strings if o.startswith("--")}
            hint = suggestion(name, options) or f" (sage-unsloth {self.stage} --help lists the fields)"
            raise ConfigError(f"unknown {'flag' if flags else 'argument'} {name}{hint}")
        parsed = self.parse_args_into_dataclasses(args=argv)
        from sage_unsloth.runtime.credentials import move_secrets_to_environment

        move_secrets_to_environment(*parsed)  # before anything can save, pickle or log the arguments
        return parsed

    def _check_config(self, config: dict, path: str) -> None:
        for key, value in config.items():
            action = self.fields.get(key)
            if action is None:
                hint = (
                    suggestion(key, self.fields) or f": not a field of sage-unsloth {self.stage}; remove it"
                )
                raise ConfigError(f"{path}: unknown key {key!r}{hint}")
            listed = action.nargs in ("+", "*")
            if listed and action.type in (int, float) and isinstance(value, str):  # ks: "1,8"
                value = config[key] = [action.type(v) for v in re.split(r"[,\s]+", value.strip()) if v]
            if isinstance(value, str) and not listed and _field_kind(action) in ("an integer", "a number"):
                try:
                    action.type(value)  # "1e-5" is a float written as a string: fine
                except ValueError:
                    raise ConfigError(
                        f"{path}: {key}: {value!r} is not {_field_kind(action)}{self._example(key, key + ': ')}"
                    ) from None
            if value is None or isinstance(value, str) or _field_kind(action) is None:
                continue  # argparse converts a string (and reports a bad one through error())
            for item in value if listed and isinstance(value, list) else [value]:
                if not _is_instance(item, _field_kind(action)):
                    raise ConfigError(
                        f"{path}: {key}: {value!r} is not {_field_kind(action)}"
                        f"{' (a list)' if listed else ''}{self._example(key, key + ': ')}"
                    )

    def _example(self, dest: str, prefix: str) -> str:
        """'; e.g. <prefix><the dataclass default>', or nothing where that default is a sentinel (None, -1)."""
        default = self.field_defaults.get(dest)
        if default is None or (
            isinstance(default, (int, float)) and not isinstance(default, bool) and default < 0
        ):
            return ""
        return f"; e.g. {prefix}{default}"

    def _split_numeric_lists(self, argv: list[str]) -> list[str]:
        numeric = {
            o
            for a in self._actions
            if a.nargs in ("+", "*") and a.type in (int, float)
            for o in a.option_strings
        }
        out, in_list = [], False
        for arg in argv:
            if arg.startswith("--"):
                in_list = arg in numeric
                out.append(arg)
            elif in_list:
                out.extend(v for v in arg.split(",") if v)
            else:
                out.append(arg)
        return out


@functools.cache
def _stage_parser_class():
    """Built on first use: TRL is imported only then (after Unsloth, where a stage needs that)."""
    from trl import TrlParser

    class StageParser(StageParserMethods, TrlParser):
        """TrlParser with one-line errors, "did you mean", ``base:`` YAMLs and a short kit-first --help."""

    return StageParser
