"""The study's text format of a grid (section 3, appendix G) and its exact parser.

Example (``A`` agent, ``G`` goal)::

      0 1 2 3 4
    0 # # # # #
    1 # _ _ G #
    2 # A _ _ #
    3 # _ _ _ #
    4 # # # # #

A header of column indices, then one line per row: its index and one symbol per cell (``#``
wall, ``_`` open, ``G`` goal, ``A`` agent, ``K`` key, ``D`` door, ``F`` flower bed), single
spaces throughout so each cell and index is one token (no alignment padding for n > 10). The
agent is drawn over what lies under it; the key disappears once held, the door once open.

:func:`parse` inverts :func:`render` exactly for initial states of grids that start with
nothing held or opened; for a later state it returns the grid as visible then
(``render(*parse(t)) == t``).
"""

from __future__ import annotations

from typing import cast

import numpy as np
from goalprobe.gridworld.core import (
    LABEL_CANVAS,
    SYMBOL_TO_CELL,
    SYMBOLS,
    CellType,
    Grid,
    RowCol,
    State,
    Variant,
)
from goalprobe.gridworld.dynamics import initial_state

_CELL_CHARS = np.array([SYMBOLS.get(c, "?") for c in sorted(CellType)])
"""Symbol of each cell-type value (``PADDING`` is never rendered: cell types inside a grid)."""


class GridParseError(ValueError):
    """Malformed grid text. ``line`` and ``column`` are 1-based (None when not one place)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.line = line
        self.column = column
        where = ""
        if line is not None:
            where = f"line {line}" + (f", col {column}" if column is not None else "") + ": "
        super().__init__(where + message)


def cell_types(grid: Grid, state: State | None = None) -> np.ndarray:
    """``(n, n)`` int8 :class:`~goalprobe.gridworld.core.CellType` of each cell in ``state``
    (default: the initial state): the agent on top, a held key and an open door as open cells."""
    state = initial_state(grid) if state is None else state
    types = np.where(grid.walls, np.int8(CellType.WALL), np.int8(CellType.OPEN)).astype(np.int8)
    for cell in grid.harm:
        types[cell] = CellType.HARM
    types[grid.goal] = CellType.GOAL
    if grid.key is not None and not state.has_key:
        types[grid.key] = CellType.KEY
    if grid.door is not None and not state.door_open:
        types[grid.door] = CellType.DOOR
    types[state.agent] = CellType.AGENT
    return types


def padded_cell_types(
    grid: Grid, state: State | None = None, canvas: int = LABEL_CANVAS
) -> np.ndarray:
    """:func:`cell_types` placed top-left on a ``(canvas, canvas)`` int8 map filled with
    ``PADDING``; ``ValueError`` when the grid is larger than the canvas."""
    n = grid.size
    if n > canvas:
        raise ValueError(f"a {n} x {n} grid does not fit the {canvas} x {canvas} label canvas")
    out = np.full((canvas, canvas), CellType.PADDING, dtype=np.int8)
    out[:n, :n] = cell_types(grid, state)
    return out


def render(grid: Grid, state: State | None = None) -> str:
    """The text of ``grid`` in ``state`` (default: the initial state); no trailing newline."""
    return render_symbols(_CELL_CHARS[cell_types(grid, state)])


def render_symbols(chars: np.ndarray) -> str:
    """The grid text of an ``(n, n)`` array of cell symbols: the column indices, then each row's
    index and symbols."""
    n = len(chars)
    lines = ["  " + " ".join(str(col) for col in range(n))]
    lines.extend(f"{row} " + " ".join(chars[row].tolist()) for row in range(n))
    return "\n".join(lines)


def _tokens(line: str, line_no: int, *, allow_indent: bool) -> list[tuple[int, str]]:
    """Split on single spaces; returns ``(1-based column, token)`` pairs."""
    start = 0
    if allow_indent:
        start = len(line) - len(line.lstrip(" "))
    if start < len(line) and line[start].isspace():
        raise GridParseError(f"unexpected whitespace {line[start]!r}", line_no, start + 1)
    out = []
    pos = start
    parts = line[start:].split(" ")
    for i, token in enumerate(parts):
        if not token:
            trailing = i == len(parts) - 1
            raise GridParseError(
                "trailing space" if trailing else "expected exactly one space between tokens",
                line_no,
                pos if trailing else pos + 1,  # the offending space
            )
        for offset, char in enumerate(token):
            if char.isspace():
                raise GridParseError(f"unexpected whitespace {char!r}", line_no, pos + offset + 1)
        out.append((pos + 1, token))
        pos += len(token) + 1
    return out


def parse(text: str, *, variant: str | None = None, grid_id: str = "") -> tuple[Grid, State]:
    """Parse grid text (the format of :func:`render`) into the visible grid and the state.

    One trailing newline (or ``\\r\\n`` line ends) is accepted. ``variant`` is by default
    inferred from the symbols (door: key_door, key only: key_no_door, flower beds only: harm,
    none of them: plain). Returns ``(grid, state)``: ``grid.start`` the agent's cell,
    ``has_key=False``, ``door_open`` True exactly when no door is shown.

    Raises:
        GridParseError: naming the line and column of the first problem (bad header, wrong row
            index, ragged or missing rows, unknown symbol, zero or several agents/goals/keys/doors).
    """
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise GridParseError("empty grid text")
    header = _tokens(lines[0], 1, allow_indent=True)
    for expected, (col_no, token) in enumerate(header):
        if token != str(expected):
            raise GridParseError(
                f"header must list the column indices 0 .. n-1; expected {expected!r}, "
                f"got {token!r}",
                1,
                col_no,
            )
    n = len(header)
    if n < 2:
        raise GridParseError(f"header names {n} column(s); a grid needs more", 1)
    if len(lines) - 1 != n:
        raise GridParseError(
            f"the header names {n} columns, so {n} rows are expected (a square grid), "
            f"got {len(lines) - 1}",
            min(len(lines), n + 2),
        )
    walls = np.zeros((n, n), dtype=bool)
    objects = (CellType.AGENT, CellType.GOAL, CellType.KEY, CellType.DOOR)
    found: dict[CellType, list[tuple[RowCol, int, int]]] = {t: [] for t in objects}
    harm: list[RowCol] = []
    for row in range(n):
        line_no = row + 2
        tokens = _tokens(lines[row + 1], line_no, allow_indent=False)
        col_no, index = tokens[0]
        if index != str(row):
            raise GridParseError(f"expected row index {row}, got {index!r}", line_no, col_no)
        cells = tokens[1:]
        if len(cells) != n:
            where = cells[n][0] if len(cells) > n else len(lines[row + 1]) + 1
            raise GridParseError(
                f"row {row} has {len(cells)} cells, expected {n} (ragged row)", line_no, where
            )
        for col, (col_no, symbol) in enumerate(cells):
            cell_type = SYMBOL_TO_CELL.get(symbol)
            if cell_type is None:
                raise GridParseError(
                    f"unknown symbol {symbol!r} at cell (row {row}, col {col}); expected one of "
                    + " ".join(SYMBOLS.values()),
                    line_no,
                    col_no,
                )
            if cell_type == CellType.WALL:
                walls[row, col] = True
            elif cell_type == CellType.HARM:
                harm.append((row, col))
            elif cell_type in found:
                found[cell_type].append(((row, col), line_no, col_no))
    located: dict[CellType, RowCol | None] = {}
    for cell_type, hits in found.items():
        name = f"{cell_type.name.lower()} ({SYMBOLS[cell_type]})"
        if len(hits) > 1:
            first = hits[0][0]
            cell, line_no, col_no = hits[1]
            raise GridParseError(
                f"a second {name} at cell {cell}; the first is at {first}", line_no, col_no
            )
        if not hits and cell_type in (CellType.AGENT, CellType.GOAL):
            raise GridParseError(f"no {name} in the grid")
        located[cell_type] = hits[0][0] if hits else None
    key, door = located[CellType.KEY], located[CellType.DOOR]
    if variant is None:
        drawn = {Variant.KEY_DOOR: door, Variant.KEY_NO_DOOR: key, Variant.HARM: harm or None}
        variant = next((name for name, cell in drawn.items() if cell is not None), Variant.PLAIN)
    agent = cast(RowCol, located[CellType.AGENT])  # both checked present above
    grid = Grid(
        walls=walls,
        goal=cast(RowCol, located[CellType.GOAL]),
        start=agent,
        key=key,
        door=door,
        variant=variant,
        grid_id=grid_id,
        harm=tuple(harm),
    )
    return grid, State(agent=agent, has_key=False, door_open=door is None)
