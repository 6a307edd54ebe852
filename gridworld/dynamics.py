"""Deterministic grid-world dynamics (study, section 3; key and door rules of appendix G.3).

* A move enters the neighbouring cell unless it is a wall, outside the grid, or a locked door;
  a blocked move leaves the agent in place.
* Key variants: the key is picked up when the agent enters its cell. A locked door opens (and
  disappears) as soon as the agent stands next to it (4-neighbourhood) while holding the key.
  These interaction rules are applied after every move and to the initial state
  (:func:`initial_state`), so a state returned here is always *settled*.
* The episode succeeds when the agent stands on the goal. ``step`` itself does not stop at the
  goal; callers end the episode (the tabular view :class:`goalprobe.gridworld.optimal.GridMDP` makes goal
  states absorbing).
"""

from __future__ import annotations

from collections.abc import Iterable

from goalprobe.gridworld.core import Action, Grid, RowCol, State


def settle(grid: Grid, state: State) -> State:
    """Apply the key and door rules to ``state``: pick up the key, open an adjacent door.

    Idempotent; a no-op on grids without key and door.
    """
    has_key = state.has_key
    door_open = state.door_open
    if grid.key is not None and not has_key and state.agent == grid.key:
        has_key = True
    if grid.door is not None and has_key and not door_open and is_adjacent(state.agent, grid.door):
        door_open = True
    if has_key == state.has_key and door_open == state.door_open:
        return state
    return State(agent=state.agent, has_key=has_key, door_open=door_open)


def initial_state(grid: Grid) -> State:
    """The settled start state of an episode on ``grid`` (same as ``grid.initial_state``)."""
    return grid.initial_state


def step(grid: Grid, state: State, action: Action | int) -> State:
    """The settled state after taking ``action`` in ``state``.

    Moving into a wall, off the grid or into a locked door leaves the agent where it is.
    """
    d_row, d_col = Action(action).delta_row_col
    row, col = state.agent
    target = (row + d_row, col + d_col)
    if grid.is_blocked(target, state):
        target = state.agent
    return settle(grid, State(agent=target, has_key=state.has_key, door_open=state.door_open))


def is_success(grid: Grid, state: State) -> bool:
    """Whether the agent stands on the goal."""
    return state.agent == grid.goal


def is_adjacent(a_row_col: RowCol, b_row_col: RowCol) -> bool:
    """Whether two cells share an edge (4-neighbourhood)."""
    return abs(a_row_col[0] - b_row_col[0]) + abs(a_row_col[1] - b_row_col[1]) == 1


def moves_inside(cell: RowCol, n: int) -> list[tuple[Action, RowCol]]:
    """``(move, cell it enters)`` of every move from ``cell`` that stays inside an n x n grid."""
    moved = [(a, (cell[0] + a.delta_row_col[0], cell[1] + a.delta_row_col[1])) for a in Action]
    return [(a, (r, c)) for a, (r, c) in moved if 0 <= r < n and 0 <= c < n]


def rollout(grid: Grid, actions: Iterable[Action | int], start: State | None = None) -> list[State]:
    """States visited when executing ``actions`` from ``start`` (default: the initial state).

    Returns ``T + 1`` states for ``T`` actions (the first is ``start``). The rollout stops early,
    without consuming further actions, once the goal is reached.
    """
    state = initial_state(grid) if start is None else settle(grid, start)
    states = [state]
    for action in actions:
        if is_success(grid, state):
            break
        state = step(grid, state, action)
        states.append(state)
    return states
