"""The interactive cognitive-map viewer: a Dash app over one run directory.

``create_app(run_dir)`` builds the app; ``goalprobe view RUN_DIR`` serves it on 127.0.0.1.

*Episode explorer*: filter episodes (grid size, density, variant, outcome), pick one and step
through it (slider, buttons, or a click on the timeline). For the chosen probe (stage, layer,
family) the true grid and the decoded cognitive map stand side by side with a per-class
probability heatmap; hovering any cell shows its class probabilities. Arrows give the agent's
action and the optimal set on the true grid and on the decoded grid; the chosen plan decoder's
plan is drawn against the executed moves; the reasoning and answer text and the step's
patching results sit below. *Run overview*: prefix accuracy of every plan decoder (with the
``0.25^N`` baseline), probe accuracies recorded in the probe cards, and the scoring summaries.
*False-belief episodes*: step through the false_belief stage's own episodes (grids whose prompt
draws another grid); for each step the true grid, the grid shown to the agent (differing cells
ringed) and the step's decoded map stand side by side, with the action and whether it is
optimal on the shown and on the true grid.

Every callback input is checked against allow-lists built on the server (episode keys,
(stage, layer, family) triples, plan-source keys, class names); nothing sent by the browser is
used as a path. Data is loaded per episode (:mod:`goalprobe.viewer.data`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

import dash
from dash import Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate
from goalprobe.agents.trajectories import TrajectoryFormatError
from goalprobe.gridworld.core import CellType
from goalprobe.viewer.data import STAGES, RunData, UnknownKeyError, find_runs
from goalprobe.viewer.false_belief_tab import (
    false_belief_cards,
    false_belief_tab,
    register_false_belief_callbacks,
)
from goalprobe.viewer.figures import (
    class_name,
    empty_figure,
    prefix_accuracy_grid_figure,
    probe_comparison_figure,
)
from goalprobe.viewer.step import (
    build_step_view,
    default_episode,
    default_map_source,
    default_plan_source,
    step_figures,
    timeline_figure,
)
from goalprobe.viewer.widgets import (
    GRAPH_CONFIG,
    GRID_HEIGHT,
    badge,
    graph,
    legend,
    step_controls,
    step_marks,
    url_query,
)

log = logging.getLogger(__name__)

_OUTCOMES = {"all": None, "success": True, "failure": False}
_TABS = ("explorer", "overview", "false_belief")
"""The tabs' values (``?view=`` in the URL)."""
_CSS = """
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

_KEYS = """
document.addEventListener('keydown', function (event) {
  if (event.key !== 'ArrowLeft' && event.key !== 'ArrowRight') { return; }
  if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) { return; }
  const t = event.target;
  if (t && t.closest && t.closest('input, textarea, select, [contenteditable=true], ' +
      '[role=slider], [role=combobox], [role=listbox], .dash-dropdown, .rc-slider')) { return; }
  const ids = event.key === 'ArrowLeft' ? ['prev', 'fb-prev'] : ['next', 'fb-next'];
  const button = ids.map(id => document.getElementById(id))
    .find(b => b && b.offsetParent !== null);
  if (button) { event.preventDefault(); button.click(); }
});
"""
"""Left and right arrows press the step buttons of the open tab (the episode explorer's or the
false-belief tab's), unless a control that uses arrows has focus."""

_INDEX = (
    """<!DOCTYPE html>
<html>
  <head>
    {%metas%}
    <title>{%title%}</title>
    {%favicon%}
    {%css%}
    <style>"""
    + _CSS
    + """</style>
  </head>
  <body>
    {%app_entry%}
    <footer>{%config%}{%scripts%}{%renderer%}</footer>
    <script>"""
    + _KEYS
    + """</script>
  </body>
</html>"""
)


def _options(values, fmt=str) -> list[dict]:
    return [{"label": fmt(v), "value": v} for v in values]


def _density_label(d: float) -> str:
    return f"{d:g}"


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


def _side_panel(run: RunData):
    facets = run.facets()
    present = {s.stage for s in run.map_sources.values()}
    stages = sorted(present, key=lambda s: (_stage_rank(s), s))
    stages = stages or ["pre_reasoning"]
    families = sorted({s.family for s in run.map_sources.values()})
    default_key = default_map_source(run)
    default = run.map_sources[default_key] if default_key else None
    default_stage = default.stage if default else stages[0]
    first_episode, first_step = default_episode(run, default_key)
    return html.Div(
        [
            html.H3("Episodes"),
            html.Label("Grid size", className="gp-label"),
            dcc.Dropdown(
                id="f-size", options=_options(facets["sizes"]), multi=True, placeholder="all"
            ),
            html.Label("Density", className="gp-label"),
            dcc.Dropdown(
                id="f-density",
                options=_options(facets["densities"], _density_label),
                multi=True,
                placeholder="all",
            ),
            html.Label("Variant", className="gp-label"),
            dcc.Dropdown(
                id="f-variant", options=_options(facets["variants"]), multi=True, placeholder="all"
            ),
            html.Label("Outcome", className="gp-label"),
            dcc.RadioItems(
                id="f-outcome",
                options=[{"label": f" {k}", "value": k} for k in _OUTCOMES],
                value="all",
                inline=True,
                inputStyle={"marginLeft": "6px"},
            ),
            dcc.Checklist(
                id="f-mapped",
                options=[{"label": " only episodes with decoded maps", "value": "mapped"}],
                value=[],
                inputStyle={"marginRight": "4px"},
                style={"marginTop": "8px", "fontSize": "13px"},
            ),
            html.Div(
                "Probes decode only their held-out test grids, so other episodes have no "
                "decoded map (the true grid and plans still show).",
                className="gp-count",
                id="mapped-why",
            ),
            html.Label("Episode", className="gp-label"),
            dcc.Dropdown(
                id="episode",
                options=[{"label": i.label, "value": k} for k, i in run.episodes.items()],
                value=first_episode,
                clearable=False,
                optionHeight=44,
            ),
            html.Div(id="episode-count", className="gp-count"),
            *step_controls("step", "prev", "next", first_step),
            html.H3("Cognitive map probe"),
            html.Label("Stage", className="gp-label"),
            dcc.RadioItems(
                id="stage",
                options=[{"label": f" {s.replace('_', '-')}", "value": s} for s in stages],
                value=default_stage,
                inline=True,
                inputStyle={"marginLeft": "6px"},
            ),
            html.Label("Layer", className="gp-label"),
            dcc.Dropdown(id="layer", clearable=False),
            html.Label("Probe family", className="gp-label"),
            dcc.Dropdown(
                id="family",
                options=_options(families),
                value=default.family if default else None,
                clearable=False,
            ),
            html.Label("Probability map class", className="gp-label"),
            dcc.Dropdown(
                id="cell-class",
                options=[
                    {"label": class_name(c), "value": class_name(c)}
                    for c in (
                        CellType.GOAL,
                        CellType.AGENT,
                        CellType.WALL,
                        CellType.OPEN,
                        CellType.KEY,
                        CellType.DOOR,
                        CellType.PADDING,
                    )
                ],
                value="goal",
                clearable=False,
            ),
            html.H3("Plan decoder"),
            dcc.Dropdown(
                id="plan",
                options=[{"label": p.label, "value": k} for k, p in run.plan_sources.items()],
                value=None,
                placeholder="none available" if not run.plan_sources else "choose a decoder",
                optionHeight=40,
            ),
        ],
        className="gp-side",
    )


def _explorer():
    return html.Div(
        [
            html.Div(id="error"),
            html.Div(
                [
                    html.Div(id="step-header", className="gp-stepbar"),
                    graph("timeline", 120),
                    legend(),
                ],
                className="gp-card",
            ),
            html.Div(
                [
                    html.Div(graph("g-true", GRID_HEIGHT), className="gp-card"),
                    html.Div(graph("g-decoded", GRID_HEIGHT), className="gp-card"),
                    html.Div(graph("g-prob", GRID_HEIGHT), className="gp-card"),
                ],
                className="gp-row3",
            ),
            html.Div(
                [
                    html.Div([graph("g-plan", GRID_HEIGHT)], className="gp-card"),
                    html.Div(
                        [graph("g-strip", 170), html.Div(id="texts", className="gp-text")],
                        className="gp-card",
                    ),
                ],
                className="gp-row2",
            ),
            html.Div(graph("g-patching", 280), className="gp-card", id="patching-card"),
        ],
        className="gp-main",
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


def _overview(run: RunData):
    cards = []
    runs, notes = [], []
    order = sorted(
        run.plan_sources.items(),
        key=lambda kv: (_stage_rank(kv[1].stage), kv[1].layer, kv[1].kind, kv[1].n_layers or 0),
    )
    for key, source in order:
        try:
            result = run.prefix_accuracy(key)
        except (OSError, ValueError, KeyError) as err:
            notes.append(f"{source.label}: {err}")
            continue
        runs.append(
            {
                "stage": source.stage,
                "layer": source.layer,
                "kind": source.kind,
                "n_layers": source.n_layers,
                "accuracy": result["accuracy"],
                "ci": result["ci"],
            }
        )
    if runs:
        cards.append(
            [
                dcc.Graph(
                    id="g-prefix",
                    figure=prefix_accuracy_grid_figure(runs),
                    config=GRAPH_CONFIG,
                ),
                html.P(PREFIX_CAPTION, className="gp-caption", id="prefix-caption"),
            ]
        )
    else:
        cards.append(
            html.Div("No predicted plans to score. " + " ".join(notes), className="gp-empty")
        )
    rows = run.probe_metrics()
    metric = (
        "accuracy_no_padding"
        if any(r["metric"] == "accuracy_no_padding" for r in rows)
        else "accuracy"
    )
    metrics = sorted(
        (r for r in rows if r["metric"] == metric),
        key=lambda r: (_stage_rank(r["group"]), r["name"]),
    )
    if metrics:
        where = "grid cells" if metric == "accuracy_no_padding" else "the whole canvas"
        cards.append(
            [
                dcc.Graph(
                    id="g-probes",
                    figure=probe_comparison_figure(
                        metrics,
                        y_title=f"accuracy on {where}",
                        title="Cognitive-map probe accuracy against its controls (test grids)",
                    ),
                    config=GRAPH_CONFIG,
                ),
                html.P(PROBE_CAPTION, className="gp-caption", id="probe-caption"),
            ]
        )
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


def _stage_rank(stage: str) -> int:
    return STAGES.index(stage) if stage in STAGES else len(STAGES)


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
    """Build the viewer app over ``run_dir`` (nothing is served until ``app.run``).

    Args:
        run_dir: a goalprobe run directory; missing artefacts are listed in a notice.
        server: the Flask server to attach to (``True``: a new one), for several runs on one
            server (:func:`create_multi_run_app`).
        url_base_pathname: where the app lives on that server (``/`` by default).
        agents: run name -> URL of every run served beside this one (a link bar in the header).
        name: this run's name among ``agents`` (default: the run directory's name).

    Returns:
        the ``dash.Dash`` app (``app.server`` is the Flask WSGI app).
    """
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
    app.index_string = _INDEX
    run_label = run.root.name + (f" · run {run.header.run_id}" if run.header else "")
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
            _missing_notice(run),
            dcc.Tabs(
                [
                    dcc.Tab(
                        label="Episode explorer",
                        value="explorer",
                        children=html.Div([_side_panel(run), _explorer()], className="gp-body"),
                    ),
                    dcc.Tab(
                        label="Run overview",
                        value="overview",
                        # filled on first visit: scoring every plan decoder reads whole files
                        children=html.Div(id="overview", className="gp-main"),
                    ),
                    dcc.Tab(
                        label="False-belief episodes",
                        value="false_belief",
                        children=false_belief_tab(run),
                    ),
                ],
                id="tabs",
                value="explorer",
                style={"margin": "12px 20px 0"},
            ),
            dcc.Store(id="fb-url-step-used", data=False),
        ]
    )
    _register_callbacks(app, run)
    register_false_belief_callbacks(app, run)
    app.run_data = run  # for callers that want the index (tests, the CLI's summary)
    return app


def _from_url(context) -> bool:
    """Whether a callback runs for the page's first load or for its query string."""
    return context.triggered_id is None or "url.search" in context.triggered_prop_ids


def create_multi_run_app(parent: str | Path):
    """Serve every run directory under ``parent`` (e.g. one per agent) on one server.

    Each run gets its own viewer at ``/<run name>/`` with links to the others in its header;
    ``/`` redirects to the first. A later second bundled agent's run only has to sit beside the
    first (``runs/demo-agent-a``, ``runs/demo-agent-b``) to be offered.

    Returns:
        ``(flask_app, {run name: dash app})``.

    Raises:
        FileNotFoundError: ``parent`` holds no run directory.
    """
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


def _map_source_key(run: RunData, stage, layer, family) -> str | None:
    """The decoded-map source of a (stage, layer, family) triple, from the allow-list."""
    for key, source in run.map_sources.items():
        if source.stage == stage and source.layer == layer and source.family == family:
            return key
    return None


def _register_callbacks(app: dash.Dash, run: RunData) -> None:
    @app.callback(Output("overview", "children"), Input("tabs", "value"), prevent_initial_call=True)
    def show_overview(tab):
        if tab != "overview":
            raise PreventUpdate
        return _overview(run)

    @app.callback(
        Output("episode", "options"),
        Output("episode", "value"),
        Output("episode-count", "children"),
        Input("f-size", "value"),
        Input("f-density", "value"),
        Input("f-variant", "value"),
        Input("f-outcome", "value"),
        Input("f-mapped", "value"),
        Input("stage", "value"),
        Input("layer", "value"),
        Input("family", "value"),
        Input("url", "search"),
        State("episode", "value"),
    )
    def filter_episodes(
        sizes, densities, variants, outcome, mapped, stage, layer, family, search, current
    ):
        facets = run.facets()
        sizes = [s for s in (sizes or []) if s in facets["sizes"]] or None
        densities = [d for d in (densities or []) if d in facets["densities"]] or None
        variants = [v for v in (variants or []) if v in facets["variants"]] or None
        matches = run.filter_episodes(
            sizes=sizes,
            densities=densities,
            variants=variants,
            success=_OUTCOMES.get(outcome) if isinstance(outcome, str) else None,
        )
        map_key = _map_source_key(run, stage, layer, family)
        with_maps = run.episodes_with_maps(map_key) if map_key is not None else frozenset()
        if isinstance(mapped, list) and "mapped" in mapped:
            matches = [i for i in matches if i.key in with_maps]
        options = [
            {"label": i.label + ("" if i.key in with_maps else " · no decoded map"), "value": i.key}
            for i in matches
        ]
        keys = [i.key for i in matches]
        wanted = url_query(search).get("episode")
        if _from_url(ctx) and wanted in keys:
            current = wanted
        value = current if current in keys else (keys[0] if keys else None)
        count = (
            f"{len(matches)} of {len(run.episodes)} episodes; "
            f"{len(with_maps)} have decoded maps in this probe"
        )
        return options, value, count

    @app.callback(
        Output("step", "value"),
        Output("step", "max"),
        Output("step", "marks"),
        Output("url-step-used", "data"),
        Input("episode", "value"),
        Input("prev", "n_clicks"),
        Input("next", "n_clicks"),
        Input("timeline", "clickData"),
        State("step", "value"),
        State("url", "search"),
        State("url-step-used", "data"),
        State("stage", "value"),
        State("layer", "value"),
        State("family", "value"),
    )
    def choose_step(episode, _prev, _next, click, current, search, used, stage, layer, family):
        if not isinstance(episode, str) or episode not in run.episodes:
            return 0, 1, None, used
        n_steps = run.episodes[episode].summary.length
        last = max(n_steps - 1, 0)
        marks = step_marks(last)
        current = int(current) if isinstance(current, int | float) else 0
        trigger = ctx.triggered_id
        used = bool(used)
        if trigger == "prev":
            value = current - 1
        elif trigger == "next":
            value = current + 1
        elif trigger == "timeline" and isinstance(click, dict) and click.get("points"):
            x = click["points"][0].get("x") if isinstance(click["points"][0], dict) else None
            value = int(x) if isinstance(x, int | float) else current
        else:
            query = url_query(search)
            map_key = _map_source_key(run, stage, layer, family)
            if not used and query.get("episode") == episode and query.get("step", "").isdigit():
                value, used = int(query["step"]), True
            elif trigger is None and isinstance(current, int):
                value = current  # the first screen's step (the layout chose a mapped one)
            elif map_key is not None:
                value = run.first_mapped_step(map_key, episode)
            else:
                value = 0
        return min(max(value, 0), last), max(last, 1), marks, True if used else used

    @app.callback(
        Output("layer", "options"),
        Output("layer", "value"),
        Input("stage", "value"),
        Input("family", "value"),
        Input("url", "search"),
        State("layer", "value"),
    )
    def layers_for(stage, family, search, current):
        layers = sorted(
            {s.layer for s in run.map_sources.values() if s.stage == stage and s.family == family}
        )
        options = [{"label": f"layer {x}", "value": x} for x in layers]
        wanted = url_query(search).get("layer", "")
        if _from_url(ctx) and wanted.isdigit() and int(wanted) in layers:
            current = int(wanted)
        value = current if current in layers else (layers[len(layers) // 2] if layers else None)
        return options, value

    @app.callback(
        Output("plan", "value"),
        Input("stage", "value"),
        Input("layer", "value"),
        Input("url", "search"),
        State("plan", "value"),
    )
    def plan_for(stage, layer, search, current):
        wanted = url_query(search).get("plan")
        if _from_url(ctx) and wanted in run.plan_sources:
            return wanted
        return default_plan_source(run, stage, layer, current)

    @app.callback(
        Output("stage", "value"),
        Output("family", "value"),
        Output("cell-class", "value"),
        Output("tabs", "value"),
        Input("url", "search"),
    )
    def selection_from_url(search):
        """The probe and tab named in the page's query string (``?stage=...&family=...&cls=...
        &view=...``)."""
        query = url_query(search)
        view = query.get("view")
        stages = {s.stage for s in run.map_sources.values()}
        families = {s.family for s in run.map_sources.values()}
        names = {class_name(c) for c in CellType}
        stage = query.get("stage")
        family = query.get("family")
        cls = query.get("cls")
        return (
            stage if stage in stages else dash.no_update,
            family if family in families else dash.no_update,
            cls if cls in names else dash.no_update,
            view if view in _TABS else dash.no_update,
        )

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
        Input("episode", "value"),
        Input("step", "value"),
        Input("stage", "value"),
        Input("layer", "value"),
        Input("family", "value"),
        Input("cell-class", "value"),
        Input("plan", "value"),
        Input("tabs", "value"),
        Input("fb-episode", "value"),
        Input("fb-step", "value"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output("step-header", "children"),
        Output("timeline", "figure"),
        Output("g-true", "figure"),
        Output("g-decoded", "figure"),
        Output("g-prob", "figure"),
        Output("g-plan", "figure"),
        Output("g-strip", "figure"),
        Output("texts", "children"),
        Output("g-patching", "figure"),
        Output("patching-card", "style"),
        Output("error", "children"),
        Input("episode", "value"),
        Input("step", "value"),
        Input("stage", "value"),
        Input("layer", "value"),
        Input("family", "value"),
        Input("cell-class", "value"),
        Input("plan", "value"),
    )
    def render(episode, step, stage, layer, family, cell_class, plan):
        if episode is None:
            blank = empty_figure("No episode matches the filters: clear a filter to see more.")
            return (
                [],
                blank,
                blank,
                blank,
                blank,
                blank,
                blank,
                [],
                blank,
                {"display": "none"},
                None,
            )
        names = {class_name(c): int(c) for c in CellType}
        if not isinstance(cell_class, str) or cell_class not in names:
            raise PreventUpdate
        if not isinstance(step, int | float | None) or not isinstance(episode, str):
            raise PreventUpdate
        map_key = _map_source_key(run, stage, layer, family)
        plan_key = plan if isinstance(plan, str) and plan in run.plan_sources else None
        try:
            view = build_step_view(
                run, episode, int(step or 0), map_source=map_key, plan_source=plan_key
            )
            figs = step_figures(view, names[cell_class], show_legend=False)
            timeline = timeline_figure(run, episode, view.step, map_key)
        except (UnknownKeyError, TrajectoryFormatError, ValueError, OSError, KeyError) as err:
            log.warning("cannot show %s step %s: %s", episode, step, err)
            blank = empty_figure("Cannot show this step (see the message above).")
            message = html.Div(f"Cannot show this step: {err}", className="gp-error")
            return (
                [],
                blank,
                blank,
                blank,
                blank,
                blank,
                blank,
                [],
                blank,
                {"display": "none"},
                message,
            )
        header = [badge(f"step {view.step} of {view.n_steps - 1}")]
        if view.action is None:
            header.append(badge("invalid step (no action)", "bad"))
        else:
            ok = view.action in view.optimal
            header.append(badge(f"action {view.action.name}", "ok" if ok else "bad"))
        header.append(
            badge("optimal (true): " + (", ".join(a.name for a in sorted(view.optimal)) or "none"))
        )
        if view.decoded is not None:
            ok = view.action is not None and view.action in view.decoded.optimal
            header.append(
                badge(
                    "optimal (decoded): "
                    + (", ".join(a.name for a in sorted(view.decoded.optimal)) or "none"),
                    "info" if ok else "bad",
                )
            )
            source = run.map_sources[map_key]
            header.append(badge(f"probe: {source.label}"))
        elif map_key is None:
            header.append(badge(f"no probe for {stage} / layer {layer} / {family}", "bad"))
        for note in view.notes:
            header.append(badge(note, "bad"))
        texts = [
            html.H4("Reasoning"),
            html.Pre(view.reasoning or "(none)", id="reasoning"),
            html.H4("Final answer"),
            html.Pre(view.final or "(none)"),
        ]
        style = {} if view.patching else {"display": "none"}
        return (
            header,
            timeline,
            figs["true"],
            figs["decoded"],
            figs["probability"],
            figs["plan"],
            figs["plan_strip"],
            texts,
            figs["patching"],
            style,
            None,
        )
