"""Stage ``behaviour``: appendix-B metrics of the main rollouts with their baselines
(``RUN/behaviour/metrics.json``, schema ``goalprobe.demo.behaviour/1``)."""

from __future__ import annotations

from pathlib import Path

from goalprobe.gridworld.behaviour import BehaviourConfig, behaviour_summary
from goalprobe.gridworld.io import read_grid_set
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Stage, register
from goalprobe.stages.rollouts import (
    behaviour_episodes,
    grid_episodes,
    read_episodes,
    truncation_counts,
)

SCHEMA = "goalprobe.demo.behaviour/1"


def run(context: StageContext, config: BehaviourConfig, stage_dir: Path):
    """Per-grid metrics, their aggregates and the random-walk baseline."""
    layout = context.layout
    grids = {g.grid_id: g for g in read_grid_set(layout.grids)}
    truncation = truncation_counts(read_episodes(layout.trajectories, truncated=True))
    kept = grid_episodes(behaviour_episodes(layout.trajectories), grids)
    payload = behaviour_summary(kept, config)
    out = write_json(
        layout.behaviour_metrics, {"schema": SCHEMA, **payload, "truncation": truncation}
    )
    overall = payload["overall"]
    return {"metrics": out}, {
        "grids": len(payload["per_grid"]),
        "accuracy": overall["accuracy"]["value"],
        "success_rate": overall["success_rate"]["value"],
        "random_walk_success_rate": overall["random_walk_success_rate"]["value"],
        "truncated_episodes": truncation["truncated_episodes"],
    }


STAGE = register(
    Stage(
        name="behaviour",
        run=run,
        reads=("grids", "rollouts"),
        writes=("behaviour metrics",),
        section="behaviour",
        control=True,
        seconds=2,
    )
)
