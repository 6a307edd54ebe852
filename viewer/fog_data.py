"""The fog stage's episodes as the viewer shows them (``RUN/fog/``): per step, the true grid
and what the fogged prompt drew (hidden cells shown as padding), with the step's action against
the free-space planner on what was revealed and against the optimal policy on the true grid.
Every file is read by its owner's reader."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from goalprobe.gridworld.core import Action, CellType, Grid, RowCol, State
from goalprobe.gridworld.fog import fogged_cell_types, free_space_actions, revealed_sets
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import cell_types
from goalprobe.viewer.false_belief_data import episode_label
from goalprobe.viewer.run_files import RunFiles, read_episodes


@dataclass(frozen=True, eq=False)
class FogEpisodes:
    """The fog stage's grids and episodes (by episode key, in file order)."""

    grids: dict[str, Grid]
    episodes: dict[str, Any]

    def label(self, key: str) -> str:
        """Grid, episode, outcome and length."""
        return episode_label(self.episodes[key].summary)


@dataclass(frozen=True)
class FogStepView:
    """One step of a fogged episode: ``(n, n)`` cell types of the true grid and of what the
    prompt drew (``hidden`` cells as ``PADDING``), the action (None: invalid) against the
    free-space planner's moves on what was revealed and the optimal moves on the true grid."""

    step: int
    n_steps: int
    true_types: np.ndarray
    shown_types: np.ndarray
    hidden: tuple[RowCol, ...]
    agent: RowCol
    action: Action | None
    free_space: frozenset[Action]
    optimal: frozenset[Action]
    reasoning: str | None
    final: str | None


def read_fog_episodes(files: RunFiles) -> FogEpisodes | None:
    """The fog stage's grids and episodes (None when the stage has not run); raises as
    :func:`goalprobe.viewer.run_files.read_episodes`."""
    read = read_episodes(files, files.layout.fog_grids, files.layout.fog_trajectories, "fog")
    return None if read is None else FogEpisodes(*read)


def fog_step_view(fog: FogEpisodes, key: str, step: int) -> FogStepView:
    """The view of step ``step`` (clipped) of episode ``key`` (``KeyError`` if unknown)."""
    episode = fog.episodes[key]
    grid = fog.grids[episode.summary.grid_id]
    steps = episode.steps
    t = min(max(int(step), 0), max(len(steps) - 1, 0))
    record = steps[t]
    state = State(tuple(record.agent_row_col))
    cells = [grid.start, *(tuple(s.next_agent_row_col) for s in steps[:t])]
    revealed = revealed_sets(grid, cells)[-1]
    shown = fogged_cell_types(grid, state, revealed).astype(np.int64)
    hidden = tuple((int(r), int(c)) for r, c in np.argwhere(shown < 0))
    shown[shown < 0] = CellType.PADDING
    action = Action[record.action] if record.action else None
    return FogStepView(
        step=t,
        n_steps=len(steps),
        true_types=cell_types(grid, state).astype(np.int64),
        shown_types=shown,
        hidden=hidden,
        agent=state.agent,
        action=action,
        free_space=free_space_actions(grid, state, revealed, goal_known=False),
        optimal=solve(grid).optimal_actions(state),
        reasoning=record.reasoning,
        final=record.final,
    )
