"""The decoded cognitive map: one decoder, each part from the read-out made for it (no I/O here).

A decoded map has three parts:

- **cells** (walls, keys, doors, harm cells): the cell-type probe's class probabilities
  ``probs (N, S, S, len(CellType))``, walls optionally from the wall probes
  (:func:`combine_walls`);
- **agent** and **goal**: the position probes' cell distributions ``(N, S, S)``
  (:meth:`goalprobe.probes.position.PositionProbe.cell_proba`), whose argmax is the decoded
  cell. The cell probe's argmax ``P(AGENT)`` finds the agent on a few percent of grids, the
  position probes (a read-out made for localisation) on most.

:func:`decode_rows` is the one place a decoded map is made from activations; :class:`Readout`
names what produced each part and decoded-map files record it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from goalprobe.gridworld.core import CellType

CELL_READOUT = "cell probe"
"""Read-out name of a part taken from the cell-type probe."""
POSITION_READOUT = "position probe"
"""Read-out name of a part taken from a position probe."""
CONDITIONAL_READOUT = "conditional wall probe"
"""Read-out name of walls from the absolute-frame ``ConditionalWallProbe``."""
AGENT_CENTRED_READOUT = "agent-centred wall probe"
"""Read-out name of walls from the agent-frame ``ConditionalWallProbe``, near the agent."""
WALL_SOURCES = (CELL_READOUT, CONDITIONAL_READOUT, AGENT_CENTRED_READOUT)
"""Codes of the per-cell ``wall_source`` map (decoded-map schema 3): index = code."""


@dataclass(frozen=True)
class Readout:
    """Which read-out produced each part of a decoded map (written as JSON into the file)."""

    cells: str = CELL_READOUT
    """Walls, keys, doors, harm cells: the cell-type probe (argmax class)."""
    agent: str = CELL_READOUT
    """The agent's cell: ``position probe`` or ``cell probe`` (argmax ``P(AGENT)``, the study's)."""
    goal: str = CELL_READOUT
    """The goal's cell, as ``agent``."""
    cell_probe: str | None = None
    """The cell probe's card (relative path), when known."""
    agent_probe: str | None = None
    """The agent position probe's card, when it gave the agent."""
    goal_probe: str | None = None
    """The goal position probe's card, when it gave the goal."""
    walls: str = CELL_READOUT
    """The wall probability: ``cell probe``, or the wall probes cell by cell (``wall_source``)."""
    wall_probe: str | None = None
    """The absolute conditional wall probe's card, when it gave walls."""
    agent_wall_probe: str | None = None
    """The agent-centred wall probe's card, when it gave walls."""

    def to_json(self) -> str:
        """The file attribute."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> Readout:
        """Read the file attribute (None: every part from the cell probe)."""
        if not text:
            return cls()
        return cls(**json.loads(text))


@dataclass(frozen=True, eq=False)
class DecodedArrays:
    """Decoded maps of ``N`` rows: ``probs (N, S, S, len(CellType))`` float32 (zero where the
    probe lacks a class), the agent's and goal's ``(N, S, S)`` cell distributions (None: read
    from ``probs``) and the :class:`Readout`."""

    probs: np.ndarray
    agent: np.ndarray | None
    goal: np.ndarray | None
    readout: Readout
    wall_source: np.ndarray | None = None
    """``(N, S, S)`` uint8 code (:data:`WALL_SOURCES`) of the read-out that gave each cell's
    wall probability, or None (every cell from the cell probe)."""

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``(probs, agent, goal)`` of row ``i``."""
        return (
            self.probs[i],
            None if self.agent is None else self.agent[i],
            None if self.goal is None else self.goal[i],
        )


def full_class_probs(probs: np.ndarray, classes) -> np.ndarray:
    """``(..., len(CellType))`` float32: a probe's ``(..., C)`` columns at their ``classes``'
    ``CellType`` index, zero for classes the probe does not predict."""
    probs = np.asarray(probs)
    out = np.zeros((*probs.shape[:-1], len(CellType)), dtype=np.float32)
    out[..., np.asarray(list(classes), dtype=np.int64)] = probs
    return out


def decode_rows(
    cell_probe: Any,
    acts: np.ndarray,
    sizes: np.ndarray,
    *,
    agent_probe: Any = None,
    goal_probe: Any = None,
    readout: Readout | None = None,
    wall_probe: Any = None,
    agent_wall_probe: Any = None,
    densities: np.ndarray | None = None,
) -> DecodedArrays:
    """Decode anchor activations ``acts`` of grids of side ``sizes`` into maps: cells from
    ``cell_probe``, agent and goal from the position probes when given (else the cell probe's
    channels), and walls from the absolute- and agent-frame wall probes when given
    (:func:`combine_walls`; they need ``densities``). ``readout``: card paths to record.
    """
    probs = full_class_probs(cell_probe.predict_proba(acts), [int(c) for c in cell_probe.classes_])
    canvas = probs.shape[1]
    agent, goal = (
        None if probe is None else probe.cell_proba(acts, sizes, canvas).astype(np.float32)
        for probe in (agent_probe, goal_probe)
    )
    base = readout or Readout()
    named = Readout(
        cells=CELL_READOUT,
        agent=CELL_READOUT if agent is None else POSITION_READOUT,
        goal=CELL_READOUT if goal is None else POSITION_READOUT,
        cell_probe=base.cell_probe,
        agent_probe=base.agent_probe if agent is not None else None,
        goal_probe=base.goal_probe if goal is not None else None,
    )
    source = None
    if wall_probe is not None or agent_wall_probe is not None:
        probs, source = _decoded_walls(
            probs, acts, sizes, densities, agent, wall_probe, agent_wall_probe
        )
        named = replace(
            named,
            walls=CONDITIONAL_READOUT if wall_probe is not None else AGENT_CENTRED_READOUT,
            wall_probe=base.wall_probe if wall_probe is not None else None,
            agent_wall_probe=base.agent_wall_probe if agent_wall_probe is not None else None,
        )
    return DecodedArrays(probs, agent, goal, named, source)


def _decoded_walls(probs, acts, sizes, densities, agent, wall_probe, agent_wall_probe):
    """:func:`combine_walls` at the decoded agent (top-1 of ``agent``, else of ``P(AGENT)``)."""
    from goalprobe.probes.wall_test import wall_inputs

    if densities is None:
        raise ValueError("the wall probes need each row's density (their prior's covariate)")
    sizes = np.asarray(sizes, dtype=np.int64)
    dist = probs[..., int(CellType.AGENT)] if agent is None else agent
    cells = np.asarray([top1_cell(dist[i], int(n)) for i, n in enumerate(sizes)], np.int64)
    X = wall_inputs(acts, sizes, densities, cells.reshape(-1, 2))
    radius = 3 if agent_wall_probe is None else int(agent_wall_probe.radius)
    return combine_walls(
        probs,
        sizes,
        cells.reshape(-1, 2),
        absolute=None if wall_probe is None else wall_probe.decode_proba(X),
        agent_centred=None if agent_wall_probe is None else agent_wall_probe.decode_proba(X),
        radius=radius,
    )


def top1_cell(dist: np.ndarray, size: int) -> tuple[int, int]:
    """The most probable cell of a ``(canvas, canvas)`` distribution within the ``n x n`` grid."""
    d = np.asarray(dist, dtype=np.float64)[:size, :size]
    i = int(np.argmax(d))
    return i // size, i % size


def decoded_classes(
    probs: np.ndarray,
    size: int,
    agent: np.ndarray | None = None,
    goal: np.ndarray | None = None,
) -> np.ndarray:
    """``(n, n)`` ``CellType`` picture of a decoded map ``probs (S, S, len(CellType))``: the
    argmax class, except that where an ``(S, S)`` agent (goal) read-out is given its top-1 cell
    is the one agent (goal) cell and that class is left out of the argmax elsewhere."""
    p = np.array(np.asarray(probs, dtype=np.float64)[:size, :size], copy=True)
    for cell_type, readout in ((CellType.AGENT, agent), (CellType.GOAL, goal)):
        if readout is not None:
            p[..., int(cell_type)] = -np.inf
    types = p.argmax(axis=-1)
    for cell_type, readout in ((CellType.GOAL, goal), (CellType.AGENT, agent)):
        if readout is not None:
            types[top1_cell(readout, size)] = int(cell_type)
    return types


def combine_walls(
    probs: np.ndarray,
    sizes: np.ndarray,
    agent_cells: np.ndarray,
    *,
    absolute: np.ndarray | None = None,
    agent_centred: np.ndarray | None = None,
    radius: int = 3,
) -> tuple[np.ndarray, np.ndarray]:
    """Replace the cell probe's wall probability by the wall read-outs, cell by cell: within
    Chebyshev ``radius`` of the decoded agent the agent-centred probe's, elsewhere in the grid the
    conditional (absolute) probe's; the other classes keep their proportions.

    ``absolute``: ``(N, S * S)`` wall probability per canvas cell; ``agent_centred``: ``(N, P)``
    per offset of :func:`goalprobe.probes.wall_test.offsets`; cells outside the grid keep the
    cell probe's. Returns ``(probs (float32), wall_source (N, S, S) uint8)``.
    """
    from goalprobe.probes.wall_test import frame_cells

    out = np.array(probs, dtype=np.float32, copy=True)
    n, side = out.shape[0], out.shape[1]
    wall = np.array(out[..., int(CellType.WALL)], copy=True).reshape(n, -1)
    source = np.zeros((n, side * side), dtype=np.uint8)
    within = np.arange(side)[None, :] < np.asarray(sizes, dtype=np.int64)[:, None]  # (n, side)
    inside = (within[:, :, None] & within[:, None, :]).reshape(n, -1)
    if absolute is not None:
        a = np.asarray(absolute, dtype=np.float32).reshape(n, -1)
        wall = np.where(inside, a, wall)
        source[inside] = 1
    if agent_centred is not None:
        flat, on_canvas = frame_cells("agent", side, agent_cells, radius)
        rows = np.broadcast_to(np.arange(n)[:, None], flat.shape)
        use = on_canvas & inside[rows, flat]
        wall[rows[use], flat[use]] = np.asarray(agent_centred, dtype=np.float32)[use]
        source[rows[use], flat[use]] = 2
    wall_map = wall.reshape(n, side, side)
    old = out[..., int(CellType.WALL)]
    rest = np.clip(1.0 - old, 1e-12, None)
    changed = source.reshape(n, side, side) > 0
    scale = np.where(changed, (1.0 - wall_map) / rest, 1.0)[..., None]
    others = out * scale
    others[..., int(CellType.WALL)] = np.where(changed, wall_map, old)
    # a cell whose other classes all had probability 0 takes OPEN for the rest
    empty = changed & (old >= 1.0 - 1e-12)
    others[..., int(CellType.OPEN)] += np.where(empty, 1.0 - wall_map, 0.0)
    return others, source.reshape(n, side, side)
