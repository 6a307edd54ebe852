"""Iso-difficulty transforms (study, section 4.2 and appendix D).

Each returns a :class:`Transformed`: the new grid and the maps of actions and cells. Geometric
transforms (``reflect``, ``reflect_vertical``, ``rotate90``, ``transpose``) preserve size,
density, shortest path length and the whole optimal policy under the maps.
``start_goal_swap`` keeps every cell in place and preserves size, density and ``L``; optimal
paths reverse. It is refused on grids with a door.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from goalprobe.gridworld.core import Action, Grid, RowCol, State


@dataclass(frozen=True)
class Transformed:
    """A transformed grid and how to carry states and actions over to it."""

    grid: Grid
    """The transformed grid (id ``<original id>~<name>``; ``extra`` records the chain of transforms
    and the source grid id)."""
    action_map: dict[Action, Action]
    """Original action -> the action doing the same on the new grid."""
    name: str
    """The transform's name."""
    cell_map: Callable[[RowCol], RowCol]
    """Original ``(row, col)`` -> new ``(row, col)``."""

    def map_state(self, state: State) -> State:
        """The state of the new grid corresponding to ``state`` (cell mapped, flags kept)."""
        return State(
            agent=self.cell_map(state.agent), has_key=state.has_key, door_open=state.door_open
        )

    def map_actions(self, actions: frozenset[Action]) -> frozenset[Action]:
        """The image of a set of actions."""
        return frozenset(self.action_map[a] for a in actions)


def _derive_action_map(cell_map: Callable[[RowCol], RowCol]) -> dict[Action, Action]:
    by_delta = {a.delta_row_col: a for a in Action}
    r0, c0 = cell_map((2, 2))
    moved = {a: cell_map((2 + a.delta_row_col[0], 2 + a.delta_row_col[1])) for a in Action}
    return {a: by_delta[(r - r0, c - c0)] for a, (r, c) in moved.items()}


def _derived_grid(grid: Grid, name: str, **changes) -> Grid:
    extra = dict(grid.extra)
    extra["transforms"] = [*grid.extra.get("transforms", []), name]
    extra["source_grid_id"] = grid.extra.get("source_grid_id", grid.grid_id)
    grid_id = f"{grid.grid_id}~{name}" if grid.grid_id else ""
    return replace(grid, grid_id=grid_id, extra=extra, **changes)


def _geometric(
    grid: Grid, name: str, walls: np.ndarray, cell_map: Callable[[RowCol], RowCol]
) -> Transformed:
    new = _derived_grid(
        grid,
        name,
        walls=walls,
        start=cell_map(grid.start),
        goal=cell_map(grid.goal),
        key=None if grid.key is None else cell_map(grid.key),
        door=None if grid.door is None else cell_map(grid.door),
    )
    return Transformed(new, _derive_action_map(cell_map), name, cell_map)


def reflect(grid: Grid) -> Transformed:
    """Mirror left-right: ``(row, col) -> (row, n - 1 - col)``; LEFT and RIGHT swap."""
    n = grid.size
    return _geometric(grid, "reflect", grid.walls[:, ::-1], lambda rc: (rc[0], n - 1 - rc[1]))


def reflect_vertical(grid: Grid) -> Transformed:
    """Mirror top-bottom: ``(row, col) -> (n - 1 - row, col)``; UP and DOWN swap."""
    n = grid.size
    return _geometric(
        grid, "reflect_vertical", grid.walls[::-1, :], lambda rc: (n - 1 - rc[0], rc[1])
    )


def rotate90(grid: Grid, quarter_turns: int = 1) -> Transformed:
    """Rotate clockwise by ``quarter_turns * 90`` degrees: one turn maps
    ``(row, col) -> (col, n - 1 - row)`` and UP -> RIGHT -> DOWN -> LEFT -> UP."""
    n = grid.size
    k = quarter_turns % 4

    def cell_map(rc: RowCol) -> RowCol:
        row, col = rc
        for _ in range(k):
            row, col = col, n - 1 - row
        return (row, col)

    name = "rotate90" if k == 1 else f"rotate{90 * k}"
    return _geometric(grid, name, np.rot90(grid.walls, k=-k), cell_map)


def transpose(grid: Grid) -> Transformed:
    """Transpose: ``(row, col) -> (col, row)``; UP <-> LEFT and DOWN <-> RIGHT."""
    return _geometric(grid, "transpose", grid.walls.T, lambda rc: (rc[1], rc[0]))


def start_goal_swap(grid: Grid) -> Transformed:
    """Exchange start and goal (identity cell and action maps; see the module docstring)."""
    if grid.door is not None:
        raise ValueError(
            f"grid {grid.grid_id or '<unnamed>'}: start/goal swap is not iso-difficulty with a "
            "door (the agent would start behind it, cut off from the key)"
        )
    if grid.key is not None and grid.key == grid.goal:
        raise ValueError("the key lies on the goal")
    new = _derived_grid(grid, "start_goal_swap", start=grid.goal, goal=grid.start)
    return Transformed(new, {a: a for a in Action}, "start_goal_swap", lambda rc: rc)


STUDY_TRANSFORMS: dict[str, Callable[[Grid], Transformed]] = {
    "reflect": reflect,
    "rotate90": rotate90,
    "start_goal_swap": start_goal_swap,
    "transpose": transpose,
}
"""The four transforms of the study (ReflectEnv, RotateEnv, StartGoalSwap, TransposeEnv)."""

TRANSFORMS: dict[str, Callable[[Grid], Transformed]] = {
    **STUDY_TRANSFORMS,
    "reflect_vertical": reflect_vertical,
}
"""Every transform by name."""


def apply_transform(grid: Grid, name: str) -> Transformed:
    """Apply the transform called ``name`` (a key of :data:`TRANSFORMS`)."""
    try:
        transform = TRANSFORMS[name]
    except KeyError as err:
        raise ValueError(
            f"unknown transform {name!r}; expected one of {sorted(TRANSFORMS)}"
        ) from err
    return transform(grid)
