"""Stage ``false_belief``: rollouts on false-belief grids and their matched controls, scored
against the known (oracle) belief, and the headline probe's reading of the shown vs the true
grid (``RUN/false_belief/``, schema ``goalprobe.false_belief/1``).

The prompt of a false-belief grid draws its shown grid (a phantom wall, a hidden wall, a stale
goal) while the episode runs on the true grid; behaviour is scored against both. With a
headline probe, every visited state is decoded as a prompt-only state: ``acc_dec`` /
``recovery_dec`` score the steps on those maps, every step's map is written to
``false_belief/decoded_maps.h5`` (for the viewer), and at the start state the decoded class at
the cells where shown and true differ is compared with both. A step on the shown goal (a stale
goal reached) has no decoded map: its prompt draws no goal.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from goalprobe.agents.prompt_states import PromptStatesConfig
from goalprobe.gridworld.core import CellType, State
from goalprobe.gridworld.false_belief import FALSE_BELIEF, require_pair_facts
from goalprobe.gridworld.io import read_grid_set
from goalprobe.probes.decoded_maps import decoded_classes, write_step_maps
from goalprobe.probes.scoring.belief import top_cells
from goalprobe.probes.scoring.false_belief import (
    ROLES,
    SCHEMA,
    Bootstrap,
    FalseBeliefResults,
    control_cells,
    decoded_cells,
    decoded_table,
    goal_follows,
    oracle_rows,
    oracle_table,
)
from goalprobe.stages import HEADLINE_STAGE
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.decode import decode_prompt_states, load_decoder
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.stages.rollouts import read_episodes, section_rollout

READING = (
    "The bundled agents were trained on grids whose prompt shows the truth; they never saw a "
    "grid that lies. 'follows shown' is how often the first action is optimal only under the "
    "grid drawn in the prompt, 'follows true' how often it is optimal only under the real one "
    "(the two sets are disjoint by construction); the control runs the same true grid drawn "
    "truthfully. An agent that acts on what it is shown has follows shown near 1 on the "
    "false-belief grids and near its control rate otherwise; a probe that reads the prompt "
    "decodes the shown cell types at the differing cells."
)


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Read the pairs and the agent's episodes on them (stage ``false_belief_rollouts``),
    decode the visited states, and score."""
    layout = context.layout
    fb = config.false_belief
    grids = list(read_grid_set(layout.false_belief_grids))
    by_id = {g.grid_id: g for g in grids}
    outputs: dict = {}
    boot = Bootstrap(n_resamples=fb.n_bootstrap, random_state=fb.seed)

    episodes = read_episodes(layout.false_belief_trajectories)
    layout.false_belief_decoded.unlink(missing_ok=True)
    decoding, decoded = {"available": False, "why": "decoding switched off"}, {}
    if fb.decode:
        decoder = load_decoder(layout)
        if decoder is None:
            decoding["why"] = "the probes stage left no headline probe"
        else:
            probe = decoder.probe
            prompts = PromptStatesConfig(
                states_per_grid=1,
                reasoning_effort=config.rollout.reasoning_effort,
                template_dir=config.rollout.template_dir,
            )
            maps = decode_prompt_states(
                context,
                config.agent,
                config.activations,
                prompts,
                grids,
                decoder,
                visited_states(episodes, by_id),
                layout.false_belief_states,
                layout.false_belief_store,
            )
            decoded = {
                (s.grid_id, s.episode, s.step): maps[(s.grid_id, s.state)]
                for e in episodes
                for s in e.steps
                if (s.grid_id, s.state) in maps
            }
            if decoded:
                keys = list(decoded)
                extra = {
                    name: None
                    if decoded[keys[0]][j] is None
                    else np.stack([decoded[k][j] for k in keys])
                    for j, name in ((1, "agent"), (2, "goal"))
                }
                write_step_maps(
                    layout.false_belief_decoded,
                    keys,
                    np.stack([decoded[k][0] for k in keys]),
                    classes=[int(c) for c in CellType],
                    stage=HEADLINE_STAGE,
                    layer=probe.layer,
                    probe=str(layout.relative(probe.card)),
                    readout=decoder.readout.to_json(),
                    **extra,
                )
                outputs["decoded_maps"] = layout.false_belief_decoded
            start_probs = {g.grid_id: maps[(g.grid_id, g.initial_state)] for g in grids}
            decoding = probe_reading(grids, by_id, start_probs, boot)
            decoding.update(
                readout=decoder.readout.to_json(),
                probe=layout.relative(probe.card),
                probe_trained_on=probe.trained_on,
                stage=HEADLINE_STAGE,
                layer=probe.layer,
                states_decoded=len(maps),
            )
            outputs.update(states=layout.false_belief_states, store=layout.false_belief_store)

    rows = oracle_rows(episodes, by_id, decoded)
    payload: FalseBeliefResults = {
        "schema": SCHEMA,
        "config": dataclasses.asdict(fb),
        "pairs": [
            {"grid_id": g.grid_id, **require_pair_facts(g)}
            for g in grids
            if require_pair_facts(g)["role"] == FALSE_BELIEF
        ],
        "behaviour": oracle_table(rows, boot),
        "decoding": decoding,
        "steps": rows,
        "reading": READING,
        "roles": ROLES,
    }
    outputs["results"] = write_json(layout.false_belief_results, payload)
    return outputs, {"grids": len(grids), "steps": len(rows)}


def visited_states(episodes, grids: dict) -> dict[str, list[State]]:
    """Per grid, its start state then every distinct state its episodes visited (in order of
    first visit), leaving out states on the shown goal (their prompt draws no goal)."""
    out = {grid_id: [grid.initial_state] for grid_id, grid in grids.items()}
    for episode in episodes:
        grid = grids[episode.summary.grid_id]
        seen = out[grid.grid_id]
        for s in episode.steps:
            if s.state not in seen and s.state.agent != grid.prompt_grid.goal:
                seen.append(s.state)
    return out


def probe_reading(grids, by_id, start_maps, boot: Bootstrap) -> dict:
    """From ``start_maps`` (grid id -> ``(probs, agent read-out, goal read-out)``): the decoded
    class at the differing cells of every pair against shown and true, where the decoded goal
    lies (:func:`goal_follows`), and every grid's decoded start map (``n x n`` ``CellType``,
    :func:`goalprobe.probes.decoded_maps.decoded_classes`) with its decoded agent and goal cells."""
    pictures = {
        g: decoded_classes(probs, by_id[g].size, agent, goal)
        for g, (probs, agent, goal) in start_maps.items()
    }
    cells = []
    for grid in grids:
        facts = require_pair_facts(grid)
        if facts["role"] != FALSE_BELIEF or grid.grid_id not in start_maps:
            continue
        cells += decoded_cells(grid, pictures[grid.grid_id])
        twin = by_id[facts["pair_id"] + "-ctl"]
        if twin.grid_id in start_maps:
            cells += control_cells(twin, grid, pictures[twin.grid_id])
    maps, goals = {}, {}
    for g, (probs, agent, goal) in start_maps.items():
        n = by_id[g].size
        maps[g] = pictures[g].tolist()
        goals[g] = {
            "agent": list(top_cells(probs, n, CellType.AGENT, 1, agent)[0]),
            "goal": list(top_cells(probs, n, CellType.GOAL, 1, goal)[0]),
            "goal_follows": goal_follows(by_id[g], goal, probs),
        }
    return {
        "available": True,
        "table": decoded_table(cells, boot),
        "cells": cells,
        "maps": maps,
        "start_cells": goals,
    }


STAGE = register(
    Stage(
        name="false_belief",
        run=run,
        reads=("probes", "false_belief_rollouts"),
        writes=(
            "false-belief states",
            "false-belief store",
            "false-belief results",
            "false-belief decoded maps",
        ),
        section="false_belief",
        uses=("agent", "activations"),
        derived=lambda c: section_rollout(c, "false_belief"),
        weights=True,
        control=True,
        seconds=2,
        torch_threads=1,
    )
)
