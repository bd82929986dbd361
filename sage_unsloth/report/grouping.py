"""Runs grouped by method for the report's plots: one line per method, its seeds folded into a band.

A run folder named ``<method>_seed<N>`` (the demo), ``<method>_s<N>`` (a sweep) or ``<method>-seed<N>`` is
seed N of ``<method>``; any other name is a method of its own. Colours come from one palette keyed by the
method (the report builds it once over all its runs), so a method keeps its colour across every plot of a
report, and no two of up to 20 methods share one.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

_SEED_SUFFIX = re.compile(r"^(?P<method>.+?)[_-](?:seed|s)(?P<seed>\d+)$")
DISTINCT_COLOURS = 20


def method_of(run: str) -> str:
    """The method a run folder belongs to: its name without a trailing seed suffix."""
    match = _SEED_SUFFIX.match(run)
    return match["method"] if match else run


def palette(names) -> dict[str, tuple[float, ...]]:
    """A colour per name, in sorted order: tab10's ten, then tab20's ten lighter shades of them, so up to 20
    names get 20 different colours (the strong ones first); more names take evenly spaced hues."""
    names = sorted(set(names))
    if len(names) <= DISTINCT_COLOURS:
        import matplotlib

        tab20 = matplotlib.colormaps["tab20"].colors
        ordered = [tab20[i] for i in range(0, 20, 2)] + [tab20[i] for i in range(1, 20, 2)]
        return dict(zip(names, ordered))
    import matplotlib

    hues = matplotlib.colormaps["hsv"](np.linspace(0, 1, len(names), endpoint=False))
    return {name: tuple(colour) for name, colour in zip(names, hues)}


def colours_for(labels, given: dict | None = None) -> dict:
    """``given`` (the report's palette over all its methods) for the labels it has; a palette of their own
    for any it lacks (a plot called on its own)."""
    given = dict(given or {})
    missing = sorted(set(labels) - set(given))
    if missing:
        given.update(palette(missing) if not given else {m: c for m, c in zip(missing, _spare(given))})
    return given


def _spare(used: dict):
    """Colours of the 20-colour palette that ``used`` does not hold, then evenly spaced hues."""
    import matplotlib

    taken = set(used.values())
    for colour in palette([f"{i:02d}" for i in range(DISTINCT_COLOURS)]).values():
        if colour not in taken:
            yield colour
    yield from (tuple(c) for c in matplotlib.colormaps["hsv"](np.linspace(0, 1, 64, endpoint=False)))


def seed_band(frame: pd.DataFrame, x: str, y: str, run: str = "run") -> pd.DataFrame:
    """Per value of ``x``: the mean of ``y`` over the runs (seeds), its min and max, and how many runs had it.
    Columns: x, mean, low, high, runs."""
    grouped = frame.dropna(subset=[y]).groupby(x, sort=True)
    out = grouped[y].agg(["mean", "min", "max"]).rename(columns={"min": "low", "max": "high"})
    out["runs"] = grouped[run].nunique()
    return out.reset_index()


def floor_at_zero(ax, values) -> None:
    """Keep the y-axis from dipping below 0 when every plotted value is >= 0 (an all-zero series otherwise
    gets matplotlib's symmetric margin, e.g. -0.055 to 0.055)."""
    values = np.asarray(list(values), dtype=float)
    values = values[np.isfinite(values)]
    if values.size and values.min() >= 0:
        low, high = ax.get_ylim()
        if low < 0:
            ax.set_ylim(0, high if high > 0 else 1)
            for line in ax.get_lines():  # a series at 0 sits on the axis: draw it over the frame
                line.set_clip_on(False)
