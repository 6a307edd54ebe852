"""Stage ``rollouts``: the agent's sampled episodes on the main grids
(``RUN/rollouts/trajectories.jsonl``), and the helpers the other rollout stages share."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from goalprobe.agent_config import Agent, AgentConfig
from goalprobe.agents.rollout import RolloutConfig, run_id_for, run_rollouts
from goalprobe.agents.trajectories import (
    Episode,
    TrajectoryFormatError,
    read_run_header,
    read_trajectories,
)
from goalprobe.config import DemoConfig
from goalprobe.gridworld.behaviour import GridEpisodes
from goalprobe.gridworld.core import Grid
from goalprobe.gridworld.io import read_grid_set
from goalprobe.stages.context import StageContext


@dataclass(frozen=True)
class RolloutsInput:
    """What the stage receives."""

    agent: AgentConfig
    """The agent."""
    rollout: RolloutConfig
    """How episodes run."""


def inputs(config: DemoConfig) -> RolloutsInput:
    """The agent and the rollout settings."""
    return RolloutsInput(config.agent, config.rollouts)


def run(context: StageContext, config: RolloutsInput, stage_dir: Path):
    """Run (or resume) the episodes of every main grid."""
    out = context.layout.trajectories
    grids = list(read_grid_set(context.layout.grids))
    summary = rollouts_into(grids, context.agent(config.agent), config.rollout, out, context)
    episodes = read_episodes(out)
    summary["success_rate"] = float(np.mean([e.summary.success for e in episodes]))
    summary["steps"] = int(sum(e.summary.length for e in episodes))
    return {"trajectories": out}, summary


def rollouts_into(
    grids: Sequence[Grid], agent: Agent, config: RolloutConfig, out: Path, context: StageContext
) -> dict:
    """Run (or resume) rollouts into ``out``; a file of another run id is replaced."""
    backend, description = agent.rollout_backend()
    if out.exists():
        try:
            stale = read_run_header(out).run_id != run_id_for(config, description)
        except TrajectoryFormatError:
            stale = True
        if stale:
            out.unlink()
    report = run_rollouts(
        grids, backend, config, out, progress=context.progress, backend_description=description
    )
    return {
        "run_id": report.run_id,
        "episodes": report.episodes_total,
        "episodes_resumed": report.episodes_skipped,
        "steps_now": report.steps,
        "invalid_steps_now": report.invalid_steps,
    }


def read_episodes(path: Path) -> list[Episode]:
    """Every finished episode of a trajectory file, in file order."""
    return list(read_trajectories(path))


def grid_episodes(episodes: Iterable[Episode], grids: Mapping[str, Grid]) -> list[GridEpisodes]:
    """Episodes grouped by grid (in order of first appearance) as the behaviour library's input.

    Raises:
        ValueError: an episode on a grid that ``grids`` lacks, or episodes of one grid with
            different horizons.
    """
    by_grid: dict[str, list[Episode]] = {}
    for episode in episodes:
        by_grid.setdefault(episode.summary.grid_id, []).append(episode)
    out = []
    for grid_id, eps in by_grid.items():
        if grid_id not in grids:
            raise ValueError(f"episodes on grid {grid_id!r}, which the grid set does not hold")
        horizons = {e.summary.horizon for e in eps}
        if len(horizons) != 1:
            raise ValueError(f"episodes on grid {grid_id!r} ran under horizons {sorted(horizons)}")
        out.append(
            GridEpisodes(grids[grid_id], horizons.pop(), tuple(e.to_trajectory_data() for e in eps))
        )
    return out
