"""Seeded generation of n x n grid worlds with obstacle density d (study, section 3).

One grid (``n`` odd, ``n >= 5``): (1) a perfect maze over the ``(odd, odd)`` lattice cells by
randomised depth-first search (the d = 1 grid, a spanning tree); (2) ``round((1 - d) * count)``
of the removable interior walls (not the border) opened uniformly at random (d = 0: an open
room); (3) a uniformly random pair of distinct connected open cells at distance
``>= min_distance`` as start and goal (rejection sampling, with an exhaustive fallback).

All randomness goes through ``Generator.random`` (platform-independent streams). Grid sets
derive one seed per grid from ``(config seed, size, density, variant, index)`` with
:class:`numpy.random.SeedSequence`, so adding a size or density leaves the other grids
unchanged and each grid can be regenerated alone from ``grid.seed``.
"""

from __future__ import annotations

import itertools
import math
import zlib
from dataclasses import dataclass

import numpy as np
from goalprobe.gridworld.core import LABEL_CANVAS, Grid, Variant
from goalprobe.gridworld.optimal import _bfs_flat

STUDY_SIZES: tuple[int, ...] = (7, 9, 11, 13, 15)
"""Grid sizes of the study (section 4)."""

STUDY_DENSITIES: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
"""Obstacle densities of the study (section 4)."""

_MAX_PAIR_ATTEMPTS = 64


def check_size(size: int, *, odd: bool = True) -> int:
    """Validate a grid side: an int in ``[5, LABEL_CANVAS]``, odd unless ``odd=False``;
    returns it. Larger grids are refused here, at the first verb, because every activation
    store labels states on a fixed ``LABEL_CANVAS`` x ``LABEL_CANVAS`` canvas."""
    if isinstance(size, bool) or not isinstance(size, int | np.integer):
        raise TypeError(f"grid size must be an int, got {size!r}")
    size = int(size)
    if size < 5:
        raise ValueError(f"grid size must be >= 5, got {size}")
    if size > LABEL_CANVAS:
        raise ValueError(
            f"grid size must be <= {LABEL_CANVAS} (activation stores label states on a "
            f"{LABEL_CANVAS} x {LABEL_CANVAS} canvas), got {size}"
        )
    if odd and size % 2 == 0:
        raise ValueError(f"generated grids need an odd size (maze lattice), got {size}")
    return size


def check_density(density: float) -> float:
    """Validate an obstacle density in ``[0, 1]``; returns it as a float."""
    density = float(density)
    if not 0.0 <= density <= 1.0 or math.isnan(density):
        raise ValueError(f"obstacle density must lie in [0, 1], got {density}")
    return density


def n_walls_to_remove(density: float, n_removable: int) -> int:
    """``round((1 - density) * n_removable)``, rounding half up, tolerant to float error
    (``0.49999999999999994`` rounds up)."""
    walls = (1.0 - check_density(density)) * n_removable
    return min(n_removable, math.floor(walls + 0.5 + 1e-9))


def carve_maze(
    open_flat: list[bool],
    n: int,
    rng: np.random.Generator,
    *,
    row_range: tuple[int, int] | None = None,
    col_range: tuple[int, int] | None = None,
) -> None:
    """Carve a perfect maze in place by randomised depth-first search on the odd lattice.

    ``open_flat``: ``n * n`` row-major cells, True where open, modified in place; ``rng``: one
    ``rng.random`` call of ``m`` doubles for ``m`` lattice cells; ``row_range`` / ``col_range``:
    inclusive odd lattice bounds (default ``(1, n - 2)``).
    """
    r0, r1 = row_range if row_range is not None else (1, n - 2)
    c0, c1 = col_range if col_range is not None else (1, n - 2)
    if r0 % 2 == 0 or r1 % 2 == 0 or c0 % 2 == 0 or c1 % 2 == 0 or r1 < r0 or c1 < c0:
        raise ValueError(f"lattice ranges must be odd and ordered, got {(r0, r1)}, {(c0, c1)}")
    m_rows = (r1 - r0) // 2 + 1
    m_cols = (c1 - c0) // 2 + 1
    m = m_rows * m_cols
    uniforms = rng.random(m).tolist()
    for i in range(m_rows):
        row_base = (r0 + 2 * i) * n + c0
        for j in range(m_cols):
            open_flat[row_base + 2 * j] = True
    visited = bytearray(m)
    start = min(int(uniforms[0] * m), m - 1)
    visited[start] = 1
    stack = [start]
    u = 1
    while stack:
        cur = stack[-1]
        i, j = divmod(cur, m_cols)
        options = []
        if i > 0 and not visited[cur - m_cols]:
            options.append(cur - m_cols)
        if i < m_rows - 1 and not visited[cur + m_cols]:
            options.append(cur + m_cols)
        if j > 0 and not visited[cur - 1]:
            options.append(cur - 1)
        if j < m_cols - 1 and not visited[cur + 1]:
            options.append(cur + 1)
        if not options:
            stack.pop()
            continue
        nxt = options[int(uniforms[u] * len(options))]
        u += 1
        visited[nxt] = 1
        ni, nj = divmod(nxt, m_cols)
        # the wall cell between the two lattice cells
        open_flat[(r0 + i + ni) * n + (c0 + j + nj)] = True
        stack.append(nxt)


def remove_walls(
    open_flat: list[bool],
    n: int,
    density: float,
    rng: np.random.Generator,
    *,
    protected: frozenset[int] = frozenset(),
) -> None:
    """Open ``round((1 - density) * R)`` of the ``R`` removable interior walls, in place.

    Removable: wall cells with ``1 <= row, col <= n - 2`` whose flat index is not in
    ``protected``. The chosen subset is uniform (partial Fisher-Yates driven by ``rng.random``).
    """
    candidates = [
        row * n + col
        for row in range(1, n - 1)
        for col in range(1, n - 1)
        if not open_flat[row * n + col] and row * n + col not in protected
    ]
    k = n_walls_to_remove(density, len(candidates))
    if k == 0:
        return
    uniforms = rng.random(k).tolist()
    total = len(candidates)
    for i in range(k):
        j = i + min(int(uniforms[i] * (total - i)), total - i - 1)
        candidates[i], candidates[j] = candidates[j], candidates[i]
        open_flat[candidates[i]] = True


def sample_start_goal(
    open_flat: list[bool],
    n: int,
    rng: np.random.Generator,
    *,
    min_distance: int = 1,
) -> tuple[int, int]:
    """A uniformly random ``(start, goal)`` pair of flat open cells at shortest-path distance
    ``>= min_distance`` (``>= 1``); ``ValueError`` when no pair qualifies."""
    if min_distance < 1:
        raise ValueError(f"min_distance must be >= 1, got {min_distance}")
    starts = goals = [i for i, is_open in enumerate(open_flat) if is_open]
    if not starts:
        raise ValueError("no open cell to place the start or the goal on")
    cache: dict[int, list[float]] = {}
    for _ in range(_MAX_PAIR_ATTEMPTS):
        u_goal, u_start = rng.random(2).tolist()
        goal = goals[min(int(u_goal * len(goals)), len(goals) - 1)]
        start = starts[min(int(u_start * len(starts)), len(starts) - 1)]
        if start == goal:
            continue
        if goal not in cache:
            cache[goal] = _bfs_flat(open_flat, n, goal)
        if min_distance <= cache[goal][start] < math.inf:
            return start, goal
    # exhaustive fallback: uniform over all qualifying pairs
    pairs: list[tuple[int, int]] = []
    for goal in goals:
        dist = _bfs_flat(open_flat, n, goal)
        pairs.extend(
            (start, goal)
            for start in starts
            if start != goal and min_distance <= dist[start] < math.inf
        )
    if not pairs:
        raise ValueError(f"no start/goal pair at shortest-path distance >= {min_distance}")
    return pairs[min(int(rng.random() * len(pairs)), len(pairs) - 1)]


def generate_grid(
    size: int,
    density: float,
    rng: np.random.Generator,
    *,
    min_distance: int = 1,
    grid_id: str = "",
    seed: int | None = None,
) -> Grid:
    """Generate one plain grid (module docstring) of odd side ``size >= 5`` and ``density`` in
    ``[0, 1]`` (1: a tree maze, 0: an open room); ``rng`` is the only randomness, ``seed`` the
    seed it came from (metadata, None when unknown)."""
    n = check_size(size)
    density = check_density(density)
    open_flat = [False] * (n * n)
    carve_maze(open_flat, n, rng)
    remove_walls(open_flat, n, density, rng)
    start, goal = sample_start_goal(open_flat, n, rng, min_distance=min_distance)
    walls = ~np.array(open_flat, dtype=bool).reshape(n, n)
    return Grid(
        walls=walls,
        goal=divmod(goal, n),
        start=divmod(start, n),
        variant=Variant.PLAIN,
        density=density,
        seed=seed,
        grid_id=grid_id,
    )


def grid_seed(base_seed: int, size: int, density: float, variant: str, index: int) -> int:
    """The per-grid seed of a grid set: a 53-bit int from a spawned ``SeedSequence``.

    Depends only on its arguments (the density to 1e-6), so cells of a grid set are independent.
    """
    spawn_key = (
        int(size),
        round(check_density(density) * 1_000_000),
        zlib.crc32(variant.encode()),
        int(index),
    )
    state = np.random.SeedSequence(int(base_seed), spawn_key=spawn_key).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(11))


def make_grid_id(variant: str, size: int, density: float, base_seed: int, index: int) -> str:
    """The stable id of a grid-set grid, e.g. ``plain-n07-d0.20-s0-i003``."""
    return f"{variant}-n{size:02d}-d{density:.2f}-s{base_seed}-i{index:03d}"


@dataclass(frozen=True)
class GridSetConfig:
    """Which grids a grid set holds (study, section 4: 5 sizes x 6 densities x 10 grids)."""

    sizes: tuple[int, ...] = STUDY_SIZES
    """Grid sides (odd, ``>= 5``)."""

    densities: tuple[float, ...] = STUDY_DENSITIES
    """Obstacle densities in ``[0, 1]``."""

    n_per_cell: int = 10
    """Number of grids per (size, density) cell."""

    variant: str = Variant.PLAIN
    """Grid variant (:class:`~goalprobe.gridworld.core.Variant`); see
    :mod:`goalprobe.gridworld.variants` for the key variants."""

    seed: int = 0
    """Base seed; each grid's seed is derived from it and the grid's cell and index."""

    min_distance: int = 1
    """Minimum shortest-path distance between start and goal (plain grids only)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(check_size(s) for s in self.sizes))
        object.__setattr__(self, "densities", tuple(check_density(d) for d in self.densities))
        if len(set(self.sizes)) != len(self.sizes):
            raise ValueError(f"sizes repeat: {self.sizes}")
        if len({round(d * 1_000_000) for d in self.densities}) != len(self.densities):
            raise ValueError(f"densities repeat: {self.densities}")
        if self.n_per_cell < 1:
            raise ValueError(f"n_per_cell must be >= 1, got {self.n_per_cell}")
        if self.min_distance < 1:
            raise ValueError(f"min_distance must be >= 1, got {self.min_distance}")


def generate_grid_set(config: GridSetConfig) -> list[Grid]:
    """All grids of ``config``, ordered by size, then density, then index."""
    from goalprobe.gridworld.variants import FAMILY, generate_variant

    if config.variant not in FAMILY:
        raise ValueError(f"unknown variant {config.variant!r}; expected one of {tuple(FAMILY)}")
    grids = []
    cells = itertools.product(config.sizes, config.densities, range(config.n_per_cell))
    for size, density, index in cells:
        # seeded by layout family, so e.g. key_door and key_door_control share layouts
        seed = grid_seed(config.seed, size, density, FAMILY[config.variant], index)
        grid = generate_variant(
            config.variant,
            size,
            density,
            np.random.default_rng(seed),
            grid_id=make_grid_id(config.variant, size, density, config.seed, index),
            seed=seed,
            min_distance=config.min_distance,
        )
        grids.append(grid)
    return grids
