"""A flag typo fails in about a second: each stage's flags are listed in stage_flags.json, read without TRL.

Every stage parses with TRL's parser over TRL/transformers dataclasses, so building it imports torch,
transformers and TRL (about 6 s idle, 40-60 s on a loaded machine) before an unknown flag can be reported.
:func:`check_flags` runs first (``sage-unsloth STAGE`` and each stage's ``main``): it reads the committed list of
the stage's option strings and YAML keys and reports an unknown one in one line, with "did you mean", exit 2,
before anything heavy is imported. It only refuses what the real parser would refuse; all other checks stay
with the parser. The list is generated from the parsers (``python -m sage_unsloth.flag_catalogue --write``) and
tests/test_flag_catalogue.py fails when it is out of date (a TRL bump that adds or removes a field).
"""

from __future__ import annotations

import importlib
import json
import sys
from functools import cache
from pathlib import Path

CATALOGUE = Path(__file__).with_name("stage_flags.json")
# stage -> the (module, class) of each dataclass its parser is built over, by name: only `--write` imports them,
# so the stages can import this module (to check their flags) without this module importing the stages.
STAGE_TYPES = {
    "sft": (("sage_unsloth.sft.config", "SageSFTConfig"), ("sage_unsloth.model_config", "SageModelConfig")),
    "rlvr": (
        ("sage_unsloth.rlvr.config", "SageGRPOConfig"),
        ("sage_unsloth.rlvr.run", "RLVRStageArgs"),
        ("sage_unsloth.model_config", "SageModelConfig"),
    ),
    "eval": (("sage_unsloth.eval.config", "EvalConfig"),),
    "report": (("sage_unsloth.report.config", "ReportArguments"),),
    "sweep": (("sage_unsloth.sweep", "SweepConfig"),),
}
ALWAYS = {"--config", "--help", "-h", "--help-all"}


def live_catalogue() -> dict[str, dict[str, list[str]]]:
    """The option strings and field names of each stage's parser, from the parsers themselves (imports TRL)."""
    from sage_unsloth.config_args import stage_parser

    out = {}
    for stage, named in STAGE_TYPES.items():
        types = tuple(getattr(importlib.import_module(module), name) for module, name in named)
        parser = stage_parser(types, stage)
        options = sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--")})
        out[stage] = {"flags": options, "keys": sorted(parser.fields)}
    return out


@cache
def _catalogue() -> dict:
    try:
        return json.loads(CATALOGUE.read_text())
    except (OSError, ValueError):
        return {}  # no list: the parser reports everything, as before


def unknown_flag(stage: str, argv: list[str]) -> str | None:
    """The one-line error for the first unknown flag or YAML key of ``argv``, or None. Only a name the list does
    not hold is reported; a stage without a list is not checked."""
    from sage_unsloth.config_args import suggestion  # stdlib only: no TRL

    entry = _catalogue().get(stage)
    if not entry:
        return None
    flags, keys = set(entry["flags"]) | ALWAYS, set(entry["keys"])
    config = argv[0] if argv and not argv[0].startswith("-") else None
    for at, arg in enumerate(argv):
        if arg == "--config" and at + 1 < len(argv):
            config = argv[at + 1]
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        if name not in flags:
            if name == "--output_dir":
                return None  # the parser's own message names where that stage writes
            hint = suggestion(name, flags) or f" (sage-unsloth {stage} --help lists the fields)"
            return f"unknown flag {name}{hint}"
    if config and Path(config).is_file():
        from sage_unsloth.config_args import BASE_KEY, ENV_KEY, ConfigError, load_config

        try:
            data = load_config(config)
        except (ConfigError, OSError):
            return None  # the parser reports a broken YAML in its own words
        for key in data:
            if key not in keys and key not in (ENV_KEY, BASE_KEY):
                return f"{config}: unknown key {key!r}{suggestion(key, keys) or f': not a field of sage-unsloth {stage}; remove it'}"
    return None


def check_flags(stage: str, argv: list[str]) -> int | None:
    """Print the one line and return 2 for an unknown flag or key, else None (go on to the real parser)."""
    error = unknown_flag(stage, argv)
    if error is None:
        return None
    print(f"error: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m sage_unsloth.flag_catalogue --write")
    CATALOGUE.write_text(json.dumps(live_catalogue(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {CATALOGUE}")
