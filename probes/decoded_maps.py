"""The decoded cognitive map: one decoder, each part from the read-out made for it, and its
files in HDF5 (layouts in docs/formats.md, "Fitted probes ..., decoded maps HDF5").

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

Decoded maps (:func:`write_decoded_maps`, schema ``goalprobe.decoded_maps``) are keyed by
activation-store row; :func:`read_decoded_maps` reads a file whole, a viewer reads
:func:`read_decoded_maps_info`, :func:`read_decoded_row_ids`, :func:`read_decoded_probs` and
:func:`read_decoded_readouts` (chosen rows only). Step maps (:func:`write_step_maps`, schema
``goalprobe.step_maps``) are keyed by trajectory step, for maps decoded from a store of their
own (the false-belief episodes' visited states). h5py is imported when a file is opened.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.probes.serialization import check_schema

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
    return divmod(int(np.argmax(d)), size)


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


DECODED_MAPS_SCHEMA = "goalprobe.decoded_maps"
"""``schema`` attribute of a decoded-maps HDF5 file."""
DECODED_MAPS_SCHEMA_VERSION = 3
"""Version of the decoded-maps HDF5 layout (docs/formats.md); version 2 (no ``wall_source``)
still reads."""


@dataclass(frozen=True)
class DecodedMaps:
    """Decoded cognitive maps read back from HDF5 (the arguments of :func:`write_decoded_maps`;
    ``classes`` from the card, ``attrs`` the optional ``role`` / ``trained_on``)."""

    probs: np.ndarray
    row_ids: np.ndarray
    classes: np.ndarray
    card: dict
    schema_version: int
    agent: np.ndarray | None = None
    goal: np.ndarray | None = None
    readout: object = None
    attrs: dict | None = None
    wall_source: np.ndarray | None = None


def write_decoded_maps(
    path: str | Path,
    probs: np.ndarray,
    row_ids: np.ndarray,
    card: dict,
    *,
    agent: np.ndarray | None = None,
    goal: np.ndarray | None = None,
    readout=None,
    wall_source: np.ndarray | None = None,
    **attrs,
) -> Path:
    """Write decoded maps to HDF5; returns ``path``.

    Args:
        probs: ``(N, S, S, C)`` probabilities (stored as float16).
        row_ids: ``(N,)`` int store rows the maps were decoded from.
        card: the decoding probe's card; its ``fitted.classes_`` names each column's ``CellType``.
        agent, goal: optional ``(N, S, S)`` cell distributions (the position probes' read-out).
        readout: a :class:`Readout` (None: all from the cell probe).
        wall_source: optional ``(N, S, S)`` uint8 code of each cell's wall read-out
            (:data:`WALL_SOURCES`).
        **attrs: further scalar attributes (``role``, ``trained_on``).
    """
    import h5py

    from goalprobe.stats import json_ready

    p = np.asarray(probs)
    rows = np.asarray(row_ids)
    if p.ndim != 4 or p.shape[1] != p.shape[2]:
        raise ValueError(f"probs must be (N, S, S, C), got shape {p.shape}")
    if rows.shape != (p.shape[0],):
        raise ValueError(f"row_ids must have shape ({p.shape[0]},), got {rows.shape}")
    if not np.issubdtype(rows.dtype, np.integer):
        raise ValueError(f"row_ids must be integers, got dtype {rows.dtype}")
    classes = (card.get("fitted") or {}).get("classes_")
    if classes is None or len(classes) != p.shape[3]:
        raise ValueError(
            f"card['fitted']['classes_'] must list the CellType of each of the {p.shape[3]} "
            "probability columns; pass the card of the probe that decoded them"
        )
    for name, extra in (("agent", agent), ("goal", goal), ("wall_source", wall_source)):
        if extra is not None and np.shape(extra) != p.shape[:3]:
            raise ValueError(f"{name} must have shape {p.shape[:3]}, got {np.shape(extra)}")
    if wall_source is not None and np.max(wall_source, initial=0) >= len(WALL_SOURCES):
        raise ValueError(f"wall_source codes must lie below {len(WALL_SOURCES)}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(out, "w") as f:
        f.attrs["schema"] = DECODED_MAPS_SCHEMA
        f.attrs["schema_version"] = DECODED_MAPS_SCHEMA_VERSION
        f.attrs["readout"] = (readout or Readout()).to_json()
        for name, value in attrs.items():
            f.attrs[name] = value
        extras = {"agent_probs": agent, "goal_probs": goal, "wall_source": wall_source}
        for name, extra in extras.items():
            if extra is not None:
                dtype = np.uint8 if name == "wall_source" else np.float16
                f.create_dataset(name, data=np.asarray(extra).astype(dtype), compression="gzip")
        if wall_source is not None:
            f.attrs["wall_sources"] = json.dumps(list(WALL_SOURCES))
        f.attrs["classes"] = np.asarray(classes, dtype=np.uint8)
        f.attrs["probe_card"] = json.dumps(json_ready(card), allow_nan=False)
        f.attrs["family"] = decoded_map_family(card)
        source = card.get("activations") or {}
        if source.get("stage") is not None:
            f.attrs["stage"] = str(source["stage"])
        if source.get("layer") is not None:
            f.attrs["layer"] = int(source["layer"])
        f.create_dataset(
            "probs",
            data=p.astype(np.float16),
            chunks=(min(256, max(1, p.shape[0])), *p.shape[1:]),
            compression="gzip",
        )
        f.create_dataset("row_ids", data=rows.astype(np.int64))
    return out


def decoded_map_family(card: dict) -> str:
    """Short label of the decoding probe (attribute ``family``): ``"mlp"``/``"linear"``,
    ``"per_cell_mlp"``/``"per_cell_linear"`` or ``"majority"``."""
    family = (card.get("hyperparameters") or {}).get("family")
    name = card.get("class")
    if name == "MajorityCellBaseline":
        return "majority"
    if name == "PerCellProbe":
        return f"per_cell_{family}"
    return str(family or name or "probe")


@contextmanager
def opened_h5(
    path: str | Path,
    schema: str = DECODED_MAPS_SCHEMA,
    versions: tuple[int, ...] = (2, DECODED_MAPS_SCHEMA_VERSION),
    datasets: tuple[str, ...] = ("probs", "row_ids"),
):
    """The HDF5 file at ``path`` (by default a decoded-maps file) open for reading, its
    ``schema``, version (one of ``versions``) and ``datasets`` checked."""
    import h5py

    with h5py.File(Path(path), "r") as f:
        check_schema(f.attrs, schema, versions, path)
        for name in datasets:
            if name not in f:
                raise ValueError(f"{path}: missing dataset {name!r}")
        yield f


def read_decoded_maps(path: str | Path) -> DecodedMaps:
    """Read a file written by :func:`write_decoded_maps` (checks schema and shapes)."""
    p = Path(path)
    with opened_h5(p) as f:
        version = int(f.attrs["schema_version"])
        probs = f["probs"][...]
        row_ids = f["row_ids"][...]
        classes = np.asarray(f.attrs["classes"], dtype=np.uint8)
        card = json.loads(f.attrs["probe_card"])
        names = ("agent_probs", "goal_probs", "wall_source")
        agent, goal, wall_source = (f[k][...] if k in f else None for k in names)
        readout = Readout.from_json(f.attrs.get("readout"))
        extra = {k: f.attrs[k] for k in ("role", "trained_on") if k in f.attrs}
    for name, value in zip(names, (agent, goal, wall_source), strict=True):
        if value is not None and value.shape != probs.shape[:3]:
            raise ValueError(f"{p}: {name} {value.shape} disagrees with probs {probs.shape}")
    if probs.shape[0] != row_ids.shape[0] or probs.shape[3] != len(classes):
        raise ValueError(
            f"{p}: probs {probs.shape}, row_ids {row_ids.shape} and {len(classes)} classes disagree"
        )
    return DecodedMaps(
        probs, row_ids, classes, card, version, agent, goal, readout, extra, wall_source
    )


@dataclass(frozen=True)
class DecodedMapsInfo:
    """What a decoded-maps file holds, from its attributes (no probabilities read): stage and
    layer (None when recorded nowhere), :func:`decoded_map_family`, classes, the shape of
    ``probs``, the card, and ``role`` (``"headline"``: the maps scoring uses by default)."""

    stage: str | None
    layer: int | None
    family: str
    classes: tuple[int, ...]
    shape: tuple[int, ...]
    card: dict = field(repr=False, compare=False)
    role: str | None = None


def read_decoded_maps_info(path: str | Path) -> DecodedMapsInfo:
    """:class:`DecodedMapsInfo` of a file (the card's ``activations`` and ``hyperparameters``
    where the attributes are absent); ValueError on a bad schema, dataset, card or shape."""
    p = Path(path)
    with opened_h5(p) as f:
        shape = tuple(int(n) for n in f["probs"].shape)
        try:
            card = json.loads(f.attrs.get("probe_card", "{}"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{p}: probe_card is not valid JSON ({err.msg})") from err
        source = card.get("activations") or {}
        params = card.get("hyperparameters") or {}
        stage = f.attrs.get("stage", source.get("stage"))
        layer = f.attrs.get("layer", source.get("layer"))
        family = f.attrs.get("family", params.get("family", card.get("class")))
        classes = tuple(int(c) for c in np.asarray(f.attrs["classes"]).tolist())
        role = f.attrs.get("role")
    if len(shape) != 4 or shape[1] != shape[2] or shape[3] != len(classes):
        raise ValueError(f"{p}: probs has shape {shape} for {len(classes)} classes")
    if any(not 0 <= c < len(CellType) for c in classes):
        raise ValueError(f"{p}: classes {classes} are not CellType values")
    return DecodedMapsInfo(
        stage=None if stage is None else _text(stage),
        layer=None if layer is None else int(layer),
        family=_text(family or "probe"),
        classes=classes,
        shape=shape,
        card=card,
        role=None if role is None else _text(role),
    )


def read_decoded_row_ids(path: str | Path) -> np.ndarray:
    """``(N,)`` int64 store rows of a decoded-maps file (schema and version checked)."""
    with opened_h5(path) as f:
        return np.asarray(f["row_ids"][()], dtype=np.int64)


def read_decoded_probs(path: str | Path, positions: Sequence[int] | np.ndarray) -> np.ndarray:
    """``(P, S, S, C)`` probabilities at file positions ``positions`` (any order, repeats
    allowed), reading only those rows."""
    from goalprobe.activations.store.reader import read_rows

    with opened_h5(path) as f:
        return read_rows(f["probs"], np.asarray(positions))


def read_decoded_readouts(
    path: str | Path, positions: Sequence[int] | np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None, object]:
    """``(agent, goal, readout)``: the position probes' ``(P, S, S)`` distributions at file
    ``positions`` (None where the file has none) and the file's ``Readout``."""
    from goalprobe.activations.store.reader import read_rows

    with opened_h5(path) as f:
        names = ("agent_probs", "goal_probs")
        agent, goal = (read_rows(f[k], np.asarray(positions)) if k in f else None for k in names)
        readout = Readout.from_json(f.attrs.get("readout"))
    return agent, goal, readout


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


STEP_MAPS_SCHEMA = "goalprobe.step_maps"
"""``schema`` attribute of a step-maps HDF5 file (decoded maps keyed by trajectory step)."""
STEP_MAPS_SCHEMA_VERSION = 2
"""Version of the step-maps HDF5 layout (docs/formats.md)."""


@dataclass(frozen=True, eq=False)
class StepMaps:
    """Decoded maps of trajectory steps read back from HDF5 (the arguments of
    :func:`write_step_maps`, ``grid_id``/``episode``/``step`` ``(N,)`` each)."""

    probs: np.ndarray
    grid_id: np.ndarray
    episode: np.ndarray
    step: np.ndarray
    classes: np.ndarray
    attrs: dict
    agent: np.ndarray | None = None
    goal: np.ndarray | None = None

    def index(self) -> dict[tuple[str, int, int], int]:
        """``(grid_id, episode, step) -> position`` of every map."""
        return {
            (str(g), int(e), int(t)): i
            for i, (g, e, t) in enumerate(zip(self.grid_id, self.episode, self.step, strict=True))
        }


def write_step_maps(
    path: str | Path,
    keys: list[tuple[str, int, int]],
    probs: np.ndarray,
    classes,
    *,
    agent: np.ndarray | None = None,
    goal: np.ndarray | None = None,
    **attrs,
) -> Path:
    """Write decoded maps keyed by ``(grid_id, episode, step)`` (maps decoded outside the
    activation store's rows, e.g. the false-belief episodes' visited states); ``probs``,
    ``classes``, ``agent``, ``goal`` as :func:`write_decoded_maps`, ``attrs`` scalar attributes
    (``stage``, ``layer``, ``probe``, ``readout``). Returns ``path``.
    """
    import h5py

    p = np.asarray(probs)
    classes = np.asarray(classes, dtype=np.uint8)
    if p.ndim != 4 or p.shape[1] != p.shape[2] or p.shape[0] != len(keys):
        raise ValueError(f"probs must be ({len(keys)}, S, S, C), got shape {p.shape}")
    if p.shape[3] != len(classes):
        raise ValueError(f"probs has {p.shape[3]} columns for {len(classes)} classes")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(out, "w") as f:
        f.attrs["schema"] = STEP_MAPS_SCHEMA
        f.attrs["schema_version"] = STEP_MAPS_SCHEMA_VERSION
        f.attrs["classes"] = classes
        for name, value in attrs.items():
            f.attrs[name] = value
        f.create_dataset("grid_id", data=[str(k[0]) for k in keys], dtype=h5py.string_dtype())
        f.create_dataset("episode", data=np.asarray([k[1] for k in keys], dtype=np.int32))
        f.create_dataset("step", data=np.asarray([k[2] for k in keys], dtype=np.int32))
        for name, extra in (("agent_probs", agent), ("goal_probs", goal)):
            if extra is not None:
                if np.shape(extra) != p.shape[:3]:
                    raise ValueError(f"{name} must have shape {p.shape[:3]}")
                f.create_dataset(name, data=np.asarray(extra).astype(np.float16))
        f.create_dataset(
            "probs",
            data=p.astype(np.float16),
            chunks=(min(256, max(1, p.shape[0])), *p.shape[1:]) if len(keys) else None,
            compression="gzip" if len(keys) else None,
        )
    return out


def read_step_maps(path: str | Path) -> StepMaps:
    """Read a file written by :func:`write_step_maps` (checks schema and shapes)."""
    p = Path(path)
    datasets = ("probs", "grid_id", "episode", "step")
    with opened_h5(p, STEP_MAPS_SCHEMA, (STEP_MAPS_SCHEMA_VERSION,), datasets) as f:
        maps = StepMaps(
            probs=f["probs"][...],
            grid_id=f["grid_id"].asstr()[...],
            episode=f["episode"][...],
            step=f["step"][...],
            classes=np.asarray(f.attrs["classes"], dtype=np.uint8),
            attrs={k: v for k, v in f.attrs.items() if k not in ("schema", "schema_version")},
            agent=f["agent_probs"][...] if "agent_probs" in f else None,
            goal=f["goal_probs"][...] if "goal_probs" in f else None,
        )
    n = len(maps.grid_id)
    if maps.probs.shape[0] != n or len(maps.episode) != n or len(maps.step) != n:
        raise ValueError(f"{p}: probs {maps.probs.shape} and the {n} step keys disagree")
    if maps.probs.ndim != 4 or maps.probs.shape[3] != len(maps.classes):
        raise ValueError(f"{p}: probs {maps.probs.shape} for {len(maps.classes)} classes")
    return maps
