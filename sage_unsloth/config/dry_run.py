"""``--dry-run`` of every stage (``dry_run`` is a field of each stage's config: config_args.DryRunArgs).

The stage parses and checks its input as a run would (the config, the folders it reads, the checkpoint it would
resume), then prints, as YAML: the resolved config (the kit's own fields and every field the YAML or the command
line set, with the values the run would use) and the plan (where the outputs go, what would be resumed or skipped,
the method, the sampler); and exits 0 without loading a model or writing anything. An input the run would refuse
is its one ``error:`` line after the config, exit 2.

On a machine without a GPU a dry run plans for the GPU the config asks for: the config is parsed as on that GPU
(:func:`parse_anywhere`: transformers refuses ``bf16: true`` on a CPU while parsing), the GPU's own checks (vLLM
needs a GPU) are left to it, and a ``gpu:`` line says what it would need, as ``sage-unsloth doctor`` does
(:func:`gpu_needs`: bfloat16, Unsloth, vLLM, 4-bit; the doctor's ``--gpu NAME`` judges a card and its memory).
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
    from sage_unsloth.config.args import stage_parser
    from sage_unsloth.config.schema import given_fields

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

    from sage_unsloth.runtime.manifest import scrub_secrets

    print(yaml.safe_dump(scrub_secrets(plain(data)), sort_keys=False, width=10_000).rstrip(), flush=True)


def redacted_command(argv: list[str]) -> str:
    """A command line as the dry run prints it: the value of a credential flag (``--hub_token``) redacted."""
    import shlex

    from sage_unsloth.runtime.credentials import redact_argv

    return shlex.join(redact_argv(list(argv)))


def parse_anywhere(parse, argv: list[str]):
    """``parse(argv)`` for a dry run: on a machine without CUDA, with ``--use_cpu true`` added for the parse (a
    config asking for bf16 is then not refused by transformers on this CPU) and ``use_cpu`` put back to what the
    command asked on each parsed object, so the plan shows the config the GPU would run."""
    from sage_unsloth.config.args import requested_flag
    from sage_unsloth.runtime.backend import cuda_available

    if cuda_available() or requested_flag(argv, "use_cpu"):
        return parse(argv)
    parsed = parse([*argv, "--use_cpu", "true"])
    for item in parsed if isinstance(parsed, tuple) else (parsed,):
        if hasattr(item, "use_cpu"):
            item.use_cpu = False
    return parsed


def gpu_needs(config_path: str | None, resolved: dict) -> str | None:
    """On a machine without CUDA: what the config's GPU would need (bfloat16 and its compute capability, Unsloth's
    kernels, vLLM, 4-bit weights), in one line naming the doctor's command that judges a card and estimates its
    memory; None on a GPU, or for a config that needs none. ``resolved``: the dry run's config (its values win over
    the YAML's)."""
    from sage_unsloth.runtime.backend import cuda_available

    if cuda_available():
        return None
    from sage_unsloth.config.args import load_config

    try:
        config = {**(load_config(config_path) if config_path else {}), **resolved}
    except (ValueError, OSError):
        config = dict(resolved)
    wants = []
    if config.get("bf16") or str(config.get("dtype")).replace("torch.", "") == "bfloat16":
        wants.append("bfloat16 (compute capability 8.0+: A100, L4, H100)")
    if config.get("backend") == "unsloth":
        wants.append("Unsloth (CUDA kernels)")
    if config.get("use_vllm"):
        wants.append("vLLM")
    if config.get("load_in_4bit"):
        wants.append("4-bit weights (bitsandbytes)")
    if not wants:
        return None
    doctor = f"sage-unsloth doctor {config_path or 'CONFIG'} --gpu NAME"
    return (
        f"this machine has no GPU; the run needs one for {', '.join(wants)} ({doctor} judges a card and estimates "
        "the memory)"
    )


def show_gpu_needs(config_path: str | None, resolved: dict) -> bool:
    """Print :func:`gpu_needs` as the plan's ``gpu:`` line when there is one; True when this machine plans for
    another (the GPU's own checks are then that machine's)."""
    need = gpu_needs(config_path, resolved)
    if need is not None:
        _print_yaml({"gpu": need})
    return need is not None
