"""Tabular MDP view of a grid (plain numpy), the input of MEG scoring (``probes/scoring/meg.py``).

The states are the settled states reachable from the start (:mod:`goalprobe.gridworld.dynamics`),
sorted by ``(has_key, door_open, row, col)``. Transitions are deterministic (one-hot rows) except
that goal states are absorbing: every action keeps the agent on the goal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from goalprobe.gridworld.core import N_ACTIONS, Action, Grid, State
from goalprobe.gridworld.dynamics import initial_state, is_success, step
from goalprobe.gridworld.optimal import OptimalPolicy, solve


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

    def goal_mask(self) -> np.ndarray:
        """``(S,)`` bool: the absorbing goal states."""
        return self.goal_utility().astype(bool)

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
