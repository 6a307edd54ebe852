"""Writing an activation store into a hidden temporary file beside the destination: append row
batches (each advances ``committed_rows``), then finalise (``complete``, fsync, atomic rename),
so a half-written store never appears under the destination name."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
from goalprobe.activations.store.schema import (
    ACTIVATION_DTYPE,
    COMPRESSIONS,
    LABEL_FIELDS,
    REASONING,
    REASONING_FIELDS,
    SCHEMA,
    SCHEMA_VERSION,
    layer_name,
    stage_tokens,
)
from goalprobe.gridworld.core import PLAN_END, PLAN_PAD, CellType

from goalprobe.version import package_version, software_versions

if TYPE_CHECKING:
    from goalprobe.stats.shapes import ResidualActs, RowMask, TokenPositions

_CHUNK_BYTES = 256 << 10
_LABEL_CHUNK_ROWS = 4096


def utc_now() -> str:
    """The current UTC time as ISO 8601 (seconds)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class StoreLayout:
    """What a store holds: ``stages`` in order, ascending ``layers`` (0-based blocks), residual
    width ``d_model``, and ``reasoning_every`` (``k`` of the reasoning rows; 0: none)."""

    stages: tuple[str, ...]
    layers: tuple[int, ...]
    d_model: int
    reasoning_every: int = 0

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a store needs at least one stage")
        for stage in self.stages:
            stage_tokens(stage)
        if len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages repeat: {self.stages}")
        layers = tuple(int(x) for x in self.layers)
        if not layers or any(x < 0 for x in layers) or list(layers) != sorted(set(layers)):
            raise ValueError(f"layers must be distinct non-negative ints, got {self.layers}")
        object.__setattr__(self, "layers", layers)
        if int(self.d_model) <= 0:
            raise ValueError(f"d_model must be positive, got {self.d_model}")
        if int(self.reasoning_every) < 0:
            raise ValueError(f"reasoning_every must be >= 0, got {self.reasoning_every}")


@dataclass
class ReasoningRows:
    """The ragged reasoning rows of a batch of ``B`` store rows (``R`` in all, in row order):
    ``(B,)`` ``counts`` and reasoning ``length`` (0: none read); ``(R,)`` token ``positions``,
    ``tokens`` offsets from the reasoning's start and ``fraction`` ``(tokens + 1) / length``;
    ``acts[layer]`` ``(R, d_model)``."""

    counts: np.ndarray
    length: np.ndarray
    positions: np.ndarray
    tokens: np.ndarray
    fraction: np.ndarray
    acts: dict[int, np.ndarray]

    @classmethod
    def empty(cls, n: int, layers: tuple[int, ...], d_model: int) -> ReasoningRows:
        """``n`` store rows without reasoning rows."""
        zeros = np.zeros(0, dtype=np.int32)
        return cls(
            counts=np.zeros(n, dtype=np.int64),
            length=np.zeros(n, dtype=np.int32),
            positions=zeros,
            tokens=zeros,
            fraction=np.zeros(0, dtype=np.float32),
            acts={x: np.zeros((0, d_model), dtype=ACTIVATION_DTYPE) for x in layers},
        )

    def check(self, n: int, layout: StoreLayout) -> None:
        """Raise ``ValueError`` naming the first array that does not fit."""
        counts = np.asarray(self.counts)
        if counts.shape != (n,) or (counts < 0).any():
            raise ValueError(f"reasoning counts have shape {counts.shape}, expected ({n},) >= 0")
        _check_shape("reasoning length", self.length, (n,))
        r = int(counts.sum())
        for name in REASONING_FIELDS:
            _check_shape(f"reasoning {name}", getattr(self, name), (r,))
        for layer in layout.layers:
            _check_shape(f"reasoning acts[{layer}]", self.acts.get(layer), (r, layout.d_model))


def _check_shape(where: str, arr, want: tuple) -> None:
    """Raise ``ValueError`` naming ``where`` unless ``arr`` is given and of shape ``want``."""
    if arr is None or np.shape(arr) != want:
        got = None if arr is None else np.shape(arr)
        raise ValueError(f"{where} has shape {got}, expected {want}")


@dataclass
class RowBatch:
    """Rows to append to a store: ``acts[stage][layer]`` ``(B, K, d_model)``,
    ``positions[stage]`` ``(B, K)``, ``present[stage]`` ``(B,)`` (absent rows are written as
    zeros), ``labels[field]`` per :data:`~goalprobe.activations.store.schema.LABEL_FIELDS` and
    the ragged reasoning rows (None: none)."""

    acts: dict[str, dict[int, ResidualActs]]
    positions: dict[str, TokenPositions]
    present: dict[str, RowMask]
    labels: dict[str, np.ndarray] = field(default_factory=dict)
    reasoning: ReasoningRows | None = None

    def __len__(self) -> int:
        return int(len(next(iter(self.labels.values()))))

    def check(self, layout: StoreLayout) -> None:
        """Raise ``ValueError`` naming the first array that does not fit ``layout``."""
        missing = [name for name in LABEL_FIELDS if name not in self.labels]
        if missing:
            raise ValueError(f"row batch lacks label field(s) {missing}")
        extra = [name for name in self.labels if name not in LABEL_FIELDS]
        if extra:
            raise ValueError(f"row batch has unknown label field(s) {extra}")
        n = len(self)
        for name, spec in LABEL_FIELDS.items():
            _check_shape(f"label {name!r}", self.labels[name], (n, *spec.shape))
        for stage in layout.stages:
            k = stage_tokens(stage)
            _check_shape(f"positions[{stage!r}]", self.positions.get(stage), (n, k))
            _check_shape(f"present[{stage!r}]", self.present.get(stage), (n,))
            for layer in layout.layers:
                acts = self.acts.get(stage, {}).get(layer)
                _check_shape(f"acts[{stage!r}][{layer}]", acts, (n, k, layout.d_model))
        if self.reasoning is not None:
            self.reasoning.check(n, layout)
            if not layout.reasoning_every and int(np.sum(self.reasoning.counts)):
                raise ValueError("reasoning rows given to a store without reasoning rows")


def _chunk_rows(row_bytes: int) -> int:
    return int(max(1, min(4096, _CHUNK_BYTES // max(1, row_bytes))))


def _growable(group, name: str, row_shape: tuple, dtype, chunk_rows: int, **filters):
    """An empty dataset of rows of ``row_shape`` that grows along its first axis."""
    return group.create_dataset(
        name,
        shape=(0, *row_shape),
        maxshape=(None, *row_shape),
        dtype=dtype,
        chunks=(chunk_rows, *row_shape),
        **filters,
    )


def _write_rows(ds, start: int, value) -> None:
    """Grow ``ds`` to ``start + len(value)`` rows and write ``value`` from row ``start``."""
    ds.resize(start + len(value), axis=0)
    ds[start : start + len(value)] = value


def hdf5_filters(compression: str) -> dict[str, Any]:
    """h5py ``create_dataset`` keyword arguments of a compression name (byte shuffle + filter)."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"unknown compression {compression!r}; expected one of {COMPRESSIONS}")
    if compression == "none":
        return {}
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": 4, "shuffle": True}
    return {"compression": "lzf", "shuffle": True}


def to_float16(arr: np.ndarray, where: str) -> np.ndarray:
    """Cast to float16; ValueError naming ``where`` for a non-finite or overflowing entry."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.asarray(arr).astype(ACTIVATION_DTYPE)
    if not np.isfinite(out).all():
        bad = np.argwhere(~np.isfinite(out))[0].tolist()
        raise ValueError(
            f"{where}: entry {bad} is not finite in float16 (source value "
            f"{np.asarray(arr)[tuple(bad)]!r}); float16 holds magnitudes up to 65504"
        )
    return out


def temp_path(path: Path) -> Path:
    """The hidden temporary file a writer for ``path`` writes into."""
    return path.parent / f".{path.name}.tmp"


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that a rename inside it is durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StoreWriter:
    """Create a store at ``path`` (written only by :meth:`finalize`; root ``attrs``, dicts and
    lists as JSON) and append rows in batches. As a context manager, a normal exit finalises
    and an exception removes the temporary file."""

    def __init__(
        self,
        path: str | os.PathLike,
        layout: StoreLayout,
        attrs: Mapping[str, Any],
        *,
        compression: str = "none",
    ) -> None:
        self.path = Path(path)
        self.layout = layout
        self.tmp = temp_path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        filters = hdf5_filters(compression)
        self._file = h5py.File(self.tmp, "w")
        self._rows = 0
        self._finalized = False
        f = self._file
        base = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "created": utc_now(),
            "package_version": package_version(),
            "software": software_versions(),
            "layers": np.asarray(layout.layers, dtype=np.int64),
            "stages": json.dumps(list(layout.stages)),
            "d_model": int(layout.d_model),
            "compression": compression,
            "reasoning_every": int(layout.reasoning_every),
        }
        fixed = {k: base[k] for k in ("schema", "schema_version", "reasoning_every", "layers")}
        for key, value in {**base, **dict(attrs), **fixed}.items():
            if isinstance(value, (dict, list, tuple)):
                value = json.dumps(value, sort_keys=True)
            elif value is None:
                raise ValueError(f"attribute {key!r} is None; store '' or omit it")
            f.attrs[key] = value
        f.attrs["complete"] = False
        f.attrs["committed_rows"] = np.int64(0)
        acts = f.create_group("activations")
        for stage in layout.stages:
            k = stage_tokens(stage)
            group = acts.create_group(stage)
            group.attrs["tokens"] = k
            rows = _chunk_rows(k * layout.d_model * 2)
            for layer in layout.layers:
                row = (k, layout.d_model)
                _growable(group, layer_name(layer), row, ACTIVATION_DTYPE, rows, **filters)
            _growable(group, "positions", (k,), np.int32, _chunk_rows(4 * k))
            _growable(group, "present", (), np.bool_, _LABEL_CHUNK_ROWS)
        labels = f.create_group("labels")
        for name, spec in LABEL_FIELDS.items():
            dtype = h5py.string_dtype("utf-8") if spec.dtype is str else spec.dtype
            ds = _growable(labels, name, spec.shape, dtype, _LABEL_CHUNK_ROWS)
            ds.attrs["doc"] = spec.doc
        reasoning = f.create_group(REASONING)
        reasoning.attrs["every"] = int(layout.reasoning_every)
        reasoning.create_dataset(
            "offsets", data=np.zeros(1, dtype=np.int64), maxshape=(None,), chunks=(4096,)
        )
        _growable(reasoning, "length", (), np.int32, _LABEL_CHUNK_ROWS)
        rrows = _chunk_rows(layout.d_model * 2)
        for layer in layout.layers:
            _growable(
                reasoning, layer_name(layer), (layout.d_model,), ACTIVATION_DTYPE, rrows, **filters
            )
        for name, dtype in REASONING_FIELDS.items():
            _growable(reasoning, name, (), dtype, _LABEL_CHUNK_ROWS)
        self._reasoning_rows = 0
        labels["cell_types"].attrs["vocabulary"] = json.dumps({c.name: int(c) for c in CellType})
        labels["plan"].attrs["tokens"] = json.dumps(
            {"UP": 0, "DOWN": 1, "LEFT": 2, "RIGHT": 3, "END": PLAN_END, "PAD": PLAN_PAD}
        )
        f.flush()

    def append(self, batch: RowBatch) -> None:
        """Append ``batch``'s rows, then advance ``committed_rows`` and flush."""
        if self._finalized:
            raise RuntimeError(f"{self.path}: store already finalised")
        batch.check(self.layout)
        n = len(batch)
        if n == 0:
            return
        start, stop = self._rows, self._rows + n
        f = self._file
        for stage in self.layout.stages:
            group = f["activations"][stage]
            present = np.asarray(batch.present[stage], dtype=bool)
            for layer in self.layout.layers:
                acts = to_float16(batch.acts[stage][layer], f"acts[{stage!r}][{layer}]")
                acts[~present] = 0
                _write_rows(group[layer_name(layer)], start, acts)
            positions = np.asarray(batch.positions[stage], dtype=np.int32).copy()
            positions[~present] = 0
            _write_rows(group["positions"], start, positions)
            _write_rows(group["present"], start, present)
        self._append_reasoning(batch, n)
        for name, spec in LABEL_FIELDS.items():
            value = batch.labels[name]
            value = np.asarray(value, dtype=object) if spec.dtype is str else np.asarray(value)
            _write_rows(f["labels"][name], start, value)
        f.flush()
        f.attrs["committed_rows"] = np.int64(stop)
        f.flush()
        self._rows = stop

    def _append_reasoning(self, batch: RowBatch, n: int) -> None:
        rows = batch.reasoning
        if rows is None:
            rows = ReasoningRows.empty(n, self.layout.layers, self.layout.d_model)
        group = self._file[REASONING]
        counts = np.asarray(rows.counts, dtype=np.int64)
        lo = self._reasoning_rows
        for layer in self.layout.layers:
            acts = to_float16(rows.acts[layer], f"reasoning acts[{layer}]")
            _write_rows(group[layer_name(layer)], lo, acts)
        for name, dtype in REASONING_FIELDS.items():
            _write_rows(group[name], lo, np.asarray(getattr(rows, name), dtype=dtype))
        start = self._rows
        _write_rows(group["length"], start, np.asarray(rows.length, dtype=np.int32))
        _write_rows(group["offsets"], start + 1, lo + np.cumsum(counts))
        self._reasoning_rows = lo + int(counts.sum())

    def finalize(self) -> Path:
        """Mark the store complete and move it onto ``path`` atomically; returns ``path``."""
        if self._finalized:
            return self.path
        self._file.attrs["complete"] = True
        self._file.flush()
        self._file.close()
        with open(self.tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)
        self._finalized = True
        return self.path

    def abort(self) -> None:
        """Close and delete the temporary file (the destination is left untouched)."""
        if self._finalized:
            return
        if self._file.id.valid:
            self._file.close()
        self.tmp.unlink(missing_ok=True)
        self._finalized = True

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()
