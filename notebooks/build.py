"""Generate the platform notebooks from the one source, notebooks/sage_recipe.py (jupytext percent format).

    python notebooks/build.py           # (re)write notebooks/colab_qwen2.5-1.5b.ipynb, kaggle_qwen2.5-3b.ipynb
    python notebooks/build.py --check   # exit 1 when a committed notebook differs from what the source gives

Per platform: the parameters cell gets its ``PLATFORM`` and ``MODEL`` (the model from
:data:`sage_unsloth.jobs.notebook.PLATFORMS`), markdown cells tagged ``only-<platform>`` are kept for that
platform only, and the notebook metadata asks Colab / Kaggle for the right accelerator. Cell ids are
fixed, so the output depends on the source alone (tests/docs/test_notebooks.py checks there is no drift).
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "sage_recipe.py"
TARGETS = {"colab": "colab_qwen2.5-1.5b.ipynb", "kaggle": "kaggle_qwen2.5-3b.ipynb"}
PLATFORM_METADATA = {
    "colab": {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}},
    "kaggle": {"kaggle": {"accelerator": "nvidiaTeslaT4", "isGpuEnabled": True, "isInternetEnabled": True,
                          "language": "python", "sourceType": "notebook"}},
}
ONLY_PREFIX = "only-"
DRIVER_TAG = "driver-check"  # the first code cell: the kit's driver rules, copied (the kit is not installed yet)
DRIVER_MODULE = HERE.parent / "sage_unsloth" / "doctor" / "driver.py"
DRIVER_CALL = (
    'if os.environ.get("SAGE_NOTEBOOK_TINY") != "1":  # CI runs the notebook on a CPU\n'
    "    print(first_contact())\n"
)


def driver_cell_source() -> str:
    """sage_unsloth/doctor/driver.py without its command-line entry, then the call the notebook makes."""
    text = DRIVER_MODULE.read_text(encoding="utf-8")
    module = text[: text.index('\n\nif __name__ == "__main__":')].rstrip()
    return f"{module}\n\n\n{DRIVER_CALL}".rstrip()


def set_parameter(source: str, name: str, value: str) -> str:
    """Replace the value of ``NAME = ...`` (one line, trailing comment kept); exactly one such line."""
    pattern = re.compile(rf"^{name} = (?:\"[^\"]*\"|\S+)(?P<comment>\s+#.*)?$", re.MULTILINE)
    new, count = pattern.subn(lambda m: f"{name} = {value!r}".replace("'", '"') + (m["comment"] or ""), source)
    if count != 1:
        raise ValueError(f"the parameters cell must assign {name} exactly once on its own line (found {count})")
    return new


def build(platform: str) -> str:
    """The .ipynb text of ``platform``'s notebook."""
    import jupytext
    import nbformat

    from sage_unsloth.jobs.notebook import PLATFORMS

    if platform not in TARGETS:
        raise ValueError(f"platform {platform!r}: choose one of {', '.join(TARGETS)}")
    notebook = jupytext.reads(SOURCE.read_text(encoding="utf-8"), fmt="py:percent")
    cells, n_parameter_cells = [], 0
    for cell in notebook.cells:
        tags = list(cell.metadata.get("tags", []))
        only = [t[len(ONLY_PREFIX):] for t in tags if t.startswith(ONLY_PREFIX)]
        unknown = set(only) - set(TARGETS)
        if unknown:
            raise ValueError(f"cell tagged for unknown platform(s) {sorted(unknown)}")
        if only and platform not in only:
            continue
        cell = copy.deepcopy(cell)
        kept = [t for t in tags if not t.startswith(ONLY_PREFIX)]
        if kept:
            cell.metadata["tags"] = kept
        else:
            cell.metadata.pop("tags", None)
        if DRIVER_TAG in kept:
            cell.source = driver_cell_source()
        if "parameters" in kept:
            n_parameter_cells += 1
            cell.source = set_parameter(cell.source, "PLATFORM", platform)
            cell.source = set_parameter(cell.source, "MODEL", PLATFORMS[platform].model)
        cell["id"] = f"cell-{len(cells):02d}"
        cells.append(cell)
    if n_parameter_cells != 1:
        raise ValueError(f"{SOURCE.name} must have exactly one cell tagged 'parameters' (found {n_parameter_cells})")
    notebook.cells = cells
    notebook.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        **PLATFORM_METADATA[platform],
    }
    notebook.nbformat, notebook.nbformat_minor = 4, 5
    return nbformat.writes(notebook) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for platform, name in TARGETS.items():
        path, text = HERE / name, build(platform)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        elif not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python notebooks/build.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
