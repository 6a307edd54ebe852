"""The viewer's stage-episode tabs, step by step: the false_belief stage's episodes (true grid,
the grid shown to the agent, the step's decoded map) with the run overview's start-state cards,
and the fog stage's episodes (the true grid beside what the fogged prompt drew, the agent's
knowledge, exact), with the step's action against the free-space planner on that knowledge and
against the optimal policy on the true grid."""

from __future__ import annotations

import dash
from dash import Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate
from goalprobe.gridworld.false_belief import FALSE_BELIEF, pair_facts
from goalprobe.viewer.data import RunData, UnknownKeyError
from goalprobe.viewer.figures.false_belief import false_belief_maps_figure
from goalprobe.viewer.figures.style import empty_figure
from goalprobe.viewer.run_files import false_belief_start_maps, fog_step_view
from goalprobe.viewer.step import (
    NO_FALSE_BELIEF,
    action_names,
    build_false_belief_step,
    false_belief_step_figure,
)
from goalprobe.viewer.widgets import (
    GRAPH_CONFIG,
    GRID_HEIGHT,
    badge,
    cannot_show,
    episode_tab,
    stage_episodes,
    step_marks,
    step_texts,
    stepped,
    url_query,
)

FALSE_BELIEF_WHY = (
    "Episodes of the false_belief stage: each false-belief grid's prompt draws another grid (a "
    "phantom wall, a hidden wall, a stale goal); its control draws the same true grid as it is."
)

FALSE_BELIEF_STEP_CAPTION = (
    "The episode runs on the true grid (left) while its prompt draws the shown grid (middle: "
    "the agent's known belief); ringed cells differ between the two. The decoded map (right) "
    "is the headline probe's reading of this step's prompt: a probe that reads the prompt "
    "decodes the shown cell types at the ringed cells. The arrow is the step's action."
)


def _false_belief_options(run: RunData) -> list[dict]:
    """The false-belief episodes, false-belief grids first, then their controls."""
    fb, _ = stage_episodes(run.false_belief_episodes)
    if fb is None:
        return []

    def first(key: str) -> bool:
        facts = pair_facts(fb.grids[fb.episodes[key].summary.grid_id]) or {}
        return facts.get("role") != FALSE_BELIEF

    return [{"label": fb.label(k), "value": k} for k in sorted(fb.episodes, key=first)]


def false_belief_tab(run: RunData):
    """The tab's layout: the episode list and step controls beside the three-map card."""
    fb, error = stage_episodes(run.false_belief_episodes)
    options = _false_belief_options(run)
    why = error or (NO_FALSE_BELIEF if fb is None else FALSE_BELIEF_WHY)
    return episode_tab(
        "fb",
        title="False-belief episode",
        why=why,
        options=options,
        option_height=58,
        caption=FALSE_BELIEF_STEP_CAPTION,
    )


FALSE_BELIEF_CAPTION = (
    "False-belief grids (start state): the true grid, the grid the prompt drew (the agent's "
    "known belief) and the headline probe's decoded map; ringed cells differ between shown and "
    "true. A probe that reads the prompt decodes the shown cell types there."
)


def false_belief_cards(run: RunData) -> list:
    """The run overview's cards: one false-belief grid of each kind at its start state."""
    try:
        pairs = false_belief_start_maps(run.files)
    except ValueError as err:
        return [html.Div(str(err), className="gp-error")]
    cards = []
    for i, pair in enumerate(pairs):
        read = ", ".join(
            f"({c['row']},{c['col']}): {c['decoded'].lower()}" for c in pair["decoded_at"]
        )
        cards.append(
            [
                dcc.Graph(
                    id=f"g-false-belief-{i}",
                    figure=false_belief_maps_figure(
                        pair["true"],
                        pair["shown"],
                        pair["decoded"],
                        differs=pair["differs"],
                        decoded_label="no probe reading (run the probes stage)",
                        title=f"{pair['kind'].replace('_', ' ')}: {pair['grid_id']}",
                    ),
                    config=GRAPH_CONFIG,
                ),
                html.P(
                    FALSE_BELIEF_CAPTION
                    + (f" Decoded at the ringed cells: {read}." if read else ""),
                    className="gp-caption",
                ),
            ]
        )
    return cards


def register_false_belief_callbacks(app: dash.Dash, run: RunData) -> None:
    """The tab's callbacks: the episode from the URL, the step, and the step's view."""

    @app.callback(
        Output("fb-episode", "value"),
        Input("url", "search"),
        State("fb-episode", "value"),
    )
    def false_belief_episode_from_url(search, current):
        """The false-belief episode named in the query string (``?view=false_belief&fb=...``)."""
        wanted = url_query(search).get("fb")
        keys = {o["value"] for o in _false_belief_options(run)}
        if wanted in keys and wanted != current:
            return wanted
        raise PreventUpdate

    @app.callback(
        Output("fb-step", "value"),
        Output("fb-step", "max"),
        Output("fb-step", "marks"),
        Output("fb-url-step-used", "data"),
        Input("fb-episode", "value"),
        Input("fb-prev", "n_clicks"),
        Input("fb-next", "n_clicks"),
        State("fb-step", "value"),
        State("url", "search"),
        State("fb-url-step-used", "data"),
    )
    def choose_false_belief_step(episode, _prev, _next, current, search, used):
        fb, _ = stage_episodes(run.false_belief_episodes)
        if fb is None or not isinstance(episode, str) or episode not in fb.episodes:
            return 0, 1, None, used
        last = max(len(fb.episodes[episode].steps) - 1, 0)
        trigger = ctx.triggered_id
        query = url_query(search)
        value = 0
        if trigger not in ("fb-prev", "fb-next") and not used and query.get("fb") == episode:
            if query.get("fb_step", "").isdigit():
                value, used = int(query["fb_step"]), True
        step = stepped(trigger, "fb", current, last, otherwise=value)
        return step, max(last, 1), step_marks(last), bool(used)

    @app.callback(
        Output("fb-header", "children"),
        Output("g-fb-maps", "figure"),
        Output("fb-texts", "children"),
        Output("fb-error", "children"),
        Input("fb-episode", "value"),
        Input("fb-step", "value"),
    )
    def render_false_belief(episode, step):
        fb, error = stage_episodes(run.false_belief_episodes)
        if fb is None or episode is None:
            message = NO_FALSE_BELIEF if error is None else f"Cannot read them: {error}"
            return [], empty_figure(message, height=GRID_HEIGHT), [], None
        if not isinstance(episode, str) or not isinstance(step, int | float | None):
            raise PreventUpdate
        try:
            view = build_false_belief_step(run, episode, int(step or 0))
            figure = false_belief_step_figure(view, height=GRID_HEIGHT + 20)
        except (UnknownKeyError, ValueError, KeyError) as err:
            return cannot_show("false-belief", episode, step, err)
        what = (
            "control (shown as it is)"
            if view.role == "control"
            else f"false belief: {view.kind.replace('_', ' ')}"
        )
        grids = [("shown", view.optimal_shown), ("true", view.optimal_true)]
        header = _step_badges(view, what, grids, "{verdict} on the {name} grid")
        if view.decoded is not None:
            grids.append(("decoded", view.decoded.optimal))
        header += [badge(f"optimal ({grid}): {action_names(o) or 'none'}") for grid, o in grids]
        texts = step_texts(view.reasoning, view.final, "fb-reasoning")
        return header, figure, texts, None


NO_FOG = "No fogged episodes in this run: run goalprobe demo (its fog stage)."

FOG_CAPTION = (
    "The episode runs on the true grid (left) while its prompt draws only the cells the agent "
    "has seen (middle; hidden cells drawn as padding and ringed), with its past moves. The "
    "revealed map is the agent's knowledge, known exactly; the free-space planner plans on it "
    "with hidden cells treated as open. The arrow is the step's action."
)


def fog_tab(run: RunData):
    """The tab's layout: the episode list and step controls beside the two maps."""
    fog, error = stage_episodes(run.fog_episodes)
    options = [] if fog is None else [{"label": fog.label(k), "value": k} for k in fog.episodes]
    why = error or (NO_FOG if fog is None else "Episodes of the fog stage (appendix A).")
    return episode_tab(
        "fog",
        title="Fogged episode",
        why=why,
        options=options,
        option_height=48,
        caption=FOG_CAPTION,
    )


def register_fog_callbacks(app: dash.Dash, run: RunData) -> None:
    """The tab's callbacks: the step and the step's view."""

    @app.callback(
        Output("fog-step", "value"),
        Output("fog-step", "max"),
        Output("fog-step", "marks"),
        Input("fog-episode", "value"),
        Input("fog-prev", "n_clicks"),
        Input("fog-next", "n_clicks"),
        State("fog-step", "value"),
    )
    def choose_fog_step(episode, _prev, _next, current):
        fog, _ = stage_episodes(run.fog_episodes)
        if fog is None or not isinstance(episode, str) or episode not in fog.episodes:
            return 0, 1, None
        last = max(len(fog.episodes[episode].steps) - 1, 0)
        return stepped(ctx.triggered_id, "fog", current, last), max(last, 1), step_marks(last)

    @app.callback(
        Output("fog-header", "children"),
        Output("g-fog-maps", "figure"),
        Output("fog-texts", "children"),
        Output("fog-error", "children"),
        Input("fog-episode", "value"),
        Input("fog-step", "value"),
    )
    def render_fog(episode, step):
        fog, error = stage_episodes(run.fog_episodes)
        if fog is None or episode is None:
            message = NO_FOG if error is None else f"Cannot read them: {error}"
            return [], empty_figure(message, height=GRID_HEIGHT), [], None
        if not isinstance(episode, str) or not isinstance(step, int | float | None):
            raise PreventUpdate
        try:
            view = fog_step_view(fog, episode, int(step or 0))
        except (KeyError, ValueError) as err:
            return cannot_show("fog", episode, step, err)
        figure = false_belief_maps_figure(
            view.true_types,
            view.shown_types,
            None,
            differs=view.hidden,
            decoded_label="not decoded per step (see the report)",
            height=GRID_HEIGHT + 20,
            agent_row_col=view.agent,
            action=None if view.action is None else int(view.action),
        )
        checks = [("free-space", view.free_space), ("true-grid", view.optimal)]
        header = _step_badges(view, "fog", checks, "{name} {verdict}")
        texts = step_texts(view.reasoning, view.final, "fog-reasoning")
        return header, figure, texts, None


def _step_badges(view, what: str, checks, label: str) -> list:
    """A stage step's badges: which step, ``what`` it is, and its action against each
    ``(name, optimal moves)`` of ``checks`` (``label`` formats ``name`` and ``verdict``)."""
    header = [badge(f"step {view.step} of {view.n_steps - 1}"), badge(what, "info")]
    if view.action is None:
        return [*header, badge("invalid step (no action)", "bad")]
    header.append(badge(f"action {view.action.name}"))
    for name, moves in checks:
        ok = view.action in moves
        verdict = "optimal" if ok else "not optimal"
        header.append(badge(label.format(name=name, verdict=verdict), "ok" if ok else "bad"))
    return header
