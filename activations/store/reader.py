"""Reading an activation store: validated on open (:class:`ActivationStore`), then only the
requested rows, in row-sorted spans."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
from goalprobe.activations.store.schema import (
    ALL_STAGES,
    CHAT_FORMAT_ATTR,
    DEFAULT_CHAT_FORMAT,
    LABEL_FIELDS,
    READABLE_VERSIONS,
    REASONING,
    REASONING_FIELDS,
    SCHEMA,
    IncompleteStoreError,
    StoreFormatError,
    layer_name,
    stage_tokens,
)
from goalprobe.activations.store.writer import ReasoningRows, RowBatch

if TYPE_CHECKING:
    from goalprobe.stats.shapes import ResidualActs, RowIndex, RowMask, TokenPositions

_SPAN_ROWS = 4096


def read_rows(ds: h5py.Dataset, rows: np.ndarray) -> np.ndarray:
    """``(M, ...)`` rows ``rows`` (any order, repeats allowed) of a dataset, read in sorted
    spans."""
    uniq, inverse = np.unique(np.asarray(rows, dtype=np.int64), return_inverse=True)
    got = np.empty((len(uniq), *ds.shape[1:]), dtype=ds.dtype)
    i = 0
    try:
        while i < len(uniq):
            lo = int(uniq[i])
            j = int(np.searchsorted(uniq, lo + _SPAN_ROWS, side="left"))
            block = uniq[i:j]
            hi = int(block[-1]) + 1
            got[i:j] = ds[lo:hi][block - lo] if len(block) * 4 >= hi - lo else ds[block]
            i = j
    except OSError as err:
        raise corrupt_store_error(ds.file.filename, f"dataset {ds.name}", err) from err
    return got[inverse]


def corrupt_store_error(path: str | os.PathLike, what: str, err: BaseException) -> StoreFormatError:
    """The error for an HDF5 read that failed inside a store that opened (corrupt bytes)."""
    return StoreFormatError(
        f"{path}: {what} cannot be read ({err}); the file is corrupt (an interrupted copy "
        "or a damaged disk?)"
    )


class ActivationStore:
    """Read-only view of one activation store file; ``attrs`` are its root attributes (JSON
    decoded). ``FileNotFoundError``, :class:`StoreFormatError` (foreign, truncated, another
    version, missing datasets) or :class:`IncompleteStoreError` before anything is read."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._present: dict[str, np.ndarray] = {}
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no such activation store")
        try:
            self._file = h5py.File(self.path, "r")
        except OSError as err:
            if not h5py.is_hdf5(self.path):
                raise StoreFormatError(
                    f"{self.path}: not an HDF5 file (a foreign file, or truncated before its "
                    "header); expected a goalprobe activation store"
                ) from err
            raise StoreFormatError(
                f"{self.path}: the HDF5 file cannot be opened ({err}); it is truncated or "
                "corrupt (an interrupted copy or write?)"
            ) from err
        try:
            self._validate()
        except (OSError, KeyError, RuntimeError) as err:  # h5py on damaged metadata
            self._file.close()
            raise corrupt_store_error(self.path, "its metadata", err) from err
        except BaseException:
            self._file.close()
            raise

    def _validate(self) -> None:
        f, path = self._file, self.path
        schema = f.attrs.get("schema")
        if schema != SCHEMA:
            raise StoreFormatError(
                f"{path}: not a goalprobe activation store (root attribute 'schema' is "
                f"{schema!r}, expected {SCHEMA!r})"
            )
        version = self._int_attr("schema_version", -1)
        if version not in READABLE_VERSIONS:
            raise StoreFormatError(
                f"{path}: store schema version {version}, this goalprobe reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
            )
        self.schema_version = version
        committed = self._int_attr("committed_rows", 0)
        if committed < 0:
            raise StoreFormatError(f"{path}: root attribute 'committed_rows' is {committed} < 0")
        if not bool(f.attrs.get("complete", False)):
            raise IncompleteStoreError(
                f"{path}: incomplete activation store ({committed} rows committed, 'complete' "
                "is False): the extraction writing it did not finish; rerun `goalprobe "
                "extract` with the same arguments to resume it"
            )
        self.attrs: dict[str, Any] = {}
        for key, value in f.attrs.items():
            if isinstance(value, str) and value[:1] in "[{":
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    pass
            elif isinstance(value, np.generic):
                value = value.item()
            self.attrs[key] = value
        self.n_rows = committed
        missing = [k for k in ("stages", "layers", "d_model") if k not in self.attrs]
        if missing:
            raise StoreFormatError(
                f"{path}: root attribute(s) {', '.join(map(repr, missing))} missing; the file "
                "claims the activation-store schema but was not written by `goalprobe extract`"
            )
        if not isinstance(self.attrs["stages"], list):
            raise StoreFormatError(
                f"{path}: root attribute 'stages' is {self.attrs['stages']!r}, expected a JSON list"
            )
        self.stages: tuple[str, ...] = tuple(self.attrs["stages"])
        unknown = [s for s in self.stages if s not in ALL_STAGES]
        if unknown or not self.stages:
            raise StoreFormatError(
                f"{path}: root attribute 'stages' is {self.attrs['stages']!r}; expected a "
                f"non-empty list of {', '.join(ALL_STAGES)}"
            )
        try:
            self.layers: tuple[int, ...] = tuple(int(x) for x in np.atleast_1d(f.attrs["layers"]))
        except (TypeError, ValueError) as err:
            raise StoreFormatError(
                f"{path}: root attribute 'layers' is {f.attrs['layers']!r}, expected integers"
            ) from err
        self.d_model = self._int_attr("d_model", -1)
        if not self.layers or self.d_model < 1:
            raise StoreFormatError(
                f"{path}: root attributes give no layers or d_model {self.d_model} < 1"
            )
        for stage in self.stages:
            row = (stage_tokens(stage), self.d_model)
            for layer in self.layers:
                self._check_dataset(f"activations/{stage}/{layer_name(layer)}", committed, row)
            for name in ("positions", "present"):
                self._check_dataset(f"activations/{stage}/{name}", committed)
        chat_format = self.attrs.get(CHAT_FORMAT_ATTR, DEFAULT_CHAT_FORMAT)
        if not isinstance(chat_format, dict) or not isinstance(chat_format.get("name"), str):
            raise StoreFormatError(
                f"{path}: root attribute {CHAT_FORMAT_ATTR!r} is {chat_format!r}, expected a "
                "JSON object with a 'name'"
            )
        self.chat_format: dict[str, Any] = dict(chat_format)
        self._check_reasoning(committed)
        for name in LABEL_FIELDS:
            self._check_dataset(f"labels/{name}", committed)

    def _check_dataset(
        self, key: str, rows: int, row_shape: tuple | None = None, of: str = "committed"
    ) -> None:
        """Raise :class:`StoreFormatError` unless dataset ``/key`` has at least ``rows`` rows
        (``of``: what they are) of ``row_shape`` (None: any)."""
        if key not in self._file:
            raise StoreFormatError(f"{self.path}: dataset /{key} is missing")
        shape = self._file[key].shape
        if shape[0] < rows:
            raise StoreFormatError(
                f"{self.path}: dataset /{key} has {shape[0]} rows, fewer than the {rows} {of}"
            )
        if row_shape is not None and shape[1:] != row_shape:
            raise StoreFormatError(
                f"{self.path}: dataset /{key} has row shape {shape[1:]}, expected {row_shape}"
            )

    def _check_reasoning(self, committed: int) -> None:
        f, path = self._file, self.path
        names = ("offsets", "length", *REASONING_FIELDS, *(layer_name(x) for x in self.layers))
        for name in names:
            if f"{REASONING}/{name}" not in f:
                raise StoreFormatError(f"{path}: dataset /{REASONING}/{name} is missing")
        group = f[REASONING]
        try:
            self.reasoning_every = int(group.attrs.get("every", -1))
            offsets = group["offsets"][: committed + 1].astype(np.int64)
        except (OSError, TypeError, ValueError) as err:
            raise corrupt_store_error(path, f"/{REASONING}", err) from err
        total = int(offsets[-1]) if len(offsets) else -1
        if (
            self.reasoning_every < 0
            or len(offsets) != committed + 1
            or offsets[0] != 0
            or (np.diff(offsets) < 0).any()
            or group["length"].shape[0] < committed
        ):
            raise StoreFormatError(
                f"{path}: /{REASONING} offsets or 'every' are inconsistent with the "
                f"{committed} committed rows"
            )
        for name in names[2:]:
            row = (self.d_model,) if name.startswith("layer_") else None
            self._check_dataset(
                f"{REASONING}/{name}", total, row, "reasoning rows its offsets name"
            )
        self._offsets = offsets

    def _int_attr(self, name: str, default: int) -> int:
        value = self._file.attrs.get(name, default)
        try:
            return int(value)
        except (TypeError, ValueError) as err:
            raise StoreFormatError(
                f"{self.path}: root attribute {name!r} is {value!r}, expected an integer"
            ) from err

    def __len__(self) -> int:
        return self.n_rows

    def __repr__(self) -> str:
        return (
            f"ActivationStore({str(self.path)!r}, rows={self.n_rows}, stages={self.stages}, "
            f"layers={self.layers}, d_model={self.d_model})"
        )

    def close(self) -> None:
        """Close the file."""
        if self._file.id.valid:
            self._file.close()

    def __enter__(self) -> ActivationStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_stage_layer(self, stage: str, layer: int | None) -> None:
        if stage not in self.stages:
            raise KeyError(f"{self.path}: no stage {stage!r}; the store holds {self.stages}")
        if layer is not None and int(layer) not in self.layers:
            raise KeyError(f"{self.path}: no layer {layer}; the store holds {self.layers}")

    def _rows(self, rows: Iterable[int] | np.ndarray | None) -> np.ndarray:
        if rows is None:
            return np.arange(self.n_rows, dtype=np.int64)
        arr = np.asarray(rows)
        if arr.dtype == bool:
            if arr.shape != (self.n_rows,):
                raise ValueError(
                    f"boolean row mask has shape {arr.shape}, expected ({self.n_rows},)"
                )
            return np.flatnonzero(arr).astype(np.int64)
        arr = arr.astype(np.int64).reshape(-1)
        if arr.size and (arr.min() < 0 or arr.max() >= self.n_rows):
            raise IndexError(
                f"{self.path}: rows must lie in [0, {self.n_rows}), got {arr.min()}..{arr.max()}"
            )
        return arr

    def labels(
        self, fields: Sequence[str] | None = None, rows: Iterable[int] | np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """``{field: (M, *shape)}`` label ``fields`` (default all) of ``rows`` (int rows or a bool
        mask; default all); strings as object arrays."""
        fields = list(LABEL_FIELDS) if fields is None else list(fields)
        unknown = [x for x in fields if x not in LABEL_FIELDS]
        if unknown:
            raise KeyError(f"unknown label field(s) {unknown}; known: {list(LABEL_FIELDS)}")
        idx = self._rows(rows)
        out = {}
        for name in fields:
            try:
                ds = self._file["labels"][name]
                if LABEL_FIELDS[name].dtype is str:
                    out[name] = np.asarray(ds.asstr()[: self.n_rows], dtype=object)[idx]
                else:
                    out[name] = read_rows(ds, idx) if rows is not None else ds[: self.n_rows]
            except (OSError, KeyError, UnicodeDecodeError) as err:
                raise corrupt_store_error(self.path, f"label field {name!r}", err) from err
        return out

    def present(self, stage: str) -> RowMask:
        """``(N,)`` bool: which rows hold ``stage`` (post-reasoning is absent without reasoning)."""
        self._check_stage_layer(stage, None)
        if stage not in self._present:
            try:
                ds = self._file["activations"][stage]["present"]
                self._present[stage] = ds[: self.n_rows].astype(bool)
            except (OSError, KeyError) as err:
                raise corrupt_store_error(self.path, f"/activations/{stage}/present", err) from err
        return self._present[stage].copy()

    def stages_with_rows(self) -> tuple[str, ...]:
        """The stored stages at least one row holds, in :attr:`stages` order."""
        return tuple(stage for stage in self.stages if self.present(stage).any())

    def positions(
        self, stage: str, rows: Iterable[int] | np.ndarray | None = None
    ) -> TokenPositions:
        """``(M, K)`` int32 token positions of ``stage`` in each row's replayed sequence."""
        self._check_stage_layer(stage, None)
        return read_rows(self._file["activations"][stage]["positions"], self._rows(rows))

    def select(
        self,
        stage: str | None = None,
        *,
        sizes: Iterable[int] | None = None,
        densities: Iterable[float] | None = None,
        grid_ids: Iterable[str] | None = None,
    ) -> RowIndex:
        """``(M,)`` int64 rows, ascending, that hold ``stage`` and whose grid size, density (1e-6
        tolerance) and grid id are among those given (None: any)."""
        mask = np.ones(self.n_rows, dtype=bool)
        if stage is not None:
            mask &= self.present(stage)
        if sizes is not None:
            mask &= np.isin(self.labels(["grid_size"])["grid_size"], np.asarray(list(sizes)))
        if densities is not None:
            dens = self.labels(["density"])["density"].astype(np.float64)
            wanted = np.asarray(list(densities), dtype=np.float64)
            mask &= np.isclose(dens[:, None], wanted[None, :], rtol=0, atol=1e-6).any(axis=1)
        if grid_ids is not None:
            wanted_ids = np.asarray(list(grid_ids), dtype=str)
            mask &= np.isin(self.labels(["grid_id"])["grid_id"].astype(str), wanted_ids)
        return np.flatnonzero(mask).astype(np.int64)

    def reasoning_offsets(self) -> np.ndarray:
        """``(N + 1,)`` int64: store row ``i``'s reasoning rows are ``[o[i], o[i + 1])``."""
        return self._offsets.copy()

    def reasoning_rows(self, rows: Iterable[int] | np.ndarray | None = None) -> ReasoningIndex:
        """The reasoning rows of store ``rows`` (int rows or a bool mask; default all), by row."""
        idx = self._rows(rows)
        starts, stops = self._offsets[idx], self._offsets[idx + 1]
        counts = stops - starts
        index = ragged_ranges(starts, counts)
        try:
            group = self._file[REASONING]
            meta = {name: read_rows(group[name], index) for name in REASONING_FIELDS}
            length = read_rows(group["length"], idx)
        except (OSError, KeyError) as err:
            raise corrupt_store_error(self.path, f"/{REASONING}", err) from err
        return ReasoningIndex(
            index, np.repeat(idx, counts), **meta, length=np.repeat(length, counts)
        )

    def read_reasoning(
        self,
        layer: int,
        index: np.ndarray,
        *,
        dtype: np.dtype | type | None = None,
    ) -> np.ndarray:
        """``(R, d_model)`` activations of reasoning rows ``index``
        (:attr:`ReasoningIndex.index`) after block ``layer``."""
        self._check_stage_layer(self.stages[0], layer)
        index = np.asarray(index, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= int(self._offsets[-1])):
            raise IndexError(
                f"{self.path}: reasoning rows must lie in [0, {int(self._offsets[-1])})"
            )
        out = read_rows(self._file[REASONING][layer_name(layer)], index)
        return out if dtype is None else out.astype(dtype)

    def read(
        self,
        stage: str,
        layer: int,
        rows: Iterable[int] | np.ndarray | None = None,
        *,
        dtype: np.dtype | type | None = None,
    ) -> ResidualActs:
        """``(M, K, d_model)`` activations of ``rows`` (int rows or a bool mask; default every row
        holding ``stage``; ValueError for a row that does not) at ``stage`` and ``layer``."""
        self._check_stage_layer(stage, layer)
        idx = self.select(stage) if rows is None else self._rows(rows)
        if rows is not None and idx.size:
            present = self.present(stage)
            if not present[idx].all():
                bad = idx[~present[idx]]
                raise ValueError(
                    f"{self.path}: {bad.size} requested row(s) hold no {stage} activations "
                    f"(first: row {bad[0]}); select rows with store.select({stage!r}, ...)"
                )
        out = read_rows(self._file["activations"][stage][layer_name(layer)], idx)
        return out if dtype is None else out.astype(dtype)

    def row_batch(self, rows: Iterable[int] | np.ndarray) -> RowBatch:
        """Everything stored for ``rows`` as a :class:`~goalprobe.activations.store.writer.RowBatch`
        (absent stages are zeros), for copying."""
        idx = self._rows(rows)
        acts: dict[str, dict[int, np.ndarray]] = {}
        positions: dict[str, np.ndarray] = {}
        present: dict[str, np.ndarray] = {}
        for stage in self.stages:
            group = self._file["activations"][stage]
            acts[stage] = {x: read_rows(group[layer_name(x)], idx) for x in self.layers}
            positions[stage] = read_rows(group["positions"], idx)
            present[stage] = read_rows(group["present"], idx).astype(bool)
        meta = self.reasoning_rows(idx)
        reasoning = ReasoningRows(
            counts=self._offsets[idx + 1] - self._offsets[idx],
            length=read_rows(self._file[REASONING]["length"], idx),
            positions=meta.positions,
            tokens=meta.tokens,
            fraction=meta.fraction,
            acts={x: self.read_reasoning(x, meta.index) for x in self.layers},
        )
        return RowBatch(acts, positions, present, self.labels(rows=idx), reasoning)


@dataclass(frozen=True)
class ReasoningIndex:
    """``(R,)`` reasoning rows of some store rows, by store row: ``index`` (for
    :meth:`ActivationStore.read_reasoning`), the store ``row`` and the fields of
    :class:`~goalprobe.activations.store.writer.ReasoningRows`, ``length`` repeated per row."""

    index: np.ndarray
    row: np.ndarray
    positions: np.ndarray
    tokens: np.ndarray
    fraction: np.ndarray
    length: np.ndarray

    def __len__(self) -> int:
        return len(self.index)


def ragged_ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``range(s, s + c)`` for each pair (int64)."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - np.cumsum(counts) + counts, counts)
    return np.arange(total, dtype=np.int64) + shift
