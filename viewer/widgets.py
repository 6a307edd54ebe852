"""Small Dash building blocks the viewer's tabs share: graph panels, the legend, step controls,
badges and the query string; the episode-and-step layout of the false-belief and fog tabs
(every id derives from the tab's ``prefix``, ``fb`` or ``fog``), stepping with prev/next, and
the reasoning-and-answer text, the reasoning coloured chunk by chunk by the logit lens's action
where the ``decision`` stage read the step."""

from __future__ import annotations

import logging
from collections.abc import Callable
from urllib.parse import parse_qs

from dash import dcc, html
from goalprobe.gridworld.core import Action
from goalprobe.probes.decision_steps import StepLensRecord
from goalprobe.viewer.figures.style import ACTION_COLOURS, LEGEND, empty_figure, rgba

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


def legend_item(label: str, colour: str, kind: str = "square"):
    """A legend's mark of ``colour`` (``kind`` as in :data:`LEGEND`) beside its ``label``."""
    marks = {"square": ("gp-swatch", "background"), "ring": ("gp-ring", "borderColor")}
    css, prop = marks.get(kind, ("gp-line", "background"))
    return html.Span(
        [html.Span(className=css, style={prop: colour}), label], className="gp-legend-item"
    )


def legend():
    """The map legend under the grid panels (colours and marks of :data:`LEGEND`)."""
    return html.Div([legend_item(*entry) for entry in LEGEND], className="gp-legend")


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


log = logging.getLogger(__name__)

NO_LENS = (
    "No logit lens for this step: the decision stage reads a seeded sample of answered steps "
    "(decision.max_steps); pick a step it read, or raise it."
)
"""What the reasoning panel says for a step the stage did not read."""
NO_LENS_RUN = "No logit lens in this run: run goalprobe demo (its decision stage)."
"""What it says when the run has no per-step lens file."""


def episode_tab(
    prefix: str,
    *,
    title: str,
    why: str,
    options: list[dict],
    option_height: int,
    caption: str,
) -> html.Div:
    """An episode tab's layout: the episode list and step controls beside a card with the
    step's header, its maps, their caption and the legend, and a card for its texts."""
    side = html.Div(
        [
            html.H3(title),
            html.Div(why, className="gp-count", id=f"{prefix}-why"),
            html.Label("Episode", className="gp-label"),
            dcc.Dropdown(
                id=f"{prefix}-episode",
                options=options,
                value=options[0]["value"] if options else None,
                clearable=False,
                optionHeight=option_height,
                placeholder="none: run goalprobe demo",
            ),
            *step_controls(f"{prefix}-step", f"{prefix}-prev", f"{prefix}-next", 0),
        ],
        className="gp-side",
    )
    main = html.Div(
        [
            html.Div(id=f"{prefix}-error"),
            html.Div(
                [
                    html.Div(id=f"{prefix}-header", className="gp-stepbar"),
                    graph(f"g-{prefix}-maps", GRID_HEIGHT + 20),
                    html.P(caption, className="gp-caption", id=f"{prefix}-caption"),
                    legend(),
                ],
                className="gp-card",
            ),
            html.Div(html.Div(id=f"{prefix}-texts", className="gp-text"), className="gp-card"),
        ],
        className="gp-main",
    )
    return html.Div([side, main], className="gp-body")


def stage_episodes(read: Callable) -> tuple:
    """``(read(), None)``, or ``(None, error message)`` when a stage's files are unreadable."""
    try:
        return read(), None
    except ValueError as err:
        return None, str(err)


def cannot_show(what: str, episode, step, err: Exception) -> tuple:
    """An episode tab's header, figure, texts and error when its step cannot be shown."""
    log.warning("cannot show %s %s step %s: %s", what, episode, step, err)
    blank = empty_figure("Cannot show this step (see the message above).")
    return [], blank, [], html.Div(f"Cannot show this step: {err}", className="gp-error")


def stepped(trigger, prefix: str, current, last: int, otherwise: int = 0) -> int:
    """The step after a prev/next press of tab ``prefix`` (``otherwise`` for any other
    trigger), kept within ``0 .. last``."""
    current = int(current) if isinstance(current, int | float) else 0
    value = {f"{prefix}-prev": current - 1, f"{prefix}-next": current + 1}.get(trigger, otherwise)
    return min(max(int(value), 0), last)


def step_texts(
    reasoning: str | None,
    final: str | None,
    reasoning_id: str,
    lens: StepLensRecord | None = None,
    why: str | None = None,
) -> list:
    """The step's reasoning (chunk by chunk with ``lens``, else plain under ``why`` it has none)
    and final answer."""
    head: list = [html.H4("Reasoning")]
    if lens is not None:
        body = lens_reasoning(lens, reasoning_id)
    else:
        if why:
            head.append(html.Div(why, className="gp-count", id=f"{reasoning_id}-why"))
        body = [html.Pre(reasoning or "(none)", id=reasoning_id)]
    return [*head, *body, html.H4("Final answer"), html.Pre(final or "(none)")]


def lens_reasoning(lens: StepLensRecord, reasoning_id: str, layer: int = -1) -> list:
    """The reasoning as the lens read it after block ``layer``: one span per chunk coloured by
    the action it names at the chunk's end (probabilities in its tooltip), under the colour
    legend and the final action."""
    blocks = lens.answer.shape[0]
    block = layer % blocks
    spans = []
    for i, chunk in enumerate(lens.chunks):
        decoded = chunk.decoded(layer)
        probs = " · ".join(f"{a.name} {chunk.probs[layer][int(a)]:.2f}" for a in Action)
        spans.append(
            html.Span(
                chunk.text,
                className="gp-chunk",
                title=(
                    f"chunk {i + 1} of {len(lens.chunks)}: tokens up to {chunk.end + 1} of "
                    f"{lens.reasoning_tokens} ({100 * chunk.fraction:.0f}%); lens after block "
                    f"{block}: {probs}"
                ),
                style={
                    "background": rgba(ACTION_COLOURS[int(decoded)], 0.28),
                    "borderRight": f"2px solid {ACTION_COLOURS[int(decoded)]}",
                },
                **{"data-action": decoded.name, "data-end": str(chunk.end)},
            )
        )
    agree = sum(c.decoded(layer) == lens.action for c in lens.chunks)
    answer = Action(int(lens.answer[layer].argmax()))
    key = [legend_item(a.name, ACTION_COLOURS[int(a)]) for a in Action]
    summary = html.Div(
        [
            html.Span(f"final action {lens.action.name}", className="gp-badge info"),
            html.Span(
                f"lens after block {block} names it at {agree} of {len(lens.chunks)} chunk ends "
                f"({lens.reasoning_tokens} reasoning tokens); at the answer it names "
                f"{answer.name}",
                className="gp-count",
            ),
        ],
        className="gp-stepbar",
    )
    legend_row = html.Div(
        [html.Span("chunk coloured by the lens's action:"), *key],
        className="gp-legend",
        id=f"{reasoning_id}-legend",
    )
    text = (
        html.Div(spans, id=reasoning_id, className="gp-reasoning")
        if spans
        else html.Pre("(empty reasoning: no chunk to read)", id=reasoning_id)
    )
    return [summary, legend_row, text]
