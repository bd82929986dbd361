"""One colour per method, the same in every plot the kit draws (the report's pass@k, support and training
curves, the demo lab's headline), whatever else a plot holds.

The key is the method: a name's model prefix (``tiny/``) and seed suffix (``_seed3``, ``_s3``, ``-seed3``) are
dropped, so every seed of a method shares its colour. The kit's methods (the configs in configs/rlvr/*/ and
configs/demo/, plus ``sft`` and ``base``) have fixed colours below; any other name gets a colour from a
stable hash of it (blake2b, never Python's salted ``hash()``), so it too keeps its colour from run to run and
plot to plot. Two unknown names can land on similar hues; give a method of your own a line in
:data:`METHOD_COLOURS` to pin it.
"""

from __future__ import annotations

import colorsys
import hashlib
import re

_SEED_SUFFIX = re.compile(r"^(?P<method>.+?)[_-](?:seed|s)(?P<seed>\d+)$")


def method_of(run: str) -> str:
    """The method a run folder belongs to: its name without a trailing seed suffix."""
    match = _SEED_SUFFIX.match(run)
    return match["method"] if match else run


# The strong tab10 colours go to the methods the demo lab plots together (SFT, the GRPO variants, the
# exploration baselines), the light tab20 shades to the tiny presets' BNPO / DAPO variants and SAGE's two
# control guides, dark tab20b shades to the rest. The GRPO beta sweep (the lab's positive control) is an
# indigo ramp, light to dark as beta grows.
METHOD_COLOURS: dict[str, str] = {
    "sft": "#000000",
    "base": "#7f7f7f",
    "grpo": "#1f77b4",
    "grpo_branch": "#ff7f0e",
    "grpo_nokl": "#2ca02c",
    "grpo_fkl": "#d62728",
    "grpo_reward": "#9467bd",
    "grpo_branch_reward": "#8c564b",
    "grpo_passk": "#e377c2",
    "grpo_entropy_adv": "#bcbd22",
    "grpo_high_entropy": "#17becf",
    "grpo_clip_cov": "#637939",
    "grpo_kl_cov": "#8c6d31",
    "grpo_ref_reset": "#7b4173",
    "grpo_token": "#f7b6d2",
    "grpo_random": "#9edae5",
    "bnpo": "#aec7e8",
    "bnpo_branch": "#ffbb78",
    "dapo": "#98df8a",
    "dapo_branch": "#ff9896",
    "dapo_full": "#c5b0d5",
    "dapo_full_branch": "#c49c94",
    "grpo_branch_paper": "#fc8d62",
    "grpo_ref_branch": "#1b9e77",
    "grpo_beta0.2": "#9c9ede",
    "grpo_beta0.5": "#6b6ecf",
    "grpo_beta1": "#5254a3",
    "grpo_beta2": "#393b79",
}
# Names that are one of the methods above run another way (the 7B presets' vLLM-server variants): the
# method's colour, as seeds share it.
ALIASES: dict[str, str] = {
    "grpo_server": "grpo",
    "grpo_branch_server": "grpo_branch",
    "base_model": "base",
}


def method_key(name: str) -> str:
    """The palette's key for a run or method name: ``model/run_seedN`` -> ``run``, lower-cased, aliases
    resolved."""
    key = method_of(str(name).rpartition("/")[2]).strip().lower()
    return ALIASES.get(key, key)


def hashed_colour(key: str) -> str:
    """A colour from a stable hash of ``key``: hue from 16 bits, saturation and value kept in a readable
    band (not too pale on white, not near black)."""
    digest = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
    hue = (digest & 0xFFFF) / 0x10000
    saturation = 0.55 + 0.4 * ((digest >> 16) & 0xFF) / 0xFF
    value = 0.55 + 0.35 * ((digest >> 24) & 0xFF) / 0xFF
    r, g, b = colorsys.hsv_to_rgb(hue, saturation, value)
    return "#{:02x}{:02x}{:02x}".format(*(round(c * 255) for c in (r, g, b)))


def colour(name: str) -> str:
    """The colour (hex) of ``name``'s method: its fixed one, else one from a stable hash of the method."""
    key = method_key(name)
    return METHOD_COLOURS.get(key) or hashed_colour(key)


def colours(names) -> dict[str, str]:
    """{name: colour(name)} for every distinct name (a run, ``model/method`` or a method name)."""
    return {name: colour(name) for name in dict.fromkeys(names)}


LINESTYLES = ("-", "--", ":", "-.")


def model_linestyles(models) -> dict[str, str]:
    """A line style per model when a plot holds several models (a method keeps its colour in each): solid for
    the first in sorted order, then dashed, dotted, dash-dot."""
    ordered = sorted(set(models))
    return {m: LINESTYLES[i % len(LINESTYLES)] for i, m in enumerate(ordered)}
