"""Reward against harm on harm grids (MACHIAVELLI's trade-off, on the grid world).

The input is the parsed ``harm/results.json`` of the demo's ``harm`` stage: its ``points`` (one
per grid and prompt condition) and the random agent's mean harms per grid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from goalprobe.viewer.figures.style import (
    EXECUTED_COLOUR,
    MISMATCH_COLOUR,
    empty_figure,
    figure_layout,
)

CONDITION_COLOURS: dict[str, str] = {"neutral": EXECUTED_COLOUR, "moral": "#2a9d8f"}
"""Marker colour of each prompt condition."""


def reward_harm_figure(
    points: Sequence[Mapping], random_mean_harms: Mapping[str, float], *, height: int = 420
) -> go.Figure:
    """Scatter of mean harms per episode (x) against path efficiency (y), one marker per grid
    and prompt condition (``points``: ``{condition, grid_id, efficiency, harms, success,
    n_episodes}``), with the random agent's mean harms per grid over the same grids as a line.
    """
    if not points:
        return empty_figure("no harm-grid episodes: run the demo's harm stage", height=height)
    rng = np.random.default_rng(0)  # jitter only: grids with equal values stay visible
    traces = []
    for condition in sorted({p["condition"] for p in points}):
        rows = [p for p in points if p["condition"] == condition]
        x = np.array([p["harms"] for p in rows]) + rng.uniform(-0.04, 0.04, len(rows))
        traces.append(
            go.Scatter(
                x=x,
                y=[p["efficiency"] for p in rows],
                mode="markers",
                name=f"{condition} prompt",
                marker={
                    "color": CONDITION_COLOURS.get(condition, MISMATCH_COLOUR),
                    "size": 9,
                    "opacity": 0.75,
                },
                customdata=[
                    [p["grid_id"], p["harms"], p["success"], p["n_episodes"]] for p in rows
                ],
                hovertemplate="%{customdata[0]}<br>harms/episode %{customdata[1]:.2f}<br>"
                "efficiency %{y:.2f}, success %{customdata[2]:.2f}<br>"
                "%{customdata[3]} episodes<extra>" + condition + "</extra>",
            )
        )
    layout = figure_layout(
        "Reward against harm: one marker per grid and prompt (x jittered)",
        height,
        xaxis={"title": "flower beds stepped on per episode", "rangemode": "tozero"},
        yaxis={"title": "path efficiency (success × L / steps)", "range": [-0.05, 1.05]},
        legend={"orientation": "h", "y": -0.2},
    )
    fig = go.Figure(traces, layout)
    if random_mean_harms:
        mean = float(np.mean(list(random_mean_harms.values())))
        fig.add_vline(
            x=mean,
            line={"dash": "dash", "color": MISMATCH_COLOUR},
            annotation_text=f"random agent {mean:.2f}",
            annotation_position="top",
        )
    return fig
