"""Decoded cognitive maps in HDF5: what a cell probe writes when applied, and how it is read
(layouts in docs/formats.md, "Fitted probes ..., decoded maps HDF5").

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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.probes.serialization import check_schema

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
        readout: a :class:`goalprobe.probes.decoder.Readout` (None: all from the cell probe).
        wall_source: optional ``(N, S, S)`` uint8 code of each cell's wall read-out
            (:data:`goalprobe.probes.decoder.WALL_SOURCES`).
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
    from goalprobe.probes.decoder import WALL_SOURCES, Readout

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
def _opened(path: str | Path):
    """The decoded-maps file at ``path`` open for reading, its schema, version and datasets
    checked."""
    import h5py

    with h5py.File(Path(path), "r") as f:
        check_schema(f.attrs, DECODED_MAPS_SCHEMA, (2, DECODED_MAPS_SCHEMA_VERSION), path)
        for name in ("probs", "row_ids"):
            if name not in f:
                raise ValueError(f"{path}: missing dataset {name!r}")
        yield f


def read_decoded_maps(path: str | Path) -> DecodedMaps:
    """Read a file written by :func:`write_decoded_maps` (checks schema and shapes)."""
    from goalprobe.probes.decoder import Readout

    p = Path(path)
    with _opened(p) as f:
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
    with _opened(p) as f:
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
    with _opened(path) as f:
        return np.asarray(f["row_ids"][()], dtype=np.int64)


def read_decoded_probs(path: str | Path, positions: Sequence[int] | np.ndarray) -> np.ndarray:
    """``(P, S, S, C)`` probabilities at file positions ``positions`` (any order, repeats
    allowed), reading only those rows."""
    with _opened(path) as f:
        return read_rows(f["probs"], positions)


def read_decoded_readouts(
    path: str | Path, positions: Sequence[int] | np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None, object]:
    """``(agent, goal, readout)``: the position probes' ``(P, S, S)`` distributions at file
    ``positions`` (None where the file has none) and the file's ``Readout``."""
    from goalprobe.probes.decoder import Readout

    with _opened(path) as f:
        agent = read_rows(f["agent_probs"], positions) if "agent_probs" in f else None
        goal = read_rows(f["goal_probs"], positions) if "goal_probs" in f else None
        readout = Readout.from_json(f.attrs.get("readout"))
    return agent, goal, readout


def read_rows(dataset, positions: Sequence[int] | np.ndarray) -> np.ndarray:
    """``dataset[positions]`` of an h5py dataset for any order of ``positions`` (h5py wants
    increasing indices), reading only those rows."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size == 0:
        return np.zeros((0, *dataset.shape[1:]), dtype=dataset.dtype)
    unique, inverse = np.unique(positions, return_inverse=True)
    return dataset[unique.tolist()][inverse]


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
    import h5py

    p = Path(path)
    with h5py.File(p, "r") as f:
        check_schema(f.attrs, STEP_MAPS_SCHEMA, (STEP_MAPS_SCHEMA_VERSION,), p)
        for name in ("probs", "grid_id", "episode", "step"):
            if name not in f:
                raise ValueError(f"{p}: missing dataset {name!r}")
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
