"""The viewer's run overview tab, filled on its first visit: prefix accuracy of every plan
decoder, the probe accuracies against their controls, the false-belief start-state cards and the
scoring summaries."""

from __future__ import annotations

import json

import dash
from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate
from goalprobe.viewer.data import RunData
from goalprobe.viewer.false_belief_tab import false_belief_cards
from goalprobe.viewer.figures.plans import prefix_accuracy_grid_figure
from goalprobe.viewer.figures.probes import probe_comparison_figure
from goalprobe.viewer.run_files import stage_rank
from goalprobe.viewer.widgets import GRAPH_CONFIG

PREFIX_CAPTION = (
    "One panel per stage (rows) and layer (columns). Look for decoders (solid, colour = "
    "capacity) that stay above the shuffled control (dotted) and the 0.25^N random baseline "
    "(dashed) beyond N = 1: that is plan information in the activations, not a prior."
)
PROBE_CAPTION = (
    "Each bar is a probe's test accuracy on grid cells (95% grid-bootstrap CI); the marks on it "
    "are its controls: majority class per cell, the priors by grid size and by size and density, "
    "and the same probe trained on shuffled labels. A probe only shows a cognitive map where it "
    "clears all of them."
)


def overview_content(run: RunData):
    cards = []
    runs, notes = [], []
    order = sorted(
        run.plan_sources.items(),
        key=lambda kv: (stage_rank(kv[1].stage), kv[1].layer, kv[1].kind, kv[1].n_layers or 0),
    )
    for key, source in order:
        try:
            result = run.prefix_accuracy(key)
        except (OSError, ValueError, KeyError) as err:
            notes.append(f"{source.label}: {err}")
            continue
        facts = {k: getattr(source, k) for k in ("stage", "layer", "kind", "n_layers")}
        runs.append({**facts, "accuracy": result["accuracy"], "ci": result["ci"]})
    if runs:
        figure = prefix_accuracy_grid_figure(runs)
        cards.append(_figure_card("g-prefix", figure, PREFIX_CAPTION, "prefix-caption"))
    else:
        cards.append(
            html.Div("No predicted plans to score. " + " ".join(notes), className="gp-empty")
        )
    rows = run.probe_metrics()
    cells_only = any(r["metric"] == "accuracy_no_padding" for r in rows)
    metric = "accuracy_no_padding" if cells_only else "accuracy"
    metrics = sorted(
        (r for r in rows if r["metric"] == metric),
        key=lambda r: (stage_rank(r["group"]), r["name"]),
    )
    if metrics:
        figure = probe_comparison_figure(
            metrics,
            y_title=f"accuracy on {'grid cells' if cells_only else 'the whole canvas'}",
            title="Cognitive-map probe accuracy against its controls (test grids)",
        )
        cards.append(_figure_card("g-probes", figure, PROBE_CAPTION, "probe-caption"))
    else:
        cards.append(
            html.Div(
                "No probe metrics recorded in the decoded-map cards: run the probe stage "
                "(goalprobe train-probe) to score them.",
                className="gp-empty",
            )
        )
    cards.extend(false_belief_cards(run))
    for name in ("belief", "meg"):
        try:
            summary = run.scoring(name)
        except ValueError as err:
            cards.append(html.Div(str(err), className="gp-error"))
            continue
        if summary is not None:
            heading = run.layout.relative(getattr(run.layout, name))
            cards.append(html.Div([html.H4(heading), _json_table(summary)]))
    return html.Div(
        [html.Div(c, className="gp-card") for c in cards],
        className="gp-main",
        style={"padding": "12px 20px"},
    )


def _figure_card(graph_id: str, figure, caption: str, caption_id: str) -> list:
    return [
        dcc.Graph(id=graph_id, figure=figure, config=GRAPH_CONFIG),
        html.P(caption, className="gp-caption", id=caption_id),
    ]


def _json_table(obj, limit: int = 60):
    rows: list = []
    for key, value in _flatten(obj):
        if len(rows) >= limit:
            rows.append(html.Tr([html.Td("…"), html.Td("")]))
            break
        text = f"{value:.4g}" if isinstance(value, float) else json.dumps(value)
        rows.append(html.Tr([html.Td(key), html.Td(text)]))
    return html.Table(rows, className="gp-table")


def _flatten(obj, prefix: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}{k}.")
    elif isinstance(obj, list) and len(obj) > 8:
        yield prefix.rstrip("."), f"[{len(obj)} items]"
    else:
        yield prefix.rstrip("."), obj


def overview_tab():
    """The tab's layout: a placeholder filled on first visit."""
    return html.Div(id="overview", className="gp-main")


def register_overview_callbacks(app: dash.Dash, run: RunData) -> None:
    """The tab's callback: compute the overview when the tab is first opened."""

    @app.callback(Output("overview", "children"), Input("tabs", "value"), prevent_initial_call=True)
    def show_overview(tab):
        if tab != "overview":
            raise PreventUpdate
        return overview_content(run)
