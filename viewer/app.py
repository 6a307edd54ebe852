"""The interactive cognitive-map viewer: a Dash app over one run directory (``goalprobe view``).

The episode explorer and the stage-episode tabs are modules with their layouts and callbacks;
this module composes them under one header beside the run overview tab (filled on its first
visit: prefix accuracy of every plan decoder, the probe accuracies against their controls, the
false-belief start-state cards and the scoring summaries), and keeps the page-level callbacks
(the tab named in the URL, the URL kept in step with every choice) and the page: its stylesheet,
its keyboard shortcuts and the HTML template around the Dash app (served from the package: no
network, no external assets)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import dash
from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate
from goalprobe.viewer.data import RunData, find_runs
from goalprobe.viewer.explorer_tab import explorer_tab, register_explorer_callbacks
from goalprobe.viewer.false_belief_tab import (
    false_belief_cards,
    false_belief_tab,
    fog_tab,
    register_false_belief_callbacks,
    register_fog_callbacks,
)
from goalprobe.viewer.figures.plans import prefix_accuracy_grid_figure
from goalprobe.viewer.figures.probes import probe_comparison_figure
from goalprobe.viewer.figures.style import stage_rank
from goalprobe.viewer.widgets import GRAPH_CONFIG, url_query

_TABS = ("explorer", "overview", "false_belief", "fog")
"""The tabs' values (``?view=`` in the URL), in page order."""


def _missing_notice(run: RunData):
    if not run.missing:
        return None
    items = [
        html.Li([html.Code(m.path), f" — {m.name}: {m.reason}; {m.consequence}"])
        for m in run.missing
    ]
    return html.Details(
        [html.Summary(f"{len(run.missing)} artefact(s) missing or unreadable"), html.Ul(items)],
        className="gp-notice",
        id="missing-notice",
        open=not run.episodes or len(run.missing) <= 4,
    )


def _agent_links(agents: Mapping[str, str] | None, current: str):
    """Links to the other runs served beside this one (one per agent), or None."""
    if not agents or len(agents) < 2:
        return None
    links = [
        html.A(name, href=href, className="current" if name == current else "", id=f"agent-{i}")
        for i, (name, href) in enumerate(agents.items())
    ]
    return html.Div([html.Span("agent:"), *links], className="gp-agents", id="agents")


def create_app(
    run_dir: str | Path,
    *,
    server=True,
    url_base_pathname: str | None = None,
    agents: Mapping[str, str] | None = None,
    name: str | None = None,
) -> dash.Dash:
    """The viewer app over ``run_dir``, on Flask ``server`` (``True``: a new one) at
    ``url_base_pathname``; ``agents``: run name -> URL of every run served beside this one,
    ``name`` this run's among them (default: the directory's)."""
    run = RunData(run_dir)
    app = dash.Dash(
        __name__,
        server=server,
        url_base_pathname=url_base_pathname,
        title=f"goalprobe viewer · {run.root.name}",
        assets_folder=str(Path(__file__).with_name("assets")),
        include_assets_files=False,
        serve_locally=True,
        update_title=None,
    )
    app.index_string = INDEX
    run_label = run.root.name + (f" · run {run.header.run_id}" if run.header else "")
    notice = _missing_notice(run)  # before the tabs, which may read (and note) more files
    tabs = (
        ("Episode explorer", "explorer", explorer_tab(run)),
        ("Run overview", "overview", html.Div(id="overview", className="gp-main")),
        ("False-belief episodes", "false_belief", false_belief_tab(run)),
        ("Fogged episodes", "fog", fog_tab(run)),
    )
    app.layout = html.Div(
        [
            dcc.Location(id="url", refresh=False),
            dcc.Store(id="url-step-used", data=False),
            dcc.Store(id="url-sync"),
            html.Div(
                [
                    html.H1("goalprobe · cognitive-map viewer"),
                    html.Span(f"{run_label} · {len(run.episodes)} episodes", className="gp-run"),
                    _agent_links(agents, name or run.root.name),
                ],
                className="gp-header",
            ),
            notice,
            dcc.Tabs(
                [dcc.Tab(label=label, value=value, children=tab) for label, value, tab in tabs],
                id="tabs",
                value="explorer",
                style={"margin": "12px 20px 0"},
            ),
            dcc.Store(id="fb-url-step-used", data=False),
        ]
    )
    register_explorer_callbacks(app, run)
    register_false_belief_callbacks(app, run)
    register_fog_callbacks(app, run)
    _register_page_callbacks(app, run)
    app.run_data = run  # for callers that want the index (tests, the CLI's summary)
    return app


def create_multi_run_app(parent: str | Path):
    """Serve every run directory under ``parent`` (e.g. one per agent) on one server, each at
    ``/<run name>/`` with links to the others, ``/`` redirecting to the first; returns
    ``(flask_app, {run name: dash app})``; ``FileNotFoundError`` when it holds no run."""
    import flask

    runs = find_runs(parent)
    if not runs:
        raise FileNotFoundError(f"{parent}: neither a run directory nor a folder of runs")
    server = flask.Flask(__name__)
    hrefs = {name: f"/{name}/" for name in runs}
    apps = {
        name: create_app(
            path, server=server, url_base_pathname=hrefs[name], agents=hrefs, name=name
        )
        for name, path in runs.items()
    }
    first = hrefs[next(iter(runs))]
    server.add_url_rule("/", "runs_index", lambda: flask.redirect(first))
    return server, apps


def _register_page_callbacks(app: dash.Dash, run: RunData) -> None:
    """The tab named in the query string (``?view=...``), the run overview computed when its tab
    is first opened, and the query string kept in step with every choice of every tab (so a URL
    reopens the same view)."""

    @app.callback(Output("tabs", "value"), Input("url", "search"))
    def tab_from_url(search):
        view = url_query(search).get("view")
        return view if view in _TABS else dash.no_update

    @app.callback(Output("overview", "children"), Input("tabs", "value"), prevent_initial_call=True)
    def show_overview(tab):
        if tab != "overview":
            raise PreventUpdate
        return overview_content(run)

    app.clientside_callback(
        """function (episode, step, stage, layer, family, cls, plan, view, fb, fbStep) {
            const q = new URLSearchParams();
            const put = (k, v) => { if (v !== null && v !== undefined && v !== '') q.set(k, v); };
            put('episode', episode); put('step', step); put('stage', stage); put('layer', layer);
            put('family', family); put('cls', cls); put('plan', plan);
            if (view && view !== 'explorer') { put('view', view); }
            if (view === 'false_belief') { put('fb', fb); put('fb_step', fbStep); }
            const search = '?' + q.toString();
            if (window.location.search !== search) {
                window.history.replaceState(null, '', window.location.pathname + search);
            }
            return search;
        }""",
        Output("url-sync", "data"),
        *(Input(x, "value") for x in ("episode", "step", "stage", "layer", "family", "cell-class")),
        *(Input(x, "value") for x in ("plan", "tabs", "fb-episode", "fb-step")),
        prevent_initial_call=True,
    )


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


CSS = """
* { box-sizing: border-box; }
body { margin: 0; font-family: Inter, system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif;
       color: #1f2933; background: #f5f6f8; font-size: 14px; }
.gp-header { display: flex; align-items: baseline; gap: 16px; padding: 12px 20px;
             background: #1d3557; color: white; }
.gp-header h1 { font-size: 18px; margin: 0; font-weight: 600; }
.gp-header .gp-run { font-size: 13px; opacity: .85; }
.gp-notice { margin: 12px 20px 0; padding: 10px 14px; background: #fff8e1;
             border: 1px solid #f2d47a; border-radius: 6px; font-size: 13px; }
.gp-notice summary { cursor: pointer; font-weight: 600; }
.gp-notice ul { margin: 6px 0 0; padding-left: 20px; }
.gp-error { margin: 0 0 10px; padding: 8px 12px; background: #fdecea; border: 1px solid #f5c2c0;
            border-radius: 6px; color: #8a1c1c; }
.gp-body { display: flex; gap: 16px; padding: 12px 20px 24px; align-items: flex-start; }
.gp-side { flex: 0 0 290px; background: white; border-radius: 8px; padding: 14px;
           box-shadow: 0 1px 2px rgba(0,0,0,.06); position: sticky; top: 12px; }
.gp-side h3 { font-size: 12px; text-transform: uppercase; letter-spacing: .06em; color: #52606d;
              margin: 14px 0 6px; }
.gp-side h3:first-child { margin-top: 0; }
.gp-side label.gp-label { display: block; font-size: 12px; color: #52606d; margin: 8px 0 3px; }
.gp-main { flex: 1 1 auto; min-width: 0; display: flex; flex-direction: column; gap: 12px; }
.gp-card { background: white; border-radius: 8px; padding: 8px 10px;
           box-shadow: 0 1px 2px rgba(0,0,0,.06); min-width: 0; }
.gp-row3 { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 12px; }
.gp-row2 { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 12px; }
.gp-stepbar { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; }
.gp-badge { display: inline-block; padding: 3px 9px; border-radius: 999px; font-size: 13px;
            background: #e9ecef; }
.gp-badge.ok { background: #d8f3dc; color: #1b4332; }
.gp-badge.bad { background: #f8d7da; color: #842029; }
.gp-badge.info { background: #e7e0f5; color: #4a1f8a; }
.gp-count { font-size: 12px; color: #52606d; margin-top: 4px; }
.gp-buttons { display: flex; gap: 6px; margin-top: 8px; }
.gp-buttons button { flex: 1; padding: 5px 0; border: 1px solid #c5ccd3; background: #f8f9fa;
                     border-radius: 5px; cursor: pointer; font-size: 13px; }
.gp-buttons button:hover { background: #e9ecef; }
.gp-text h4 { margin: 4px 0; font-size: 13px; color: #52606d; }
.gp-text pre { white-space: pre-wrap; word-break: break-word; margin: 0 0 8px;
               font-family: ui-monospace, 'SFMono-Regular', Menlo, monospace; font-size: 12.5px;
               background: #f8f9fa; border-radius: 5px; padding: 8px; max-height: 220px;
               overflow: auto; }
.gp-reasoning { white-space: pre-wrap; word-break: break-word; margin: 0 0 8px;
                font-family: ui-monospace, 'SFMono-Regular', Menlo, monospace; font-size: 12.5px;
                background: #f8f9fa; border-radius: 5px; padding: 8px; max-height: 260px;
                overflow: auto; line-height: 1.6; }
.gp-chunk { border-radius: 2px; padding: 1px 0; }
.gp-table { border-collapse: collapse; font-size: 13px; }
.gp-table td, .gp-table th { padding: 3px 10px; border-bottom: 1px solid #eceff1; text-align: left; }
.gp-empty { color: #6c757d; padding: 20px; }
.gp-caption { font-size: 13px; color: #3e4c59; margin: 4px 8px 6px; max-width: 70em; }
.gp-agents { display: flex; gap: 6px; align-items: baseline; font-size: 13px; margin-left: auto; }
.gp-agents a { color: #dbe4ee; text-decoration: none; padding: 2px 8px; border-radius: 999px;
               border: 1px solid rgba(255,255,255,.35); }
.gp-agents a.current { background: white; color: #1d3557; }
#overview { padding: 12px 0; }
.gp-legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 12px; color: #3e4c59;
             padding: 4px 2px 2px; border-top: 1px solid #eceff1; margin-top: 4px; }
.gp-legend-item { display: inline-flex; align-items: center; gap: 6px; }
.gp-swatch { width: 13px; height: 13px; border: 1px solid #8a8f98; border-radius: 2px;
             display: inline-block; }
.gp-line { width: 20px; height: 4px; border-radius: 2px; display: inline-block; }
.gp-ring { width: 12px; height: 12px; border: 3px solid; border-radius: 50%;
           display: inline-block; }
"""

KEYS = """
document.addEventListener('keydown', function (event) {
  if (event.key !== 'ArrowLeft' && event.key !== 'ArrowRight') { return; }
  if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) { return; }
  const t = event.target;
  if (t && t.closest && t.closest('input, textarea, select, [contenteditable=true], ' +
      '[role=slider], [role=combobox], [role=listbox], .dash-dropdown, .rc-slider')) { return; }
  const ids = event.key === 'ArrowLeft' ? ['prev', 'fb-prev', 'fog-prev']
                                         : ['next', 'fb-next', 'fog-next'];
  const button = ids.map(id => document.getElementById(id))
    .find(b => b && b.offsetParent !== null);
  if (button) { event.preventDefault(); button.click(); }
});
"""
"""Left and right arrows press the step buttons of the open tab (the episode explorer's, the
false-belief tab's or the fog tab's), unless a control that uses arrows has focus."""

INDEX = (
    """<!DOCTYPE html>
<html>
  <head>
    {%metas%}
    <title>{%title%}</title>
    {%favicon%}
    {%css%}
    <style>"""
    + CSS
    + """</style>
  </head>
  <body>
    {%app_entry%}
    <footer>{%config%}{%scripts%}{%renderer%}</footer>
    <script>"""
    + KEYS
    + """</script>
  </body>
</html>"""
)
