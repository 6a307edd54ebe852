"""Stage ``fog``: the agent on fogged grids (the study's Appendix A), read against the
free-space planner and a random walk on the same grids, with the study's failure modes
(``RUN/fog/``, schema ``goalprobe.demo.fog/2``).

Neither bundled agent was trained on fog: their tokenizers read the hidden cell ``*`` and most
of the fog instructions as unknown words (listed in the results), so what they do here is what
a fully observable policy does with an input it was never shown.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from goalprobe.agents.prompts import not_readable
from goalprobe.agents.trajectories import read_run_header
from goalprobe.gridworld.core import Action
from goalprobe.gridworld.fog import (
    AGENT,
    episode_row,
    fog_readings,
    generate_fog_set,
    reference_rows,
)
from goalprobe.gridworld.io import write_grid_set
from goalprobe.gridworld.optimal import solve
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.stages.rollouts import (
    read_episodes,
    rollouts_into,
    section_rollout,
    truncation_counts,
)

SCHEMA = "goalprobe.demo.fog/2"
"""Version 2 adds ``truncation`` (:func:`goalprobe.stages.rollouts.truncation_counts` and the
token budget): the episodes cut off by the token limit, left out of every score and reported
apart (never as the agent's failures). Version-1 files (no ``truncation``) still read."""


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Fog the grids, run the agent, and score its episodes against the references."""
    layout = context.layout
    f = config.fog
    grids = generate_fog_set(f.grids, f.radius)
    write_grid_set(layout.fog_grids, grids)
    by_id = {g.grid_id: g for g in grids}
    agent = context.agent(config.agent)
    summary = rollouts_into(grids, agent, config.rollout, layout.fog_trajectories, context)
    episodes = read_episodes(layout.fog_trajectories, truncated=True)
    truncation = {**truncation_counts(episodes), "max_new_tokens": config.rollout.max_new_tokens}

    def row(episode):
        actions = [Action[s.action] for s in episode.steps if s.action is not None]
        return episode_row(by_id[episode.summary.grid_id], actions, AGENT)

    finished = [e for e in episodes if not e.truncated]
    rows = [row(e) for e in finished]
    invalid = sum(s.action is None for e in finished for s in e.steps)
    if not rows:
        raise ValueError(
            f"all fog episodes of {layout.fog_trajectories.name} were cut off by the token limit "
            "(truncated) or took no valid action: raise rollouts.max_new_tokens"
        )
    rng = np.random.default_rng(f.seed)
    for grid in grids:
        horizon = config.rollout.horizon(solve(grid).shortest_path_length)
        rows.extend(reference_rows(grid, horizon, rng, f.random_walks_per_grid))
    # both readings: without the episodes cut off by the token limit, and with them counted
    # as what they are (the moves made before the cut, no success)
    cut_rows = [row(e) for e in episodes if e.truncated]
    table = fog_readings(rows, cut_rows, n_resamples=f.n_bootstrap, random_state=f.seed)
    # what the agent can read of the fogged prompts (the trajectory header's record)
    coverage = read_run_header(layout.fog_trajectories).prompt_coverage
    unknown = (
        None
        if coverage is None
        else sorted({*coverage["grid"]["pieces"], *coverage["instructions"]["pieces"]})
    )
    payload = {
        "schema": SCHEMA,
        "agent": config.agent.model,
        "radius": f.radius,
        "grids": len(grids),
        "invalid_steps": invalid,
        "truncation": truncation,
        "unknown_prompt_pieces": unknown,
        "prompt_coverage": coverage,
        # "n/a: the agent cannot read ..." (the hidden cell, the fog instructions): no verdict
        "not_applicable": not_readable(coverage),
        "policies": table,
        "episodes": [r.to_dict() for r in rows],
    }
    outputs = {
        "grids": layout.fog_grids,
        "trajectories": layout.fog_trajectories,
        "results": write_json(layout.fog_results, payload),
    }
    return outputs, {
        "grids": len(grids),
        "success_agent": table[AGENT]["success"]["value"],
        "truncated_episodes": truncation["truncated_episodes"],
        "rollouts": summary,
    }


STAGE = register(
    Stage(
        name="fog",
        run=run,
        writes=("fog grids", "fog trajectories", "fog results"),
        section="fog",
        uses=("agent",),
        derived=lambda c: section_rollout(
            c, "fog", horizon_factor=c.fog.horizon_factor, horizon_steps=None
        ),
        generates=True,
        control=True,
        seconds=41,
    )
)
