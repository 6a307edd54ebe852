"""The viewer's fog tab: the fog stage's episodes step by step, the true grid beside what the
fogged prompt drew (the agent's knowledge, exact), with the step's action against the
free-space planner on that knowledge and against the optimal policy on the true grid."""

from __future__ import annotations

import dash
from dash import Input, Output, State, ctx
from dash.exceptions import PreventUpdate
from goalprobe.viewer.data import RunData
from goalprobe.viewer.figures.false_belief import false_belief_maps_figure
from goalprobe.viewer.figures.style import empty_figure
from goalprobe.viewer.fog_data import fog_step_view
from goalprobe.viewer.step_panels import (
    cannot_show,
    episode_tab,
    stage_episodes,
    step_texts,
    stepped,
)
from goalprobe.viewer.widgets import GRID_HEIGHT, badge, step_marks

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
        header = [badge(f"step {view.step} of {view.n_steps - 1}"), badge("fog", "info")]
        if view.action is None:
            header.append(badge("invalid step (no action)", "bad"))
        else:
            header.append(badge(f"action {view.action.name}"))
            for name, moves in (("free-space", view.free_space), ("true-grid", view.optimal)):
                ok = view.action in moves
                header.append(
                    badge(f"{name} {'optimal' if ok else 'not optimal'}", "ok" if ok else "bad")
                )
        texts = step_texts(view.reasoning, view.final, "fog-reasoning")
        return header, figure, texts, None
