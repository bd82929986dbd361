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
