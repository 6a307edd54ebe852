"""Small Dash building blocks the viewer's tabs share: graph panels, the legend, step controls,
badges, and the query string."""

from __future__ import annotations

from urllib.parse import parse_qs

from dash import dcc, html
from goalprobe.viewer.figures.style import LEGEND, empty_figure

GRID_HEIGHT = 440
"""Height in pixels of the grid panels."""


GRAPH_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "modeBarButtonsToRemove": ["lasso2d", "select2d"],
}


def step_controls(slider: str, prev: str, nxt: str, value: int) -> list:
    """A step slider with its prev/next buttons (the arrow keys press them) and their hint."""
    return [
        html.H3("Step"),
        dcc.Slider(
            id=slider,
            min=0,
            max=1,
            step=1,
            value=value,
            marks=None,
            tooltip={"placement": "bottom"},
        ),
        html.Div(
            [
                html.Button("◀ prev", id=prev, n_clicks=0),
                html.Button("next ▶", id=nxt, n_clicks=0),
            ],
            className="gp-buttons",
        ),
        html.Div("keys: ← → step through the episode", className="gp-count"),
    ]


def step_marks(last: int) -> dict[int, str]:
    """About eight labelled marks on a step slider ending at ``last``."""
    return {i: str(i) for i in range(0, last + 1, max(1, last // 8 or 1))}


def graph(graph_id: str, height: int | None = None):
    """An empty ``dcc.Graph`` panel (its callback draws it)."""
    style = {"height": f"{height}px"} if height else {}
    return dcc.Graph(id=graph_id, config=GRAPH_CONFIG, style=style, figure=empty_figure("loading…"))


def legend():
    """The map legend under the grid panels (colours and marks of :data:`LEGEND`)."""
    marks = {"square": ("gp-swatch", "background"), "ring": ("gp-ring", "borderColor")}
    items = []
    for label, colour, kind in LEGEND:
        css, prop = marks.get(kind, ("gp-line", "background"))
        mark = html.Span(className=css, style={prop: colour})
        items.append(html.Span([mark, label], className="gp-legend-item"))
    return html.Div(items, className="gp-legend")


def badge(text: str, kind: str = ""):
    """A small labelled badge (``kind``: ``ok``, ``bad``, ``info`` or plain)."""
    return html.Span(text, className=f"gp-badge {kind}".strip())


def url_query(search) -> dict[str, str]:
    """The first value of each key of a ``?a=1&b=2`` query string (empty for anything else)."""
    if not isinstance(search, str):
        return {}
    return {k: v[0] for k, v in parse_qs(search.lstrip("?")).items() if v}


def from_url(context) -> bool:
    """Whether a callback runs for the page's first load or for its query string."""
    return context.triggered_id is None or "url.search" in context.triggered_prop_ids
