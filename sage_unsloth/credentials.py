"""No secret in any written file: a token given as a flag or YAML key leaves the parsed arguments at once.

Stages parse their arguments in one place (sage_unsloth/config_args.py, ``StageParser.parse``), which calls
:func:`move_secrets_to_environment` on every parsed object. A field whose name says credential (``hub_token``,
an ``*_api_key``, ...; the rule of sage_unsloth/manifest.py) is moved into the environment variable the
library reads instead (``hub_token`` -> ``HF_TOKEN``, which huggingface_hub uses when the Trainer pushes with
``token=None``) and set to None on the object. So the pickled ``training_args.bin`` of every checkpoint, the
manifests and the W&B run config (built from the arguments) never hold it, and pushing still works.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

from sage_unsloth.manifest import is_secret_key

logger = logging.getLogger(__name__)

# Field -> the environment variable its library reads when the field is None. Fields not listed go to their
# upper-cased name (e.g. wandb_api_key -> WANDB_API_KEY, the variable wandb reads).
SECRET_ENVIRONMENT = {"hub_token": "HF_TOKEN"}


def move_secrets_to_environment(*parsed) -> list[str]:
    """Move each credential field's value of the dataclass objects ``parsed`` into the environment and clear
    it; returns the names of the fields moved (for a test, never the values)."""
    moved = []
    for obj in parsed:
        if not dataclasses.is_dataclass(obj):
            continue
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name, None)
            if not value or not isinstance(value, str) or not is_secret_key(field.name):
                continue
            variable = SECRET_ENVIRONMENT.get(field.name, field.name.upper())
            os.environ[variable] = value  # the flag wins over an older value, as it would have as a field
            setattr(obj, field.name, None)
            moved.append(field.name)
            logger.info(
                "--%s: moved to the environment (%s) so that no written file holds it", field.name, variable
            )
    if moved:
        # W&B records sys.argv in its run metadata: the flags' values go from there too (not from /proc, which
        # no file is written from).
        sys.argv[1:] = redact_argv(sys.argv[1:])
    return moved


REDACTED = "<redacted>"


def redact_argv(argv: list[str]) -> list[str]:
    """``argv`` with the value of each credential flag (``--hub_token VALUE``, ``--hub-token=VALUE``, any name
    :func:`~sage_unsloth.manifest.is_secret_key` calls a credential) replaced by ``<redacted>``: for a command
    line the kit prints (the Ctrl-C line), which must not echo a token."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, eq, _ = arg.partition("=")
        secret = arg.startswith("--") and is_secret_key(name[2:].replace("-", "_"))
        if secret and eq:
            arg = f"{name}={REDACTED}"
        hide_next = secret and not eq
        out.append(arg)
    return out
