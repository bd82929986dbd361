"""Config errors in a second, all at once: every stage's fields are listed in config/stage_schema.json, read without TRL.

Every stage parses with TRL's parser over TRL/transformers dataclasses, so building it imports torch,
transformers and TRL (about 6 s idle, 15-60 s on a loaded machine) before a bad input can be reported, and then
it reports one problem at a time. :func:`check_stage_input` runs first (``sage-unsloth STAGE`` and each stage's
``main``): from the committed schema of the stage's fields (flags, types, lists, choices, and the
``FIELD_RULES`` of sage_unsloth/config/field_rules.py: intervals, names, plug-in syntax) it finds every problem of the
command line and of the YAML with its ``base:`` chain — a missing or unreadable config file, a YAML syntax error
(file, line, column), unknown flags and keys (with "did you mean"), values of the wrong type, names that are not
a choice, numbers out of range — and the stage prints them, one ``error:`` line each, exit 2, before anything
heavy is imported. It refuses only what the real parser and the configs' ``__post_init__`` refuse; those still
run afterwards, with the checks that need more than one field, a file or the machine.

The schema is generated from the parsers (``python -m sage_unsloth.config.schema --write``);
tests/cli/test_config_schema.py fails when it is out of date (a TRL bump that adds a field, a new rule) and holds each
rule to what the real dataclass refuses.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from functools import cache
from pathlib import Path

from sage_unsloth.config.field_rules import FALSE, SCHEMA, TRUE

# stage -> the (module, class) of each dataclass its parser is built over, by name: only `--write` imports them,
# so the stages can import this module (to check their input) without this module importing the stages.
STAGE_TYPES = {
    "sft": (
        ("sage_unsloth.sft.config", "SageSFTConfig"),
        ("sage_unsloth.config.model_config", "SageModelConfig"),
    ),
    "rlvr": (
        ("sage_unsloth.rlvr.config", "SageGRPOConfig"),
        ("sage_unsloth.rlvr.run", "RLVRStageArgs"),
        ("sage_unsloth.config.model_config", "SageModelConfig"),
    ),
    "eval": (("sage_unsloth.eval.config", "EvalConfig"),),
    "report": (("sage_unsloth.report.config", "ReportArguments"),),
    "sweep": (("sage_unsloth.jobs.sweep", "SweepConfig"),),
}
# Where each stage's configs live (the missing-file message names it).
CONFIGS_DIRS = {stage: f"configs/{stage}/" for stage in STAGE_TYPES}
# transformers fields whose names its __post_init__ checks against an enum its parser does not list as choices.
UPSTREAM_NAMES = {
    "optim": ("transformers.training_args", "OptimizerNames"),
    "lr_scheduler_type": ("transformers.trainer_utils", "SchedulerType"),
}
HELP_FLAGS = {"--help", "-h", "--help-all"}
KINDS = {"int": "an integer", "float": "a number", "bool": "true or false"}
_BAD = object()  # a value that did not convert (already reported)


# ---------------------------------------------------------------------------------------------- the schema
def live_schema() -> dict:
    """Each stage's flags and fields from its parser and its classes' FIELD_RULES (imports TRL)."""
    from sage_unsloth.config.args import stage_parser
    from sage_unsloth.config.field_rules import Names, field_rules

    upstream = {
        name: Names(tuple(str(m.value) for m in getattr(importlib.import_module(module), enum)))
        for name, (module, enum) in UPSTREAM_NAMES.items()
    }
    out = {}
    for stage, named in STAGE_TYPES.items():
        types = tuple(getattr(importlib.import_module(module), name) for module, name in named)
        parser = stage_parser(types, stage)
        rules = {name: rule for cls in types for name, rule in field_rules(cls).items()}
        flags = {o: a.dest for a in parser._actions for o in a.option_strings if o.startswith("--")}
        switches = sorted(o for a in parser._actions if a.nargs == 0 for o in a.option_strings)
        fields = {}
        for dest, action in sorted(parser.fields.items()):
            rule = rules.get(dest) or (upstream.get(dest) if dest in upstream else None)
            fields[dest] = _field_record(action, parser._example(dest, ""), rule)
        unknown_rules = sorted(set(rules) - set(fields))
        if unknown_rules:
            raise ValueError(f"{stage}: FIELD_RULES name fields its parser lacks: {unknown_rules}")
        out[stage] = {"flags": dict(sorted(flags.items())), "switches": switches, "fields": fields}
        retired = {old: hint for cls in types for old, hint in getattr(cls, "RETIRED_FIELDS", {}).items()}
        if retired:
            out[stage]["retired"] = dict(sorted(retired.items()))
    return out


def _field_record(action, example: str, rule) -> dict:
    type_name = getattr(action.type, "__name__", "")
    kind = {"string_to_bool": "bool", "int": "int", "float": "float"}.get(type_name, "str")
    record: dict = {"type": kind}
    if getattr(action.type, "__qualname__", "").startswith("_accept_none"):
        record["none_ok"] = True  # TRL's parser reads "none" / "null" as None for a `T | None` field
    if action.nargs in ("+", "*"):
        record["list"] = True
    elif action.nargs == "?":
        record["optional_value"] = True
    if action.choices:
        record["choices"] = [str(getattr(c, "value", c)) for c in action.choices]
    if example:
        record["example"] = example.removeprefix("; e.g. ")
    if rule is not None:
        record.update(rule.as_json())
    return record


@cache
def _schema() -> dict:
    try:
        return json.loads(SCHEMA.read_text())
    except (OSError, ValueError):
        return {}  # no schema: the parser reports everything, as before


# ---------------------------------------------------------------------------------------------- the check
class _Report:
    def __init__(self):
        self.lines: list[str] = []

    def add(self, line: str | None) -> None:
        if line and line not in self.lines:
            self.lines.append(line)


def check_stage_input(stage: str, argv: list[str]) -> list[str]:
    """Every problem of ``argv`` (``[CONFIG] [--key value ...]``) and its YAML found without TRL, one line each
    (without the ``error:`` prefix); [] when the real parser should go on. With ``--help`` only the config file is
    checked (the parser prints the help after reading it); a stage without a schema gets only that check too."""
    return stage_input(stage, argv)[1]


def stage_input(stage: str, argv: list[str]) -> tuple[dict, list[str]]:
    """(the values ``argv`` sets, field by field: the YAML with its ``base:`` chain under the flags, each converted
    as the stage's parser converts it; the problems :func:`check_stage_input` reports). What a check that must not
    import TRL (the doctor judging a card) reads a stage's command line with."""
    report, flag_report = _Report(), _Report()  # the config file's problems first, then the command line's
    entry = _schema().get(stage) or {}
    if HELP_FLAGS & set(argv):
        entry = {}
    config_path, given = _read_flags(stage, argv, entry, flag_report)
    config = None
    if config_path is not None:
        config = _read_config(config_path, CONFIGS_DIRS.get(stage, "configs/"), report)
    if not entry:
        return dict(config or {}), report.lines + flag_report.lines
    fields = entry["fields"]
    retired = entry.get("retired", {})
    from_yaml = (
        _check_config(stage, config_path, config, fields, report, retired) if config is not None else {}
    )
    values = {**from_yaml, **given}  # the command line replaces the YAML's value
    for key, value in values.items():
        if key in given:
            _check_rule(key, value, fields, values, flag_report, prefix="")
        else:
            _check_rule(key, value, fields, values, report, prefix=f"{config_path}: ")
    return values, report.lines + flag_report.lines


def stage_defaults(stage: str) -> dict:
    """Each field's default as the stage's parser has it (the schema's examples, converted as a flag is); a field
    whose default is None, a sentinel or a list is left out."""
    out = {}
    for name, field in ((_schema().get(stage) or {}).get("fields") or {}).items():
        if "example" in field and not field.get("list"):
            value = _convert(field["example"], field)
            if value is not _BAD:
                out[name] = value
    return out


def given_fields(stage: str, argv: list[str]) -> list[str]:
    """The fields ``argv`` sets, in the YAML (with its ``base:`` chain) or on the command line (what a dry run
    shows beside the kit's own fields)."""
    from sage_unsloth.config.args import BASE_KEY, ENV_KEY, ConfigError, load_config

    config_path, given = _read_flags(stage, argv, _schema().get(stage) or {}, _Report())
    try:
        config = load_config(config_path) if config_path else {}
    except (ConfigError, OSError):
        config = {}
    return [k for k in dict.fromkeys([*config, *given]) if k not in (BASE_KEY, ENV_KEY)]


def _read_flags(stage: str, argv: list[str], entry: dict, report: _Report) -> tuple[str | None, dict]:
    """(the config path, field -> value of each known flag, converted as TRL's parser converts it); unknown flags
    and bad values are reported."""
    from sage_unsloth.config.args import OUTPUT_FLAGS, suggestion

    flags, switches = entry.get("flags", {}), set(entry.get("switches", ()))
    config_path, tokens = (argv[0], argv[1:]) if argv and not argv[0].startswith("-") else (None, list(argv))
    given: dict[str, object] = {}
    at = 0
    while at < len(tokens):
        token = tokens[at]
        at += 1
        if token in HELP_FLAGS:
            continue
        if not _is_flag(token):
            if entry:
                report.add(f"unknown argument {token} (sage-unsloth {stage} --help lists the fields)")
            continue
        name, eq, inline = token.partition("=")
        values = [inline] if eq else []
        if not eq and name not in switches:
            while at < len(tokens) and not _is_flag(tokens[at]):
                values.append(tokens[at])
                at += 1
        if name == "--config":
            if values:
                config_path = values[0]
            else:
                report.add("--config needs a YAML path")
            continue
        if not entry:
            continue
        dest = flags.get(name)
        if dest is None:
            retired = entry.get("retired", {}).get(name[2:].replace("-", "_"))
            if retired:
                report.add(f"--{retired}")
            elif name == "--output_dir" and stage in OUTPUT_FLAGS:
                report.add(f"--output_dir is not a flag of sage-unsloth {stage}: {OUTPUT_FLAGS[stage]}")
            else:
                hint = suggestion(name, flags) or f" (sage-unsloth {stage} --help lists the fields)"
                report.add(f"unknown flag {name}{hint}")
            continue
        value = False if name in switches else _flag_value(name, values, entry["fields"][dest], report)
        if value is not _BAD:
            given[dest] = value
    return config_path, given


def _is_flag(token: str) -> bool:
    """What argparse reads as an option: a leading '-' that is not a negative number, and no space."""
    from sage_unsloth.config.args import NUMBER

    return token.startswith("-") and not NUMBER.match(token) and " " not in token


def _read_config(path: str, configs_dir: str, report: _Report) -> dict | None:
    from sage_unsloth.config.args import ConfigError, load_config

    if not Path(path).is_file():
        report.add(f"config file {path} not found: pass a YAML from {configs_dir}")
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        report.add(str(exc))
        return None


def _flag_value(name: str, values: list[str], field: dict, report: _Report):
    """The flag's value converted as TRL's parser converts it, or _BAD (reported)."""
    kind = field["type"]
    if field.get("list"):
        if kind in ("int", "float"):  # --ks 1,8 (config_args splits numeric lists at commas)
            values = [v for value in values for v in value.split(",") if v]
        if not values:
            report.add(f"argument {name}: expected at least one argument")
            return _BAD
        converted = [_convert(v, field) for v in values]
        bad = [v for v, c in zip(values, converted) if c is _BAD]
        if bad:
            report.add(f"{name} {bad[0]}: not {KINDS[kind]}{_example(field, name + ' ')}")
            return _BAD
        return converted
    if not values:
        if field.get("optional_value"):
            return True if kind == "bool" else None
        report.add(f"argument {name}: expected one argument")
        return _BAD
    if len(values) > 1:
        report.add(f"unknown argument {values[1]} (after {name} {values[0]}: it takes one value)")
    value = _convert(values[0], field)
    if value is _BAD:
        report.add(f"{name} {values[0]}: not {KINDS[kind]}{_example(field, name + ' ')}")
    return value


def _convert(text: str, field: dict):
    if field.get("none_ok") and text.lower() in ("none", "null"):
        return None
    kind = field["type"]
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        return _BAD
    if kind == "bool":
        lowered = text.lower()
        return True if lowered in TRUE else False if lowered in FALSE else _BAD
    return text


def _example(field: dict, prefix: str) -> str:
    return f"; e.g. {prefix}{field['example']}" if "example" in field else ""


def _check_config(
    stage, path, config: dict, fields: dict, report: _Report, retired: dict | None = None
) -> dict:
    """The YAML's keys and value types, as config_args' parser checks them; returns field -> converted value."""
    from sage_unsloth.config.args import BASE_KEY, ENV_KEY, suggestion

    values = {}
    for key, value in config.items():
        if key in (ENV_KEY, BASE_KEY):
            continue
        field = fields.get(key)
        if field is None and key in (retired or {}):
            report.add(f"{path}: {retired[key]}")
            continue
        if field is None:
            hint = suggestion(key, fields) or f": not a field of sage-unsloth {stage}; remove it"
            report.add(f"{path}: unknown key {key!r}{hint}")
            continue
        value = _yaml_value(path, key, value, field, report)
        if value is not _BAD:
            values[key] = value
    return values


def _yaml_value(path, key: str, value, field: dict, report: _Report):
    kind = field["type"]
    listed = field.get("list", False)
    if kind == "str" and any(
        isinstance(item, bool) for item in (value if isinstance(value, list) else [value])
    ):
        report.add(_boolean_text(path, key, value))
        return _BAD
    if value is None or kind == "str":
        return value
    if listed and isinstance(value, str) and kind in ("int", "float"):  # ks: "1, 8"
        value = [v for v in re.split(r"[,\s]+", value.strip()) if v]
    items = value if listed and isinstance(value, list) else [value]
    converted = []
    for item in items:
        ok = _convert(item, field) if isinstance(item, str) else item if _is_instance(item, kind) else _BAD
        if ok is _BAD:
            report.add(
                f"{path}: {key}: {value!r} is not {KINDS[kind]}{' (a list)' if listed else ''}"
                f"{_example(field, key + ': ')}"
            )
            return _BAD
        converted.append(ok)
    return converted if listed and isinstance(value, list) else converted[0]


def _boolean_text(path, key: str, value) -> str:
    """A text field given an unquoted yes/no/on/off/true/false, which YAML 1.1 (PyYAML) reads as a boolean: the line
    naming the file and line where it is written, its spelling and the quoted form."""
    from sage_unsloth.config.args import config_files
    from sage_unsloth.config.yaml_files import key_spelling

    try:
        found = key_spelling(config_files(path), key)
    except (ValueError, OSError):
        found = None
    if found is None or isinstance(value, list):
        return (
            f"{path}: {key}: {value!r} is a YAML boolean, not text (an unquoted yes, no, on, off, true or false): "
            f"quote the text, e.g. {key}: 'no'"
        )
    file, line, text = found
    return (
        f"{file}, line {line}: {key}: {text} is read by YAML as the boolean {value}, not as text: quote it, "
        f"{key}: '{text}'"
    )


def _is_instance(value, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    numeric = (int, float) if kind == "float" else (int,)
    return isinstance(value, numeric) and not isinstance(value, bool)


def _check_rule(key: str, value, fields: dict, values: dict, report: _Report, prefix: str) -> None:
    from sage_unsloth.config.args import suggestion
    from sage_unsloth.config.field_rules import names_in, node_name, rule_from_json

    field = fields[key]
    items = value if isinstance(value, list) else [value]
    if "choices" in field:
        for item in items:
            if item is not None and str(item) not in field["choices"]:
                report.add(
                    f"{prefix}{key}={item!r} is not one of {', '.join(field['choices'])}"
                    f"{suggestion(str(item), field['choices'])}"
                )
    rule = rule_from_json(field)
    if rule is None:
        return
    extra = names_in(values.get(field["also_from"])) if field.get("also_from") else ()
    for item in items:
        if item is not None and (problem := rule.problem(key, item, extra)):
            report.add(prefix + problem)
            continue
        spec = node_name(item) if field.get("node") else item  # a node's plug-in is its name
        if field.get("plugins") and isinstance(spec, str) and ":" in spec:  # with the other problems, now
            report.add(plugin_location_problem(key, spec))


def plugin_location_problem(key: str, spec: str) -> str | None:
    """Why the plug-in ``spec`` (``path/to/file.py:function`` or ``package.module:function``) cannot be where it says,
    found without importing it, in the words of the stage's own import (sage_unsloth/plugins/registry.py), or None: a file
    that does not exist, does not parse (its line) or defines no such name at its top level; a module whose top-level
    package is not on the path. What only importing it shows (a failing import, the signature, the arguments, the
    trial call) is the stage's, after this check."""
    import ast
    import importlib.util

    from sage_unsloth.config.args import suggestion

    module, _, attr = spec.partition(":")
    if not (module.endswith(".py") or "/" in module):
        top = module.split(".")[0]
        if importlib.util.find_spec(top) is None:
            return (
                f"{key}={spec!r}: cannot import module {module!r} (No module named {top!r}); put its folder on "
                "PYTHONPATH or name the file ('path/to/file.py:function')"
            )
        return None
    path = Path(module).expanduser()
    if not path.is_file():
        return f"{key}={spec!r}: no file {str(path)!r} (paths are relative to the working directory)"
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as err:
        return f"{key}={spec!r}: {path.name} line {err.lineno}: {type(err).__name__}: {err.msg}"
    except (OSError, ValueError):
        return None  # unreadable, or null bytes: the import says what
    names = _top_level_names(tree)
    if names is None or attr in names:
        return None
    public = sorted(n for n in names if not n.startswith("_"))
    return f"{key}={spec!r}: module {module!r} has no {attr!r}{suggestion(attr, public)}"


def _top_level_names(tree) -> set[str] | None:
    """The names a module's top level binds (definitions, assignments, imports, in its if / try / with blocks too);
    None where it cannot be told without running it (a star import, a module __getattr__, globals())."""
    import ast

    names: set[str] = set()
    blocks = [tree.body]
    while blocks:
        for node in blocks.pop():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                if any(alias.name == "*" for alias in node.names):
                    return None
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                targets += [item.optional_vars for item in getattr(node, "items", ())]
                names.update(
                    n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)
                )
            for field in ("body", "orelse", "finalbody", "handlers"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    blocks.extend(
                        [getattr(node, field)] if isinstance(getattr(node, field, None), list) else []
                    )
    if "__getattr__" in names or any(
        isinstance(n, ast.Name) and n.id in ("globals", "setattr", "exec") for n in ast.walk(tree)
    ):
        return None
    return names


def refuse_bad_input(stage: str, argv: list[str]) -> int | None:
    """Print every problem :func:`check_stage_input` finds, one ``error:`` line each, and return 2; None when
    there is none (go on to the real parser)."""
    problems = check_stage_input(stage, argv)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    return 2 if problems else None


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m sage_unsloth.config.schema --write")
    SCHEMA.write_text(json.dumps(live_schema(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {SCHEMA}")
    from sage_unsloth.config import editor_schema  # the same rules as JSON Schema, for editors

    for path in editor_schema.write():
        print(f"wrote {path}")
