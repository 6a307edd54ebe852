"""False-belief grids: the prompt draws a grid that differs from the true one in known cells.

The prompt shows :attr:`Grid.shown` (the *oracle belief*) while the episode runs on the true
grid. Three kinds, each with a matched control (the same true grid, shown as it is), all with
disjoint shown-optimal and true-optimal first actions: ``phantom_wall`` (walls drawn on the
cells the true optimal first moves enter), ``hidden_wall`` (walls drawn open where the shown
grid's optimal first moves go) and ``stale_goal`` (the goal drawn at an old cell). Every pair
records ``kind``, ``role``, ``pair_id``, ``differs`` and both optimal first actions in
``extra["false_belief"]``. Seeded; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from goalprobe.gridworld.core import Grid, RowCol, State
from goalprobe.gridworld.dynamics import step
from goalprobe.gridworld.generator import generate_grid, grid_seed
from goalprobe.gridworld.optimal import bfs_distances, solve
from goalprobe.gridworld.text import cell_types

PHANTOM_WALL = "phantom_wall"
HIDDEN_WALL = "hidden_wall"
STALE_GOAL = "stale_goal"
KINDS: tuple[str, ...] = (PHANTOM_WALL, HIDDEN_WALL, STALE_GOAL)
"""The false-belief kinds, in report order."""

FALSE_BELIEF = "false_belief"
CONTROL = "control"
ROLES: tuple[str, ...] = (FALSE_BELIEF, CONTROL)
"""A grid's role in its pair."""


@dataclass(frozen=True)
class FalseBeliefSetConfig:
    """Which false-belief pairs to generate."""

    size: int = 7
    """Grid side (odd, >= 5)."""
    density: float = 0.2
    """Obstacle density of the base grids (low: room for detours)."""
    pairs_per_kind: int = 4
    """False-belief grids per kind (each with its control)."""
    kinds: tuple[str, ...] = KINDS
    """Which kinds (see :data:`KINDS`)."""
    min_distance: int = 3
    """Minimum start-goal distance of a base grid (keeps the difference off the goal)."""
    max_tries: int = 200
    """Base grids drawn per pair before giving up."""
    seed: int = 0
    """Base seed; every pair derives its own from it, its kind and its index."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(KINDS))
        if unknown or not self.kinds:
            raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {self.kinds}")
        if self.pairs_per_kind < 1:
            raise ValueError(f"pairs_per_kind must be >= 1, got {self.pairs_per_kind}")
        if self.min_distance < 2:
            raise ValueError(f"min_distance must be >= 2, got {self.min_distance}")
        if self.max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {self.max_tries}")


def start_optimal(grid: Grid) -> frozenset:
    """The optimal first actions of ``grid`` (the true ones; use ``grid.prompt_grid`` for the
    shown ones)."""
    return solve(grid).optimal_actions(grid.initial_state)


def differing_cells(grid: Grid, state: State | None = None) -> list[RowCol]:
    """The cells whose cell type differs between the shown and the true grid in ``state``
    (default: the initial state), sorted; empty for a grid without ``shown``."""
    if grid.shown is None:
        return []
    state = grid.initial_state if state is None else state
    diff = cell_types(grid.shown, state) != cell_types(grid, state)
    return [(int(r), int(c)) for r, c in np.argwhere(diff)]


def _walled_first_moves(grid: Grid) -> Grid | None:
    """``grid`` with walls on the cells its optimal first moves enter (None when the goal is one
    of them or the walled grid is unsolvable)."""
    start = grid.initial_state
    cells = sorted({step(grid, start, a).agent for a in start_optimal(grid)})
    if grid.goal in cells:
        return None
    walls = grid.walls.copy()
    for cell in cells:
        walls[cell] = True
    walled = replace(grid, walls=walls)
    return walled if solve(walled).is_solvable else None


def _phantom(base: Grid) -> Grid | None:
    shown = _walled_first_moves(base)
    return None if shown is None else replace(base, shown=shown)


def _hidden(base: Grid) -> Grid | None:
    true = _walled_first_moves(base)
    return None if true is None else replace(true, shown=base)


def _stale(base: Grid) -> Grid | None:
    true_first = start_optimal(base)
    dist = bfs_distances(base.walls, base.goal)  # inf on walls
    reachable = np.argwhere(np.isfinite(dist)).tolist()
    candidates = [(r, c) for r, c in reachable if (r, c) not in (base.start, base.goal)]
    candidates.sort(key=lambda cell: (-dist[cell], cell))
    for old in candidates:
        shown = replace(base, goal=old)
        if not start_optimal(shown) & true_first:
            return replace(base, shown=shown)
    return None


_BUILDERS = {PHANTOM_WALL: _phantom, HIDDEN_WALL: _hidden, STALE_GOAL: _stale}


def _names(actions) -> list[str]:
    return [a.name for a in sorted(actions)]


def make_pair(base: Grid, kind: str, pair_id: str) -> tuple[Grid, Grid] | None:
    """The false-belief grid of ``kind`` built on ``base`` and its control, or None when
    ``base`` does not admit one (difference on the goal, unsolvable, no disjoint first
    actions)."""
    if kind not in _BUILDERS:
        raise ValueError(f"unknown false-belief kind {kind!r}; expected one of {KINDS}")
    grid = _BUILDERS[kind](base)
    if grid is None or grid.shown is None:
        return None
    true_first, shown_first = start_optimal(grid), start_optimal(grid.shown)
    if true_first & shown_first or not true_first or not shown_first:
        return None
    facts = {
        "kind": kind,
        "pair_id": pair_id,
        "differs": [list(c) for c in differing_cells(grid)],
        "true_optimal_start": _names(true_first),
        "shown_optimal_start": _names(shown_first),
    }
    fb = replace(
        grid,
        grid_id=f"{pair_id}-fb",
        extra={**base.extra, FALSE_BELIEF: {**facts, "role": FALSE_BELIEF}},
    )
    control = replace(
        grid,
        shown=None,
        grid_id=f"{pair_id}-ctl",
        extra={**base.extra, FALSE_BELIEF: {**facts, "role": CONTROL, "differs": []}},
    )
    return fb, control


def generate_false_belief_set(config: FalseBeliefSetConfig) -> list[Grid]:
    """``pairs_per_kind`` pairs (false-belief grid, then its control) of every kind, seeded;
    ``ValueError`` when no base grid admits a pair of some kind within ``max_tries`` draws."""
    grids: list[Grid] = []
    for kind in config.kinds:
        for index in range(config.pairs_per_kind):
            pair_id = f"fb-{kind}-n{config.size:02d}-s{config.seed}-i{index:03d}"
            seed = grid_seed(config.seed, config.size, config.density, f"fb/{kind}", index)
            rng = np.random.default_rng(seed)
            for _ in range(config.max_tries):
                base = generate_grid(
                    config.size, config.density, rng, min_distance=config.min_distance, seed=seed
                )
                pair = make_pair(base, kind, pair_id)
                if pair is not None:
                    grids.extend(pair)
                    break
            else:
                raise ValueError(
                    f"{pair_id}: no {config.size} x {config.size} grid of density "
                    f"{config.density} admitted a {kind} pair in {config.max_tries} draws"
                )
    return grids


def pair_facts(grid: Grid) -> dict | None:
    """The ``extra["false_belief"]`` record of a grid of a false-belief set (None otherwise)."""
    facts = grid.extra.get(FALSE_BELIEF)
    return facts if isinstance(facts, dict) else None


def require_pair_facts(grid: Grid) -> dict:
    """:func:`pair_facts` of a grid that must belong to a false-belief set (else ValueError)."""
    facts = pair_facts(grid)
    if facts is None:
        raise ValueError(f"grid {grid.grid_id!r} is not part of a false-belief pair")
    return facts
