"""What the viewer shows for one step (:func:`build_step_view`, a false-belief step:
:func:`build_false_belief_step`) and its figures, shared by the app and the export. The decoded
grid is the one decoder of :mod:`goalprobe.probes.decoded_maps`, its optimal actions from
breadth-first distances to the decoded goal."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import takewhile
from typing import Any

import numpy as np
from goalprobe.activations.store.schema import plan_rows
from goalprobe.gridworld.core import PLAN_END, PLAN_PAD, Action, CellType, RowCol, State
from goalprobe.gridworld.dynamics import rollout
from goalprobe.gridworld.text import cell_types, parse
from goalprobe.probes.decision_steps import StepLensRecord
from goalprobe.probes.decoded_maps import CELL_READOUT, POSITION_READOUT, decoded_classes
from goalprobe.probes.scoring.belief import decoded_walls, optimal_mask_for_pair, top_cells
from goalprobe.viewer.data import EpisodeData, RunData, UnknownKeyError
from goalprobe.viewer.figures.attribution import attribution_map_figure
from goalprobe.viewer.figures.false_belief import false_belief_maps_figure
from goalprobe.viewer.figures.maps import (
    cell_map_figure,
    episode_timeline_figure,
    plan_figure,
    probability_figure,
)
from goalprobe.viewer.figures.patching import patching_heatmap_figure
from goalprobe.viewer.figures.plans import plan_strip_categories, plan_strip_figure
from goalprobe.viewer.figures.style import DECODED_COLOUR, class_name, empty_figure
from goalprobe.viewer.run_files import HEADLINE_FAMILY, N_CLASSES


@dataclass(frozen=True, eq=False)
class DecodedView:
    """The decoded cognitive map of one step (of map source ``source``): ``probs`` ``(n, n,
    len(CellType))`` within the true size, ``argmax`` classes, the most probable agent and goal
    cells, the ``optimal`` actions on the decoded grid, the ``classes`` the probe predicts and
    what placed the agent and the goal (``readout``, :func:`readout_label`)."""

    source: str
    probs: np.ndarray
    argmax: np.ndarray
    agent_row_col: RowCol
    goal_row_col: RowCol
    optimal: frozenset[Action]
    classes: tuple[int, ...]
    readout: str = CELL_READOUT


@dataclass(frozen=True, eq=False)
class PlanView:
    """The predicted plan of one step (``(H,)`` tokens) against the executed one (``target``,
    the plan label), the cells each visits from ``s_t`` and the matched ``prefix`` length."""

    source: str
    predicted: np.ndarray
    target: np.ndarray
    predicted_path: list[RowCol]
    executed_path: list[RowCol]
    prefix: int


@dataclass(frozen=True, eq=False)
class StepView:
    """Everything shown for step ``t`` of an episode: the true state ``s_t`` (``(n, n)``
    classes, the agent's cell and its cells ``s_0 .. s_t``), the action (None: invalid) and
    ``pi*(s_t)``, the texts, the decoded map and plan (or None), the patching and attribution
    records whose base is this step, ``notes`` on empty panels, the map source asked for, and
    the decision stage's logit lens (or None, with ``lens_why``)."""

    episode: str
    step: int
    n_steps: int
    size: int
    true_cells: np.ndarray
    agent_row_col: RowCol
    history: list[RowCol]
    action: Action | None
    optimal: frozenset[Action]
    reasoning: str | None
    final: str | None
    decoded: DecodedView | None
    plan: PlanView | None
    patching: list[dict] = field(default_factory=list)
    attribution: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    map_source: str | None = None
    lens: StepLensRecord | None = None
    lens_why: str | None = None


def action_names(actions) -> str:
    """Names of ``actions`` in action order, comma-separated."""
    return ", ".join(a.name for a in sorted(actions))


def step_badges(view: StepView) -> list[tuple[str, str]]:
    """``(text, kind)`` badges of a step's action against its optimal sets: the action (``ok``
    when optimal on the true grid), the true optimal set and, with a decoded map, the decoded
    one (``info`` when the action is in it)."""
    if view.action is None:
        out = [("invalid step (no action)", "bad")]
    else:
        out = [(f"action {view.action.name}", "ok" if view.action in view.optimal else "bad")]
    out.append((f"optimal (true): {action_names(view.optimal) or 'none'}", ""))
    if view.decoded is not None:
        ok = view.action is not None and view.action in view.decoded.optimal
        decoded = action_names(view.decoded.optimal) or "none"
        out.append((f"optimal (decoded): {decoded}", "info" if ok else "bad"))
    return out


def decoded_view(
    probs: np.ndarray,
    size: int,
    *,
    source: str,
    classes: tuple[int, ...],
    door_locked: bool,
    agent: np.ndarray | None = None,
    goal: np.ndarray | None = None,
) -> DecodedView:
    """The decoded grid of ``probs`` (``(S, S, len(CellType))``, true side ``size``) and its
    optimal actions; ``agent`` / ``goal``: position read-outs, or None for the cell probe's."""
    probs = np.asarray(probs)
    walls = decoded_walls(probs, size, door_locked=door_locked)
    agent_cell = top_cells(probs, size, CellType.AGENT, 1, agent)[0]
    goal_cell = top_cells(probs, size, CellType.GOAL, 1, goal)[0]
    mask = optimal_mask_for_pair(walls, agent_cell, goal_cell)
    return DecodedView(
        source=source,
        probs=probs[:size, :size],
        argmax=decoded_classes(probs, size, agent, goal),
        agent_row_col=agent_cell,
        goal_row_col=goal_cell,
        optimal=frozenset(Action(int(a)) for a in np.flatnonzero(mask)),
        classes=classes,
        readout=readout_label(agent is not None, goal is not None),
    )


def record_view(record, source: str, classes: tuple[int, ...], probs, agent=None, goal=None):
    """:func:`decoded_view` of a step record's map (its door locked while closed and no key is
    held)."""
    locked = record.door_row_col is not None and not record.door_open and not record.has_key
    return decoded_view(
        probs,
        record.grid_size,
        source=source,
        classes=classes,
        door_locked=locked,
        agent=agent,
        goal=goal,
    )


def readout_label(agent: bool, goal: bool) -> str:
    """What placed the agent and the goal, for a badge: both from the position probes, both
    from the cell probe, or which from which."""
    if agent and goal:
        return f"{POSITION_READOUT}s"
    if not agent and not goal:
        return CELL_READOUT
    parts = (("agent", agent), ("goal", goal))
    return ", ".join(f"{name}: {POSITION_READOUT if pos else CELL_READOUT}" for name, pos in parts)


def plan_actions(tokens: np.ndarray) -> list[Action]:
    """The actions of a plan row up to its first ``END`` (``PAD`` ends it too)."""
    moves = takewhile(lambda token: token not in (PLAN_END, PLAN_PAD), np.asarray(tokens).tolist())
    return [Action(int(token)) for token in moves]


def _positions(data: EpisodeData) -> list[RowCol]:
    """Agent cells ``s_0 .. s_T`` of the episode."""
    return [s.agent_row_col for s in data.steps] + [data.summary.final_agent_row_col]


def build_step_view(
    run: RunData,
    episode: str,
    step: int,
    *,
    map_source: str | None = None,
    plan_source: str | None = None,
) -> StepView:
    """Gather what is shown for ``step`` (clipped) of ``episode``; the episode and source keys
    are checked against the run's allow-lists."""
    data = run.episode(episode)
    t = int(min(max(int(step), 0), len(data.steps) - 1))
    record = data.steps[t]
    visible, state = parse(record.grid_text)
    true_cells = cell_types(visible, state).astype(np.int64)
    notes: list[str] = []
    decoded = None
    if map_source is not None:
        source = run.map_source(map_source)
        maps = run.decoded_maps(map_source, episode)
        if maps.present[t]:
            decoded = record_view(record, map_source, source.classes, *maps.decoded_parts(t))
        else:
            notes.append("no decoded map for this step (probes decode their test grids only)")
    plan = None
    if plan_source is not None:
        plans = run.predicted_plans(plan_source, episode)
        if plans.present[t]:
            predicted = plans.values[t]
            target = plan_rows([s.action_enum for s in data.steps], len(predicted))[t]
            prefix = plan_strip_categories(predicted, target)["prefix"]
            actions = plan_actions(predicted)
            start = State(
                agent=record.agent_row_col, has_key=record.has_key, door_open=record.door_open
            )
            predicted_path = [s.agent for s in rollout(data.grid, actions, start=start)]
            n_exec = len(plan_actions(target))
            positions = _positions(data)
            valid = [i for i in range(t, len(data.steps)) if data.steps[i].action is not None]
            executed = [positions[t], *(positions[i + 1] for i in valid[:n_exec])]
            plan = PlanView(
                source=plan_source,
                predicted=np.asarray(predicted),
                target=target,
                predicted_path=predicted_path,
                executed_path=executed,
                prefix=prefix,
            )
        else:
            notes.append("no predicted plan for this step")
    lens, lens_why = step_lens(run, record)
    return StepView(
        episode=episode,
        step=t,
        n_steps=len(data.steps),
        size=record.grid_size,
        true_cells=true_cells,
        agent_row_col=record.agent_row_col,
        history=_positions(data)[: t + 1],
        action=record.action_enum,
        optimal=record.optimal_action_set,
        reasoning=record.reasoning,
        final=record.final,
        decoded=decoded,
        plan=plan,
        patching=run.patching_records(episode, t),
        attribution=run.attribution_records(episode, t),
        notes=notes,
        map_source=map_source,
        lens=lens,
        lens_why=lens_why,
    )


def step_lens(run: RunData, record) -> tuple[StepLensRecord | None, str | None]:
    """The decision stage's lens on a main-rollout step, or None with why there is none."""
    from goalprobe.viewer.widgets import NO_LENS, NO_LENS_RUN

    try:
        lens_file = run.decision_steps()
    except ValueError as err:
        return None, f"Cannot read the decision stage's lens file: {err}"
    if lens_file is None:
        return None, NO_LENS_RUN
    lens = lens_file.steps.get((record.grid_id, record.episode, record.step))
    if lens is None:
        return None, NO_LENS
    if record.action_enum != lens.action:
        return None, (
            f"The decision stage's lens for this step answered {lens.action.name}, the step "
            f"{record.action or 'no action'}: it was read from other rollouts (rerun the stage)."
        )
    return lens, None


def episode_flags(run: RunData, episode: str, map_source: str | None) -> dict[str, list]:
    """Per-step rows for the timeline: optimal on the true grid and on the decoded grid."""
    data = run.episode(episode)
    optimal_true = [
        None if s.action_enum is None else s.action_enum in s.optimal_action_set for s in data.steps
    ]
    flags: dict[str, list] = {"optimal (true grid)": optimal_true}
    if map_source is not None:
        maps = run.decoded_maps(map_source, episode)
        source = run.map_source(map_source)
        row: list[bool | None] = []
        for t, s in enumerate(data.steps):
            if not maps.present[t] or s.action_enum is None:
                row.append(None)
                continue
            view = record_view(s, map_source, source.classes, *maps.decoded_parts(t))
            row.append(s.action_enum in view.optimal)
        flags["optimal (decoded grid)"] = row
    return flags


def step_figures(
    view: StepView, cell_class: int = int(CellType.GOAL), *, show_legend: bool = True
) -> dict[str, Any]:
    """The plotly figures of a step by panel (a blank figure saying why where data is missing);
    ``cell_class``: the probability heatmap's ``CellType``; ``show_legend=False`` when the page
    draws the legend once."""
    action = None if view.action is None else int(view.action)
    figs: dict[str, Any] = {
        "true": cell_map_figure(
            view.true_cells,
            title="True grid",
            agent_row_col=view.agent_row_col,
            action=action,
            optimal_actions=[int(a) for a in view.optimal],
            history=view.history,
            probs=None if view.decoded is None else view.decoded.probs,
            true_cell_types=view.true_cells,
            show_legend=show_legend,
        )
    }
    if view.decoded is not None:
        d = view.decoded
        figs["decoded"] = cell_map_figure(
            d.argmax,
            title="Decoded cognitive map (argmax)",
            probs=d.probs,
            true_cell_types=view.true_cells,
            agent_row_col=d.agent_row_col,
            action=action,
            optimal_actions=[int(a) for a in d.optimal],
            optimal_label="optimal (decoded grid)",
            optimal_colour=DECODED_COLOUR,
            markers={"decoded agent": d.agent_row_col, "decoded goal": d.goal_row_col},
            show_legend=show_legend,
        )
        figs["probability"] = probability_figure(
            d.probs[:, :, int(cell_class)],
            int(cell_class),
            title=f"P({class_name(cell_class)}) per cell",
            true_cell_types=view.true_cells,
            probs=d.probs,
        )
    else:
        message = (
            "No decoded map: choose a stage, layer and probe family that have one."
            if view.map_source is None
            else "No decoded map for this step: probes decode only their held-out test grids. "
            "Tick 'only episodes with decoded maps' or pick another episode."
        )
        figs["decoded"] = empty_figure(message, height=420)
        figs["probability"] = empty_figure(message, height=420)
    if view.plan is not None:
        p = view.plan
        figs["plan"] = plan_figure(
            view.true_cells,
            executed_path=p.executed_path,
            predicted_path=p.predicted_path,
            title="Decoded plan vs executed actions",
            show_legend=show_legend,
        )
        figs["plan_strip"] = plan_strip_figure(p.predicted, p.target)
    else:
        figs["plan"] = empty_figure(
            "No predicted plan for this step: choose a plan decoder, or a step of a test grid.",
            height=420,
        )
        figs["plan_strip"] = empty_figure("No predicted plan for this step.", height=170)
    figs["patching"] = (
        patching_heatmap_figure(view.patching, title="Patching at this step: mean recovered")
        if view.patching
        else empty_figure("No patching results for this step.", height=200)
    )
    figs["attribution"] = attribution_step_figure(view.attribution)
    return figs


def attribution_step_figure(records, height: int = 520):
    """The heat map of a step's first attributed pair (metric ``coordinates`` when it has one):
    its GradDrop magnitude, else the signed AtP estimate."""
    if not records:
        return empty_figure("No attribution for this step.", height=200)
    record = next((r for r in records if r.metric == "coordinates"), records[0])
    values = record.graddrop if record.graddrop is not None else record.atp
    kind = "GradDrop |AtP|" if record.graddrop is not None else "AtP"
    return attribution_map_figure(
        values, record.positions, record.cell_positions, anchors=record.pre_reasoning,
        changed_cells=record.changed_cells, layers=record.layers, height=height,
        title=f"Attribution at this step, {record.metric} ({kind}): {record.pair_id}",
    )  # fmt: skip


def timeline_figure(run: RunData, episode: str, step: int, map_source: str | None):
    """The episode timeline with ``step`` outlined."""
    return episode_timeline_figure(episode_flags(run, episode, map_source), current_step=step)


def default_map_source(run: RunData) -> str | None:
    """The decoded-map source shown first: the headline maps when the run has them (the maps
    scoring uses, with the position probes' agent and goal); else pre-reasoning, ``mlp`` when
    present, middle layer."""
    if not run.map_sources:
        return None
    sources = list(run.map_sources.values())
    headline = [s for s in sources if s.family == HEADLINE_FAMILY]
    if headline:
        return headline[0].key
    stages = {s.stage for s in sources}
    stage = "pre_reasoning" if "pre_reasoning" in stages else sorted(stages)[0]
    families = {s.family for s in sources if s.stage == stage}
    family = "mlp" if "mlp" in families else sorted(families)[0]
    layers = sorted(s.layer for s in sources if s.stage == stage and s.family == family)
    layer = layers[len(layers) // 2]
    return next(s.key for s in sources if (s.stage, s.family, s.layer) == (stage, family, layer))


def default_plan_source(
    run: RunData, stage: str | None, layer: int | None, current: str | None = None
) -> str | None:
    """The plan source that best matches a stage and layer: same stage, same layer, a trained
    decoder (not a control), the study's best capacity (2 layers), then ``current``."""
    if not run.plan_sources:
        return None

    def score(item) -> tuple:
        key, p = item
        return (
            p.stage == stage,
            p.layer == layer,
            p.kind == "decoder",
            p.n_layers == 2,
            key == current,
        )

    return max(run.plan_sources.items(), key=score)[0]


def default_episode(run: RunData, map_source: str | None) -> tuple[str | None, int]:
    """The episode and step shown first: the first episode (in file order) that has a decoded
    map in ``map_source``, at its first mapped step; else the first episode, at step 0."""
    if not run.episodes:
        return None, 0
    if map_source is not None:
        mapped = run.episodes_with_maps(map_source)
        for key in run.episodes:
            if key in mapped:
                return key, run.first_mapped_step(map_source, key)
    return next(iter(run.episodes)), 0


NO_FALSE_BELIEF = (
    "No false-belief episodes in this run: run goalprobe demo (its false_belief stage rolls the "
    "agent out on grids whose prompt draws another grid) to produce them."
)
"""What the false-belief tab says when the stage has not run."""


@dataclass(frozen=True, eq=False)
class FalseBeliefStepView:
    """Step ``t`` of a false-belief episode: the grid's pair facts (``role`` ``false_belief``
    or ``control``, shown as it is), ``(n, n)`` classes of ``s_t`` on the true and the shown
    grid, the cells where they differ, the action (None: invalid), the optimal actions on each
    grid (shown: the oracle belief's), the decoded map (or None, with ``decoded_why``) and the
    texts."""

    episode: str
    step: int
    n_steps: int
    grid_id: str
    kind: str
    role: str
    true_cells: np.ndarray
    shown_cells: np.ndarray
    differs: list[RowCol]
    agent_row_col: RowCol
    action: Action | None
    optimal_true: frozenset[Action]
    optimal_shown: frozenset[Action]
    decoded: DecodedView | None
    decoded_why: str | None
    reasoning: str | None
    final: str | None


def build_false_belief_step(run: RunData, episode: str, step: int) -> FalseBeliefStepView:
    """Gather step ``step`` (clipped) of a false-belief episode; :class:`UnknownKeyError` when
    the run has none or ``episode`` is not one."""
    from goalprobe.gridworld.false_belief import pair_facts
    from goalprobe.probes.scoring.false_belief import oracle_optimal_mask

    fb = run.false_belief_episodes()
    if fb is None or not isinstance(episode, str) or episode not in fb.episodes:
        raise UnknownKeyError(f"unknown false-belief episode {episode!r}")
    data = fb.episodes[episode]
    t = int(min(max(int(step), 0), len(data.steps) - 1))
    record = data.steps[t]
    grid = fb.grids[record.grid_id]
    state = record.state
    facts = pair_facts(grid) or {}
    key = (record.grid_id, record.episode, record.step)
    probs = fb.maps.get(key)
    agent_map, goal_map = fb.readouts.get(key, (None, None))
    decoded, why = None, fb.maps_why
    if probs is not None:
        classes = tuple(range(N_CLASSES))
        decoded = record_view(record, fb.maps_label, classes, probs, agent_map, goal_map)
    elif why is None:
        why = (
            "No decoded map for this step: the stage decodes every visited state but those on "
            "the shown goal (a prompt that draws the agent there draws no goal)."
        )
    return FalseBeliefStepView(
        episode=episode,
        step=t,
        n_steps=len(data.steps),
        grid_id=record.grid_id,
        kind=str(facts.get("kind", "")),
        role=str(facts.get("role", "")),
        true_cells=cell_types(grid, state).astype(np.int64),
        shown_cells=cell_types(grid.prompt_grid, state).astype(np.int64),
        differs=[(int(r), int(c)) for r, c in facts.get("differs", [])],
        agent_row_col=record.agent_row_col,
        action=record.action_enum,
        optimal_true=record.optimal_action_set,
        optimal_shown=frozenset(
            Action(int(a)) for a in np.flatnonzero(oracle_optimal_mask(grid, state))
        ),
        decoded=decoded,
        decoded_why=why,
        reasoning=record.reasoning,
        final=record.final,
    )


def false_belief_step_figure(view: FalseBeliefStepView, height: int | None = 440):
    """The three maps of a false-belief step (:func:`false_belief_maps_figure`), with the
    action drawn from the agent's cell."""
    kind = view.kind.replace("_", " ")
    role = "control (shown as it is)" if view.role == "control" else "false belief"
    return false_belief_maps_figure(
        view.true_cells,
        view.shown_cells,
        None if view.decoded is None else view.decoded.argmax,
        probs=None if view.decoded is None else view.decoded.probs,
        differs=view.differs,
        title=f"{kind} · {role}: {view.grid_id}, step {view.step}",
        decoded_label=view.decoded_why or "",
        height=height,
        agent_row_col=view.agent_row_col,
        action=None if view.action is None else int(view.action),
    )
