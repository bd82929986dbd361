"""One colour per method, the same in every plot the kit draws (the report's pass@k, support and training
curves, the demo lab's headline), whatever else a plot holds.

The key is the method: a name's model prefix (``tiny/``) and seed suffix (``_seed3``; legacy ``_s3``, ``-seed3``) are
dropped, so every seed of a method shares its colour. The kit's methods (the configs in configs/rlvr/*/ and
configs/demo/, plus ``sft`` and ``base``) have fixed colours: a lab method's in its own file (``lab: colour:``),
the others below; any other name gets a colour from a stable hash of it (blake2b, never Python's salted
``hash()``), so it too keeps its colour from run to run and plot to plot, whatever other methods are added; a
knob setting of a kit method (the lab's ``--grid`` names, ``<method>-tau0.3``) keeps its method's hue at a
lightness of its own. Two unknown names can land on similar hues; give a lab method of your own a ``colour:`` in
its ``lab:`` block to pin it.
"""

from __future__ import annotations

import colorsys
import hashlib

from ..config.method_cards import demo_cards
from ..runtime.layout import split_run


def method_of(run: str) -> str:
    """The method a run folder belongs to: its name without a trailing seed suffix (sage_unsloth/runtime/layout.py
    split_run; a legacy ``_s3`` / ``-seed3`` too, so old results keep their colours)."""
    return split_run(run, legacy=True)[0]


# One colour per arm, with no implied pairs: no two methods that can be plotted together (the demo lab's
# methods, configs/demo/; the 7B and tiny presets, configs/rlvr/*/) share a hue at another lightness, as tab20's
# light/dark pairs did (BNPO beside GRPO, DAPO beside no-KL, the token guide beside Pass@k), which suggested links
# between unrelated arms. The tab10 colours stay with the methods the lab has always drawn in them; the others
# were chosen by a greedy search over sRGB for the largest smallest CIELAB distance to every colour they can be
# plotted with, at least 12 degrees of hue away from each of them (tests/report/test_report_palette.py checks both).
# The lab's methods carry their colour in their own file (configs/demo/<name>.yaml, lab: colour:, read by
# sage_unsloth/config/method_cards.py); a preset of configs/rlvr/ with a lab method's name is that method and shares its
# colour. Below: the names that are no lab method.
METHOD_COLOURS: dict[str, str] = {
    "sft": "#000000",
    "base": "#7f7f7f",
    "grpo_token": "#0055ee",
    "grpo_random": "#5500ff",
    "bnpo": "#ff0088",
    "bnpo_branch": "#115533",
    "dapo": "#bbcc88",
    "dapo_branch": "#0088ff",
    "dapo_full": "#00bbff",
    "dapo_full_branch": "#009988",
}


def fixed_colours() -> dict[str, str]:
    """Every fixed colour: the names above and the lab's methods' own (their cards' ``colour``)."""
    return {**METHOD_COLOURS, **{c.name: c.colour for c in demo_cards() if c.colour}}


def families() -> tuple[frozenset[str], ...]:
    """Methods that are one method at several settings of a knob (their cards' ``family``: GRPO's beta sweep,
    an indigo ramp light to dark as beta grows; the lab's branch-guide shapes, oranges): they may share a hue
    (and only they)."""
    members: dict[str, set[str]] = {}
    for card in demo_cards():
        if card.family:
            members.setdefault(card.family, set()).add(card.name)
    return tuple(frozenset(names) for names in members.values())


# Names that are one of the methods above run another way: the method's colour, as seeds share it.
ALIASES: dict[str, str] = {"base_model": "base"}
# A 7B preset generated through vLLM's server (configs/rlvr/qwen2.5-math-7b/<method>_server.yaml) is <method>.
SERVER_SUFFIX = "_server"


def method_key(name: str) -> str:
    """The palette's key for a run or method name: ``model/run_seedN`` -> ``run``, lower-cased, aliases and
    the server suffix resolved."""
    key = method_of(str(name).rpartition("/")[2]).strip().lower()
    return ALIASES.get(key, key).removesuffix(SERVER_SUFFIX)


def hashed_colour(key: str) -> str:
    """A colour from a stable hash of ``key``: hue from 16 bits, saturation and value kept in a readable
    band (not too pale on white, not near black)."""
    digest = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
    hue = (digest & 0xFFFF) / 0x10000
    saturation = 0.55 + 0.4 * ((digest >> 16) & 0xFF) / 0xFF
    value = 0.55 + 0.35 * ((digest >> 24) & 0xFF) / 0xFF
    r, g, b = colorsys.hsv_to_rgb(hue, saturation, value)
    return "#{:02x}{:02x}{:02x}".format(*(round(c * 255) for c in (r, g, b)))


def setting_colour(base: str, key: str) -> str:
    """A knob setting of a method (the lab's ``--grid`` names ``METHOD-key<v>...``): the method's hue, so that the
    relation shows, at a lightness of its own from a stable hash of the full name (never the method's own)."""
    r, g, b = (int(base[i : i + 2], 16) / 255 for i in (1, 3, 5))
    hue, lightness, saturation = colorsys.rgb_to_hls(r, g, b)
    digest = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
    shift = 0.12 + 0.18 * (digest & 0xFF) / 0xFF  # 0.12 to 0.30 away from the method's lightness
    lightness = lightness + shift if lightness + shift <= 0.82 else lightness - shift
    r, g, b = colorsys.hls_to_rgb(hue, min(max(lightness, 0.18), 0.82), saturation)
    return "#{:02x}{:02x}{:02x}".format(*(round(c * 255) for c in (r, g, b)))


def colour(name: str) -> str:
    """The colour (hex) of ``name``'s method: its fixed one; for a knob setting of a method with one
    (``<method>-tau0.3``), that method's hue at another lightness; else one from a stable hash of the
    method."""
    key = method_key(name)
    fixed = fixed_colours()
    if key in fixed:
        return fixed[key]
    base = key.split("-", 1)[0]
    if "-" in key and base in fixed:
        return setting_colour(fixed[base], key)
    return hashed_colour(key)


def colours(names) -> dict[str, str]:
    """{name: colour(name)} for every distinct name (a run, ``model/method`` or a method name)."""
    return {name: colour(name) for name in dict.fromkeys(names)}


LINESTYLES = ("-", "--", ":", "-.")


def model_linestyles(models) -> dict[str, str]:
    """A line style per model when a plot holds several models (a method keeps its colour in each): solid for
    the first in sorted order, then dashed, dotted, dash-dot."""
    ordered = sorted(set(models))
    return {m: LINESTYLES[i % len(LINESTYLES)] for i, m in enumerate(ordered)}
