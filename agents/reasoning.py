"""The bundled agent's reasoning and answer texts (what it is trained to write).

The reasoning names where the agent, the goal (and, in key variants, the key, the door and the
key status) are, what lies next to the agent in each direction, then plans the next few moves
of a shortest path::

    A is at (3, 5). G is at (1, 1). Next to A: UP _ DOWN # LEFT _ RIGHT #. Plan: UP UP LEFT LEFT.
    A is at (2, 1). G is at (4, 3). K is at (2, 5). D is at (3, 3). I do not carry the key.
    Next to A: UP _ DOWN _ LEFT # RIGHT _. Plan: RIGHT RIGHT RIGHT RIGHT.

(one line each; the symbols are those of :mod:`goalprobe.gridworld.text`). The final answer is the JSON object the prompt asks for, ``{"action": "UP"}``.

The map agent (``bundled:map``, docs/map_agent.md) adds, after ``Next to A:``, a line copying the
12 cells within two steps of A (:data:`NEAR_OFFSETS`, row by row; ``#`` outside the grid), which
its completion can only take from the pre-reasoning anchors::

    ... Next to A: UP _ DOWN # LEFT _ RIGHT #. The walls by A: _ # _ _ # _ # _ _ # _ _. Plan: ...

:func:`parse_near` reads that line back (the copy line's accuracy is a behavioural measure of what
the anchors hold).
"""

from __future__ import annotations

from collections.abc import Sequence

from goalprobe.gridworld.core import SYMBOL_TO_CELL, SYMBOLS, Action, CellType, Grid, RowCol, State
from goalprobe.gridworld.text import cell_types

PLAN_STEPS = 4
"""Number of moves the reasoning plans ahead (fewer when the goal is nearer)."""

CARRYING_KEY = "I carry the key."
NOT_CARRYING_KEY = "I do not carry the key."
PLAN_PREFIX = "Plan:"
NEIGHBOURS_PREFIX = "Next to A:"
NEAR_PREFIX = "The walls by A:"
"""Prefix of the copy line of the cells within two steps of A (words of the bundled vocabulary)."""

NEAR_OFFSETS: tuple[tuple[int, int], ...] = tuple(
    (r, c) for r in range(-2, 3) for c in range(-2, 3) if 0 < abs(r) + abs(c) <= 2
)
"""The cells the copy line names, as ``(d_row, d_col)`` from A: Manhattan distance 1 and 2, row by
row."""


def format_row_col(cell: RowCol) -> str:
    """``(row, col)`` as the prompts write it, e.g. ``(3, 5)``."""
    return f"({cell[0]}, {cell[1]})"


def describe_state(grid: Grid, state: State, *, key_variant: bool, near: bool = False) -> str:
    """The first part of the reasoning: where A and G (and K, D, the key) are, A's neighbours
    and (``near``) the copy line of :func:`describe_near`."""
    parts = [f"A is at {format_row_col(state.agent)}.", f"G is at {format_row_col(grid.goal)}."]
    if grid.key is not None and not state.has_key:
        parts.append(f"K is at {format_row_col(grid.key)}.")
    if grid.door is not None and not state.door_open:
        parts.append(f"D is at {format_row_col(grid.door)}.")
    if key_variant:
        parts.append(CARRYING_KEY if state.has_key else NOT_CARRYING_KEY)
    parts.append(describe_neighbours(grid, state))
    if near:
        parts.append(describe_near(grid, state))
    return " ".join(parts)


def _symbols(grid: Grid, state: State, offsets) -> list[str]:
    """The symbol of the cell at each ``(d_row, d_col)`` from A (``#`` outside the grid)."""
    types = cell_types(grid, state)
    n = grid.size
    out = []
    for d_row, d_col in offsets:
        row, col = state.agent[0] + d_row, state.agent[1] + d_col
        inside = 0 <= row < n and 0 <= col < n
        out.append(SYMBOLS[CellType(types[row, col]) if inside else CellType.WALL])
    return out


def near_symbols(grid: Grid, state: State) -> list[str]:
    """The symbols of the :data:`NEAR_OFFSETS` cells (``#`` outside the grid)."""
    return _symbols(grid, state, NEAR_OFFSETS)


def describe_near(grid: Grid, state: State) -> str:
    """``The walls by A: _ # ... _.``: the symbols of the 12 cells within two steps of A in
    :data:`NEAR_OFFSETS` order."""
    return f"{NEAR_PREFIX} {' '.join(near_symbols(grid, state))}."


def parse_near(reasoning: str) -> list[CellType | None] | None:
    """The cell types a reasoning's copy line names, in :data:`NEAR_OFFSETS` order (None for a
    symbol that is not a cell's, or missing at the end), or None when the reasoning has no
    copy line."""
    start = reasoning.find(NEAR_PREFIX)
    if start < 0:
        return None
    body = reasoning[start + len(NEAR_PREFIX) :].split(".", 1)[0].split()
    named = [SYMBOL_TO_CELL.get(symbol) for symbol in body[: len(NEAR_OFFSETS)]]
    return named + [None] * (len(NEAR_OFFSETS) - len(named))


def describe_neighbours(grid: Grid, state: State) -> str:
    """``Next to A: UP _ DOWN # LEFT _ RIGHT G.``: the symbol each move would step onto
    (``#`` outside the grid)."""
    symbols = _symbols(grid, state, [a.delta_row_col for a in Action])
    words = [f"{a.name} {s}" for a, s in zip(Action, symbols, strict=True)]
    return f"{NEIGHBOURS_PREFIX} {' '.join(words)}."


def reasoning_text(
    grid: Grid, state: State, plan: Sequence[Action], *, key_variant: bool, near: bool = False
) -> str:
    """The full reasoning: :func:`describe_state` then ``Plan: <moves>.`` (``plan``: at least
    one move; :data:`PLAN_STEPS` in training)."""
    if not plan:
        raise ValueError("a plan needs at least one move")
    moves = " ".join(Action(a).name for a in plan)
    described = describe_state(grid, state, key_variant=key_variant, near=near)
    return f"{described} {PLAN_PREFIX} {moves}."


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
