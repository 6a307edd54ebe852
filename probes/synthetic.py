"""Synthetic activations with a planted cognitive map, for sanity checks, tests and benchmarks.

Each grid has random walls (or a given layout), a goal and several steps (agent cells reachable
from the goal); a step's activation is Gaussian noise plus a random linear image of its latent
state (one-hot walls, agent, goal, grid size, distance to the goal). A working probe recovers
the map; on shuffled labels it must not. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.gridworld.optimal import bfs_distances


@dataclass(frozen=True)
class Layout:
    """One given grid of :func:`planted_cell_data`: ``(n, n)`` bool walls, the (open) goal cell
    and the density it was generated with (metadata)."""

    walls: np.ndarray
    goal: tuple[int, int]
    density: float


@dataclass(frozen=True)
class PlantedCellData:
    """A synthetic probing data set, row ``i`` one step of one grid: ``acts (N, n_anchors,
    d_model)`` and the labels an activation store holds (``labels``: ``(N, S, S)`` uint8
    ``CellType`` maps, ``PADDING`` outside the grid)."""

    acts: np.ndarray
    labels: np.ndarray
    grid_ids: np.ndarray
    grid_sizes: np.ndarray
    densities: np.ndarray
    agent_row_col: np.ndarray
    goal_row_col: np.ndarray
    goal_distance: np.ndarray


def planted_cell_data(
    n_grids: int,
    *,
    steps_per_grid: int = 4,
    sizes: tuple[int, ...] = (5, 7),
    canvas: int | None = None,
    densities: tuple[float, ...] = (0.0, 0.2, 0.4),
    d_model: int = 64,
    n_anchors: int = 3,
    signal: float = 1.0,
    wall_signal: float | None = None,
    dtype: type = np.float32,
    chunk_rows: int = 4096,
    random_state: int = 0,
    layouts: Sequence[Layout] | None = None,
) -> PlantedCellData:
    """Draw a synthetic data set with a planted, linearly embedded cognitive map.

    ``n_grids * steps_per_grid`` rows, sizes and densities drawn uniformly, on a canvas of side
    ``canvas`` (default ``max(sizes)``). ``signal``: the planted signal's scale against unit
    noise; ``wall_signal``: the wall cells' alone (default ``signal``; 0: no wall map);
    ``chunk_rows``: rows embedded at a time. ``layouts``: one :class:`Layout` per grid instead
    of random walls, goals and densities (the agents' cells are still drawn among the cells
    reachable from the goal).
    """
    side = max(sizes) if canvas is None else canvas
    if max(sizes) > side:
        raise ValueError(f"grid size {max(sizes)} exceeds the canvas {side}")
    if layouts is not None and len(layouts) != n_grids:
        raise ValueError(f"{len(layouts)} layouts for {n_grids} grids")
    if layouts is not None and any(lay.walls.shape[0] not in sizes for lay in layouts):
        raise ValueError(f"a layout's side is not among sizes={sizes}")
    rng = np.random.default_rng(random_state)
    n_rows = n_grids * steps_per_grid
    labels = np.full((n_rows, side, side), CellType.PADDING, dtype=np.uint8)
    grid_sizes = np.empty(n_rows, dtype=np.int64)
    grid_density = np.empty(n_rows, dtype=np.float64)
    agent = np.empty((n_rows, 2), dtype=np.int64)
    goal = np.empty((n_rows, 2), dtype=np.int64)
    distance = np.empty(n_rows, dtype=np.float32)
    for g in range(n_grids):
        if layouts is None:
            n = int(rng.choice(sizes))
            density = float(rng.choice(densities))
            walls = rng.random((n, n)) < density
            goal_rc = (int(rng.integers(n)), int(rng.integers(n)))
        else:
            walls = np.array(layouts[g].walls, dtype=bool)
            n, density = walls.shape[0], float(layouts[g].density)
            goal_rc = (int(layouts[g].goal[0]), int(layouts[g].goal[1]))
        walls[goal_rc] = False
        dist = bfs_distances(walls, goal_rc)
        reachable = np.argwhere(np.isfinite(dist) & (dist > 0))
        if len(reachable) == 0:  # goal walled in: drop the walls of this grid
            walls[:] = False
            dist = bfs_distances(walls, goal_rc)
            reachable = np.argwhere(np.isfinite(dist) & (dist > 0))
        rows = slice(g * steps_per_grid, (g + 1) * steps_per_grid)
        picks = reachable[rng.integers(len(reachable), size=steps_per_grid)]
        base = np.where(walls, CellType.WALL, CellType.OPEN).astype(np.uint8)
        base[goal_rc] = CellType.GOAL
        labels[rows, :n, :n] = base
        labels[np.arange(rows.start, rows.stop), picks[:, 0], picks[:, 1]] = CellType.AGENT
        grid_sizes[rows] = n
        grid_density[rows] = density
        agent[rows] = picks
        goal[rows] = goal_rc
        distance[rows] = dist[picks[:, 0], picks[:, 1]]
    grid_ids = np.repeat(np.array([f"g{g:06d}" for g in range(n_grids)]), steps_per_grid)

    cells = side * side
    size_codes = np.searchsorted(np.asarray(sorted(sizes)), grid_sizes)
    n_latent = 3 * cells + len(sizes) + 1
    n_features = n_anchors * d_model
    active = 3.0 + np.mean(labels == CellType.WALL) * cells
    directions = rng.standard_normal((n_latent, n_features), dtype=np.float32)
    directions *= signal / np.sqrt(active)
    if wall_signal is not None:
        directions[:cells] *= wall_signal / signal if signal else 0.0
        if not signal:
            noise = rng.standard_normal((cells, n_features), dtype=np.float32)
            directions[:cells] = wall_signal / np.sqrt(active) * noise
    dist_scaled = (distance - distance.mean()) / max(float(distance.std()), 1.0)
    acts: np.ndarray = np.empty((n_rows, n_features), dtype=dtype)
    for start in range(0, n_rows, chunk_rows):
        stop = min(start + chunk_rows, n_rows)
        m = stop - start
        latent = np.zeros((m, n_latent), dtype=np.float32)
        flat = labels[start:stop].reshape(m, cells)
        latent[:, :cells] = flat == CellType.WALL
        latent[np.arange(m), cells + agent[start:stop, 0] * side + agent[start:stop, 1]] = 1.0
        latent[np.arange(m), 2 * cells + goal[start:stop, 0] * side + goal[start:stop, 1]] = 1.0
        latent[np.arange(m), 3 * cells + size_codes[start:stop]] = 1.0
        latent[:, -1] = dist_scaled[start:stop]
        block = rng.standard_normal((m, n_features), dtype=np.float32)
        block += latent @ directions
        acts[start:stop] = block
    acts = acts.reshape(n_rows, n_anchors, d_model)
    return PlantedCellData(acts, labels, grid_ids, grid_sizes, grid_density, agent, goal, distance)
