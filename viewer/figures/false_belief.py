"""False-belief grids: the true grid, the grid shown to the agent and the decoded map side by
side, the cells where shown and true differ ringed (at the start state in the run overview, at
any step of a false-belief episode in the viewer's false-belief tab, with the step's action);
and the oracle-belief rates by kind."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from goalprobe.gridworld.core import RowCol
from goalprobe.viewer.figures.maps import (
    _action_arrows,
    _cell_heatmap,
    _grid_axes_layout,
    cell_hover_text,
)
from goalprobe.viewer.figures.style import (
    DECODED_COLOUR,
    EXECUTED_COLOUR,
    ci_error_y,
    figure_layout,
    message_annotation,
    rgba,
)
from plotly.subplots import make_subplots

PANEL_TITLES = ("true grid", "shown to the agent (oracle belief)", "decoded map")
"""Titles of the panels, left to right."""


def false_belief_maps_figure(
    true_types: np.ndarray,
    shown_types: np.ndarray,
    decoded_types: np.ndarray | None = None,
    *,
    probs: np.ndarray | None = None,
    differs: Sequence[RowCol] = (),
    title: str = "",
    decoded_label: str = "no decoded map for this step",
    height: int | None = 380,
    agent_row_col: RowCol | None = None,
    action: int | None = None,
) -> go.Figure:
    """Three ``(n, n)`` cell-class maps side by side: the true grid, the shown grid and the
    decoded map (None: the third panel says ``decoded_label``; ``probs``
    ``(n, n, len(CellType))`` behind it feed the hover). ``differs``: cells ringed in every
    panel; with ``agent_row_col`` and ``action`` the step's action is drawn as an arrow.
    """
    true_types = np.asarray(true_types).astype(np.int64)
    shown_types = np.asarray(shown_types).astype(np.int64)
    if true_types.shape != shown_types.shape or true_types.ndim != 2:
        raise ValueError(f"true {true_types.shape} and shown {shown_types.shape} must be (n, n)")
    n = true_types.shape[0]
    fig = make_subplots(rows=1, cols=3, subplot_titles=PANEL_TITLES, horizontal_spacing=0.06)
    panels = [
        (true_types, cell_hover_text(true_types, None)),
        (shown_types, cell_hover_text(true_types, None)),
    ]
    if decoded_types is not None:
        decoded = np.asarray(decoded_types).astype(np.int64)
        panels.append((decoded, cell_hover_text(true_types, probs)))
    rows = [r for r, _ in differs]
    cols = [c for _, c in differs]
    for i, (types, hover) in enumerate(panels, start=1):
        fig.add_trace(go.Heatmap(_cell_heatmap(types, hover)), row=1, col=i)
        if differs:
            fig.add_trace(
                go.Scatter(
                    x=cols,
                    y=rows,
                    mode="markers",
                    marker={
                        "symbol": "square-open",
                        "size": 30 if n <= 11 else 20,
                        "color": DECODED_COLOUR,
                        "line": {"width": 3, "color": rgba(DECODED_COLOUR, 0.9)},
                    },
                    name="shown ≠ true",
                    showlegend=i == 1,
                    hovertemplate="shown ≠ true<br>row %{y}, col %{x}<extra></extra>",
                ),
                row=1,
                col=i,
            )
    axes = _grid_axes_layout(n, n)
    legend = {"orientation": "h", "y": -0.12, "x": 0}
    margin = {"l": 30, "r": 10, "t": 70, "b": 50}
    fig.update_layout(
        figure_layout(title, height, showlegend=bool(differs), legend=legend, margin=margin)
    )
    for i in range(1, 4):
        suffix = "" if i == 1 else str(i)
        x_axis = {**axes["xaxis"], "title": None}
        y_axis = {**axes["yaxis"], "title": None, "scaleanchor": f"x{suffix}"}
        if i > len(panels):
            x_axis["visible"] = y_axis["visible"] = False
        fig.update_layout({f"xaxis{suffix}": x_axis, f"yaxis{suffix}": y_axis})
        if i <= len(panels) and agent_row_col is not None and action is not None:
            for arrow in _action_arrows(agent_row_col, [int(action)], EXECUTED_COLOUR, 3.5, 0.95):
                refs = {"xref": f"x{suffix}", "yref": f"y{suffix}"}
                fig.add_annotation({**arrow, **refs, "axref": refs["xref"], "ayref": refs["yref"]})
    if decoded_types is None:
        fig.add_annotation(
            message_annotation(decoded_label, wrap=26, xref="x3 domain", yref="y3 domain", size=13)
        )
    return fig


def oracle_rates_figure(behaviour: Mapping, title: str = "") -> go.Figure:
    """First-step rates by kind: how often the first action follows the shown grid and the
    true one, on the false-belief grid and on its control, with 95% intervals."""
    kinds = [k for k in behaviour if k != "all"] + (["all"] if "all" in behaviour else [])
    fig = go.Figure()
    for role, colour in (("false_belief", "#d62728"), ("control", "#1f77b4")):
        for field, dash in (("follows_shown", ""), ("follows_true", "/")):
            stats = [(behaviour[k].get(role) or {}).get(field) or {} for k in kinds]
            values = [s.get("value") for s in stats]
            fig.add_bar(
                x=kinds,
                y=values,
                name=f"{role.replace('_', ' ')}: {field.replace('_', ' ')}",
                marker={"color": colour, "pattern": {"shape": dash}},
                error_y=ci_error_y(stats, missing=None),
            )
    fig.update_layout(
        figure_layout(title or "First action: optimal only under the shown or the true grid", 380)
    )
    fig.update_layout(barmode="group", yaxis={"range": [0, 1.05], "title": "share of episodes"})
    return fig
