"""The decoded cognitive map: one decoder, each part from the read-out made for it (no I/O here).

A decoded map has three parts:

- **cells** (walls, keys, doors, harm cells): the cell-type probe's class probabilities
  ``probs (N, S, S, len(CellType))``; the decoded walls are the cells whose most likely class is
  ``WALL`` (:func:`goalprobe.probes.scoring.belief.decoded_walls`);
- **agent** and **goal**: the position probes' cell distributions ``(N, S, S)``
  (:meth:`goalprobe.probes.position.PositionProbe.cell_proba`: ``P(row) P(col)`` within the
  grid), whose argmax is the one decoded agent (goal) cell and whose top-k cells are the top-k
  analysis's candidates. The cell probe's argmax ``P(AGENT)`` finds the agent on a few percent of
  grids, the position probes (a read-out made for localisation) on most.

:func:`decode_rows` is the one place a decoded map is made from activations; the probes stage
(the rollouts' maps scored by ``goalprobe score``), the false-belief and intention stages (maps of
prompt-only states) and the viewer (which reads the files) all go through it. :data:`READOUTS`
names what produced each part; decoded-map files record it (``readout`` attribute, decoded-map
schema 2, :func:`goalprobe.probes.serialization.write_decoded_maps`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from goalprobe.gridworld.core import CellType

CELL_READOUT = "cell probe"
"""Read-out name of a part taken from the cell-type probe."""
POSITION_READOUT = "position probe"
"""Read-out name of a part taken from a position probe."""


@dataclass(frozen=True)
class Readout:
    """Which read-out produced each part of a decoded map (written as JSON into the file)."""

    cells: str = CELL_READOUT
    """Walls, keys, doors, harm cells: the cell-type probe (argmax class)."""
    agent: str = CELL_READOUT
    """The agent's cell: ``position probe`` (its cell distribution) or ``cell probe`` (argmax
    ``P(AGENT)``, the study's read-out and every schema-1 file's)."""
    goal: str = CELL_READOUT
    """The goal's cell, as ``agent``."""
    cell_probe: str | None = None
    """The cell probe's card (relative path), when known."""
    agent_probe: str | None = None
    """The agent position probe's card, when it gave the agent."""
    goal_probe: str | None = None
    """The goal position probe's card, when it gave the goal."""

    def to_json(self) -> str:
        """The file attribute."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> Readout:
        """Read the file attribute (None: the cell read-out of schema-1 files)."""
        if not text:
            return cls()
        return cls(**json.loads(text))


@dataclass(frozen=True, eq=False)
class DecodedArrays:
    """Decoded maps of ``N`` rows.

    Attributes:
        probs: ``(N, S, S, len(CellType))`` float32 cell-type probabilities (every
            ``CellType`` column, zero where the probe lacks the class).
        agent: ``(N, S, S)`` float32 distribution of the agent's cell, or None (read from
            ``probs[..., AGENT]``).
        goal: ``(N, S, S)`` float32 distribution of the goal's cell, or None.
        readout: what produced each part.
    """

    probs: np.ndarray
    agent: np.ndarray | None
    goal: np.ndarray | None
    readout: Readout

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``(probs, agent, goal)`` of row ``i``."""
        return (
            self.probs[i],
            None if self.agent is None else self.agent[i],
            None if self.goal is None else self.goal[i],
        )


def full_class_probs(probs: np.ndarray, classes) -> np.ndarray:
    """``(..., C)`` probabilities over a probe's ``classes`` -> ``(..., len(CellType))`` float32
    (absent classes get 0)."""
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
) -> DecodedArrays:
    """Decode anchor activations into maps: cells from ``cell_probe``, agent and goal from the
    position probes when given (else the cell probe's channels).

    Args:
        cell_probe: a fitted cell-type probe (``predict_proba -> (N, S, S, C)``, ``classes_``).
        acts: ``(N, ...)`` anchor activations of the probes' stage and layer.
        sizes: ``(N,)`` the grid side of each row (the position distributions live inside it).
        agent_probe, goal_probe: fitted :class:`goalprobe.probes.position.PositionProbe`, or None.
        readout: card paths to record (the read-out names are filled in here).
    """
    probs = full_class_probs(cell_probe.predict_proba(acts), [int(c) for c in cell_probe.classes_])
    canvas = probs.shape[1]
    agent = None if agent_probe is None else agent_probe.cell_proba(acts, sizes, canvas)
    goal = None if goal_probe is None else goal_probe.cell_proba(acts, sizes, canvas)
    base = readout or Readout()
    named = Readout(
        cells=CELL_READOUT,
        agent=CELL_READOUT if agent is None else POSITION_READOUT,
        goal=CELL_READOUT if goal is None else POSITION_READOUT,
        cell_probe=base.cell_probe,
        agent_probe=base.agent_probe if agent is not None else None,
        goal_probe=base.goal_probe if goal is not None else None,
    )
    as32 = None if agent is None else agent.astype(np.float32)
    return DecodedArrays(probs, as32, None if goal is None else goal.astype(np.float32), named)


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
    """``(n, n)`` ``CellType`` picture of a decoded map: the cell probe's argmax class, except
    that where a read-out is given its top-1 cell is the one agent (goal) cell and the cell
    probe's ``AGENT`` (``GOAL``) class is left out of the argmax elsewhere.

    Args:
        probs: ``(S, S, len(CellType))`` cell-type probabilities.
        size: the grid side n.
        agent, goal: ``(S, S)`` read-out distributions, or None.
    """
    p = np.array(np.asarray(probs, dtype=np.float64)[:size, :size], copy=True)
    for cell_type, readout in ((CellType.AGENT, agent), (CellType.GOAL, goal)):
        if readout is not None:
            p[..., int(cell_type)] = -np.inf
    types = p.argmax(axis=-1)
    for cell_type, readout in ((CellType.GOAL, goal), (CellType.AGENT, agent)):
        if readout is not None:
            types[top1_cell(readout, size)] = int(cell_type)
    return types
