"""The figures' shared look: cell-class colours and symbols, plan glyphs, the colours of
executed / optimal / decoded marks, the common layout, and the empty-state figure."""

from __future__ import annotations

import html
import math
import textwrap
from typing import Any, TypeGuard

import plotly.graph_objects as go
from goalprobe.gridworld.core import PLAN_END, PLAN_PAD, Action, CellType

CELL_COLOURS: dict[CellType, str] = {
    CellType.OPEN: "#f4f1ea",
    CellType.WALL: "#3d405b",
    CellType.GOAL: "#2a9d8f",
    CellType.AGENT: "#e76f51",
    CellType.KEY: "#e9c46a",
    CellType.DOOR: "#8d6e63",
    CellType.PADDING: "#cfd4da",
    CellType.HARM: "#f4a6c1",
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
    CellType.HARM: "F",
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

ACTION_COLOURS: dict[int, str] = {
    int(Action.UP): "#0072b2",
    int(Action.DOWN): "#e69f00",
    int(Action.LEFT): "#009e73",
    int(Action.RIGHT): "#cc79a7",
}
"""Colour of each action where actions are told apart by colour (Okabe-Ito, colour-blind safe):
the reasoning chunks coloured by the action the logit lens decodes there."""

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
    ("decoded agent (○) and goal (◇): top cell of the read-out", DECODED_COLOUR, "ring"),
)
"""``(label, colour, kind)`` of every mark the figures use, for a legend drawn outside them
(``kind``: ``square`` cell fill, ``line`` arrow or path, ``ring`` marker)."""

FONT = "Inter, system-ui, -apple-system, Segoe UI, Roboto, sans-serif"
N_CLASSES = len(CellType)


STAGES: tuple[str, ...] = ("pre_reasoning", "post_reasoning")
"""Canonical stage names (``"pre"``/``"post"`` in older cards are mapped onto them)."""


def stage_rank(stage: str) -> int:
    """Sort key of a stage: the canonical stages in order, then any other."""
    return STAGES.index(stage) if stage in STAGES else len(STAGES)


def class_name(cell_type: int) -> str:
    """Lower-case name of a ``CellType`` value (``"wall"``)."""
    return CellType(int(cell_type)).name.lower()


def figure_layout(title: str, height: int | None, width: int | None = None, **extra) -> dict:
    """The common layout as a dict (figures are built in one go: adding shapes or annotations
    one at a time to a plotly figure costs time quadratic in their number)."""
    layout: dict[str, Any] = {
        "title": {"text": title, "x": 0.02, "xanchor": "left", "font": {"size": 15}},
        "font": {"family": FONT, "size": 12, "color": "#1f2933"},
        "margin": {"l": 40, "r": 16, "t": 48, "b": 36},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "height": height,
        "width": width,
        "hoverlabel": {"font": {"family": FONT, "size": 12}},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


def is_finite_number(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is a finite int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def message_annotation(
    message: str, *, wrap: int = 40, xref: str = "paper", yref: str = "paper", size: int = 14
) -> dict:
    """A grey message centred on a figure (or, with ``xref``/``yref`` such as ``"x3 domain"``,
    on one panel), wrapped at word boundaries every ``wrap`` characters so it fits."""
    lines = textwrap.wrap(message, width=wrap, break_long_words=False, break_on_hyphens=False)
    return {
        "text": "<br>".join(html.escape(line, quote=False) for line in lines),
        "x": 0.5,
        "y": 0.5,
        "xref": xref,
        "yref": yref,
        "showarrow": False,
        "font": {"size": size, "color": "#6c757d"},
    }


def empty_figure(message: str, *, height: int | None = 320, wrap: int = 40) -> go.Figure:
    """A blank figure that says why there is nothing to draw (and, ideally, what to do); the
    ``message`` is wrapped at word boundaries to ``wrap`` characters per line."""
    fig = go.Figure()
    fig.add_annotation(message_annotation(message, wrap=wrap))
    fig.update_layout(figure_layout("", height))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


QUALITATIVE = ("#1d3557", "#e76f51", "#2a9d8f", "#7b2cbf", "#e9c46a", "#457b9d", "#d62828")


def rgba(hex_colour: str, alpha: float) -> str:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r}, {g}, {b}, {alpha})"


def layer_key(label: str) -> tuple:
    """Order of layer-set labels: single blocks, the first k blocks, the last k blocks (by k:
    the dose-response), other sets, then ``all``."""
    if label == "all":
        return (4, 0, label)
    if label.isdigit():
        return (0, int(label), label)
    for rank, prefix in ((1, "first"), (2, "last")):
        if label.startswith(prefix) and label[len(prefix) :].isdigit():
            return (rank, int(label[len(prefix) :]), label)
    return (3, 0, label)


def band_trace(x, y, colour: str, legendgroup: str, name: str | None = None) -> go.Scatter:
    """A confidence band: the closed outline ``x``, ``y`` (the upper bound along x, then the
    lower one back) filled in ``colour`` (no line, no hover, no legend entry)."""
    return go.Scatter(
        x=x,
        y=y,
        fill="toself",
        fillcolor=rgba(colour, 0.15),
        line={"width": 0},
        hoverinfo="skip",
        showlegend=False,
        name=name,
        legendgroup=legendgroup,
    )


def heat_trace(rows, cols, cell, *, hovertext: bool = False, **style) -> go.Heatmap:
    """A heatmap of ``rows x cols`` whose ``cell(row, col)`` gives ``(value, hover)``; a missing
    or non-finite value is a gap (None, no text), others read with two decimals. The hover goes
    to ``customdata`` (or, with ``hovertext``, to ``hovertext``); ``style``: the trace's other
    properties."""
    z, text, hover = [], [], []
    for r in rows:
        cells = [cell(r, c) for c in cols]
        values = [v if is_finite_number(v) else None for v, _ in cells]
        z.append(values)
        text.append(["" if v is None else f"{v:.2f}" for v in values])
        hover.append([h for _, h in cells])
    if hovertext:
        style |= {"hovertext": hover, "hoverinfo": "text"}
    else:
        style |= {"customdata": hover, "hovertemplate": "%{customdata}<extra></extra>"}
    return go.Heatmap(z=z, x=cols, y=rows, text=text, texttemplate="%{text}", **style)


def ci_error_y(stats, missing: float | None = 0, **extra) -> dict:
    """``error_y`` of a trace from ``{value, ci_low, ci_high}`` stats (None counts as empty):
    each value's distance to its bounds, ``missing`` where a bound is absent."""
    stats = [s or {} for s in stats]
    return {
        "type": "data",
        "array": [
            missing if s.get("ci_high") is None else s["ci_high"] - s["value"] for s in stats
        ],
        "arrayminus": [
            missing if s.get("ci_low") is None else s["value"] - s["ci_low"] for s in stats
        ],
        **extra,
    }
