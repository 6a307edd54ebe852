"""Stage ``rollouts``: the agent's sampled episodes on the main grids
(``RUN/rollouts/trajectories.jsonl``), and the helpers the other rollout stages share."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from goalprobe.agents.agent_config import Agent
from goalprobe.agents.bundled import is_bundled
from goalprobe.agents.preflight import PreflightReport, run_preflight
from goalprobe.agents.rollout import RolloutConfig, per_episode_scheduling, run_id_for, run_rollouts
from goalprobe.agents.trajectories import (
    Episode,
    TrajectoryFormatError,
    read_run_header,
    read_trajectories,
)
from goalprobe.gridworld.behaviour import GridEpisodes
from goalprobe.gridworld.core import Grid
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import read_grid_set
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Settings, Stage, register


def section_rollout(config, section: str, **changes) -> dict:
    """``{"rollout": ...}``: the demo's rollout settings with the episode count of its section
    ``section`` (and ``changes``), for a stage's ``derived`` values."""
    episodes = getattr(config, section).episodes_per_grid
    return {"rollout": dataclasses.replace(config.rollouts, episodes_per_grid=episodes, **changes)}


def variant_grids(
    variants: Sequence[str], sizes: tuple[int, ...], density: float, count: int, seed: int
) -> list[Grid]:
    """The grid sets of each of ``variants`` in turn (``count`` grids per size, one seed)."""
    return [
        g
        for variant in variants
        for g in generate_grid_set(GridSetConfig(sizes, (density,), count, variant, seed))
    ]


def run(context: StageContext, config: Settings, stage_dir: Path):
    """Run (or resume) the episodes of every main grid; a fresh run of a model other than the
    bundled ones starts with the pre-flight (``stage_dir/preflight.json``), which refuses a
    budget that cuts more than ``preflight.max_truncated`` of its steps."""
    out = context.layout.trajectories
    grids = list(read_grid_set(context.layout.grids))
    agent = context.agent(config.agent)
    checked = preflight_into(grids, agent, config, stage_dir, context)
    summary = rollouts_into(grids, agent, config.rollout, out, context)
    if checked is not None:
        summary["preflight"] = checked.to_dict()
    episodes = read_episodes(out, truncated=True)
    finished = [e for e in episodes if not e.truncated]
    summary["success_rate"] = (
        float(np.mean([e.summary.success for e in finished])) if finished else None
    )
    summary["truncated_episodes"] = len(episodes) - len(finished)
    summary["steps"] = int(sum(e.summary.length for e in episodes))
    return {"trajectories": out}, summary


def preflight_into(
    grids: Sequence[Grid], agent: Agent, config: Settings, stage_dir: Path, context: StageContext
) -> PreflightReport | None:
    """Run the pre-flight when it applies (a model other than the bundled ones, steps > 0, and
    no episode of this run finished yet); write it to ``stage_dir/preflight.json`` and raise
    :class:`~goalprobe.agents.preflight.PreflightRefused` when it refuses."""
    if is_bundled(config.agent.model) or config.preflight.steps < 1:
        return None
    backend, description = agent.rollout_backend()
    if _run_id_of(context.layout.trajectories) == run_id_for(config.rollout, description):
        return None  # resuming a run that already passed its pre-flight
    report = run_preflight(grids, backend, config.rollout, config.preflight)
    write_json(stage_dir / "preflight.json", report.to_dict())
    if context.say is not None:
        context.say(report.describe())
    report.check(config.preflight)
    return report


def rollouts_into(
    grids: Sequence[Grid], agent: Agent, config: RolloutConfig, out: Path, context: StageContext
) -> dict:
    """Run (or resume) rollouts into ``out``. A file of another run is moved aside to
    ``<stem>.<its run id>.jsonl`` (never deleted) and moved back when that run is asked for
    again; a server is scheduled per episode, as many in flight as it takes requests."""
    backend, description = agent.rollout_backend()
    run_id = run_id_for(config, description)
    aside = out.with_name(f"{out.stem}.{run_id}{out.suffix}")
    previous = _run_id_of(out)
    if out.exists() and previous != run_id:
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
        "truncated_episodes_now": report.truncated_episodes,
    }
    if report.retokenized_steps:
        summary["retokenized_steps_now"] = report.retokenized_steps
    if report.batch is not None:  # lockstep generation: the batch used, halved on OOM
        summary["generation_batch"] = report.batch
    return summary


def _run_id_of(path: Path) -> str | None:
    """The run id of the trajectory file at ``path`` (None: no file, or not a trajectory file)."""
    if not path.exists():
        return None
    try:
        return read_run_header(path).run_id
    except TrajectoryFormatError:
        return None


def read_episodes(path: Path, *, truncated: bool = False) -> list[Episode]:
    """The finished episodes of a trajectory file, in file order: by default only those that
    hold behaviour (a truncated episode ended on a generation cut off by the token limit, not
    on the agent's choice; ``truncated=True`` keeps them, e.g. to count them)."""
    return [e for e in read_trajectories(path) if truncated or not e.truncated]


def grid_episodes(episodes: Iterable[Episode], grids: Mapping[str, Grid]) -> list[GridEpisodes]:
    """Episodes grouped by grid (in order of first appearance) as the behaviour library's input,
    truncated episodes (cut off by the token limit: not the agent's choice) left out, and grids
    with no other. ``ValueError``: a grid ``grids`` lacks, or one grid with two horizons."""
    by_grid: dict[str, list[Episode]] = {}
    for episode in (e for e in episodes if not e.truncated):
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


def behaviour_episodes(path: Path) -> list[Episode]:
    """The episodes of ``path`` that hold behaviour (``ValueError`` naming the budget to raise
    when every one was truncated)."""
    episodes = read_episodes(path, truncated=True)
    kept = [e for e in episodes if not e.truncated]
    if episodes and not kept:
        raise ValueError(
            f"all {len(episodes)} episodes of {path.name} were cut off by the token limit "
            "(truncated); behaviour needs finished episodes: raise rollouts.max_new_tokens"
        )
    return kept


def truncation_counts(episodes: Sequence[Episode]) -> dict:
    """How many episodes and steps were cut off by the token limit, reported beside (never
    inside) the behaviour metrics."""
    truncated = [e for e in episodes if e.truncated]
    return {
        "episodes": len(episodes),
        "truncated_episodes": len(truncated),
        "truncated_fraction": len(truncated) / len(episodes) if episodes else None,
        "steps_before_truncation": int(sum(e.summary.length - 1 for e in truncated)),
        "excluded": "truncated episodes count toward neither success nor optimality",
    }


STAGE = register(
    Stage(
        name="rollouts",
        run=run,
        reads=("grids",),
        writes=("trajectories",),
        uses=("agent", "preflight"),
        derived=lambda c: {"rollout": c.rollouts},
        generates=True,
        control=True,
        seconds=110,
    )
)
