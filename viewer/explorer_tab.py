"""The viewer's episode explorer tab: filter episodes, step through one, and see the true grid
beside the chosen probe's decoded map, the plan decoder's plan, the texts and the step's
patching and attribution. Every callback input is checked against the run's allow-lists."""

from __future__ import annotations

import logging

import dash
from dash import Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate
from goalprobe.agents.trajectories import TrajectoryFormatError
from goalprobe.gridworld.core import CellType
from goalprobe.viewer.data import RunData, UnknownKeyError
from goalprobe.viewer.figures.style import class_name, empty_figure, stage_rank
from goalprobe.viewer.step import (
    build_step_view,
    default_episode,
    default_map_source,
    default_plan_source,
    step_badges,
    step_figures,
    timeline_figure,
)
from goalprobe.viewer.widgets import (
    GRID_HEIGHT,
    badge,
    from_url,
    graph,
    legend,
    step_controls,
    step_marks,
    step_texts,
    url_query,
)

log = logging.getLogger(__name__)

_OUTCOMES = {"all": None, "success": True, "failure": False}


def _options(values, fmt=str) -> list[dict]:
    return [{"label": fmt(v), "value": v} for v in values]


def _filter(label: str, filter_id: str, options: list[dict]) -> list:
    """A labelled multi-choice episode filter (none chosen: all)."""
    return [
        html.Label(label, className="gp-label"),
        dcc.Dropdown(id=filter_id, options=options, multi=True, placeholder="all"),
    ]


def _side_panel(run: RunData):
    facets = run.facets()
    present = {s.stage for s in run.map_sources.values()}
    stages = sorted(present, key=lambda s: (stage_rank(s), s)) or ["pre_reasoning"]
    families = sorted({s.family for s in run.map_sources.values()})
    default_key = default_map_source(run)
    default = run.map_sources[default_key] if default_key else None
    default_stage = default.stage if default else stages[0]
    first_episode, first_step = default_episode(run, default_key)
    return html.Div(
        [
            html.H3("Episodes"),
            *_filter("Grid size", "f-size", _options(facets["sizes"])),
            *_filter("Density", "f-density", _options(facets["densities"], "{:g}".format)),
            *_filter("Variant", "f-variant", _options(facets["variants"])),
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
                options=_options(["goal", "agent", "wall", "open", "key", "door", "padding"]),
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


def _explorer_main():
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
            html.Div(graph("g-attribution", 540), className="gp-card", id="attribution-card"),
        ],
        className="gp-main",
    )


def explorer_tab(run: RunData):
    """The tab's layout: filters, episode and probe choices beside the step's panels."""
    return html.Div([_side_panel(run), _explorer_main()], className="gp-body")


def _map_source_key(run: RunData, stage, layer, family) -> str | None:
    """The decoded-map source of a (stage, layer, family) triple, from the allow-list."""
    for key, source in run.map_sources.items():
        if source.stage == stage and source.layer == layer and source.family == family:
            return key
    return None


def _blank_outputs(why: str, message=None) -> tuple:
    """The step panels' outputs when there is no step to show: blank figures saying ``why``,
    cards hidden, the error ``message``."""
    blank = empty_figure(why)
    hidden = {"display": "none"}
    return ([], blank, blank, blank, blank, blank, blank, [], blank, hidden, blank, hidden, message)


def register_explorer_callbacks(app: dash.Dash, run: RunData) -> None:
    """The tab's callbacks: filters, step, layer and plan choices, the probe named in the URL,
    and the step's panels."""
    _register_navigation(app, run)
    _register_choices(app, run)
    _register_panels(app, run)


def _register_navigation(app: dash.Dash, run: RunData) -> None:
    """The episode filters and the step chosen (slider, buttons, timeline clicks, the URL)."""

    @app.callback(
        Output("episode", "options"),
        Output("episode", "value"),
        Output("episode-count", "children"),
        *(Input(x, "value") for x in ("f-size", "f-density", "f-variant", "f-outcome")),
        *(Input(x, "value") for x in ("f-mapped", "stage", "layer", "family")),
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
        if from_url(ctx) and wanted in keys:
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
        *(State(x, "value") for x in ("stage", "layer", "family")),
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


def _register_choices(app: dash.Dash, run: RunData) -> None:
    """The layers and plan decoder of the chosen probe, and the probe named in the URL."""

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
        if from_url(ctx) and wanted.isdigit() and int(wanted) in layers:
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
        if from_url(ctx) and wanted in run.plan_sources:
            return wanted
        return default_plan_source(run, stage, layer, current)

    @app.callback(
        Output("stage", "value"),
        Output("family", "value"),
        Output("cell-class", "value"),
        Input("url", "search"),
    )
    def selection_from_url(search):
        """The probe named in the page's query string (``?stage=...&family=...&cls=...``)."""
        query = url_query(search)
        allowed = {
            "stage": {s.stage for s in run.map_sources.values()},
            "family": {s.family for s in run.map_sources.values()},
            "cls": {class_name(c) for c in CellType},
        }
        return tuple(
            query[k] if query.get(k) in ok else dash.no_update for k, ok in allowed.items()
        )


def _register_panels(app: dash.Dash, run: RunData) -> None:
    """The chosen step's panels: maps, probabilities, plan, texts, patching and attribution."""

    @app.callback(
        Output("step-header", "children"),
        Output("timeline", "figure"),
        *(Output(x, "figure") for x in ("g-true", "g-decoded", "g-prob", "g-plan", "g-strip")),
        Output("texts", "children"),
        Output("g-patching", "figure"),
        Output("patching-card", "style"),
        Output("g-attribution", "figure"),
        Output("attribution-card", "style"),
        Output("error", "children"),
        *(Input(x, "value") for x in ("episode", "step", "stage", "layer", "family")),
        Input("cell-class", "value"),
        Input("plan", "value"),
    )
    def render(episode, step, stage, layer, family, cell_class, plan):
        if episode is None:
            return _blank_outputs("No episode matches the filters: clear a filter to see more.")
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
            message = html.Div(f"Cannot show this step: {err}", className="gp-error")
            return _blank_outputs("Cannot show this step (see the message above).", message)
        header = [badge(f"step {view.step} of {view.n_steps - 1}")]
        header += [badge(text, kind) for text, kind in step_badges(view)]
        if view.decoded is not None:
            source = run.map_sources[map_key]
            header.append(badge(f"probe: {source.label}"))
            header.append(badge(f"agent and goal: {view.decoded.readout}", "info"))
        elif map_key is None:
            header.append(badge(f"no probe for {stage} / layer {layer} / {family}", "bad"))
        header += [badge(note, "bad") for note in view.notes]
        texts = step_texts(view.reasoning, view.final, "reasoning", view.lens, view.lens_why)
        style = {} if view.patching else {"display": "none"}
        maps = [figs[x] for x in ("true", "decoded", "probability", "plan", "plan_strip")]
        attribution_style = {} if view.attribution else {"display": "none"}
        panels = (figs["patching"], style, figs["attribution"], attribution_style)
        return (header, timeline, *maps, texts, *panels, None)
