"""Grid variants with instrumental and implicit goals (study, section 4.3), with matched controls.

Every variant of a family generated from the same random stream shares walls, start and goal,
so a variant and its control differ only in the key (and door).

**Key-door family.** A full wall line splits the interior into two mazes (density as in
:mod:`goalprobe.gridworld.generator`); one cell of the line is the door; start and key lie on
the agent's side, the goal on the other. ``key_door``: the door is locked (the key is
instrumental); ``key_no_door``: the door is open (the key is useless, an implicit goal);
``key_door_control``: door open, no key.

**Two-path family.** A rectangle with an open perimeter and walled interior, start and goal at
opposite corners: exactly two shortest paths of equal length. ``two_path_key`` puts a useless
key on one of them; ``two_path_no_key`` is the same grid without it.

Layouts are built in one orientation, then rotated by a random number of quarter turns.

**Iso-difficulty transforms** (study, section 4.2 and appendix D) each return a
:class:`Transformed`: the new grid and the maps of actions and cells. Geometric transforms
(``reflect``, ``reflect_vertical``, ``rotate90``, ``transpose``) preserve size, density, shortest
path length and the whole optimal policy under the maps. ``start_goal_swap`` keeps every cell in
place and preserves size, density and ``L``; optimal paths reverse. It is refused on grids with a
door.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from goalprobe.gridworld.core import Action, Grid, RowCol, Variant
from goalprobe.gridworld.generator import (
    carve_maze,
    check_density,
    check_size,
    generate_grid,
    remove_walls,
)
from goalprobe.gridworld.optimal import _bfs_flat

FAMILY: dict[str, str] = {
    Variant.PLAIN: Variant.PLAIN,
    Variant.KEY_DOOR: Variant.KEY_DOOR,
    Variant.KEY_NO_DOOR: Variant.KEY_DOOR,
    Variant.KEY_DOOR_CONTROL: Variant.KEY_DOOR,
    Variant.TWO_PATH_KEY: Variant.TWO_PATH_KEY,
    Variant.TWO_PATH_NO_KEY: Variant.TWO_PATH_KEY,
}
"""Layout family of each variant; grid sets seed by family, so matched variants share layouts."""

VARIANTS: tuple[str, ...] = tuple(FAMILY)
"""Every variant name."""


@dataclass(frozen=True)
class KeyDoorFamily:
    """Matched grids of one key-door layout."""

    key_door: Grid
    """Locked door between agent and goal, key on the agent's side."""
    key_no_door: Grid
    """The same with the door cell open (the key is useless)."""
    control: Grid
    """The same with the door cell open and no key."""


@dataclass(frozen=True)
class TwoPathFamily:
    """Matched grids of one two-path layout."""

    with_key: Grid
    """Two equally short paths, a useless key on one of them."""
    control: Grid
    """The same grid without the key."""
    key_path_cells: tuple[tuple[int, int], ...]
    """The cells of the shortest path holding the key, start to goal."""
    other_path_cells: tuple[tuple[int, int], ...]
    """The cells of the other shortest path, start to goal."""


def _pick(items: list, u: float):
    return items[min(int(u * len(items)), len(items) - 1)]


def _rotate_all(grids: list[Grid], quarter_turns: int) -> list[Grid]:
    if quarter_turns % 4 == 0:
        return grids
    out = []
    for grid in grids:
        turned = rotate90(grid, quarter_turns).grid
        out.append(replace(turned, grid_id=grid.grid_id, extra=dict(grid.extra)))
    return out


def generate_key_door_family(
    size: int,
    density: float,
    rng: np.random.Generator,
    *,
    grid_id: str = "",
    seed: int | None = None,
) -> KeyDoorFamily:
    """Generate one key-door layout and its three variants (module docstring): side ``size``
    (odd, ``>= 5``), ``density`` of each side's maze, ``rng`` the only randomness; the variants
    share ``grid_id`` (their variant is in ``grid.variant``) and record ``seed``."""
    n = check_size(size)
    density = check_density(density)
    u = rng.random(3).tolist()
    separator = 2 * (1 + min(int(u[0] * ((n - 3) // 2)), (n - 3) // 2 - 1))  # even, 2..n-3
    door_col = 2 * min(int(u[1] * ((n - 1) // 2)), (n - 1) // 2 - 1) + 1  # odd, 1..n-2
    quarter_turns = min(int(u[2] * 4), 3)
    open_flat = [False] * (n * n)
    carve_maze(open_flat, n, rng, row_range=(1, separator - 1), col_range=(1, n - 2))
    carve_maze(open_flat, n, rng, row_range=(separator + 1, n - 2), col_range=(1, n - 2))
    protected = frozenset(separator * n + col for col in range(n))
    remove_walls(open_flat, n, density, rng, protected=protected)
    door = separator * n + door_col
    agent_dist = _bfs_flat(open_flat, n, (separator - 1) * n + door_col)
    goal_dist = _bfs_flat(open_flat, n, (separator + 1) * n + door_col)
    agent_side = [i for i, d in enumerate(agent_dist) if d < np.inf]
    goal_side = [i for i, d in enumerate(goal_dist) if d < np.inf]
    u_start, u_key, u_goal = rng.random(3).tolist()
    start = _pick(agent_side, u_start)
    key = _pick([c for c in agent_side if c != start], u_key)
    goal = _pick(goal_side, u_goal)
    open_flat[door] = True
    walls = ~np.array(open_flat, dtype=bool).reshape(n, n)
    common: dict[str, Any] = dict(
        walls=walls, start=divmod(start, n), goal=divmod(goal, n), density=density
    )
    common.update(seed=seed, grid_id=grid_id)
    grids = [
        Grid(key=divmod(key, n), door=divmod(door, n), variant=Variant.KEY_DOOR, **common),
        Grid(key=divmod(key, n), variant=Variant.KEY_NO_DOOR, **common),
        Grid(variant=Variant.KEY_DOOR_CONTROL, **common),
    ]
    return KeyDoorFamily(*_rotate_all(grids, quarter_turns))


def generate_two_path_family(
    size: int,
    density: float,
    rng: np.random.Generator,
    *,
    grid_id: str = "",
    seed: int | None = None,
) -> TwoPathFamily:
    """Generate one two-path layout with the key on one path, and its no-key control (arguments
    as :func:`generate_key_door_family`; ``density`` of the maze around the rectangle)."""
    n = check_size(size)
    density = check_density(density)
    base = generate_grid(n, density, rng)
    open_flat = (~base.walls).ravel().tolist()
    spans = list(range(2, n - 2, 2))  # even side lengths 2..n-3
    u = rng.random(6).tolist()
    height, width = _pick(spans, u[0]), _pick(spans, u[1])
    top = _pick(list(range(1, n - 1 - height, 2)), u[2])
    left = _pick(list(range(1, n - 1 - width, 2)), u[3])
    bottom, right = top + height, left + width
    for row in range(top, bottom + 1):
        for col in range(left, right + 1):
            on_ring = row in (top, bottom) or col in (left, right)
            open_flat[row * n + col] = on_ring
    # start top-left, goal bottom-right; path A: along the top then down; path B: down then along
    path_a = [(top, c) for c in range(left, right + 1)] + [
        (r, right) for r in range(top + 1, bottom + 1)
    ]
    path_b = [(r, left) for r in range(top, bottom + 1)] + [
        (bottom, c) for c in range(left + 1, right + 1)
    ]
    key_on_a = u[4] < 0.5
    key_path, other_path = (path_a, path_b) if key_on_a else (path_b, path_a)
    key = _pick(key_path[1:-1], u[5])
    quarter_turns = min(int(rng.random() * 4), 3)
    walls = ~np.array(open_flat, dtype=bool).reshape(n, n)
    common: dict[str, Any] = dict(
        walls=walls, start=(top, left), goal=(bottom, right), density=density
    )
    common.update(seed=seed, grid_id=grid_id)
    grids = [
        Grid(key=key, variant=Variant.TWO_PATH_KEY, **common),
        Grid(variant=Variant.TWO_PATH_NO_KEY, **common),
    ]
    with_key, control = _rotate_all(grids, quarter_turns)
    turn = rotate90(grids[0], quarter_turns).cell_map
    return TwoPathFamily(
        with_key=with_key,
        control=control,
        key_path_cells=tuple(turn(c) for c in key_path),
        other_path_cells=tuple(turn(c) for c in other_path),
    )


_VARIANT_PICKERS: dict[str, Callable[..., Grid]] = {
    Variant.KEY_DOOR: lambda *a, **k: generate_key_door_family(*a, **k).key_door,
    Variant.KEY_NO_DOOR: lambda *a, **k: generate_key_door_family(*a, **k).key_no_door,
    Variant.KEY_DOOR_CONTROL: lambda *a, **k: generate_key_door_family(*a, **k).control,
    Variant.TWO_PATH_KEY: lambda *a, **k: generate_two_path_family(*a, **k).with_key,
    Variant.TWO_PATH_NO_KEY: lambda *a, **k: generate_two_path_family(*a, **k).control,
}


def generate_variant(
    variant: str,
    size: int,
    density: float,
    rng: np.random.Generator,
    *,
    grid_id: str = "",
    seed: int | None = None,
    min_distance: int = 1,
) -> Grid:
    """Generate one grid of ``variant``; the same ``rng`` state gives matched layouts across a
    family (e.g. ``key_door`` and ``key_door_control``). ``min_distance`` applies to ``plain``."""
    if variant == Variant.PLAIN:
        return generate_grid(
            size, density, rng, min_distance=min_distance, grid_id=grid_id, seed=seed
        )
    if variant not in _VARIANT_PICKERS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    return _VARIANT_PICKERS[variant](size, density, rng, grid_id=grid_id, seed=seed)


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
    if name not in TRANSFORMS:
        raise ValueError(f"unknown transform {name!r}; expected one of {sorted(TRANSFORMS)}")
    return TRANSFORMS[name](grid)
