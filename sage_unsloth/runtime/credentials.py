"""No secret in any written file: a token given as a flag or YAML key leaves the parsed arguments at once.

Stages parse their arguments in one place (sage_unsloth/config/args.py, ``StageParser.parse``), which calls
:func:`move_secrets_to_environment` on every parsed object. A field whose name says credential (``hub_token``,
an ``*_api_key``, ...; the rule of sage_unsloth/runtime/manifest.py) is moved into the environment variable the
library reads instead (``hub_token`` -> ``HF_TOKEN``, which huggingface_hub uses when the Trainer pushes with
``token=None``) and set to None on the object. So the pickled ``training_args.bin`` of every checkpoint, the
manifests and the W&B run config (built from the arguments) never hold it, and pushing still works.

A plug-in's argument named like a credential (``guide: {name: my.py:fn, api_key: ...}``: a key of a plug-in node,
a mapping field) cannot move to the environment, since the plug-in takes it as a keyword argument. It is sealed
instead (:func:`seal_secret_arguments`, from the same call): the mapping holds a :class:`SealedArgument`, a string
whose text is ``<redacted>`` and which carries the value beside it. So the pickled ``training_args.bin`` (it pickles
as the plain text ``<redacted>``), the config's ``to_dict`` / JSON (W&B's run config), its repr and the manifests
hold ``<redacted>``, and only the binding of the plug-in's arguments (sage_unsloth/plugins/registry.py, :func:`unsealed`)
hands the plug-in the value. A node given as JSON on the command line (``--guide '{"name": ..., "api_key": ...}'``) is
redacted in ``sys.argv`` and in every command line the kit prints or records (:func:`redact_argv`).

Drivers that start stages elsewhere (``sage-unsloth sweep``, the lab's runner) never put a credential into a
job's argument list either: a credential flag inside ``rlvr_args`` / ``eval_args`` / ``report_args`` is moved
into the driver's environment the same way (:func:`split_secret_flags`), and an executor that runs jobs on
other machines (slurm, ray) hands the credential variables of that environment to its jobs through a file
only the user can read (:func:`write_credentials_file`, mode 0600, removed when the driver ends), whose path,
not its contents, travels with each job (``SAGE_CREDENTIALS_FILE``). So the job records, logs, submitit's
pickles and Ray's task arguments hold no credential.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import sys
from pathlib import Path

from sage_unsloth.runtime.manifest import is_secret_key

logger = logging.getLogger(__name__)

# Field -> the environment variable its library reads when the field is None. Fields not listed go to their
# upper-cased name (e.g. wandb_api_key -> WANDB_API_KEY, the variable wandb reads).
SECRET_ENVIRONMENT = {"hub_token": "HF_TOKEN"}
CREDENTIALS_FILE_ENV = "SAGE_CREDENTIALS_FILE"  # a job's pointer to its driver's credentials file


MOVED: set[str] = set()  # the variables this process moved credentials into (a driver hands them to its jobs)


def environment_variable(field_name: str) -> str:
    """The environment variable a credential field's library reads (``hub_token`` -> ``HF_TOKEN``)."""
    return SECRET_ENVIRONMENT.get(field_name, field_name.upper())


def move_secrets_to_environment(*parsed) -> list[str]:
    """Move each credential field's value of the dataclass objects ``parsed`` into the environment and clear
    it, and seal each credential-like key of their mapping fields (:func:`seal_secret_arguments`); returns the
    names of the fields moved and of the keys sealed (``field.key``; for a test, never the values)."""
    moved = []
    for obj in parsed:
        if not dataclasses.is_dataclass(obj):
            continue
        moved += seal_secret_arguments(obj)
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name, None)
            if not value or not isinstance(value, str) or not is_secret_key(field.name):
                continue
            variable = environment_variable(field.name)
            os.environ[variable] = value  # the flag wins over an older value, as it would have as a field
            MOVED.add(variable)
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


class SealedArgument(str):
    """A plug-in argument holding a credential: the text ``<redacted>``, the value in :attr:`secret`. It pickles as
    the plain text (``training_args.bin``), copies as itself (the same process keeps the value)."""

    secret: str

    def __new__(cls, secret: str):
        sealed = super().__new__(cls, REDACTED)
        sealed.secret = str(getattr(secret, "secret", secret))
        return sealed

    def __reduce__(self):
        return (str, (REDACTED,))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def unsealed(value):
    """``value`` with each :class:`SealedArgument` in it (a mapping's values, a list's items) replaced by its
    secret: what a plug-in receives."""
    if isinstance(value, SealedArgument):
        return value.secret
    if isinstance(value, dict):
        return {key: unsealed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(unsealed(item) for item in value)
    return value


def seal_secret_arguments(obj) -> list[str]:
    """Seal the credential-like keys (:func:`~sage_unsloth.runtime.manifest.is_secret_key`) holding text in each mapping
    field of the dataclass ``obj`` (a plug-in node), at any depth; returns ``field.key`` of each."""
    sealed: list[str] = []

    def seal(mapping: dict, where: str) -> None:
        for key, value in mapping.items():
            if isinstance(value, dict):
                seal(value, f"{where}.{key}")
            elif (
                is_secret_key(key)
                and isinstance(value, str)
                and value
                and not isinstance(value, SealedArgument)
            ):
                mapping[key] = SealedArgument(value)
                sealed.append(f"{where}.{key}")

    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name, None)
        if isinstance(value, dict):
            seal(value, field.name)
    if sealed:
        logger.info("%s: sealed (<redacted> in every record; the plug-in gets the value)", ", ".join(sealed))
    return sealed


def _secret_flag(arg: str) -> tuple[str, bool] | None:
    """(field name, value given with '=') when ``arg`` is a credential flag, else None."""
    if not arg.startswith("--"):
        return None
    name, eq, _ = arg.partition("=")
    field = name[2:].replace("-", "_")
    if not field.isidentifier():  # "--max_steps 2 --hub_token X" is flags inside one argument, not a flag
        return None
    return (field, bool(eq)) if is_secret_key(field) else None


def redact_argv(argv: list[str]) -> list[str]:
    """``argv`` with the value of each credential flag (``--hub_token VALUE``, ``--hub-token=VALUE``, any name
    :func:`~sage_unsloth.runtime.manifest.is_secret_key` calls a credential) replaced by ``<redacted>``, also inside an
    argument that holds flags of its own (a sweep's ``--rlvr_args '--hub_token VALUE'``): for a command line the
    kit prints or records (the Ctrl-C line, a lock's holder), which must not echo a token."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        flag = _secret_flag(arg)
        if flag and flag[1]:
            arg = f"{arg.partition('=')[0]}={REDACTED}"
        elif flag is None and "--" in arg[2:]:  # flags inside one argument
            arg = _redact_inner(arg)
        else:
            arg = _redact_mapping(arg)
        hide_next = bool(flag) and not flag[1]
        out.append(arg)
    return out


def _redact_mapping(arg: str) -> str:
    """A JSON mapping argument (``{"api_key": ...}``, or ``--x_args={...}``) with its credential-like keys'
    values redacted; any other argument as it is."""
    name, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    if not value.lstrip().startswith("{") or (arg.startswith("--") and not eq):
        return arg
    try:
        mapping = json.loads(value)
    except ValueError:
        return arg
    if not isinstance(mapping, dict):
        return arg
    from sage_unsloth.runtime.manifest import scrub_secrets

    scrubbed = scrub_secrets(mapping)
    if scrubbed == mapping:
        return arg
    return f"{name}{eq}{json.dumps(scrubbed)}"


def _redact_inner(text: str) -> str:
    """``text`` (one argument holding flags of its own) with their credential values redacted."""
    if text.startswith("--") and "=" in text:  # --rlvr_args=--hub_token VALUE
        name, _, value = text.partition("=")
        return f"{name}={_redact_words(value)}"
    return _redact_words(text)


def _redact_words(text: str) -> str:
    try:
        inner = shlex.split(text)
    except ValueError:
        return text
    if inner == [text] and _secret_flag(text) is None:
        return text  # one word with "--" inside (a path like /tmp/a--b), not a flag: nothing more to split
    redacted = redact_argv(inner)
    return shlex.join(redacted) if redacted != inner else text


def split_secret_flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(``argv`` without its credential flags and their values, {environment variable: value}) for a stage
    command a driver builds: the variable is the one :func:`move_secrets_to_environment` would set."""
    out, found, take = [], {}, None
    for arg in argv:
        if take is not None:
            if arg.startswith("--"):
                out.append(arg)  # a flag without a value: nothing to move
            else:
                found[environment_variable(take)] = arg
            take = None
            continue
        flag = _secret_flag(arg)
        if flag is None:
            out.append(arg)
        elif flag[1]:
            found[environment_variable(flag[0])] = arg.partition("=")[2]
        else:
            take = flag[0]
    return out, found


def move_secret_flags(args: str, field: str) -> str:
    """A driver's flags for its stages (a sweep's ``rlvr_args``) without their credential flags, whose values
    move into this process's environment (:func:`split_secret_flags`), from where the jobs get them."""
    try:
        argv = shlex.split(args)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc} (unbalanced quotes?): fix its quoting") from None
    clean, found = split_secret_flags(argv)
    for variable, value in found.items():
        os.environ[variable] = value
        MOVED.add(variable)
        logger.info(
            "%s: a credential flag moved to the environment (%s), out of every job record", field, variable
        )
    return shlex.join(clean) if found else args


def secret_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The credential variables of ``env`` (default: this process's environment), e.g. HF_TOKEN, WANDB_API_KEY."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if v and is_secret_key(k)}


def write_credentials_file(folder: str | os.PathLike, variables: dict[str, str]) -> Path:
    """Write ``variables`` to ``folder/.credentials.json``, readable by the user only (0600, in a 0700 folder
    created for it), replacing an older one; returns its path."""
    folder = Path(folder) / ".credentials"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    path = folder / "credentials.json"
    tmp = folder / f".credentials.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(variables, fh)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_credentials_file(path: str | os.PathLike | None) -> dict[str, str]:
    """The variables of a credentials file (a job's ``SAGE_CREDENTIALS_FILE``); {} without one. A file others
    can read is refused (its owner should not have let it be), in one line."""
    if not path:
        return {}
    path = Path(path)
    mode = path.stat().st_mode & 0o077
    if mode:
        raise PermissionError(
            f"{path} is readable by others (mode {oct(path.stat().st_mode & 0o777)}): chmod 600 it"
        )
    variables = json.loads(path.read_text(encoding="utf-8"))
    return {str(k): str(v) for k, v in variables.items()}


def remove_credentials_file(path: str | os.PathLike | None) -> None:
    if path:
        Path(path).unlink(missing_ok=True)
        try:
            Path(path).parent.rmdir()
        except OSError:
            pass
