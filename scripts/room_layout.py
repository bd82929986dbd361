#!/usr/bin/env python
"""Groups the package's top level into rooms by what the modules are, so that the layout shows the architecture:
the map below says where each flat module goes; this script moves the files there (``git mv``, so history
follows) and rewrites every name that points at one.

    python scripts/room_layout.py            # move what is still flat, rewrite the names; idempotent
    python scripts/room_layout.py --check    # exit 1 naming each module still to move and each stale name

Rooms (each a package with a docstring saying what it holds; ``compat.py``, the one contact with TRL / Unsloth /
vLLM internals, and ``cli.py``, the entry point, stay where they are):

    config/    what a run is asked: the stage parsers, the pre-import schema check, field rules, bounded YAML
               reading, the editors' JSON Schemas, input checks, the dry run, the training stages' command
               line, the lab's method cards
    runtime/   what keeps a run safe and recorded: checkpoints and their contents, the finite-step guard,
               interrupts, the process lifeline, folder locks, logs, manifests, credentials, the output layout,
               the results contract, the W&B run contract, the backend (which stack runs)
    plugins/   the four plug-in kinds and their one contract: the registry, the call wrapper, its guard and the
               trial call, the guides (with the SAGE math, anchor.py), advantage estimators, policy terms, KL terms
    model/     loading the model stacks, and the tiny offline model
    jobs/      the job graph and what runs multi-step work on it: executors, the sweep, the stage commands
               (recipe), the notebooks' recipe
    data/      the bundled data and the prompt format; eval/ takes ``sample`` and ``export``

What a run rewrites, in every tracked text file: the import statements (``from sage_unsloth import anchor``
becomes ``from sage_unsloth.plugins import anchor``; a module renamed in its room keeps its local name, ``from
sage_unsloth.plugins import calls as plugin_calls``; a relative import stays relative to the file's new place),
dotted names anywhere (``"sage_unsloth.rlvr.kl_terms.KL_TERMS"`` in a monkeypatch target, ``python -m
sage_unsloth.config_schema``), file paths (``sage_unsloth/config_args.py``, ``rlvr/kl_terms.py``, a bare
``config_args.py`` in prose), a moved file's ``Path(__file__).resolve().parents[k]`` (it sits deeper), and the
package data of pyproject.toml; then ruff sorts and formats the Python files
it changed (under sage_unsloth/, tests/, benchmarks/, scripts/), notebooks/build.py regenerates the notebooks
and the editor schema module its JSON Schemas. A branch
that still has flat modules (or names them) is brought over by running this again.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = "sage_unsloth"

# old path (relative to sage_unsloth/) -> new path: a module, a package folder, or a data file
MOVES: dict[str, str] = {
    # configuration
    "config_args.py": "config/args.py",
    "config_schema.py": "config/schema.py",
    "field_rules.py": "config/field_rules.py",
    "input_checks.py": "config/input_checks.py",
    "dry_run.py": "config/dry_run.py",
    "model_config.py": "config/model_config.py",
    "training_cli.py": "config/training_cli.py",
    "method_cards.py": "config/method_cards.py",
    "stage_schema.json": "config/stage_schema.json",
    "config_yaml.py": "config/yaml_files.py",
    "editor_schema.py": "config/editor_schema.py",
    # runtime safety and records
    **{
        f"{name}.py": f"runtime/{name}.py"
        for name in (
            "checkpoints",
            "checkpoint_contents",
            "finite_steps",
            "interrupt",
            "lifeline",
            "folder_lock",
            "log_writer",
            "training_log",
            "manifest",
            "credentials",
            "backend",
            "layout",
            "results",
            "wandb_runs",
        )
    },
    # plug-ins
    "registry.py": "plugins/registry.py",
    "plugin_calls.py": "plugins/calls.py",
    "plugin_guard.py": "plugins/guard.py",
    "guides.py": "plugins/guides.py",
    "anchor.py": "plugins/anchor.py",
    "rlvr/advantages.py": "plugins/advantages.py",
    "rlvr/policy_terms.py": "plugins/policy_terms.py",
    "rlvr/kl_terms.py": "plugins/kl_terms.py",
    "rlvr/plugin_probe.py": "plugins/probe.py",
    # the model stacks
    "models.py": "model/loading.py",
    "tiny_model.py": "model/tiny.py",
    # the job graph and what runs on it
    "executors": "jobs/executors",
    "sweep.py": "jobs/sweep.py",
    "recipe.py": "jobs/recipe.py",
    "notebook.py": "jobs/notebook.py",
    # data and the commands of the eval room
    "prompts.py": "data/prompts.py",
    "sample.py": "eval/sample.py",
    "export.py": "eval/export.py",
}

ROOMS = {
    "config": "What a run is asked: each stage's parser over its config classes (args.py), the check of every input "
    "before TRL is imported (schema.py, stage_schema.json, field_rules.py), bounded YAML reading (yaml_files.py), "
    "the editors' JSON Schemas (editor_schema.py), input files and folders (input_checks.py), the dry run, the "
    "training stages' command line and the lab's method cards.",
    "runtime": "What keeps a run safe and recorded: complete and sane checkpoints, the finite-step guard, interrupts "
    "and the process lifeline, folder locks, the training log, manifests and credentials, the output layout, the "
    "results contract between eval and report, the W&B run contract (wandb_runs.py), and which stack runs "
    "(backend.py).",
    "plugins": "The four plug-in kinds and their one contract (docs/extending.md): the registry that resolves a "
    "config's node, the call wrapper with its guard (guard.py: time budgets, signals, exits) and the trial call "
    "before loading, the guides with the SAGE math they use (anchor.py), the advantage estimators, the policy terms "
    "and the KL terms.",
    "model": "Loading the model stacks (TRL / Unsloth, the base and its LoRA) and the tiny offline model the tests and "
    "the demo build.",
}


def module_of(path: str) -> str:
    """The dotted module of a path under sage_unsloth/ (a package folder, a .py file)."""
    name = path.removesuffix(".py").replace("/", ".")
    return f"{PKG}.{name}"


MODULES = {module_of(old): module_of(new) for old, new in MOVES.items() if not old.endswith(".json")}


def new_module(name: str) -> str | None:
    """The module ``name`` moved to (a name inside a moved package moves with it), or None."""
    for old in sorted(MODULES, key=len, reverse=True):
        if name == old or name.startswith(old + "."):
            return MODULES[old] + name[len(old) :]
    return None


# ------------------------------------------------------------------------------------------------ the moves
def git(*args: str, check: bool = True) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=check, capture_output=True, text=True).stdout


def pending_moves() -> list[tuple[Path, Path]]:
    pkg = REPO / PKG
    return [(pkg / old, pkg / new) for old, new in MOVES.items() if (pkg / old).exists()]


def move_files() -> None:
    for old, new in pending_moves():
        if new.exists():
            raise SystemExit(f"{old} and {new} both exist: merge them by hand, then run this again")
        new.parent.mkdir(parents=True, exist_ok=True)
        init = new.parent / "__init__.py"
        if new.parent.name in ROOMS and not init.exists():
            init.write_text(f'"""{_wrap(ROOMS[new.parent.name])}\n"""\n')
            git("add", str(init))
        git("mv", str(old), str(new))


def _wrap(text: str, width: int = 110) -> str:
    lines, line = [], ""
    for word in text.split():
        if len(line) + len(word) + 1 > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


# ------------------------------------------------------------------------------------------------ the imports
def file_module(path: Path) -> list[str]:
    """The package a .py file at ``path`` sits in, as parts (``sage_unsloth/demo/run.py`` -> [sage_unsloth, demo])."""
    rel = path.relative_to(REPO)
    return list(rel.parts[:-1])


def future_package(path: Path) -> list[str]:
    """The package the file will sit in once moved (its own move, or its folder's)."""
    rel = path.relative_to(REPO / PKG).as_posix() if path.is_relative_to(REPO / PKG) else None
    if rel is None:
        return file_module(path)
    for old in sorted(MOVES, key=len, reverse=True):
        if rel == old or rel.startswith(old + "/"):
            new = MOVES[old] + rel[len(old) :]
            return [PKG, *Path(new).parts[:-1]]
    return file_module(path)


def resolve(node: ast.ImportFrom, package: list[str]) -> str:
    if not node.level:
        return node.module or ""
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def relative(target: str, package: list[str]) -> str:
    """``target`` (dotted) as seen from ``package``: relative when they share the top package, else absolute."""
    parts = target.split(".")
    common = 0
    while common < min(len(parts), len(package)) and parts[common] == package[common]:
        common += 1
    if common == 0:
        return target
    return "." * (len(package) - common + 1) + ".".join(parts[common:])


def rewrite_imports(path: Path, text: str) -> str:
    """``text`` of the .py file at ``path`` with each import of a moved module pointing at its new place."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    package, future = file_module(path), future_package(path)
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [(a.name, a.asname) for a in node.names]
            if not any(new_module(n) for n, _ in names):
                continue
            parts = [f"{new_module(n) or n}" + (f" as {a}" if a else "") for n, a in names]
            edits.append((node, [f"import {', '.join(parts)}"]))
        elif isinstance(node, ast.ImportFrom):
            source = resolve(node, package)
            if not source.startswith(PKG):
                continue
            lines = _from_lines(node, source, future)
            if lines is not None:
                edits.append((node, lines))
    if not edits:
        return text
    rows = text.splitlines(keepends=True)
    for node, lines in sorted(edits, key=lambda e: e[0].lineno, reverse=True):
        first, last = node.lineno - 1, node.end_lineno - 1
        indent = rows[first][: node.col_offset]
        tail = rows[last][node.end_col_offset :]
        comment = tail.rstrip("\n")
        new = [indent + line + "\n" for line in lines]
        if comment.strip():
            new[0] = new[0].rstrip("\n") + comment + "\n"
        rows[first : last + 1] = new
    return "".join(rows)


def _from_lines(node: ast.ImportFrom, source: str, future: list[str]) -> list[str] | None:
    relative_form = node.level > 0
    where = (lambda target: relative(target, future)) if relative_form else (lambda target: target)
    moved = new_module(source)
    if moved is not None:  # the module itself moved: its names come along
        return [f"from {where(moved)} import {_names(node.names)}"]
    groups: dict[str, list[str]] = {}
    stay = []
    for alias in node.names:
        target = new_module(f"{source}.{alias.name}")
        if target is None:
            stay.append(alias)
            continue
        parent, leaf = target.rsplit(".", 1)
        local = alias.asname or alias.name
        groups.setdefault(parent, []).append(leaf if leaf == local else f"{leaf} as {local}")
    if not groups:
        if relative_form and where(source) != "." * node.level + (node.module or ""):
            return [f"from {where(source)} import {_names(node.names)}"]  # the file itself moved
        return None
    lines = [f"from {where(source)} import {_names(stay)}"] if stay else []
    lines += [f"from {where(parent)} import {', '.join(names)}" for parent, names in groups.items()]
    return lines


def _names(aliases) -> str:
    return ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)


# ------------------------------------------------------------------------------------------------ names in text
def _patterns() -> list[tuple[re.Pattern, str]]:
    out = []
    for old, new in sorted(MODULES.items(), key=lambda item: -len(item[0])):
        out.append((re.compile(r"(?<![\w.])" + re.escape(old) + r"(?!\w)"), new))
    for old, new in sorted(MOVES.items(), key=lambda item: -len(item[0])):
        out.append((re.compile(r"(?<![\w./])" + re.escape(f"{PKG}/{old}") + r"(?![\w])"), f"{PKG}/{new}"))
        # a path relative to the package (rlvr/kl_terms.py, executors/slurm.py) or a bare file name in prose; a
        # folder only with its slash, and not a name quoted on its own (code building a path: "stage_schema.json")
        end = r"(?=/)" if "." not in old else r"(?=[\s)`,:;/]|$)"
        out.append((re.compile(r"(?<![\w./\"'])" + re.escape(old) + end, re.MULTILINE), new))
    return out


PATTERNS = _patterns()


def rewrite_names(text: str) -> str:
    text = rewrite_import_lines(text)
    for pattern, new in PATTERNS:
        text = pattern.sub(new, text)
    return text


IMPORT_LINE = re.compile(
    rf"^([ \t]*)(from[ \t]+{PKG}[\w.]*[ \t]+import[ \t]+[\w, \t]+?)([ \t]*#[^\n]*)?[ \t]*$", re.MULTILINE
)


def rewrite_import_lines(text: str) -> str:
    """A one-line absolute ``from sage_unsloth import a, b`` that the AST does not see as an import (inside a
    string of code a test runs in a subprocess, a doc's code block) rewritten as an import statement is: a moved
    module's name would not be dotted, so :data:`PATTERNS` would miss it."""

    def one(match: re.Match) -> str:
        try:
            (node,) = ast.parse(match[2]).body
        except (SyntaxError, ValueError):
            return match[0]
        if not isinstance(node, ast.ImportFrom) or node.level:
            return match[0]
        lines = _from_lines(node, node.module or "", [])
        if lines is None:
            return match[0]
        return "\n".join(match[1] + line for line in lines) + (match[3] or "")

    return IMPORT_LINE.sub(one, text)


def rewrite_pyproject(text: str) -> str:
    """The schema travels as package data of its new package."""
    line = re.search(r'^"sage_unsloth" = \[(.*)\]\n', text, re.MULTILINE)
    if line and '"stage_schema.json"' in line[1]:
        rest = [
            item.strip()
            for item in line[1].split(",")
            if item.strip() and item.strip() != '"stage_schema.json"'
        ]
        replaced = (f'"sage_unsloth" = [{", ".join(rest)}]\n' if rest else "") + (
            '"sage_unsloth.config" = ["stage_schema.json"]\n'
        )
        text = text[: line.start()] + replaced + text[line.end() :]
    return text


TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".sh", ".in", ".ini"}
# this script, and the rooms' own docstrings it writes (they name their modules by their new, short names)
SKIP = {"scripts/room_layout.py", *(f"{PKG}/{room}/__init__.py" for room in ROOMS)}


def tracked_text_files() -> list[Path]:
    files = git("ls-files", "--cached", "--others", "--exclude-standard").split("\n")
    out = []
    for name in files:
        path = REPO / name
        if not name or name in SKIP or not path.is_file():
            continue
        if path.suffix in TEXT_SUFFIXES or path.name in ("Makefile",):
            out.append(path)
    return out


def rewrite_depth(path: Path, text: str) -> str:
    """A file moving into a room sits deeper: its ``Path(__file__).resolve().parents[k]`` (a folder above its own)
    gains the levels it went down."""
    down = len(future_package(path)) - len(file_module(path))
    if down <= 0:
        return text
    pattern = re.compile(r"(Path\(__file__\)(?:\.resolve\(\))?\.parents\[)(\d+)(\])")
    return pattern.sub(lambda m: f"{m[1]}{int(m[2]) + down}{m[3]}", text)


def rewrite_file(path: Path) -> bool:
    text = path.read_text(errors="strict")
    new = rewrite_depth(path, rewrite_imports(path, text)) if path.suffix == ".py" else text
    new = rewrite_names(new)
    if path.name == "pyproject.toml":
        new = rewrite_pyproject(new)
    if new != text:
        path.write_text(new)
        return True
    return False


# ------------------------------------------------------------------------------------------------ check / run
def stale(paths: list[Path]) -> list[str]:
    """What still names a flat module: an import of one, or its dotted name or path in any text."""
    out = []
    for path in paths:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if (rewrite_imports(path, text) if path.suffix == ".py" else text) != text or rewrite_names(
            text
        ) != text:
            out.append(f"{path.relative_to(REPO)}: names a module this script moves")
    return out


def tidy(changed: list[Path]) -> None:
    """Sort the imports and format the Python files this run changed (the lint's folders only), rebuild the
    notebooks and the editors' JSON Schemas (generated text naming the modules' paths)."""
    found = [p for p in (Path(sys.executable).parent / "ruff", REPO / ".venv" / "bin" / "ruff") if p.exists()]
    ruff = str(found[0]) if found else "ruff"
    linted = [
        str(p)
        for p in changed
        if p.suffix == ".py" and p.relative_to(REPO).parts[0] in (PKG, "tests", "benchmarks", "scripts")
    ]
    if linted:
        subprocess.run(
            [ruff, "check", "--fix", "--select", "I001,F401", "-q", *linted], cwd=REPO, check=False
        )
        subprocess.run([ruff, "format", "-q", *linted], cwd=REPO, check=False)
    if (REPO / "notebooks" / "build.py").exists():
        subprocess.run([sys.executable, str(REPO / "notebooks" / "build.py")], cwd=REPO, check=True)
    if (REPO / PKG / MOVES["editor_schema.py"]).exists():  # the editors' JSON Schemas name the modules' paths
        editor = module_of(MOVES["editor_schema.py"])
        subprocess.run([sys.executable, "-m", editor, "--write"], cwd=REPO, check=True, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 naming what is still flat"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = [
            f"{old.relative_to(REPO)}: still to move to {new.relative_to(REPO)}"
            for old, new in pending_moves()
        ]
        problems += stale(tracked_text_files())
        print("\n".join(problems) if problems else "the package's top level is in rooms")
        return 1 if problems else 0
    # Rewrite first (a file's relative imports are read from where it is), then move.
    changed = [path for path in tracked_text_files() if rewrite_file(path)]
    move_files()
    changed = [_moved(path) for path in changed]
    tidy(changed)
    top = sorted(p.name for p in (REPO / PKG).iterdir() if not p.name.startswith((".", "__pycache__")))
    print(f"{len(changed)} files rewritten; sage_unsloth/ holds {len(top)} entries: {', '.join(top)}")
    return 0


def _moved(path: Path) -> Path:
    rel = path.relative_to(REPO / PKG).as_posix() if path.is_relative_to(REPO / PKG) else None
    if rel is None:
        return path
    for old in sorted(MOVES, key=len, reverse=True):
        if rel == old or rel.startswith(old + "/"):
            return REPO / PKG / (MOVES[old] + rel[len(old) :])
    return path


if __name__ == "__main__":
    raise SystemExit(main())
