"""House rules read from the source itself (``ast``, nothing imported or run): no function in sage_unsloth/ longer
than a reader can hold at once."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sage_unsloth"
MAX_FUNCTION_LINES = 80  # def line to last line, docstring and comments included


def function_lengths(root: Path = PACKAGE) -> dict[str, int]:
    """``<path under root>:<qualified name>`` -> lines, for every function and method (nested ones too)."""
    lengths = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        lengths.update(_lengths_in(tree, f"{path.relative_to(root).as_posix()}:"))
    return lengths


def _lengths_in(node, prefix: str) -> dict[str, int]:
    lengths = {}
    for child in ast.iter_child_nodes(node):
        name = prefix
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                lengths[name] = child.end_lineno - child.lineno + 1
            name += "."
        lengths.update(_lengths_in(child, name))
    return lengths


def test_no_function_is_longer_than_the_limit():
    long = {name: n for name, n in function_lengths().items() if n > MAX_FUNCTION_LINES}
    listed = "\n".join(f"  {name}: {n} lines" for name, n in sorted(long.items(), key=lambda kv: -kv[1]))
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named pieces):\n{listed}"


def test_the_measure_counts_methods_and_nested_functions(tmp_path):
    (tmp_path / "m.py").write_text(
        "def f():\n    def g():\n        pass\n    return g\n\n\nclass C:\n    def h(self):\n        x = 1\n"
        "        return x\n"
    )
    assert function_lengths(tmp_path) == {"m.py:f": 4, "m.py:f.g": 2, "m.py:C.h": 3}
