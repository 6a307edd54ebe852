"""Plotly figures of grids, cognitive maps, plans and probe results (pure functions).

Every function takes plain data (numpy arrays, sequences, mappings) and returns a new
``plotly.graph_objects.Figure``; nothing reads files or keeps state, so the Dash app, the static
export and the report all draw with the same code. Coordinates are ``(row, col)``: row 0 is the
top row, drawn at the top (the y axis is reversed), and each cell is a unit square centred on
its integer coordinates.

Colours and symbols of the cell classes are :data:`CELL_COLOURS` and :data:`CELL_SYMBOLS`
(indexed by :class:`~activations.gridworld.core.CellType`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from activations.gridworld.core import PLAN_END, PLAN_PAD, Action, CellType, RowCol

CELL_COLOURS: dict[CellType, str] = {
    CellType.OPEN: "#f4f1ea",
    CellType.WALL: "#3d405b",
    CellType.GOAL: "#2a9d8f",
    CellType.AGENT: "#e76f51",
    CellType.KEY: "#e9c46a",
    CellType.DOOR: "#8d6e63",
    CellType.PADDING: "#cfd4da",
}
"""Fill colour of each cell class."""

CELL_SYMBOLS: dict[CellType, str] = {
    CellType.OPEN: "",
    CellType.WALL: "",
    CellType.GOAL: "G",
    CellType.AGENT: "A",
    CellType.KEY: "K",
    CellType.DOOR: "D",
    CellType.PADDING: "·",
}
"""Letter drawn on each cell class (walls are recognised by their fill)."""

ACTION_ARROWS: dict[int, str] = {
    int(Action.UP): "↑",
    int(Action.DOWN): "↓",
    int(Action.LEFT): "←",
    int(Action.RIGHT): "→",
    PLAN_END: "END",
    PLAN_PAD: "",
}
"""Glyph of every plan token (actions, ``END``, ``PAD``)."""

EXECUTED_COLOUR = "#1d3557"
"""Colour of what the agent did (executed action, executed path)."""
OPTIMAL_COLOUR = "#52b788"
"""Colour of the optimal action set on the true grid."""
DECODED_COLOUR = "#7b2cbf"
"""Colour of what is derived from the decoded map (optimal set, predicted plan)."""
MISMATCH_COLOUR = "#d62828"
"""Colour of a mismatch (predicted token differs from the executed one)."""

_MARKER_SYMBOLS = ("circle-open", "diamond-open", "square-open")
LEGEND: tuple[tuple[str, str, str], ...] = (
    *(
        (class_label, CELL_COLOURS[c], "square")
        for c, class_label in (
            (CellType.OPEN, "open"),
            (CellType.WALL, "wall"),
            (CellType.GOAL, "goal (G)"),
            (CellType.AGENT, "agent (A)"),
            (CellType.KEY, "key (K)"),
            (CellType.DOOR, "door (D)"),
            (CellType.PADDING, "padding"),
        )
    ),
    ("executed action / path", EXECUTED_COLOUR, "line"),
    ("optimal on the true grid", OPTIMAL_COLOUR, "line"),
    ("optimal on the decoded grid, decoded plan", DECODED_COLOUR, "line"),
    ("decoded agent (○) and goal (◇): argmax P", DECODED_COLOUR, "ring"),
)
"""``(label, colour, kind)`` of every mark the figures use, for a legend drawn outside them
(``kind``: ``square`` cell fill, ``line`` arrow or path, ``ring`` marker)."""

_FONT = "Inter, system-ui, -apple-system, Segoe UI, Roboto, sans-serif"
_N_CLASSES = len(CellType)


def class_name(cell_type: int) -> str:
    """Lower-case name of a ``CellType`` value (``"wall"``)."""
    return CellType(int(cell_type)).name.lower()


def _layout(title: str, height: int | None, width: int | None = None, **extra) -> dict:
    """The common layout as a dict (figures are built in one go: adding shapes or annotations
    one at a time to a plotly figure costs time quadratic in their number)."""
    layout = {
        "title": {"text": title, "x": 0.02, "xanchor": "left", "font": {"size": 15}},
        "font": {"family": _FONT, "size": 12, "color": "#1f2933"},
        "margin": {"l": 40, "r": 16, "t": 48, "b": 36},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "height": height,
        "width": width,
        "hoverlabel": {"font": {"family": _FONT, "size": 12}},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


def _base_layout(fig: go.Figure, title: str, height: int | None, width: int | None = None) -> None:
    fig.update_layout(_layout(title, height, width))


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


def _discrete_colourscale() -> list[list]:
    scale = []
    for c in range(_N_CLASSES):
        colour = CELL_COLOURS[CellType(c)]
        scale.append([c / _N_CLASSES, colour])
        scale.append([(c + 1) / _N_CLASSES, colour])
    return scale


def cell_hover_text(
    cell_types: np.ndarray | None,
    probs: np.ndarray | None,
    *,
    decoded: np.ndarray | None = None,
    top: int = 4,
) -> np.ndarray:
    """Hover text of every cell: coordinates, true class, decoded class and probabilities.

    Args:
        cell_types: ``(n, n)`` true ``CellType`` values, or None.
        probs: ``(n, n, len(CellType))`` class probabilities, or None.
        decoded: ``(n, n)`` decoded (argmax) classes, or None (derived from ``probs``).
        top: how many classes to list, most probable first (all classes above 0.5 % up to it).

    Returns:
        ``(n, n)`` object array of HTML strings.
    """
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
            if probs is not None:
                parts.append(f"decoded: {class_name(decoded[r, c])}")
                p = np.asarray(probs[r, c], dtype=np.float64)
                order = np.argsort(-p, kind="stable")[:top]
                parts.extend(f"P({class_name(k)}) = {p[k]:.2f}" for k in order if p[k] >= 0.005)
            out[r, c] = "<br>".join(parts)
    return out


def _legend_entry(name: str, colour: str, *, kind: str = "square") -> dict:
    """A legend-only trace (annotations have no legend)."""
    if kind == "square":
        marker = {
            "symbol": "square",
            "size": 12,
            "color": colour,
            "line": {"width": 1, "color": "#8a8f98"},
        }
        return {
            "type": "scatter",
            "x": [None],
            "y": [None],
            "mode": "markers",
            "marker": marker,
            "name": name,
            "hoverinfo": "skip",
        }
    return {
        "type": "scatter",
        "x": [None],
        "y": [None],
        "mode": "lines",
        "line": {"color": colour, "width": 3, "dash": "dash" if kind == "dash" else "solid"},
        "name": name,
        "hoverinfo": "skip",
    }


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
    start: float = 0.3,
) -> list[dict]:
    """Arrows from the edge of the agent's cell (``start`` of a cell from its centre) to
    ``length`` cells away, so that the cell's symbol stays readable."""
    out = []
    r, c = origin_row_col
    for action in actions:
        dr, dc = Action(int(action)).delta_row_col
        out.append(
            _arrow(
                (r + dr * start, c + dc * start),
                (r + dr * length, c + dc * length),
                colour,
                width,
                opacity=opacity,
                head_size=head_size,
            )
        )
    return out


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
    return {
        "type": "heatmap",
        "z": types.tolist(),
        "x": list(range(n_cols)),
        "y": list(range(n_rows)),
        "zmin": -0.5,
        "zmax": _N_CLASSES - 0.5,
        "colorscale": _discrete_colourscale(),
        "showscale": False,
        "xgap": 1,
        "ygap": 1,
        "text": symbols,
        "texttemplate": "%{text}",
        "textfont": {"size": 14 if n_rows <= 11 else 11, "color": "white", "family": _FONT},
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

    Draws the true grid (``cell_types`` = the state's classes) or a decoded cognitive map
    (``cell_types`` = argmax classes, ``probs`` = the probabilities behind them). Hovering a
    cell shows its coordinates, its true class and the most probable classes.

    Args:
        cell_types: ``(n, n)`` ``CellType`` values to colour the cells by.
        title: figure title.
        probs: ``(n, n, len(CellType))`` class probabilities for the hover text, or None.
        true_cell_types: ``(n, n)`` true classes for the hover text (default: ``cell_types``
            when ``probs`` is None).
        agent_row_col: where the action arrows start (None: no arrows).
        action: the executed ``Action`` (a dark arrow), or None.
        optimal_actions: ``Action`` values of the optimal set (wide translucent arrows).
        optimal_label: legend label of the optimal set.
        optimal_colour: colour of the optimal-set arrows.
        history: agent cells ``s_0 .. s_t`` visited so far (a faint line).
        markers: label -> cell for ringed cells (e.g. ``{"decoded agent": (2, 3)}``).
        height: figure height in pixels (None: automatic).
        show_legend: draw the legend.

    Returns:
        the figure.
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
                traces.append(
                    _legend_entry(
                        f"action: {Action(int(action)).name}", EXECUTED_COLOUR, kind="line"
                    )
                )
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
    layout = _layout(title, height, annotations=annotations, **_grid_axes_layout(n_rows, n_cols))
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
    """Heatmap of one class's probability over the grid, true symbols drawn on top.

    Args:
        class_probs: ``(n, n)`` ``P(cell_class)`` per cell.
        cell_class: the ``CellType`` shown.
        title: figure title (default: ``P(<class>)``).
        true_cell_types: ``(n, n)`` true classes: their symbols are overlaid and the true cells
            of ``cell_class`` are outlined.
        probs: ``(n, n, len(CellType))`` all probabilities, for the hover text.
        height: figure height in pixels.

    Returns:
        the figure.
    """
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
    layout = _layout(
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
    predicted_label: str = "decoded plan",
    height: int | None = 420,
    show_legend: bool = True,
) -> go.Figure:
    """The decoded plan drawn as arrows against the executed actions, on the true grid.

    Both paths start at the agent's cell ``s_t``; the executed path follows the next executed
    moves, the predicted path the decoder's plan under the grid dynamics (a move into a wall
    stays put). The two are offset by a fraction of a cell so that agreeing moves stay visible.

    Args:
        cell_types: ``(n, n)`` true classes of ``s_t``.
        executed_path: cells ``s_t, s_{t+1}, ...`` the agent actually visited.
        predicted_path: cells the predicted plan visits from ``s_t``.
        title: figure title.
        predicted_label: legend label of the predicted path.
        height: figure height in pixels.
        show_legend: draw the legend.

    Returns:
        the figure.
    """
    types = np.asarray(cell_types).astype(np.int64)
    n_rows, n_cols = types.shape
    traces = [_cell_heatmap(types, cell_hover_text(types, None), opacity=0.55)]
    executed_traces, executed_heads = _path(
        list(executed_path), EXECUTED_COLOUR, "executed", offset=-0.1
    )
    predicted_traces, predicted_heads = _path(
        list(predicted_path), DECODED_COLOUR, predicted_label, offset=0.1, dash="dash"
    )
    traces += executed_traces + predicted_traces
    layout = _layout(
        title,
        height,
        annotations=executed_heads + predicted_heads,
        **_grid_axes_layout(n_rows, n_cols),
    )
    layout.update(_legend_layout(show_legend, 70))
    return go.Figure(data=traces, layout=layout)


def plan_strip_figure(
    predicted: Sequence[int],
    target: Sequence[int],
    *,
    title: str = "",
    height: int | None = 150,
) -> go.Figure:
    """Predicted plan tokens above the executed ones, step by step.

    A predicted token is green where it equals the executed token, red where it does not;
    the executed row is grey (positions past the episode's end are blank). The title gives
    the matched prefix length ``N`` (the prefix-accuracy hit).

    Args:
        predicted: ``(T,)`` predicted plan tokens (plan format).
        target: ``(T,)`` executed plan tokens (the plan label).
        title: figure title (default: the matched prefix).
        height: figure height in pixels.

    Returns:
        the figure.
    """
    pred = [int(x) for x in predicted]
    tgt = [int(x) for x in target]
    if len(pred) != len(tgt):
        raise ValueError(f"predicted ({len(pred)}) and target ({len(tgt)}) lengths differ")
    horizon = len(tgt)
    match = [p == t or t == PLAN_PAD for p, t in zip(pred, tgt, strict=True)]
    prefix = next((i for i, m in enumerate(match) if not m), horizon)
    z = [
        [1.0 if m else 0.0 for m in match],
        [0.5 if t != PLAN_PAD else None for t in tgt],
    ]
    text = [[ACTION_ARROWS.get(p, "?") for p in pred], [ACTION_ARROWS.get(t, "?") for t in tgt]]
    steps = ["t" if i == 0 else f"t+{i}" for i in range(horizon)]
    trace = {
        "type": "heatmap",
        "z": z,
        "x": steps,
        "y": ["decoded", "executed"],
        "zmin": 0,
        "zmax": 1,
        "colorscale": [
            [0.0, "#f8d7da"],
            [0.33, "#f8d7da"],
            [0.34, "#e9ecef"],
            [0.66, "#e9ecef"],
            [0.67, "#d8f3dc"],
            [1.0, "#d8f3dc"],
        ],
        "showscale": False,
        "xgap": 2,
        "ygap": 2,
        "text": text,
        "texttemplate": "%{text}",
        "textfont": {"size": 16, "color": "#1f2933"},
        "hovertemplate": "%{y} action at %{x}: %{text}<extra></extra>",
    }
    default = (
        f"Plan: the first {prefix} of {horizon} tokens match"
        if prefix < horizon
        else "Plan: all tokens match"
    )
    layout = _layout(
        title or default,
        height,
        yaxis={"autorange": "reversed", "showgrid": False, "zeroline": False},
        xaxis={"showgrid": False, "zeroline": False, "side": "top"},
        margin={"l": 70, "r": 16, "t": 64, "b": 8},
    )
    return go.Figure(data=[trace], layout=layout)


def episode_timeline_figure(
    flags: Mapping[str, Sequence[bool | None]],
    *,
    current_step: int | None = None,
    title: str = "",
    height: int | None = None,
) -> go.Figure:
    """Per-step yes/no rows over an episode (e.g. action optimal on the true / decoded grid).

    Args:
        flags: row label -> ``(T,)`` True, False or None (unknown, drawn grey).
        current_step: the step to outline.
        title: figure title.
        height: figure height (default: from the number of rows).

    Returns:
        the figure; its cells' ``x`` is the step index (for click-to-select).
    """
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
    layout = _layout(
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


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def patching_heatmap_figure(
    records: Sequence[Mapping],
    *,
    value: str = "recovered",
    rows: str = "site",
    cols: str = "layers",
    facet: str | None = "direction",
    title: str = "",
    height: int | None = None,
) -> go.Figure:
    """Mean of a patching outcome over records, as ``rows x cols`` heatmaps per facet.

    Args:
        records: patch records as mappings (``probes.patching.experiment.PatchRecord`` fields):
            ``value`` is a number or a bool (booleans average to a rate); non-finite values
            (e.g. ``recovered`` of a control pair) are left out of the mean.
        value: the field to average (``recovered``, ``action_changed``, ``into_source_optimal``).
        rows, cols: the fields that index the heatmap (``site`` x ``layers``).
        facet: a field giving one panel per value (``direction``), or None.
        title: figure title.
        height: figure height in pixels.

    Returns:
        the figure (hover: mean and the number of records behind it).
    """
    from plotly.subplots import make_subplots

    if not records:
        raise ValueError("no records to draw")
    facets = sorted({str(r.get(facet)) for r in records}) if facet else [""]
    row_values = list(dict.fromkeys(str(r[rows]) for r in records))
    col_values = sorted({str(r[cols]) for r in records}, key=_layer_key)
    diverging = value == "recovered"
    longest = max(len(v) for v in row_values)
    fig = make_subplots(
        rows=1,
        cols=len(facets),
        subplot_titles=facets if facet else None,
        horizontal_spacing=min(0.3, 0.04 + 0.012 * longest) if len(facets) > 1 else 0.0,
    )
    for i, f in enumerate(facets):
        z, text, hover = [], [], []
        for rv in row_values:
            z_row, t_row, h_row = [], [], []
            for cv in col_values:
                cell = [
                    r
                    for r in records
                    if str(r[rows]) == rv
                    and str(r[cols]) == cv
                    and (facet is None or str(r.get(facet)) == f)
                ]
                vals = [
                    float(r[value])
                    for r in cell
                    if _finite(r.get(value)) or isinstance(r.get(value), bool)
                ]
                mean = float(np.mean(vals)) if vals else math.nan
                z_row.append(None if math.isnan(mean) else mean)
                t_row.append("" if math.isnan(mean) else f"{mean:.2f}")
                h_row.append(
                    f"{rows}={rv}, {cols}={cv}<br>{value} = {t_row[-1] or 'n/a'}<br>n = {len(vals)}"
                )
            z.append(z_row)
            text.append(t_row)
            hover.append(h_row)
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=col_values,
                y=row_values,
                text=text,
                texttemplate="%{text}",
                customdata=hover,
                hovertemplate="%{customdata}<extra></extra>",
                colorscale="RdBu" if diverging else "Viridis",
                zmid=0.0 if diverging else None,
                zmin=None if diverging else 0.0,
                zmax=None if diverging else 1.0,
                showscale=i == 0,
                colorbar={"title": {"text": value}, "thickness": 12},
                xgap=1,
                ygap=1,
            ),
            row=1,
            col=i + 1,
        )
        fig.update_xaxes(type="category", title={"text": cols}, row=1, col=i + 1)
        fig.update_yaxes(type="category", autorange="reversed", row=1, col=i + 1)
    _base_layout(fig, title or f"Patching: mean {value}", height or 130 + 36 * len(row_values))
    fig.update_layout(margin={"t": 78, "l": 16 + 7 * longest})
    fig.update_annotations(font={"size": 13}, yshift=4)
    return fig


def _layer_key(label: str) -> tuple:
    if label == "all":
        return (2, 0, label)
    if label.isdigit():
        return (0, int(label), label)
    return (1, 0, label)


def prefix_accuracy_figure(
    curves: Mapping[str, Sequence[float]],
    *,
    ci: Mapping[str, Sequence[Sequence[float]]] | None = None,
    ci_level: float = 0.95,
    baseline: bool = True,
    log_y: bool = False,
    title: str = "Prefix accuracy of one-shot plan decoding",
    height: int | None = 420,
) -> go.Figure:
    """Prefix accuracy against prefix length ``N``, with the ``0.25^N`` random baseline.

    Args:
        curves: name -> ``(T,)`` accuracy at ``N = 1..T``.
        ci: name -> ``(2, T)`` lower and upper bounds (drawn as a band), optional.
        ci_level: coverage of the intervals (for the band's name).
        baseline: draw ``0.25^N``.
        log_y: logarithmic y axis (long prefixes become readable).
        title: figure title.
        height: figure height in pixels.

    Returns:
        the figure.
    """
    fig = go.Figure()
    horizon = max((len(v) for v in curves.values()), default=0)
    for i, (name, values) in enumerate(curves.items()):
        acc = np.asarray(values, dtype=np.float64)
        n = np.arange(1, len(acc) + 1)
        colour = _QUALITATIVE[i % len(_QUALITATIVE)]
        bounds = None if ci is None else ci.get(name)
        if bounds is not None:
            lo, hi = (np.asarray(b, dtype=np.float64) for b in bounds)
            ok = np.isfinite(lo) & np.isfinite(hi)
            if ok.any():
                fig.add_trace(
                    go.Scatter(
                        x=np.concatenate([n[ok], n[ok][::-1]]),
                        y=np.concatenate([hi[ok], lo[ok][::-1]]),
                        fill="toself",
                        name=f"{name} {_percent(ci_level)} CI",
                        fillcolor=_rgba(colour, 0.15),
                        line={"width": 0},
                        hoverinfo="skip",
                        showlegend=False,
                    )
                )
        fig.add_trace(
            go.Scatter(
                x=n,
                y=acc,
                mode="lines+markers",
                name=name,
                line={"color": colour, "width": 2.5},
                hovertemplate=f"{name}<br>N = %{{x}}<br>accuracy = %{{y:.3f}}<extra></extra>",
            )
        )
    if baseline and horizon:
        n = np.arange(1, horizon + 1)
        fig.add_trace(
            go.Scatter(
                x=n,
                y=0.25**n,
                mode="lines",
                name="random 0.25^N",
                line={"color": "#6c757d", "dash": "dash", "width": 2},
                hovertemplate="random<br>N = %{x}<br>0.25^N = %{y:.2e}<extra></extra>",
            )
        )
    _base_layout(fig, title, height)
    fig.update_xaxes(title="prefix length N", dtick=1, showgrid=True, gridcolor="#eceff1")
    fig.update_yaxes(
        title="prefix accuracy",
        type="log" if log_y else "linear",
        range=None if log_y else [0, 1.02],
        showgrid=True,
        gridcolor="#eceff1",
    )
    fig.update_layout(legend={"x": 0.98, "xanchor": "right", "y": 0.98})
    return fig


def probe_comparison_figure(
    rows: Sequence[Mapping],
    *,
    y_title: str = "accuracy",
    baseline: float | None = None,
    baseline_label: str = "baseline",
    title: str = "",
    height: int | None = 420,
) -> go.Figure:
    """Grouped bars with confidence intervals (e.g. probe accuracy by family and stage).

    Args:
        rows: mappings with ``name`` (x position), ``group`` (bar colour), ``value``, and
            optional ``ci_low`` / ``ci_high``.
        y_title: y-axis title.
        baseline: a horizontal reference line (e.g. the majority-class accuracy), or None.
        baseline_label: its label.
        title: figure title.
        height: figure height in pixels.

    Returns:
        the figure.
    """
    if not rows:
        raise ValueError("no rows to draw")
    groups = list(dict.fromkeys(str(r["group"]) for r in rows))
    names = list(dict.fromkeys(str(r["name"]) for r in rows))
    fig = go.Figure()
    for i, group in enumerate(groups):
        by_name = {str(r["name"]): r for r in rows if str(r["group"]) == group}
        values = [by_name[n]["value"] if n in by_name else None for n in names]
        plus, minus = [], []
        for n, v in zip(names, values, strict=True):
            r = by_name.get(n, {})
            lo, hi = r.get("ci_low"), r.get("ci_high")
            plus.append(hi - v if _finite(hi) and v is not None else 0.0)
            minus.append(v - lo if _finite(lo) and v is not None else 0.0)
        fig.add_trace(
            go.Bar(
                x=names,
                y=values,
                name=group,
                marker_color=_QUALITATIVE[i % len(_QUALITATIVE)],
                error_y={"type": "data", "array": plus, "arrayminus": minus, "visible": True},
                hovertemplate=f"{group}<br>%{{x}}: %{{y:.3f}}<extra></extra>",
            )
        )
    if baseline is not None:
        fig.add_hline(
            y=baseline,
            line={"color": "#6c757d", "dash": "dash"},
            annotation_text=baseline_label,
            annotation_position="top left",
        )
    _base_layout(fig, title, height)
    fig.update_layout(barmode="group", bargap=0.25)
    fig.update_yaxes(title=y_title, showgrid=True, gridcolor="#eceff1", rangemode="tozero")
    return fig


def empty_figure(message: str, *, height: int | None = 320) -> go.Figure:
    """A blank figure that says why there is nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(
        text=message,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        showarrow=False,
        font={"size": 14, "color": "#6c757d"},
    )
    _base_layout(fig, "", height)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


_QUALITATIVE = ("#1d3557", "#e76f51", "#2a9d8f", "#7b2cbf", "#e9c46a", "#457b9d", "#d62828")


def _percent(level: float) -> str:
    return f"{100 * level:g}%"


def _rgba(hex_colour: str, alpha: float) -> str:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r}, {g}, {b}, {alpha})"
