"""Stage ``rollouts``: the agent's sampled episodes on the main grids
(``RUN/rollouts/trajectories.jsonl``), and the helpers the other rollout stages share."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from goalprobe.agent_config import Agent, AgentConfig
from goalprobe.agents.rollout import (
    RolloutConfig,
    per_episode_scheduling,
    run_id_for,
    run_rollouts,
)
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
    """Run (or resume) rollouts into ``out``.

    A file of another run (another agent, engine or rollout config) is never deleted: it is
    moved aside to ``<stem>.<its run id>.jsonl`` and moved back when that run is asked for
    again, so switching ``--backend`` (server to local and back) keeps the server's episodes.
    A server is scheduled per episode with as many episodes in flight as it takes requests.
    """
    backend, description = agent.rollout_backend()
    run_id = run_id_for(config, description)
    aside = out.with_name(f"{out.stem}.{run_id}{out.suffix}")
    if out.exists():
        try:
            previous = read_run_header(out).run_id
        except TrajectoryFormatError:
            previous = None
        if previous != run_id:
            if previous is None:
                out.unlink()  # not a trajectory file of any run: nothing to keep
            else:
                out.replace(out.with_name(f"{out.stem}.{previous}{out.suffix}"))
    if not out.exists() and aside.exists():
        aside.replace(out)
    if per_episode_scheduling(backend):
        server = backend.config
        in_flight = server.max_concurrency * len(server.base_urls)
        config = dataclasses.replace(config, batch_size=max(config.batch_size, in_flight))
    report = run_rollouts(
        grids, backend, config, out, progress=context.progress, backend_description=description
    )
    summary = {
        "run_id": report.run_id,
        "episodes": report.episodes_total,
        "episodes_resumed": report.episodes_skipped,
        "steps_now": report.steps,
        "invalid_steps_now": report.invalid_steps,
    }
    if report.retokenized_steps:
        summary["retokenized_steps_now"] = report.retokenized_steps
    return summary


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
