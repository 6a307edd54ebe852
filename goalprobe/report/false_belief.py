"""Report section: false-belief grids, scoring against a known belief (issue 18, part 1)."""

from __future__ import annotations

import numpy as np

from goalprobe.gridworld.core import Action
from goalprobe.gridworld.false_belief import (
    FALSE_BELIEF,
    STALE_GOAL,
    pair_facts,
    require_pair_facts,
)
from goalprobe.gridworld.io import read_grid_set
from goalprobe.gridworld.text import cell_types
from goalprobe.report.blocks import Block, Box, Figures, Text, stat_text, table
from goalprobe.report.run import MissingInput, RunReader
from goalprobe.viewer.figures.false_belief import false_belief_maps_figure, oracle_rates_figure

ROLES = (("false_belief", "false belief"), ("control", "control"))

BEHAVIOUR_METRICS = (
    ("follows_shown", "first action optimal only on the shown grid"),
    ("follows_true", "first action optimal only on the true grid"),
    ("acc_gt", "Acc. GT (all steps)"),
    ("acc_oracle", "Acc. Oracle (all steps)"),
    ("recovery_oracle", "Recovery vs oracle (GT-suboptimal steps)"),
    ("acc_dec", "Acc. Dec. (steps with a decoded map)"),
    ("acc_gt_decoded_steps", "Acc. GT on the same steps"),
    ("acc_dec_minus_gt", "Acc. Dec. − Acc. GT (paired)"),
    ("recovery_dec", "Recovery vs decoded map"),
    ("episodes_decoded_goal_shown", "decoded goal on the drawn grid's goal only (episodes)"),
    ("episodes_decoded_goal_true", "decoded goal on the true grid's goal only (episodes)"),
    ("episodes_decoded_goal_both", "decoded goal on the shared goal (episodes)"),
    ("episodes_decoded_goal_neither", "decoded goal elsewhere (episodes)"),
    ("decoded_goal_shown", "decoded goal on the drawn goal only (all steps)"),
    ("chance_acc_gt", "chance: Acc. GT"),
    ("chance_acc_oracle", "chance: Acc. Oracle"),
)


def false_belief(run: RunReader, fig: Figures) -> list[Block]:
    """This run's agent, then the positive control's (``RUN/control/``, when it ran the stage):
    behaviour against the oracle belief per kind and role, the paired first-step differences,
    the decoded map's shown-vs-true reading (cells and goal), and one pair drawn side by side
    with the agent's first action."""
    blocks = _agent_blocks(run, fig)
    control = RunReader(run.layout.control.root)
    if control.layout.false_belief_results.is_file():
        blocks.append(
            Text(
                "Positive control (RUN/control/): the map agent's anchors carry the goal, so on "
                "stale-goal grids its decoded goal should be the drawn one and its actions "
                "should follow the decoded map rather than the true grid."
            )
        )
        blocks.extend(_agent_blocks(control, fig))
    return blocks


def _agent_blocks(run: RunReader, fig: Figures) -> list[Block]:
    """The section's blocks for one run directory."""
    data = run.json(run.layout.false_belief_results)
    behaviour = data["behaviour"]
    kinds = list(behaviour)
    blocks: list[Block] = [
        Box("note", data["reading"] + " " + _this_run(data)),
        fig(oracle_rates_figure(behaviour)),
    ]
    header = ("metric", *(f"{k}: {label}" for k in kinds for _, label in ROLES))
    rows = [
        (
            label,
            *(
                stat_text((behaviour[k].get(role) or {}).get(metric))
                for k in kinds
                for role, _ in ROLES
            ),
        )
        for metric, label in BEHAVIOUR_METRICS
    ]
    blocks.append(
        table(
            header,
            rows,
            caption="Steps of the agent's episodes on false-belief grids and their controls "
            "(same true grid, drawn truthfully). Acc. Oracle: the action is optimal on the grid "
            "the prompt drew, from the agent's true cell; Recovery vs oracle: among actions "
            "suboptimal on the true grid, the share optimal on the shown one. Chance: a "
            "uniformly random action. 95% grid-bootstrap intervals.",
        )
    )
    blocks.append(
        table(
            (
                "kind",
                "follows shown: false belief − control",
                "follows true: false belief − control",
            ),
            [
                (
                    k,
                    stat_text(behaviour[k]["difference"]["follows_shown"]),
                    stat_text(behaviour[k]["difference"]["follows_true"]),
                )
                for k in kinds
            ],
            caption="Paired first-step differences; pairs resampled (95% interval).",
        )
    )
    decoding = data["decoding"]
    if not decoding.get("available"):
        blocks.append(Box("not_run", f"probe reading: {decoding.get('why')}"))
        return blocks
    dec = decoding["table"]
    blocks.append(
        table(
            ("kind", "role", "decoded = shown", "decoded = true", "neither", "cells"),
            [
                (
                    k,
                    label,
                    stat_text(dec[k][role]["matches_shown"]),
                    stat_text(dec[k][role]["matches_true"]),
                    stat_text(dec[k][role]["neither"]),
                    dec[k][role]["matches_shown"]["n"],
                )
                for k in dec
                for role, label in ROLES
                if role in dec[k]
            ],
            caption=f"Does the probe decode the shown grid or the true one? The headline probe "
            f"({decoding['probe']}, {decoding['stage']}, layer {decoding['layer']}) applied to "
            "the start-state prompt, at the cells where shown and true differ; on the control "
            "the same cells (shown = true there) give the probe's accuracy without a conflict. "
            "95% grid-bootstrap intervals.",
        )
    )
    blocks.append(Text(walls_follow_text(decoding)))
    blocks.extend(_example(run, fig, decoding, data.get("steps", [])))
    return blocks


WALL_KINDS = ("phantom_wall", "hidden_wall")
"""The false-belief kinds whose differing cell is a wall (drawn or not)."""
CELLS_FOR_80 = 17
"""Changed cells a kind needs for a 95% interval to show >= 80% when every cell follows
(issue 39: the Clopper-Pearson lower bound at 17 of 17 is 80.5%)."""


def walls_follow_text(decoding: dict) -> str:
    """How often the decoded wall at the phantom and hidden cells follows the drawn grid, per
    kind, with its interval (honest at 0% and 100%), its n and the read-out that made the
    walls; where a kind has fewer than :data:`CELLS_FOR_80` changed cells, what it would take."""
    from goalprobe.probes.decoded_maps import Readout

    walls = Readout.from_json(decoding.get("readout")).walls
    dec = decoding["table"]
    parts: list[str] = []
    short = False
    for kind in WALL_KINDS:
        entry = (dec.get(kind) or {}).get("false_belief")
        if not entry:
            continue
        shown = entry["matches_shown"]
        short |= shown.get("n", 0) < CELLS_FOR_80
        parts.append(
            f"{kind.replace('_', ' ')}: {stat_text(shown)} of {shown.get('n')} cells "
            f"({shown.get('n_grids', '?')} grids)"
        )
    if not parts:
        return "No phantom or hidden wall cells were decoded in this run."
    text = (
        f"Decoded walls (read-out: {walls}) at the changed cells follow the drawn grid in "
        + "; ".join(parts)
        + "."
    )
    if short:
        text += (
            f" An interval that can show >= 80% needs at least {CELLS_FOR_80} changed cells per "
            "kind (17 of 17: Clopper-Pearson lower bound 80.5%); this run has fewer (raise "
            "false_belief.grids.pairs_per_kind: 1-2 changed cells per pair, A's first moves)."
        )
    return text


def _this_run(data: dict) -> str:
    """What this run found, in one or two sentences (numbers from the results)."""
    pooled = data["behaviour"]["all"]
    fb = (pooled.get("false_belief") or {}).get("follows_shown")
    ctl = (pooled.get("control") or {}).get("follows_shown")
    diff = pooled["difference"]["follows_shown"]
    text = (
        f"In this run the first action follows the shown grid in {stat_text(fb)} of "
        f"false-belief episodes and in {stat_text(ctl)} of control episodes (difference "
        f"{stat_text(diff)}, {diff.get('n_pairs')} pairs)."
    )
    decoding = data["decoding"]
    if decoding.get("available"):
        cells = decoding["table"]["all"]["false_belief"]
        text += (
            f" At the differing cells the probe decodes the shown type in "
            f"{stat_text(cells['matches_shown'])} and the true type in "
            f"{stat_text(cells['matches_true'])} of cells."
        )
    return text


def _example(run: RunReader, fig: Figures, decoding: dict, steps: list) -> list[Block]:
    """One false-belief grid (a stale goal when there is one) drawn three ways: true, shown,
    decoded (the cell probe's classes with the read-out's agent and goal, start state), with
    the agent's first action of its first episode."""
    try:
        grids = read_grid_set(run.layout.false_belief_grids)
    except FileNotFoundError as err:
        raise MissingInput(str(err)) from err
    fbs = [g for g in grids if (pair_facts(g) or {}).get("role") == FALSE_BELIEF]
    grid = next((g for g in fbs if require_pair_facts(g)["kind"] == STALE_GOAL), fbs[0])
    facts = require_pair_facts(grid)
    if grid.shown is None:
        raise ValueError(f"false-belief grid {grid.grid_id!r} has no shown grid")
    decoded = decoding.get("maps", {}).get(grid.grid_id)
    first = next(
        (r for r in steps if r["grid_id"] == grid.grid_id and r["step"] == 0 and r["action"]),
        None,
    )
    action = None if first is None else int(Action[first["action"]])
    start = decoding.get("start_cells", {}).get(grid.grid_id, {})
    title = f"{facts['kind']}: {grid.grid_id} (start state)"
    if first is not None:
        title += f", first action {first['action']}"
    if start:
        title += f", decoded goal: {start.get('goal_follows')}"
    return [
        fig(
            false_belief_maps_figure(
                cell_types(grid),
                cell_types(grid.shown),
                None if decoded is None else np.asarray(decoded),
                differs=[tuple(c) for c in facts["differs"]],
                title=title,
                agent_row_col=grid.initial_state.agent,
                action=action,
            )
        )
    ]
