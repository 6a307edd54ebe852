"""Grids and cognitive maps: cell classes, class probabilities, actions, paths and plans
drawn on the grid, and the episode's timeline of per-step flags. Coordinates are ``(row, col)``:
row 0 is drawn at the top."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from goalprobe.gridworld.core import Action, CellType, RowCol
from goalprobe.viewer.figures.style import (
    _MARKER_SYMBOLS,
    CELL_COLOURS,
    CELL_SYMBOLS,
    DECODED_COLOUR,
    EXECUTED_COLOUR,
    FONT,
    N_CLASSES,
    OPTIMAL_COLOUR,
    class_name,
    figure_layout,
)


def _grid_axes_layout(n_rows: int, n_cols: int) -> dict:
    """Square cells, row 0 at the top, a tick per cell."""
    common = {
        "showgrid": False,
        "zeroline": False,
        "constrain": "domain",
        "ticks": "",
        "tickfont": {"size": 10},
    }
    return {
        "xaxis": {
            **common,
            "range": [-0.5, n_cols - 0.5],
            "tickvals": list(range(n_cols)),
            "title": {"text": "col", "standoff": 2},
        },
        "yaxis": {
            **common,
            "range": [n_rows - 0.5, -0.5],
            "tickvals": list(range(n_rows)),
            "scaleanchor": "x",
            "scaleratio": 1,
            "title": {"text": "row", "standoff": 2},
        },
    }


def cell_hover_text(
    cell_types: np.ndarray | None,
    probs: np.ndarray | None,
    *,
    decoded: np.ndarray | None = None,
    top: int = 4,
) -> np.ndarray:
    """``(n, n)`` HTML hover text of every cell: coordinates, true class (``cell_types``
    ``(n, n)``), decoded class (``decoded``, else the argmax of ``probs``) and the ``top``
    most probable classes above 0.5 % (``probs``: ``(n, n, len(CellType))``)."""
    source = cell_types if cell_types is not None else probs
    if source is None:
        raise ValueError("need cell_types or probs")
    n_rows, n_cols = np.asarray(source).shape[:2]
    if probs is not None and decoded is None:
        decoded = np.asarray(probs).argmax(axis=-1)
    out = np.empty((n_rows, n_cols), dtype=object)
    for r in range(n_rows):
        for c in range(n_cols):
            parts = [f"<b>row {r}, col {c}</b>"]
            if cell_types is not None:
                parts.append(f"true: {class_name(cell_types[r, c])}")
            if probs is not None and decoded is not None:
                parts.append(f"decoded: {class_name(decoded[r, c])}")
                p = np.asarray(probs[r, c], dtype=np.float64)
                order = np.argsort(-p, kind="stable")[:top]
                parts.extend(f"P({class_name(k)}) = {p[k]:.2f}" for k in order if p[k] >= 0.005)
            out[r, c] = "<br>".join(parts)
    return out


def _legend_entry(name: str, colour: str, *, kind: str = "square") -> dict:
    """A legend-only trace (annotations have no legend)."""
    if kind == "square":
        line = {"width": 1, "color": "#8a8f98"}
        marker = {"symbol": "square", "size": 12, "color": colour, "line": line}
        style: dict = {"mode": "markers", "marker": marker}
    else:
        style = {"mode": "lines", "line": {"color": colour, "width": 3, "dash": "solid"}}
    return {"type": "scatter", "x": [None], "y": [None], **style, "name": name, "hoverinfo": "skip"}


def _arrow(
    start_row_col: tuple[float, float],
    end_row_col: tuple[float, float],
    colour: str,
    width: float,
    *,
    opacity: float = 1.0,
    offset: float = 0.0,
    head_size: float = 1.0,
) -> dict:
    """An arrow annotation from one point to another, in cell coordinates."""
    (r0, c0), (r1, c1) = start_row_col, end_row_col
    return {
        "x": c1 + offset,
        "y": r1 + offset,
        "ax": c0 + offset,
        "ay": r0 + offset,
        "xref": "x",
        "yref": "y",
        "axref": "x",
        "ayref": "y",
        "text": "",
        "showarrow": True,
        "arrowhead": 3,
        "arrowsize": head_size,
        "arrowwidth": width,
        "arrowcolor": colour,
        "opacity": opacity,
        "standoff": 0,
        "startstandoff": 0,
    }


def _action_arrows(
    origin_row_col: RowCol,
    actions: Sequence[int],
    colour: str,
    width: float,
    length: float,
    *,
    opacity: float = 1.0,
    head_size: float = 1.0,
) -> list[dict]:
    """Arrows from the edge of the agent's cell (0.3 of a cell from its centre) to ``length``
    cells away, so that the cell's symbol stays readable."""
    r, c = origin_row_col
    start = 0.3
    deltas = [Action(int(action)).delta_row_col for action in actions]
    return [
        _arrow(
            (r + dr * start, c + dc * start),
            (r + dr * length, c + dc * length),
            colour,
            width,
            opacity=opacity,
            head_size=head_size,
        )
        for dr, dc in deltas
    ]


def _path(
    path: Sequence[RowCol],
    colour: str,
    name: str,
    *,
    offset: float = 0.0,
    dash: str = "solid",
    arrows: bool = True,
    opacity: float = 1.0,
) -> tuple[list[dict], list[dict]]:
    """A polyline through cell centres with an arrowhead on every move: ``(traces, arrows)``."""
    if len(path) == 0:
        return [], []
    trace = {
        "type": "scatter",
        "x": [p[1] + offset for p in path],
        "y": [p[0] + offset for p in path],
        "mode": "lines+markers",
        "line": {"color": colour, "width": 3, "dash": dash},
        "marker": {"size": 6, "color": colour},
        "opacity": opacity,
        "name": name,
        "customdata": [[p[0], p[1], i] for i, p in enumerate(path)],
        "hovertemplate": f"{name}<br>move %{{customdata[2]}}: row %{{customdata[0]}}, col %{{customdata[1]}}<extra></extra>",
    }
    heads = []
    if arrows:
        for (r0, c0), (r1, c1) in zip(path[:-1], path[1:], strict=True):
            if (r0, c0) == (r1, c1):
                continue
            # the head at 70 % of the move, so that consecutive heads do not pile up on centres
            end = (r0 + 0.7 * (r1 - r0), c0 + 0.7 * (c1 - c0))
            heads.append(_arrow((r0, c0), end, colour, 2.5, offset=offset, opacity=opacity))
    return [trace], heads


def _cell_heatmap(types: np.ndarray, hover: np.ndarray, *, opacity: float = 1.0) -> dict:
    n_rows, n_cols = types.shape
    symbols = [[CELL_SYMBOLS[CellType(int(c))] for c in row] for row in types.tolist()]
    colours = [CELL_COLOURS[CellType(c)] for c in range(N_CLASSES)]
    scale = [[(c + k) / N_CLASSES, colour] for c, colour in enumerate(colours) for k in (0, 1)]
    return {
        "type": "heatmap",
        "z": types.tolist(),
        "x": list(range(n_cols)),
        "y": list(range(n_rows)),
        "zmin": -0.5,
        "zmax": N_CLASSES - 0.5,
        "colorscale": scale,
        "showscale": False,
        "xgap": 1,
        "ygap": 1,
        "text": symbols,
        "texttemplate": "%{text}",
        "textfont": {"size": 14 if n_rows <= 11 else 11, "color": "white", "family": FONT},
        "customdata": hover.tolist(),
        "hovertemplate": "%{customdata}<extra></extra>",
        "name": "cells",
        "showlegend": False,
        "opacity": opacity,
    }


def _legend_layout(show: bool, bottom: int) -> dict:
    return {
        "showlegend": show,
        "legend": {
            "orientation": "h",
            "yanchor": "top",
            "y": -0.1,
            "x": 0,
            "font": {"size": 11},
            "itemclick": False,
            "itemdoubleclick": False,
        },
        "margin": {"l": 40, "r": 16, "t": 48, "b": bottom if show else 40},
    }


def cell_map_figure(
    cell_types: np.ndarray,
    *,
    title: str = "",
    probs: np.ndarray | None = None,
    true_cell_types: np.ndarray | None = None,
    agent_row_col: RowCol | None = None,
    action: int | None = None,
    optimal_actions: Sequence[int] = (),
    optimal_label: str = "optimal (true grid)",
    optimal_colour: str = OPTIMAL_COLOUR,
    history: Sequence[RowCol] = (),
    markers: Mapping[str, RowCol] | None = None,
    height: int | None = 420,
    show_legend: bool = True,
) -> go.Figure:
    """A grid of cell classes with symbols, optionally with actions and the path so far.

    Draws the true grid (``cell_types`` ``(n, n)`` = the state's classes) or a decoded map
    (``cell_types`` = argmax classes, ``probs`` ``(n, n, len(CellType))`` the probabilities
    behind them; the hover text shows them beside ``true_cell_types``, by default
    ``cell_types`` when ``probs`` is None). From ``agent_row_col``: the executed ``action`` as a
    dark arrow, ``optimal_actions`` as wide translucent ones; ``history``: cells ``s_0 .. s_t``
    as a faint line; ``markers``: label -> ringed cell (``{"decoded agent": (2, 3)}``).
    """
    types = np.asarray(cell_types).astype(np.int64)
    if types.ndim != 2:
        raise ValueError(f"cell_types must be (n, n), got shape {types.shape}")
    if probs is not None and np.asarray(probs).shape[:2] != types.shape:
        raise ValueError(f"probs {np.asarray(probs).shape} do not match cell_types {types.shape}")
    n_rows, n_cols = types.shape
    truth = true_cell_types if true_cell_types is not None else (types if probs is None else None)
    traces = [_cell_heatmap(types, cell_hover_text(truth, probs))]
    annotations: list[dict] = []
    if show_legend:
        traces += [
            _legend_entry(class_name(c), CELL_COLOURS[CellType(c)])
            for c in sorted(set(types.ravel().tolist()))
        ]
    if len(history) > 1:
        path_traces, _ = _path(list(history), "#6c757d", "path so far", arrows=False, opacity=0.55)
        traces += path_traces
    if agent_row_col is not None:
        opt = sorted(int(a) for a in optimal_actions)
        if opt:
            annotations += _action_arrows(
                agent_row_col, opt, optimal_colour, 8, 1.0, opacity=0.75, head_size=0.6
            )
            if show_legend:
                traces.append(_legend_entry(optimal_label, optimal_colour, kind="line"))
        if action is not None:
            annotations += _action_arrows(agent_row_col, [int(action)], EXECUTED_COLOUR, 2.5, 0.9)
            if show_legend:
                label = f"action: {Action(int(action)).name}"
                traces.append(_legend_entry(label, EXECUTED_COLOUR, kind="line"))
    for i, (label, (r, c)) in enumerate((markers or {}).items()):
        traces.append(
            {
                "type": "scatter",
                "x": [c],
                "y": [r],
                "mode": "markers",
                "marker": {
                    "symbol": _MARKER_SYMBOLS[i % len(_MARKER_SYMBOLS)],
                    "size": 26 if n_rows <= 11 else 19,
                    "color": DECODED_COLOUR,
                    "line": {"width": 3, "color": DECODED_COLOUR},
                },
                "name": label,
                "hovertemplate": f"{label}<br>row {r}, col {c}<extra></extra>",
                "showlegend": show_legend,
            }
        )
    layout = figure_layout(
        title, height, annotations=annotations, **_grid_axes_layout(n_rows, n_cols)
    )
    layout.update(_legend_layout(show_legend, 90))
    return go.Figure(data=traces, layout=layout)


def probability_figure(
    class_probs: np.ndarray,
    cell_class: int,
    *,
    title: str = "",
    true_cell_types: np.ndarray | None = None,
    probs: np.ndarray | None = None,
    height: int | None = 420,
) -> go.Figure:
    """Heatmap of ``class_probs`` ``(n, n)`` = ``P(cell_class)`` per cell, with the symbols of
    ``true_cell_types`` ``(n, n)`` on top and its ``cell_class`` cells outlined; ``probs``
    ``(n, n, len(CellType))`` feeds the hover text."""
    z = np.asarray(class_probs, dtype=np.float64)
    if z.ndim != 2:
        raise ValueError(f"class_probs must be (n, n), got shape {z.shape}")
    n_rows, n_cols = z.shape
    trace: dict = {
        "type": "heatmap",
        "z": z.tolist(),
        "x": list(range(n_cols)),
        "y": list(range(n_rows)),
        "zmin": 0.0,
        "zmax": 1.0,
        "colorscale": "Viridis",
        "xgap": 1,
        "ygap": 1,
        "colorbar": {"title": {"text": "P", "side": "right"}, "thickness": 12, "len": 0.8},
        "name": class_name(cell_class),
        "hovertemplate": "row %{y}, col %{x}<br>P = %{z:.3f}<extra></extra>",
    }
    if probs is not None:
        trace["customdata"] = cell_hover_text(true_cell_types, probs).tolist()
        trace["hovertemplate"] = "%{customdata}<extra></extra>"
    shapes = []
    if true_cell_types is not None:
        truth = np.asarray(true_cell_types)
        trace["text"] = [
            [CELL_SYMBOLS[CellType(int(c))] if c != CellType.PADDING else "" for c in row]
            for row in truth.tolist()
        ]
        trace["texttemplate"] = "%{text}"
        trace["textfont"] = {"size": 13 if n_rows <= 11 else 10, "color": "white"}
        shapes = [
            {
                "type": "rect",
                "x0": c - 0.5,
                "x1": c + 0.5,
                "y0": r - 0.5,
                "y1": r + 0.5,
                "line": {"color": "#ff006e", "width": 3},
            }
            for r, c in zip(*np.nonzero(truth == int(cell_class)), strict=True)
        ]
    layout = figure_layout(
        title or f"P({class_name(cell_class)})",
        height,
        shapes=shapes,
        **_grid_axes_layout(n_rows, n_cols),
    )
    return go.Figure(data=[trace], layout=layout)


def plan_figure(
    cell_types: np.ndarray,
    *,
    executed_path: Sequence[RowCol],
    predicted_path: Sequence[RowCol] = (),
    title: str = "",
    height: int | None = 420,
    show_legend: bool = True,
) -> go.Figure:
    """The decoded plan drawn as arrows against the executed actions, on the true grid.

    Both paths start at the agent's cell ``s_t``; the executed path follows the next executed
    moves, the predicted path the decoder's plan under the grid dynamics (a move into a wall
    stays put). The two are offset by a fraction of a cell so that agreeing moves stay visible.
    ``cell_types``: ``(n, n)`` true classes of ``s_t``.
    """
    types = np.asarray(cell_types).astype(np.int64)
    n_rows, n_cols = types.shape
    traces = [_cell_heatmap(types, cell_hover_text(types, None), opacity=0.55)]
    executed_traces, executed_heads = _path(
        list(executed_path), EXECUTED_COLOUR, "executed", offset=-0.1
    )
    predicted_traces, predicted_heads = _path(
        list(predicted_path), DECODED_COLOUR, "decoded plan", offset=0.1, dash="dash"
    )
    traces += executed_traces + predicted_traces
    layout = figure_layout(
        title,
        height,
        annotations=executed_heads + predicted_heads,
        **_grid_axes_layout(n_rows, n_cols),
    )
    layout.update(_legend_layout(show_legend, 70))
    return go.Figure(data=traces, layout=layout)


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
