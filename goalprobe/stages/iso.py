"""Stage ``iso``: rollouts on iso-difficulty transforms of the main grids and the paired tests
of Table 3 (``RUN/iso/``, schema ``goalprobe.demo.iso/1``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from goalprobe.gridworld.behaviour import grid_rows, iso_tests
from goalprobe.gridworld.io import read_grid_set, write_grid_set
from goalprobe.gridworld.variants import apply_transform
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Settings, Stage, register
from goalprobe.stages.rollouts import grid_episodes, read_episodes, rollouts_into

SCHEMA = "goalprobe.demo.iso/1"


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Transform the base grids, run the agent on them, and test each transform."""
    layout = context.layout
    main = {g.grid_id: g for g in read_grid_set(layout.grids)}
    base = list(main.values())
    if config.iso.base_grids and config.iso.base_grids < len(base):
        picks = np.linspace(0, len(base) - 1, config.iso.base_grids).round().astype(int)
        base = [base[i] for i in sorted(set(picks.tolist()))]
    transformed = [apply_transform(g, t).grid for t in config.iso.transforms for g in base]
    write_grid_set(layout.iso_grids, transformed)
    out = layout.iso_trajectories
    rollout = config.rollout
    if config.iso.episodes_per_grid:
        rollout = replace(rollout, episodes_per_grid=config.iso.episodes_per_grid)
    summary = rollouts_into(transformed, context.agent(config.agent), rollout, out, context)

    all_grids = {**main, **{g.grid_id: g for g in transformed}}
    base_ids = {g.grid_id for g in base}
    base_episodes = [e for e in read_episodes(layout.trajectories) if e.summary.grid_id in base_ids]
    base_rows = {
        r["grid_id"]: r
        for r in grid_rows(grid_episodes(base_episodes, all_grids), config.behaviour)
    }
    # only this set's transforms: a file resumed under the same rollout config may hold the
    # episodes of transforms an earlier preset ran (resume goes by grid id and episode)
    ours = [e for e in read_episodes(out) if e.summary.grid_id in all_grids]
    trans_rows = grid_rows(grid_episodes(ours, all_grids), config.behaviour)
    by_transform = {
        name: {
            all_grids[r["grid_id"]].extra["source_grid_id"]: r
            for r in trans_rows
            if r["grid_id"].endswith(f"~{name}")
        }
        for name in config.iso.transforms
    }
    payload = {
        "schema": SCHEMA,
        "base_grids": sorted(base_ids),
        "transforms": list(config.iso.transforms),
        "equivalence_margin": config.iso.equivalence_margin,
        "tests": iso_tests(
            base_rows, by_transform, config.behaviour, margin=config.iso.equivalence_margin
        ),
        "per_grid": trans_rows,
    }
    results = write_json(layout.iso_results, payload)
    summary["pairs"] = len(base) * len(config.iso.transforms)
    return {"grids": layout.iso_grids, "trajectories": out, "results": results}, summary


STAGE = register(
    Stage(
        name="iso",
        run=run,
        reads=("grids", "rollouts"),
        writes=("iso-difficulty grids", "iso-difficulty trajectories", "iso-difficulty results"),
        section="iso",
        uses=("agent", "behaviour"),
        derived=lambda c: {"rollout": c.rollouts},
        generates=True,
        seconds=65,
    )
)
