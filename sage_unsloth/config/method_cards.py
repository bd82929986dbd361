"""A lab method is one YAML file: its stage-2 config, and a ``lab:`` block (its card) that says how the lab
shows it. Adding a method to the demo lab is adding one file to configs/demo/; no table in the code names it.

    lab:
      label: GRPO + Branch        # the name tables and plots show (required)
      colour: "#ff7f0e"           # its colour in every plot (optional: else one from a stable hash of its name)
      order: 4                    # its place among the lab's methods (runs, tables); files without one go last
      compare_with: {sft: 4, other: 7}  # the B of each A - B pair it is A of, with the pair's place among the
                                        # comparisons (a list [sft, other] places them after the placed ones)
      sets: [default]             # named method sets it belongs to (--methods default, baselines, ...)
      family: branch_shapes       # methods that are one method at several settings share a family (a hue)
      role: branch                # a part the lab gives one method (ROLES)

The stages never read the block (config_args drops ``lab:`` with ``base:``). A method without ``compare_with`` is
compared with SFT and with the method whose role is ``control``. ``SAGE_UNSLOTH_DEMO_CONFIGS`` points the lab at
another folder of demo configs (a copy of configs/demo with methods of its own).
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

LAB_KEY = "lab"
CONFIGS_ENV = "SAGE_UNSLOTH_DEMO_CONFIGS"
KIT_DEMO_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "demo"
SFT = "sft"  # the one SFT model every RL run starts from: a B of pairs, never a method file
# The parts the lab gives one method each: the control (a method without compare_with is compared with it; its
# plan shares define the regime check, sage_unsloth.demo.reproduce), the branch guide whose tau and gamma the
# analysis measures at the branch point (sage_unsloth.demo.analysis), and Branch in the paper's shape (the
# frontier labels an arm with exactly its knobs 'Branch', sage_unsloth.demo.frontier).
ROLES = ("control", "branch", "paper_shape")
CARD_KEYS = ("label", "colour", "order", "compare_with", "sets", "family", "role")
HEX_COLOUR = re.compile(r"^#[0-9a-fA-F]{6}$")


@dataclass(frozen=True)
class MethodCard:
    """One method file's ``lab:`` block (see the module doc)."""

    name: str  # the file's stem: the method's run folders are <name>_seed<s>
    label: str
    path: Path
    colour: str | None = None
    order: float = math.inf
    compare_with: tuple[tuple[str, float], ...] | None = (
        None  # (B, the pair's place); None: SFT and the control
    )
    sets: tuple[str, ...] = ()
    family: str | None = None
    role: str | None = None


def demo_configs() -> Path:
    """The folder of the demo's configs: configs/demo, or the folder ``SAGE_UNSLOTH_DEMO_CONFIGS`` names."""
    return Path(os.environ.get(CONFIGS_ENV) or KIT_DEMO_CONFIGS).resolve()


def _fail(path: Path, key: str, fix: str) -> ValueError:
    return ValueError(f"{path}: lab: {key}: {fix}")


def _compare_with(path: Path, value) -> tuple[tuple[str, float], ...] | None:
    if value is None:
        return None
    if isinstance(value, list | tuple) and all(isinstance(b, str) for b in value):
        return tuple((b, math.inf) for b in value)
    if isinstance(value, dict) and all(isinstance(v, int | float) for v in value.values()):
        return tuple((str(b), float(place)) for b, place in value.items())
    raise _fail(path, "compare_with", "a list of methods [sft, other] or a mapping {method: place}")


def card_of(path: Path, block) -> MethodCard:
    """The card of the method file ``path`` from its ``lab:`` mapping; a bad key is one line naming the fix."""
    path = Path(path)
    if not isinstance(block, dict) or not isinstance(block.get("label"), str) or not block["label"].strip():
        raise _fail(path, "label", "a lab: mapping needs label: <the name tables show>")
    unknown = sorted(set(block) - set(CARD_KEYS))
    if unknown:
        raise _fail(path, unknown[0], f"not a key of a method's lab: block; use {', '.join(CARD_KEYS)}")
    colour = block.get("colour")
    if colour is not None and not (isinstance(colour, str) and HEX_COLOUR.match(colour)):
        raise _fail(path, "colour", f"{colour!r} is not a hex colour; write it quoted, e.g. '#1f77b4'")
    sets = block.get("sets") or ()
    if isinstance(sets, str) or not all(isinstance(s, str) for s in sets):
        raise _fail(path, "sets", "a list of set names, e.g. [default]")
    role = block.get("role")
    if role is not None and role not in ROLES:
        raise _fail(path, "role", f"{role!r} is none of {', '.join(ROLES)}")
    order = block.get("order", math.inf)
    if not isinstance(order, int | float):
        raise _fail(path, "order", "a number (the method's place among the lab's methods)")
    return MethodCard(
        name=path.stem,
        label=block["label"],
        path=path,
        colour=colour,
        order=float(order),
        compare_with=_compare_with(path, block.get("compare_with")),
        sets=tuple(sets),
        family=block.get("family"),
        role=role,
    )


def read_card(path: Path) -> MethodCard | None:
    """The card of one YAML file, or None when it has no ``lab:`` block (a base, sft.yaml, eval.yaml, ...)."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or LAB_KEY not in data:
        return None
    return card_of(Path(path), data[LAB_KEY])


@functools.cache
def read_cards(folder: Path) -> tuple[MethodCard, ...]:
    """Every method file of ``folder`` (a YAML with a ``lab:`` block), in the lab's order (order, then name);
    each role held by one method at most."""
    folder = Path(folder)
    paths = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    cards = sorted((c for c in map(read_card, paths) if c is not None), key=lambda c: (c.order, c.name))
    for role in ROLES:
        holders = [c.name for c in cards if c.role == role]
        if len(holders) > 1:
            raise ValueError(f"{folder}: role {role} is held by {', '.join(holders)}: give it to one of them")
    return tuple(cards)


def demo_cards() -> tuple[MethodCard, ...]:
    """The cards of the demo lab's methods (:func:`demo_configs`)."""
    return read_cards(demo_configs())


def role_holder(role: str, cards: tuple[MethodCard, ...] | None = None) -> MethodCard:
    """The method that plays ``role`` (ROLES) in the lab."""
    found = [c for c in (demo_cards() if cards is None else cards) if c.role == role]
    if not found:
        raise ValueError(f"{demo_configs()}: no method file has lab: role: {role}: give one that role")
    return found[0]
