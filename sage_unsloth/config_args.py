"""The command-line shape shared by every stage: ``CONFIG.yaml [--key value ...]``.

TRL's ``TrlParser`` reads a YAML through ``--config``; the stages also take it as the first positional
argument, the way the scripts and README call them.
"""

from __future__ import annotations

from pathlib import Path


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
    import yaml

    for i, arg in enumerate(argv):
        if arg == "--backend" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--backend="):
            return arg.split("=", 1)[1]
    config_path = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else (argv[0] if argv else "")
    if config_path and not config_path.startswith("--") and Path(config_path).is_file():
        config = yaml.safe_load(Path(config_path).read_text()) or {}
        if isinstance(config, dict) and config.get("backend"):
            return str(config["backend"])
    return default
