"""Per-step views of one episode (the viewer's timeline)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from goalprobe.viewer.figures.style import (
    EXECUTED_COLOUR,
    figure_layout,
)


def episode_timeline_figure(
    flags: Mapping[str, Sequence[bool | None]],
    *,
    current_step: int | None = None,
    title: str = "",
    height: int | None = None,
) -> go.Figure:
    """Per-step yes/no rows over an episode (e.g. action optimal on the true / decoded grid):
    ``flags`` maps a row label to ``(T,)`` True, False or None (unknown, drawn grey); a cell's
    ``x`` is its step index (for click-to-select)."""
    labels = list(flags)
    if not labels:
        raise ValueError("flags is empty")
    n_steps = max(len(v) for v in flags.values())
    z, text = [], []
    for label in labels:
        values = list(flags[label]) + [None] * (n_steps - len(flags[label]))
        z.append([None if v is None else float(bool(v)) for v in values])
        text.append(["unknown" if v is None else ("yes" if v else "no") for v in values])
    trace = {
        "type": "heatmap",
        "z": z,
        "x": list(range(n_steps)),
        "y": labels,
        "zmin": 0,
        "zmax": 1,
        "colorscale": [[0, "#f4a6a6"], [0.5, "#f4a6a6"], [0.5, "#95d5b2"], [1, "#95d5b2"]],
        "showscale": False,
        "xgap": 2,
        "ygap": 2,
        "customdata": text,
        "hovertemplate": "step %{x}<br>%{y}: %{customdata}<extra></extra>",
    }
    shapes = []
    if current_step is not None:
        shapes.append(
            {
                "type": "rect",
                "x0": current_step - 0.5,
                "x1": current_step + 0.5,
                "y0": -0.5,
                "y1": len(labels) - 0.5,
                "line": {"color": EXECUTED_COLOUR, "width": 3},
            }
        )
    layout = figure_layout(
        title,
        height or 60 + 30 * len(labels),
        shapes=shapes,
        xaxis={
            "title": {"text": "step", "standoff": 0},
            "dtick": 1 if n_steps <= 40 else 5,
            "showgrid": False,
            "zeroline": False,
        },
        yaxis={"autorange": "reversed", "showgrid": False, "zeroline": False},
        margin={"l": 140, "r": 16, "t": 36 if title else 8, "b": 40},
    )
    return go.Figure(data=[trace], layout=layout)
