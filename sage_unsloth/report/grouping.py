"""Runs grouped by method for the report's plots: one line per method, its seeds folded into a band.

A run folder named ``<method>_seed<N>`` (sage_unsloth/runtime/layout.py run_name: the demo and the sweep; a legacy
``<method>_s<N>`` or ``<method>-seed<N>`` is read too) is seed N of ``<method>``; any other name is a method of its
own. Colours come from one palette keyed by the
method (sage_unsloth/report/palette.py), so a method keeps its colour in every plot of every report and in
the demo lab, whatever else is plotted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import palette as _palette
from .palette import method_of  # noqa: F401 (grouping.method_of: the reports' name for it)


def palette(names) -> dict[str, str]:
    """{name: its method's colour} from the kit's one palette (sage_unsloth/report/palette.py): the colour
    depends on the method alone, never on which other names are plotted."""
    return _palette.colours(names)


def colours_for(labels, given: dict | None = None) -> dict:
    """``given`` (explicit colours, e.g. the report's) for the labels it has; the palette's for the rest."""
    given = dict(given or {})
    given.update({label: c for label, c in palette(labels).items() if label not in given})
    return given


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
