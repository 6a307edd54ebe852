"""The versioned HDF5 activation store: layout, writer, reader, sharding and merge.

Layout and attributes: :mod:`goalprobe.activations.store.schema`. Typical use::

    store = ActivationStore("acts.h5")
    rows = store.select("pre_reasoning", sizes=[7, 9], grid_ids=train_grids)
    acts = store.read("pre_reasoning", 15, rows)  # (len(rows), 3, d_model) float16

Splits by grid are made where the data is read for training (:mod:`goalprobe.probes.splits`).
"""

from goalprobe.activations.store.merge import concatenate_stores, merge_shards
from goalprobe.activations.store.reader import ActivationStore, ReasoningIndex, read_rows
from goalprobe.activations.store.schema import (
    ALL_STAGES,
    ANCHOR_STAGES,
    GRID_CELLS,
    LABEL_FIELDS,
    SCHEMA,
    SCHEMA_VERSION,
    IncompleteStoreError,
    Shard,
    StoreFormatError,
    shard_of,
)
from goalprobe.activations.store.writer import ReasoningRows, RowBatch, StoreLayout, StoreWriter

__all__ = [
    "ALL_STAGES",
    "ANCHOR_STAGES",
    "GRID_CELLS",
    "LABEL_FIELDS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "ActivationStore",
    "IncompleteStoreError",
    "ReasoningIndex",
    "ReasoningRows",
    "RowBatch",
    "Shard",
    "StoreFormatError",
    "StoreLayout",
    "StoreWriter",
    "concatenate_stores",
    "merge_shards",
    "read_rows",
    "shard_of",
]
