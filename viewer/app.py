"""The interactive cognitive-map viewer: a Dash app over one run directory (``goalprobe view``).

Each tab is a module with its layout and callbacks; this module composes them under one header
and keeps the page-level callbacks (the tab named in the URL, the URL kept in step with every
choice)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import dash
from dash import Input, Output, dcc, html
from goalprobe.viewer.data import RunData, find_runs
from goalprobe.viewer.explorer_tab import explorer_tab, register_explorer_callbacks
from goalprobe.viewer.false_belief_tab import false_belief_tab, register_false_belief_callbacks
from goalprobe.viewer.fog_tab import fog_tab, register_fog_callbacks
from goalprobe.viewer.overview_tab import overview_tab, register_overview_callbacks
from goalprobe.viewer.page import INDEX
from goalprobe.viewer.widgets import url_query

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
        ("Run overview", "overview", overview_tab()),
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
    register_overview_callbacks(app, run)
    register_false_belief_callbacks(app, run)
    register_fog_callbacks(app, run)
    _register_page_callbacks(app)
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


def _register_page_callbacks(app: dash.Dash) -> None:
    """The tab named in the query string (``?view=...``), and the query string kept in step with
    every choice of every tab (so a URL reopens the same view)."""

    @app.callback(Output("tabs", "value"), Input("url", "search"))
    def tab_from_url(search):
        view = url_query(search).get("view")
        return view if view in _TABS else dash.no_update

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
