"""The bundled agent's reasoning and answer texts (what it is trained to write).

The reasoning names where the agent, the goal (and, in key variants, the key, the door and the
key status) are, what lies next to the agent in each direction, then plans the next few moves
of a shortest path::

    A is at (3, 5). G is at (1, 1). Next to A: UP _ DOWN # LEFT _ RIGHT #. Plan: UP UP LEFT LEFT.
    A is at (2, 1). G is at (4, 3). K is at (2, 5). D is at (3, 3). I do not carry the key.
    Next to A: UP _ DOWN _ LEFT # RIGHT _. Plan: RIGHT RIGHT RIGHT RIGHT.

(one line each; the symbols are those of :mod:`goalprobe.gridworld.text`). The final answer is the JSON object the prompt asks for, ``{"action": "UP"}``.
"""

from __future__ import annotations

from collections.abc import Sequence

from goalprobe.gridworld.core import SYMBOLS, Action, CellType, Grid, RowCol, State
from goalprobe.gridworld.text import cell_types

PLAN_STEPS = 4
"""Number of moves the reasoning plans ahead (fewer when the goal is nearer)."""

CARRYING_KEY = "I carry the key."
NOT_CARRYING_KEY = "I do not carry the key."
PLAN_PREFIX = "Plan:"
NEIGHBOURS_PREFIX = "Next to A:"


def format_row_col(cell: RowCol) -> str:
    """``(row, col)`` as the prompts write it, e.g. ``(3, 5)``."""
    return f"({cell[0]}, {cell[1]})"


def describe_state(grid: Grid, state: State, *, key_variant: bool) -> str:
    """The first part of the reasoning: where A and G (and K, D, the key) are."""
    parts = [f"A is at {format_row_col(state.agent)}.", f"G is at {format_row_col(grid.goal)}."]
    if grid.key is not None and not state.has_key:
        parts.append(f"K is at {format_row_col(grid.key)}.")
    if grid.door is not None and not state.door_open:
        parts.append(f"D is at {format_row_col(grid.door)}.")
    if key_variant:
        parts.append(CARRYING_KEY if state.has_key else NOT_CARRYING_KEY)
    parts.append(describe_neighbours(grid, state))
    return " ".join(parts)


def describe_neighbours(grid: Grid, state: State) -> str:
    """``Next to A: UP _ DOWN # LEFT _ RIGHT G.``: the symbol each move would step onto
    (``#`` outside the grid)."""
    types = cell_types(grid, state)
    n = grid.size
    words = []
    for action in Action:
        d_row, d_col = action.delta_row_col
        row, col = state.agent[0] + d_row, state.agent[1] + d_col
        inside = 0 <= row < n and 0 <= col < n
        words.append(
            f"{action.name} {SYMBOLS[CellType(types[row, col]) if inside else CellType.WALL]}"
        )
    return f"{NEIGHBOURS_PREFIX} {' '.join(words)}."


def reasoning_text(grid: Grid, state: State, plan: Sequence[Action], *, key_variant: bool) -> str:
    """The full reasoning: :func:`describe_state` then ``Plan: <moves>.``

    Args:
        plan: the next moves (at least one; :data:`PLAN_STEPS` in training).
    """
    if not plan:
        raise ValueError("a plan needs at least one move")
    moves = " ".join(Action(a).name for a in plan)
    return f"{describe_state(grid, state, key_variant=key_variant)} {PLAN_PREFIX} {moves}."


def final_text(action: Action | int) -> str:
    """The final answer for ``action``: ``{"action": "UP"}``."""
    return f'{{"action": "{Action(action).name}"}}'


def vocabulary_texts() -> list[str]:
    """Texts holding every word the reasoning and the answers use (for the tokenizer)."""
    texts = [CARRYING_KEY, NOT_CARRYING_KEY, PLAN_PREFIX, NEIGHBOURS_PREFIX]
    texts.append("A is at G is at K is at D is at")
    texts += [f"{PLAN_PREFIX} {a.name} {a.name}." for a in Action]
    texts += [final_text(a) for a in Action]
    return texts
