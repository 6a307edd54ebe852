"""Core types of the grid world: actions, cell types, the static grid and the dynamic state.

Coordinates are ``(row, col)`` everywhere: row 0 is the top row, col 0 the leftmost column.
``UP`` decreases the row, ``LEFT`` decreases the column. This module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np

RowCol = tuple[int, int]
"""A cell coordinate as ``(row, col)``."""


class Action(IntEnum):
    """The four deterministic moves; the integer values index action arrays everywhere."""

    UP = 0
    DOWN = 1
    LEFT = 2
    RIGHT = 3

    @property
    def delta_row_col(self) -> RowCol:
        """The ``(d_row, d_col)`` displacement of this move."""
        return _DELTAS[self]

    @classmethod
    def from_name(cls, name: str) -> Action:
        """Parse ``"UP"``/``"up"``/... into an :class:`Action`; raises ``ValueError`` otherwise."""
        try:
            return cls[name.strip().upper()]
        except KeyError as err:
            raise ValueError(
                f"unknown action {name!r}; expected one of UP, DOWN, LEFT, RIGHT"
            ) from err


_DELTAS: dict[Action, RowCol] = {
    Action.UP: (-1, 0),
    Action.DOWN: (1, 0),
    Action.LEFT: (0, -1),
    Action.RIGHT: (0, 1),
}
N_ACTIONS = 4


class CellType(IntEnum):
    """Cell classes shared by rendering, labels in the HDF5 store and the probes.

    ``PADDING`` marks positions outside a grid smaller than the 15 x 15 label canvas.
    ``HARM`` (a flower bed: passable, but stepping on it harms it) comes after ``PADDING`` so
    that the study's classes 0..6 keep their values; only harm grids
    (:mod:`goalprobe.gridworld.harm`) contain it.
    """

    OPEN = 0
    WALL = 1
    GOAL = 2
    AGENT = 3
    KEY = 4
    DOOR = 5
    PADDING = 6
    HARM = 7


STUDY_CELL_TYPES = 7
"""Number of cell classes of the study (``OPEN`` .. ``PADDING``), the classes the bundled agents'
training read-outs have; ``HARM`` is an extension after them."""

SYMBOLS: dict[CellType, str] = {
    CellType.OPEN: "_",
    CellType.WALL: "#",
    CellType.GOAL: "G",
    CellType.AGENT: "A",
    CellType.KEY: "K",
    CellType.DOOR: "D",
    CellType.HARM: "F",
}
"""Text symbol of each renderable cell type (padding is never rendered)."""

SYMBOL_TO_CELL: dict[str, CellType] = {s: c for c, s in SYMBOLS.items()}

LABEL_CANVAS = 15
"""Side of the padded label canvas used by the activation store and the general probes."""


class Variant(str):
    """Names of grid variants (plain strings so that they serialise as themselves)."""

    PLAIN = "plain"
    KEY_DOOR = "key_door"
    KEY_NO_DOOR = "key_no_door"
    TWO_PATH_KEY = "two_path_key"
    TWO_PATH_NO_KEY = "two_path_no_key"
    KEY_DOOR_CONTROL = "key_door_control"
    HARM = "harm"
    """A plain layout with flower beds (harm cells), see :mod:`goalprobe.gridworld.harm`."""
    FOG = "fog"
    """A plain layout under fog (the study's Appendix A), see :mod:`goalprobe.gridworld.fog`;
    its visibility radius is ``extra["fog_radius"]``."""


@dataclass(frozen=True)
class State:
    """The dynamic part of an episode."""

    agent: RowCol
    """The agent's cell as ``(row, col)``."""
    has_key: bool = False
    """Whether the agent carries the key."""
    door_open: bool = False
    """Whether the door has been opened (an open door is an open cell)."""


@dataclass(frozen=True, eq=False)
class Grid:
    """A static n x n layout plus the start state."""

    walls: np.ndarray
    """``(n, n)`` bool array, True where a cell is a wall. Never mutated (read-only view)."""
    goal: RowCol
    """The goal cell ``(row, col)``."""
    start: RowCol
    """The agent's start cell ``(row, col)``."""
    key: RowCol | None = None
    """The key cell, or None when the variant has no key."""
    door: RowCol | None = None
    """The door cell, or None when the variant has no door."""
    variant: str = Variant.PLAIN
    """The variant name (see :class:`Variant`)."""
    density: float | None = None
    """The obstacle density the grid was generated with (metadata)."""
    seed: int | None = None
    """The seed it was generated from, or None when built by hand (metadata)."""
    grid_id: str = ""
    """A stable identifier, used to join every artefact back to this grid."""
    extra: dict = field(default_factory=dict)
    """JSON-ready metadata (the transform applied, what a false-belief variant changed)."""
    shown: Grid | None = None
    """The grid drawn in the prompt (the *oracle belief* of a false-belief grid), or None; it may
    differ only in walls and goal. Dynamics, optimal policies and success use this (true) grid;
    prompts render :attr:`prompt_grid`."""
    harm: tuple[RowCol, ...] = ()
    """Sorted harm cells (flower beds, ``F``): passable, harmed by standing on them; never a wall,
    the start, the goal, the key or the door."""
    start_has_key: bool = False
    """The episode starts holding the key (an intervention; needs a key, whose cell then shows as
    open, as after a pickup)."""
    start_door_open: bool = False
    """The episode starts with the door open (an intervention; needs a door)."""

    def __post_init__(self) -> None:
        walls = np.array(self.walls, dtype=bool)
        if walls.ndim != 2 or walls.shape[0] != walls.shape[1]:
            raise ValueError(f"walls must be a square 2-D array, got shape {walls.shape}")
        walls.setflags(write=False)
        object.__setattr__(self, "walls", walls)
        object.__setattr__(self, "goal", _rc(self.goal))
        object.__setattr__(self, "start", _rc(self.start))
        if self.key is not None:
            object.__setattr__(self, "key", _rc(self.key))
        if self.door is not None:
            object.__setattr__(self, "door", _rc(self.door))
        n = self.size
        harm = tuple(sorted({_rc(cell) for cell in self.harm}))
        named = [(name, getattr(self, name)) for name in ("goal", "start", "key", "door")]
        for name, cell in [*named, *(("harm cell", cell) for cell in harm)]:
            if cell is None:
                continue
            if not (0 <= cell[0] < n and 0 <= cell[1] < n):
                raise ValueError(f"{name} {cell} lies outside the {n} x {n} grid")
            if walls[cell]:
                raise ValueError(f"{name} {cell} lies on a wall")
        if self.goal == self.start:
            raise ValueError(f"start and goal coincide at {self.goal}")
        if self.key is not None and self.key == self.goal:
            raise ValueError(f"key and goal coincide at {self.key}")
        if self.door is not None and self.door in (self.start, self.goal, self.key):
            raise ValueError(f"the door at {self.door} overlaps the start, goal or key")
        for cell in harm:
            if cell in (self.start, self.goal, self.key, self.door):
                raise ValueError(f"harm cell {cell} overlaps the start, goal, key or door")
        object.__setattr__(self, "harm", harm)
        if self.shown is not None:
            _check_shown(self, self.shown)
        if self.start_has_key and self.key is None:
            raise ValueError("start_has_key needs a key (the cell it was picked up from)")
        if self.start_door_open and self.door is None:
            raise ValueError("start_door_open needs a door")

    @property
    def size(self) -> int:
        """Side length n."""
        return int(self.walls.shape[0])

    @property
    def initial_state(self) -> State:
        """The state an episode starts in, with the key and door rules applied (a key on the
        start cell is already held; see :func:`goalprobe.gridworld.dynamics.settle`), and the
        intervened start (:attr:`start_has_key`, :attr:`start_door_open`) when set."""
        # imported here: dynamics builds on this module
        from goalprobe.gridworld.dynamics import settle

        door_open = self.door is None or self.start_door_open
        return settle(
            self, State(agent=self.start, has_key=self.start_has_key, door_open=door_open)
        )

    def is_blocked(self, cell: RowCol, state: State) -> bool:
        """Whether the agent cannot enter ``cell`` in ``state`` (wall, outside, or locked door)."""
        r, c = cell
        n = self.size
        if not (0 <= r < n and 0 <= c < n) or self.walls[r, c]:
            return True
        return self.door is not None and cell == self.door and not state.door_open

    @property
    def prompt_grid(self) -> Grid:
        """The grid the prompt draws: ``shown`` when present, else this grid."""
        return self if self.shown is None else self.shown

    def with_start(self, start: RowCol) -> Grid:
        """A copy whose agent starts at ``start`` (the shown grid's start moves with it)."""
        shown = None if self.shown is None else replace(self.shown, start=start)
        return replace(self, start=start, shown=shown)

    def _identity(self) -> tuple:
        """What equality and hashing compare: everything but the metadata."""
        return (
            self.walls.tobytes(),
            self.goal,
            self.start,
            self.key,
            self.door,
            self.variant,
            self.shown,
            self.harm,
            self.start_has_key,
            self.start_door_open,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Grid):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())


def _check_shown(true: Grid, shown: Grid) -> None:
    """Raise ``ValueError`` unless ``shown`` may be drawn in place of ``true``."""
    if not isinstance(shown, Grid):
        raise ValueError(f"shown must be a Grid or None, got {type(shown).__name__}")
    if shown.shown is not None:
        raise ValueError("a shown grid cannot itself carry a shown grid")
    if shown.size != true.size:
        raise ValueError(f"the shown grid is {shown.size} x {shown.size}, not {true.size}")
    for name in ("start", "key", "door", "harm"):
        if getattr(shown, name) != getattr(true, name):
            raise ValueError(
                f"the shown grid's {name} {getattr(shown, name)} differs from the true "
                f"{getattr(true, name)}; only walls and goal may differ"
            )


def _rc(cell) -> RowCol:
    r, c = cell
    return (int(r), int(c))


PLAN_HORIZON = 10
"""Number of future executed actions stored as the plan label of each step."""

PLAN_END = 4
"""Plan token marking the end of the episode (after the last executed action)."""

PLAN_PAD = 5
"""Plan token for positions after ``PLAN_END``; ignored by losses and metrics."""
