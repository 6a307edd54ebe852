"""Exact optimal policies by breadth-first search (study, sections 3-4).

The optimal action set of a state is every action that lowers the exact BFS distance to the
goal by one (ties kept). States are ``(agent cell, has_key, door_open)``; arrays over them are
indexed ``[has_key, door_open, row, col]``: one BFS over cells without a door, a reverse BFS
over the ``4 n^2`` product states with one. Unreachable states have distance ``math.inf`` and
no optimal action; the goal has distance 0 and none either.

:class:`GridMDP` (:func:`build_mdp`) is the tabular MDP view of a grid, the input of MEG
scoring: the settled states reachable from the start, sorted by ``(has_key, door_open, row,
col)``; transitions are deterministic (one-hot rows) except that goal states are absorbing.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
from goalprobe.gridworld.core import N_ACTIONS, Action, Grid, RowCol, State
from goalprobe.gridworld.dynamics import initial_state, is_success, moves_inside, step


class UnsolvableGridError(ValueError):
    """The goal cannot be reached from the start state."""


def default_horizon(shortest_path_length: int) -> int:
    """``ceil(1.5 * L)`` computed in integers (no floating-point rounding)."""
    return (3 * int(shortest_path_length) + 1) // 2


@lru_cache(maxsize=64)
def _neighbours(n: int) -> tuple[tuple[int, ...], ...]:
    """For each flat cell index of an n x n grid, its in-bounds 4-neighbours (flat indices)."""
    return tuple(tuple(t for t in targets if t is not None) for targets in _moves(n))


@lru_cache(maxsize=64)
def _moves(n: int) -> tuple[tuple[int | None, ...], ...]:
    """For each flat cell, the flat target of each action in ``Action`` order (None: off-grid)."""
    table = []
    for row in range(n):
        for col in range(n):
            targets = {a: r * n + c for a, (r, c) in moves_inside((row, col), n)}
            table.append(tuple(targets.get(a) for a in Action))
    return tuple(table)


def _bfs_flat(open_cells: list[bool], n: int, *sources: int) -> list[float]:
    """Undirected BFS distances (flat list, ``inf`` where unreachable) to the nearest of the flat
    cells ``sources``."""
    inf = math.inf
    dist = [inf] * (n * n)
    for source in sources:
        dist[source] = 0
    nbrs = _neighbours(n)
    frontier = list(sources)
    d = 0
    while frontier:
        d += 1
        nxt = []
        for cell in frontier:
            for other in nbrs[cell]:
                if open_cells[other] and dist[other] == inf:
                    dist[other] = d
                    nxt.append(other)
        frontier = nxt
    return dist


def bfs_distances(walls: np.ndarray, *sources: RowCol) -> np.ndarray:
    """``(n, n)`` float64 shortest-path distances from the nearest of the open cells ``sources``
    to every cell of ``(n, n)`` bool ``walls``, ignoring key and door (``math.inf``: wall,
    unconnected)."""
    walls = np.asarray(walls, dtype=bool)
    n = walls.shape[0]
    for source in sources:
        if walls[source]:
            raise ValueError(f"source {source} is a wall")
    dist = _bfs_flat((~walls).ravel().tolist(), n, *(row * n + col for row, col in sources))
    return np.array(dist, dtype=np.float64).reshape(n, n)


@dataclass(frozen=True, eq=False)
class OptimalPolicy:
    """The exact optimal policy of a grid (build it with :func:`solve`)."""

    grid: Grid
    """The grid it solves."""
    distances: np.ndarray
    """``(2, 2, n, n)`` float64 indexed ``[has_key, door_open, row, col]``: the number of steps to
    the goal under optimal play, ``math.inf`` where unreachable. Read-only."""
    action_masks: np.ndarray
    """``(2, 2, n, n, 4)`` bool, True for the optimal actions (indexed by
    :class:`~goalprobe.gridworld.core.Action`). Read-only."""

    def _index(self, state: State) -> tuple[int, int, int, int]:
        row, col = state.agent
        n = self.grid.size
        if not (0 <= row < n and 0 <= col < n):
            raise ValueError(f"agent {state.agent} lies outside the {n} x {n} grid")
        return int(state.has_key), int(state.door_open), row, col

    def distance(self, state: State) -> int | float:
        """Optimal number of steps from ``state`` to the goal: an int, or ``math.inf``."""
        d = self.distances[self._index(state)]
        return int(d) if math.isfinite(d) else math.inf

    def action_mask(self, state: State) -> np.ndarray:
        """``(4,)`` bool: which actions are optimal in ``state`` (all False at the goal)."""
        return self.action_masks[self._index(state)].copy()

    def optimal_actions(self, state: State) -> frozenset[Action]:
        """The set of optimal actions in ``state`` (empty at the goal and where unreachable)."""
        mask = self.action_masks[self._index(state)]
        return frozenset(Action(a) for a in range(N_ACTIONS) if mask[a])

    def policy(self, state: State) -> np.ndarray:
        """``(4,)`` float64: ``pi*(. | state)``, uniform over the optimal actions.

        Raises ``ValueError`` where no action is optimal (at the goal, or goal unreachable).
        """
        mask = self.action_masks[self._index(state)]
        count = int(mask.sum())
        if count == 0:
            why = "the goal" if is_success(self.grid, state) else "a state that cannot reach it"
            raise ValueError(f"pi* is undefined at {state}: it is {why}")
        return mask.astype(np.float64) / count

    @cached_property
    def start_state(self) -> State:
        """The settled initial state."""
        return initial_state(self.grid)

    @property
    def is_solvable(self) -> bool:
        """Whether the goal can be reached from the start state."""
        return math.isfinite(self.distances[self._index(self.start_state)])

    @property
    def shortest_path_length(self) -> int:
        """L, the optimal number of steps from the start; raises :class:`UnsolvableGridError`."""
        d = self.distance(self.start_state)
        if d == math.inf:
            raise UnsolvableGridError(
                f"grid {self.grid.grid_id or '<unnamed>'}: the goal {self.grid.goal} cannot be "
                f"reached from the start {self.grid.start}"
            )
        return int(d)

    @property
    def horizon(self) -> int:
        """The default episode horizon ``ceil(1.5 L)``."""
        return default_horizon(self.shortest_path_length)

    def optimal_trajectory(
        self, rng: np.random.Generator | None = None, start: State | None = None
    ) -> tuple[list[State], list[Action]]:
        """Follow ``pi*`` from ``start`` (default: the start state) to the goal.

        Ties are broken uniformly at random with ``rng``, or by the lowest action index when
        ``rng`` is None. Returns ``L + 1`` states and ``L`` actions.
        """
        state = self.start_state if start is None else start
        if self.distance(state) == math.inf:
            raise UnsolvableGridError(f"the goal cannot be reached from {state}")
        states, actions = [state], []
        while not is_success(self.grid, state):
            options = sorted(self.optimal_actions(state))
            action = options[0] if rng is None else options[int(rng.integers(len(options)))]
            state = step(self.grid, state, action)
            states.append(state)
            actions.append(action)
        return states, actions


def solve(grid: Grid) -> OptimalPolicy:
    """Exact BFS distances and optimal action sets of every state of ``grid``."""
    if grid.door is None:
        distances, masks = _solve_static(grid)
    else:
        distances, masks = _solve_product(grid, grid.door)
    distances.setflags(write=False)
    masks.setflags(write=False)
    return OptimalPolicy(grid=grid, distances=distances, action_masks=masks)


def _solve_static(grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """No door: one undirected BFS over cells, broadcast to the four (has_key, door_open) layers."""
    n = grid.size
    own = bfs_distances(grid.walls, grid.goal)
    # distance after each action: the neighbour's distance, or the own one when blocked
    padded = np.full((n + 2, n + 2), np.inf)
    padded[1:-1, 1:-1] = own
    after = np.empty((n, n, N_ACTIONS))
    for action in Action:
        d_row, d_col = action.delta_row_col
        nbr = padded[1 + d_row : 1 + d_row + n, 1 + d_col : 1 + d_col + n]
        blocked = np.isinf(nbr)  # walls and off-grid (open neighbours of a finite cell are finite)
        after[..., action] = np.where(blocked, own, nbr)
    mask = np.isfinite(own)[..., None] & (after == (own - 1)[..., None])
    distances = np.broadcast_to(own, (2, 2, n, n)).copy()
    masks = np.broadcast_to(mask, (2, 2, n, n, N_ACTIONS)).copy()
    return distances, masks


def _solve_product(grid: Grid, door_cell: RowCol) -> tuple[np.ndarray, np.ndarray]:
    """With a door (``door_cell``, the grid's): reverse BFS over (has_key, door_open, cell), flat
    index ``layer * n^2 + cell`` with ``layer = 2 * has_key + door_open``."""
    n = grid.size
    n_cells = n * n
    walls = grid.walls.ravel().tolist()
    moves = _moves(n)
    door = door_cell[0] * n + door_cell[1]
    key = grid.key[0] * n + grid.key[1] if grid.key is not None else None
    goal = grid.goal[0] * n + grid.goal[1]
    door_nbrs = set(_neighbours(n)[door])
    n_states = 4 * n_cells
    valid = [False] * n_states
    succ = np.zeros((n_states, N_ACTIONS), dtype=np.int64)
    preds: list[list[int]] = [[] for _ in range(n_states)]
    for has_key in (0, 1):
        for door_open in (0, 1):
            base = (2 * has_key + door_open) * n_cells
            for cell in range(n_cells):
                if walls[cell] or (cell == door and not door_open):
                    continue
                s = base + cell
                valid[s] = True
                for action, target in enumerate(moves[cell]):
                    if target is None or walls[target] or (target == door and not door_open):
                        target = cell
                    hk = has_key or target == key
                    do = door_open or (hk and target in door_nbrs)
                    t = (2 * hk + do) * n_cells + target
                    succ[s, action] = t
                    if cell != goal:
                        preds[t].append(s)
    inf = math.inf
    dist = [inf] * n_states
    frontier = [layer * n_cells + goal for layer in range(4) if valid[layer * n_cells + goal]]
    for s in frontier:
        dist[s] = 0
    queue = deque(frontier)
    while queue:
        t = queue.popleft()
        dt = dist[t] + 1
        for s in preds[t]:
            if dist[s] == inf:
                dist[s] = dt
                queue.append(s)
    dist_arr = np.array(dist, dtype=np.float64)
    mask = np.isfinite(dist_arr)[:, None] & (dist_arr[succ] == (dist_arr - 1)[:, None])
    return dist_arr.reshape(2, 2, n, n), mask.reshape(2, 2, n, n, N_ACTIONS)


@dataclass(frozen=True, eq=False)
class GridMDP:
    """A finite-horizon tabular MDP of one grid.

    Attributes:
        grid: the grid it models.
        states: the ``S`` reachable settled states, sorted by ``(has_key, door_open, row, col)``.
        transitions: ``(S, A, S)`` float64, ``P(s' | s, a)``; rows sum to 1; goal states absorbing.
        initial: ``(S,)`` float64, one-hot on the start state.
        horizon: number of decisions per episode (default ``ceil(1.5 L)``).
    """

    grid: Grid
    states: tuple[State, ...]
    transitions: np.ndarray
    initial: np.ndarray
    horizon: int
    _index: dict[State, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        s = len(self.states)
        if self.transitions.shape != (s, N_ACTIONS, s):
            raise ValueError(
                f"transitions must have shape {(s, N_ACTIONS, s)}, got {self.transitions.shape}"
            )
        if self.initial.shape != (s,):
            raise ValueError(f"initial must have shape {(s,)}, got {self.initial.shape}")
        if not np.allclose(self.transitions.sum(axis=-1), 1.0):
            raise ValueError("every transitions[s, a] row must sum to 1")
        if not np.isclose(self.initial.sum(), 1.0):
            raise ValueError("initial must sum to 1")
        object.__setattr__(self, "_index", {state: i for i, state in enumerate(self.states)})

    @property
    def n_states(self) -> int:
        """S."""
        return len(self.states)

    @property
    def n_actions(self) -> int:
        """A (always 4)."""
        return N_ACTIONS

    def index(self, state: State) -> int:
        """The row of ``state`` in every ``(S, ...)`` array; ``ValueError`` if not reachable."""
        try:
            return self._index[state]
        except KeyError as err:
            raise ValueError(f"{state} is not a reachable state of this MDP") from err

    def goal_utility(self) -> np.ndarray:
        """``(S,)`` float64: 1 at states with the agent on the goal, else 0."""
        return np.array([float(is_success(self.grid, s)) for s in self.states])

    def key_utility(self) -> np.ndarray:
        """``(S,)`` float64: 1 at states where the agent holds the key, else 0."""
        return np.array([float(s.has_key) for s in self.states])

    def harm_utility(self) -> np.ndarray:
        """``(S,)`` float64: 1 at states with the agent on a harm cell (flower bed), else 0."""
        harm = set(self.grid.harm)
        return np.array([float(s.agent in harm) for s in self.states])

    def optimal_policy_matrix(self, policy: OptimalPolicy | None = None) -> np.ndarray:
        """``(S, A)`` float64: ``pi*`` per state (of ``policy``, default ``solve(self.grid)``);
        uniform at goal (absorbing) states."""
        policy = solve(self.grid) if policy is None else policy
        out = np.full((self.n_states, N_ACTIONS), 1.0 / N_ACTIONS)
        for i, state in enumerate(self.states):
            if not is_success(self.grid, state):
                out[i] = policy.policy(state)
        return out


def build_mdp(grid: Grid, *, horizon: int | None = None) -> GridMDP:
    """The tabular MDP of ``grid`` over the states reachable from its start; ``horizon``:
    decisions per episode, default ``ceil(1.5 L)`` (requires a solvable grid)."""
    start = initial_state(grid)
    seen = {start}
    frontier = [start]
    edges: dict[State, list[State]] = {}
    while frontier:
        nxt = []
        for state in frontier:
            if is_success(grid, state):
                successors = [state] * N_ACTIONS
            else:
                successors = [step(grid, state, a) for a in Action]
            edges[state] = successors
            for succ in successors:
                if succ not in seen:
                    seen.add(succ)
                    nxt.append(succ)
        frontier = nxt
    states = tuple(sorted(seen, key=lambda s: (s.has_key, s.door_open, s.agent[0], s.agent[1])))
    index = {state: i for i, state in enumerate(states)}
    transitions = np.zeros((len(states), N_ACTIONS, len(states)))
    for state, successors in edges.items():
        for action, succ in enumerate(successors):
            transitions[index[state], action, index[succ]] = 1.0
    initial = np.zeros(len(states))
    initial[index[start]] = 1.0
    if horizon is None:
        horizon = solve(grid).horizon
    elif horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    for array in (transitions, initial):
        array.setflags(write=False)
    return GridMDP(grid, states, transitions, initial, int(horizon))
