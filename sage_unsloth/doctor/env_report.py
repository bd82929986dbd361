"""``sage-unsloth env``: what a bug report needs to say about this machine and the installed stack.

The kit's version and commit, Python and the platform, torch's CUDA build, each GPU and the NVIDIA driver, and
every pinned package (pyproject.toml's ``==`` pins, core and extras, and the versions the kit's contact points
with TRL / Unsloth / vLLM are pinned to in sage_unsloth/compat.py) with the version installed here, or in the
evaluation interpreter (``SAGE_EVAL_PYTHON``, else the kit's ``.venv-eval`` as ``scripts/03_eval.sh`` picks it:
vLLM lives there on CPU), and the pins it differs from. The facts
come from the doctor's queries (sage_unsloth/doctor/env.py); nothing here judges them (that is the doctor's job).
Never prints an environment variable's value: tokens stay out of bug reports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sage_unsloth.doctor import env

EVAL_PYTHON_ENV = ("SAGE_EVAL_PYTHON", "SAGE_VLLM_PYTHON")
KIT_EVAL_PYTHON = Path(__file__).resolve().parents[2] / ".venv-eval" / "bin" / "python"  # make install's


@dataclass
class PinnedPackage:
    name: str
    pinned: str  # the pin ("1.15.0"); two pins that disagree are both listed ("1.15.0 / 1.16.0")
    installed: str | None
    where: str  # "here", or the interpreter it was found in
    source: str  # "core", "[gpu,unsloth]", "compat" (a contact point's pin)

    @property
    def differs(self) -> bool:
        return self.installed is not None and not any(
            env.same_release(self.installed, pin) for pin in self.pinned.split(" / ")
        )


@dataclass
class Environment:
    kit: str
    commit: str | None
    python: str
    platform: str
    torch_cuda: str | None
    driver: str | None
    gpus: list[str] = field(default_factory=list)
    packages: list[PinnedPackage] = field(default_factory=list)

    @property
    def differing(self) -> list[PinnedPackage]:
        return [p for p in self.packages if p.differs]


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


def pinned_packages(
    pins: list[env.Pin], contact_pins: dict[str, str], here: dict, elsewhere: dict, where: str
) -> list[PinnedPackage]:
    """One row per pinned package: pyproject's pins and compat.PINNED's (the same version twice is one pin),
    with the version installed here, else in the evaluation interpreter (``elsewhere``, found in ``where``)."""
    rows: dict[str, PinnedPackage] = {}
    for pin in pins:
        source = f"[{','.join(pin.extras)}]" if pin.extras else "core"
        rows[pin.name] = PinnedPackage(pin.name, pin.version, None, "", source)
    for raw, version in contact_pins.items():
        name = _normal(raw)
        row = rows.setdefault(name, PinnedPackage(name, version, None, "", "compat"))
        if version not in row.pinned.split(" / "):
            row.pinned += f" / {version}"
    for row in rows.values():
        if here.get(row.name) is not None:
            row.installed, row.where = here[row.name], "here"
        elif elsewhere.get(row.name) is not None:
            row.installed, row.where = elsewhere[row.name], where
    return sorted(rows.values(), key=lambda r: (r.source not in ("core", "compat"), r.name))


def _eval_python() -> str | None:
    """The evaluation interpreter: the first of EVAL_PYTHON_ENV that is set, else the kit's ``.venv-eval``; None
    when it is missing or is this interpreter."""
    given = [os.environ.get(name) for name in EVAL_PYTHON_ENV if os.environ.get(name)]
    path = given[0] if given else str(KIT_EVAL_PYTHON)
    return path if Path(path).exists() and not _this_environment(path) else None


def _this_environment(python: str) -> bool:
    """Whether ``python`` runs in this process's environment. A virtual environment's python is a link to its base
    interpreter, so two environments of one base resolve to one file: they are told apart by their folders
    (``<env>/bin/python``'s ``<env>`` against ``sys.prefix``)."""
    folder = Path(python).absolute().parent.parent
    return os.path.realpath(folder) == os.path.realpath(sys.prefix)


def versions_in(python: str, names: list[str]) -> dict[str, str | None]:
    """env.installed_versions run in another interpreter (the evaluation one); {} when it cannot say."""
    try:
        done = subprocess.run(
            [python, "-m", "sage_unsloth.doctor.env_report", "--versions", *names],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}


def collect() -> Environment:
    from sage_unsloth import __version__
    from sage_unsloth.compat import PINNED
    from sage_unsloth.runtime.manifest import git_commit

    pins = env.kit_pins()
    names = sorted({p.name for p in pins} | {_normal(n) for n in PINNED})
    here = env.installed_versions(names)
    python = _eval_python()
    missing = [n for n in names if here.get(n) is None]
    elsewhere = versions_in(python, missing) if python and missing else {}
    facts = env.collect_gpu_facts()
    gpus = [
        f"{d.name}, compute capability {d.capability[0]}.{d.capability[1]}, {d.total_gib:.1f} GiB "
        f"({d.free_gib:.1f} free)"
        for d in facts.devices
    ]
    return Environment(
        kit=__version__,
        commit=git_commit(Path(__file__).resolve().parents[2]),
        python=sys.version.split()[0],
        platform=platform.platform(),
        torch_cuda=facts.torch_cuda,
        driver=facts.driver,
        gpus=gpus,
        packages=pinned_packages(pins, PINNED, here, elsewhere, python or ""),
    )


def render(report: Environment) -> str:
    lines = [
        f"sage-unsloth {report.kit}" + (f" (commit {report.commit})" if report.commit else ""),
        f"Python {report.python} on {report.platform}",
        f"torch CUDA build: {report.torch_cuda or 'none (CPU build)'}",
        f"NVIDIA driver: {report.driver or 'none found (no nvidia-smi)'}",
        f"GPUs: {'; '.join(report.gpus) if report.gpus else 'none visible'}",
        "",
        f"{'package':<16} {'installed':<18} {'pinned':<20} pin of",
    ]
    for row in report.packages:
        installed = row.installed or "-"
        if row.installed and row.where != "here":
            installed += " *"
        mark = "  <- differs" if row.differs else ""
        lines.append(f"{row.name:<16} {installed:<18} {row.pinned:<20} {row.source}{mark}")
    elsewhere = sorted({row.where for row in report.packages if row.installed and row.where != "here"})
    if elsewhere:
        lines.append(f"* installed in the evaluation interpreter {', '.join(elsewhere)}")
    differing = report.differing
    lines.append(
        "differs from the pins: "
        + (
            ", ".join(f"{r.name} {r.installed} (pinned {r.pinned})" for r in differing)
            if differing
            else "none"
        )
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from sage_unsloth.config.args import KitArgumentParser

    parser = KitArgumentParser(prog="sage-unsloth env", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--versions", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.versions is not None:  # the query another interpreter answers (versions_in)
        print(json.dumps(env.installed_versions(args.versions)))
        return 0
    report = collect()
    if args.json:
        data = asdict(report)
        data["differs"] = [row.name for row in report.differing]
        print(json.dumps(data, indent=1))
    else:
        print(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
