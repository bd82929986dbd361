"""``--dry-run`` of every stage (``dry_run`` is a field of each stage's config: config_args.DryRunArgs).

The stage parses and checks its input as a run would (the config, the folders it reads, the checkpoint it would
resume), then prints, as YAML: the resolved config (the kit's own fields and every field the YAML or the command
line set, with the values the run would use) and the plan (where the outputs go, what would be resumed or skipped,
the method, the sampler); and exits 0 without loading a model or writing anything. An input the run would refuse
is its one ``error:`` line after the config, exit 2.
"""

from __future__ import annotations

import dataclasses
import enum


def plain(value):
    """``value`` as YAML-safe plain data (paths and enums as text, tuples as lists)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def resolved_config(stage: str, configs: tuple, argv: list[str]) -> dict:
    """The fields a dry run shows: the kit's own (as ``--help`` lists them) and those ``argv`` sets, each with its
    resolved value from the first of ``configs`` (the parsed dataclasses) that has it."""
    from sage_unsloth.config_args import stage_parser
    from sage_unsloth.config_schema import given_fields

    names = stage_parser(tuple(type(c) for c in configs), stage).kit_fields()
    names += [n for n in given_fields(stage, argv) if n not in names]
    out = {}
    for name in names:
        for config in configs:
            if hasattr(config, name):
                out[name] = plain(getattr(config, name))
                break
    return out


def show(stage: str, config: dict, plan: dict | None = None) -> None:
    """Print the header and the config (then the plan, when it is known) as YAML."""
    print(f"# sage-unsloth {stage} --dry-run: nothing is loaded or written; drop --dry-run to run it")
    _print_yaml({"config": config})
    if plan is not None:
        show_plan(plan)


def show_plan(plan: dict) -> None:
    _print_yaml({"plan": plan})


def _print_yaml(data: dict) -> None:
    """One value a line (no folding of long commands); credentials redacted as in the manifests."""
    import yaml

    from sage_unsloth.manifest import scrub_secrets

    print(yaml.safe_dump(scrub_secrets(plain(data)), sort_keys=False, width=10_000).rstrip(), flush=True)


def redacted_command(argv: list[str]) -> str:
    """A command line as the dry run prints it: the value of a credential flag (``--hub_token``) redacted."""
    import shlex

    from sage_unsloth.credentials import redact_argv

    return shlex.join(redact_argv(list(argv)))
