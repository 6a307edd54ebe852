"""Joining stores: concatenation (extraction parts) and merging of shards (``goalprobe merge``),
both into one new self-contained store, block by block, through the atomic
:class:`~goalprobe.activations.store.writer.StoreWriter`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from goalprobe.activations.store.reader import ActivationStore, ragged_ranges
from goalprobe.activations.store.schema import StoreFormatError, shard_of, stage_tokens
from goalprobe.activations.store.writer import (
    ReasoningRows,
    RowBatch,
    StoreLayout,
    StoreWriter,
    utc_now,
)

_BLOCK_BYTES = 64 << 20

_MATCHING_ATTRS: tuple[str, ...] = (
    "model_id",
    "model_revision",
    "backend",
    "trajectory_sha256",
    "trajectory_steps",
    "shard_count",
    "d_model",
    "attention",
    "compute",
)


def _layout(store: ActivationStore) -> StoreLayout:
    return StoreLayout(store.stages, store.layers, store.d_model, store.reasoning_every)


def _check_layout(store: ActivationStore, ref: ActivationStore) -> None:
    if _layout(store) != _layout(ref):
        raise StoreFormatError(
            f"{store.path}: layout {_layout(store)} differs from {ref.path}'s {_layout(ref)}"
        )


def _block_rows(layout: StoreLayout) -> int:
    row_bytes = sum(stage_tokens(s) for s in layout.stages) * len(layout.layers) * layout.d_model
    return int(max(1, min(4096, _BLOCK_BYTES // max(1, 2 * row_bytes))))


def concatenate_stores(
    sources: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    attrs: Mapping[str, Any],
    *,
    order: np.ndarray | None = None,
    compression: str = "none",
) -> Path:
    """Write the rows of ``sources`` (complete stores of one layout), in concatenation order or the
    permutation ``order``, into ``output`` with root ``attrs``; returns ``output``."""
    stores = [ActivationStore(p) for p in sources]
    try:
        if not stores:
            raise ValueError("nothing to concatenate: no source stores")
        layout = _layout(stores[0])
        for store in stores[1:]:
            _check_layout(store, stores[0])
        sizes = np.asarray([len(s) for s in stores], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        total = int(offsets[-1])
        order = np.arange(total) if order is None else np.asarray(order, dtype=np.int64)
        if order.shape != (total,) or not np.array_equal(np.sort(order), np.arange(total)):
            raise ValueError(f"order must be a permutation of the {total} source rows")
        which = np.searchsorted(offsets, order, side="right") - 1
        local = order - offsets[which]
        block = _block_rows(layout)
        with StoreWriter(output, layout, attrs, compression=compression) as writer:
            for start in range(0, total, block):
                w, loc = which[start : start + block], local[start : start + block]
                pieces = []
                for s in np.unique(w):
                    sel = np.flatnonzero(w == s)
                    pieces.append((sel, stores[s].row_batch(loc[sel])))
                writer.append(_assemble(pieces))
        return Path(output)
    finally:
        for store in stores:
            store.close()


def _assemble(pieces: list[tuple[np.ndarray, RowBatch]]) -> RowBatch:
    """One RowBatch from ``(rows_in_block, RowBatch)`` pieces, in block row order."""
    order = np.argsort(np.concatenate([sel for sel, _ in pieces]))
    batches = [batch for _, batch in pieces]
    reasoning = [b.reasoning for b in batches if b.reasoning is not None]  # row_batch's: all
    counts = np.concatenate([r.counts for r in reasoning]).astype(np.int64)
    gather = ragged_ranges((np.cumsum(counts) - counts)[order], counts[order])

    def cat(items, get, take=order):
        return np.concatenate([get(item) for item in items], axis=0)[take]

    first = batches[0]
    return RowBatch(
        acts={
            stage: {x: cat(batches, lambda b, s=stage, x=x: b.acts[s][x]) for x in layers}
            for stage, layers in first.acts.items()
        },
        positions={s: cat(batches, lambda b, s=s: b.positions[s]) for s in first.positions},
        present={s: cat(batches, lambda b, s=s: b.present[s]) for s in first.present},
        labels={k: cat(batches, lambda b, k=k: b.labels[k]) for k in first.labels},
        reasoning=ReasoningRows(
            counts=counts[order],
            length=cat(reasoning, lambda r: r.length),
            positions=cat(reasoning, lambda r: r.positions, gather),
            tokens=cat(reasoning, lambda r: r.tokens, gather),
            fraction=cat(reasoning, lambda r: r.fraction, gather),
            acts={x: cat(reasoning, lambda r, x=x: r.acts[x], gather) for x in reasoning[0].acts},
        ),
    )


def merge_shards(
    shards: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    compression: str | None = None,
) -> Path:
    """Merge the shard stores (any order) of one extraction into ``output`` in trajectory-file
    order; :class:`StoreFormatError` naming the file, shard or step unless they share trajectory
    file, model and layout and hold shards ``0 .. N-1`` and every step exactly once."""
    paths = [Path(p) for p in shards]
    if not paths:
        raise ValueError("no shard stores to merge")
    stores = [ActivationStore(p) for p in paths]
    try:
        ref = stores[0]
        for store in stores[1:]:
            for key in _MATCHING_ATTRS:
                if store.attrs.get(key) != ref.attrs.get(key):
                    raise StoreFormatError(
                        f"{store.path}: attribute {key!r} is {store.attrs.get(key)!r} but "
                        f"{ref.path} has {ref.attrs.get(key)!r}; these are not shards of one "
                        "extraction"
                    )
            _check_layout(store, ref)
        count = int(ref.attrs["shard_count"])
        seen: dict[int, Path] = {}
        for store in stores:
            index = int(store.attrs["shard_index"])
            if index in seen:
                raise StoreFormatError(
                    f"shard {index}/{count} given twice: {seen[index]} and {store.path}"
                )
            seen[index] = store.path
        missing = sorted(set(range(count)) - set(seen))
        if missing:
            raise StoreFormatError(
                f"shard(s) {', '.join(f'{i}/{count}' for i in missing)} missing; got "
                f"{len(seen)} of {count} shard files"
            )
        step_index = []
        for store in stores:
            labels = store.labels(["grid_id", "step_index"])
            index = int(store.attrs["shard_index"])
            for grid in np.unique(labels["grid_id"].astype(str)):
                if shard_of(grid, count) != index:
                    raise StoreFormatError(
                        f"{store.path}: grid {grid!r} belongs to shard "
                        f"{shard_of(grid, count)}/{count}, not {index}/{count}"
                    )
            step_index.append(labels["step_index"].astype(np.int64))
        all_steps = np.concatenate(step_index)
        expected = int(ref.attrs["trajectory_steps"])
        values, counts = np.unique(all_steps, return_counts=True)
        if (counts > 1).any():
            dup = int(values[counts > 1][0])
            owners = [str(s.path) for s, idx in zip(stores, step_index, strict=True) if dup in idx]
            raise StoreFormatError(
                f"step {dup} of the trajectory file appears {int(counts[values == dup][0])} "
                f"times (in {', '.join(owners)})"
            )
        if len(values) != expected or (len(values) and (values[0] < 0 or values[-1] >= expected)):
            lost = np.setdiff1d(np.arange(expected), values)
            raise StoreFormatError(
                f"the shards hold {len(values)} of the {expected} steps of the trajectory file; "
                f"missing step indices start {lost[:5].tolist()}"
            )
        ordered = sorted(range(len(stores)), key=lambda i: int(stores[i].attrs["shard_index"]))
        attrs = {k: v for k, v in ref.attrs.items() if k not in _OWN_ATTRS}
        attrs.update(
            shard_index=0,
            shard_count=1,
            merged_from=[paths[i].name for i in ordered],
            merged=utc_now(),
        )
        if any("part_batching" in s.attrs for s in stores):  # each shard's parts, in order
            attrs["part_batching"] = [
                b for i in ordered for b in (stores[i].attrs.get("part_batching") or [])
            ]
        order = np.argsort(np.concatenate([step_index[i] for i in ordered]), kind="stable")
        sources = [paths[i] for i in ordered]
        if compression is None:
            compression = str(ref.attrs.get("compression", "none"))
    finally:
        for store in stores:
            store.close()
    return concatenate_stores(sources, output, attrs, order=order, compression=compression)


_OWN_ATTRS = frozenset(
    {
        "schema",
        "schema_version",
        "complete",
        "committed_rows",
        "created",
        "layers",
        "stages",
        "d_model",
        "compression",
        "package_version",
    }
)
