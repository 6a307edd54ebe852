"""Stage ``keys``: rollouts on the key variants and their matched controls, and Table 1
(``RUN/keys/``, schema ``goalprobe.demo.keys/1``)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from goalprobe.config import DemoConfig
from goalprobe.gridworld.behaviour import KeyEpisode, key_variant_table
from goalprobe.gridworld.core import RowCol
from goalprobe.gridworld.io import write_grid_set
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.stages.rollouts import (
    read_episodes,
    rollouts_into,
    section_rollout,
    variant_grids,
)

SCHEMA = "goalprobe.demo.keys/1"


def _received(config: DemoConfig) -> dict:
    """The rollout settings under the key variants' horizon and count, and the intervals."""
    rollout = section_rollout(config, "keys", horizon_steps=config.keys.horizon)
    return {**rollout, "intervals": config.behaviour.intervals}


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Generate the variants, run the agent, and tabulate each variant."""
    layout = context.layout
    k = config.keys
    grids = variant_grids(k.variants, k.sizes, k.density, k.grids_per_size, k.seed)
    write_grid_set(layout.keys_grids, grids)
    out = layout.keys_trajectories
    summary = rollouts_into(grids, context.agent(config.agent), config.rollout, out, context)
    by_id = {g.grid_id: g for g in grids}
    episodes = [
        KeyEpisode(
            by_id[e.summary.grid_id],
            e.to_trajectory_data(),
            e.summary.episode,
            cast(RowCol, tuple(e.summary.final_agent_row_col)),
        )
        for e in read_episodes(out)
        # a file resumed under the same rollout config may hold episodes of grids an earlier
        # preset generated (resume goes by grid id and episode): only this set's count
        if e.summary.grid_id in by_id
    ]
    variants, jaccard = key_variant_table(episodes, config.intervals)
    payload = {
        "schema": SCHEMA,
        "horizon": k.horizon,
        "variants": variants,
        "two_path_jaccard": jaccard,
    }
    results = write_json(layout.keys_results, payload)
    return {"grids": layout.keys_grids, "trajectories": out, "results": results}, summary


STAGE = register(
    Stage(
        name="keys",
        run=run,
        writes=("key-variant grids", "key-variant trajectories", "key-variant results"),
        section="keys",
        uses=("agent",),
        derived=_received,
        generates=True,
        seconds=55,
    )
)
