"""The attribution file: ``<stem>.safetensors`` (the arrays of each
:class:`~goalprobe.probes.attribution.PairAttribution`, ``atp.i``, ``graddrop.i``, ...) +
``<stem>.json`` (the card: schema, the caller's ``meta`` and one ``records`` entry per record),
never pickle; the layout is in docs/formats.md, "Attribution".
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from goalprobe.probes.attribution import PairAttribution
from goalprobe.probes.serialization import check_schema, stem_paths

SCHEMA = "goalprobe.attribution"
"""``schema`` of the card and the safetensors metadata."""
SCHEMA_VERSION = 1
"""Layout version; bumped on any incompatible change."""

_ARRAYS = {
    "atp": np.float32,
    "graddrop": np.float32,
    "positions": np.int64,
    "cell_positions": np.int64,
    "readouts": np.int64,
}
"""The arrays of a record (``<name>.<index>`` in the safetensors file), in writing order."""
_CARD_FIELDS = (
    "pair_id", "grid_id", "kind", "moved", "metric", "layers", "metric_base", "metric_cf",
    "prompt_length", "pre_reasoning", "changed_cells",
)  # fmt: skip
"""The fields of a record in its card entry (then ``graddrop`` and ``grid_span``)."""


def write_attributions(
    path: str | os.PathLike, records: Sequence[PairAttribution], meta: dict
) -> tuple[Path, Path]:
    """Write ``records`` and ``meta``; returns both paths. The card is written last, so a file
    pair without its card is incomplete."""
    from safetensors.numpy import save

    tensors_path, card_path = stem_paths(path)
    tensors: dict[str, np.ndarray] = {}
    entries = []
    for i, r in enumerate(records):
        for name, dtype in _ARRAYS.items():
            value = getattr(r, name)
            if value is not None:
                tensors[f"{name}.{i}"] = np.ascontiguousarray(value, dtype=dtype)
        entry = {name: getattr(r, name) for name in _CARD_FIELDS}  # json writes tuples as lists
        entries.append(entry | {"graddrop": r.graddrop is not None, "grid_span": r.grid_span})
    tensors_path.parent.mkdir(parents=True, exist_ok=True)
    data = save(tensors, metadata={"schema": SCHEMA, "schema_version": str(SCHEMA_VERSION)})
    tensors_path.write_bytes(_sorted_metadata(data))
    card = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **meta, "records": entries}
    card_path.write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    return tensors_path, card_path


def _sorted_metadata(data: bytes) -> bytes:
    """``data`` (a safetensors file) with its header's ``__metadata__`` keys in sorted order:
    safetensors writes them in hash-map order, which differs between processes, so the same
    records would not give the same bytes. Same length (the header is re-padded with spaces, as
    the format allows)."""
    import struct

    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if len(text) > length:
        raise ValueError("the sorted safetensors header is longer than the original")
    return data[:8] + text.ljust(length, b" ") + data[8 + length :]


def read_attributions(path: str | os.PathLike) -> tuple[list[PairAttribution], dict]:
    """``(records, card)`` of an attribution file written by :func:`write_attributions`
    (ValueError naming the file on a bad schema or when card and arrays disagree)."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    tensors_path, card_path = stem_paths(path)
    card = json.loads(card_path.read_text(encoding="utf-8"))
    check_schema(card, SCHEMA, (SCHEMA_VERSION,), card_path)
    with safe_open(str(tensors_path), framework="numpy") as handle:
        check_schema(handle.metadata() or {}, SCHEMA, (SCHEMA_VERSION,), tensors_path)
    arrays = load_file(str(tensors_path))
    records = []
    for i, e in enumerate(card["records"]):
        try:
            fields = {name: e[name] for name in _CARD_FIELDS}
            fields.update({name: arrays[f"{name}.{i}"] for name in _ARRAYS if name != "graddrop"})
            fields["graddrop"] = arrays[f"graddrop.{i}"] if e["graddrop"] else None
            for name in ("atp", "graddrop"):
                if fields[name] is not None:
                    fields[name] = fields[name].astype(np.float64)
            fields["grid_span"] = e.get("grid_span", (0, 0))
            for name in ("layers", "pre_reasoning", "grid_span"):
                fields[name] = tuple(fields[name])
            fields["changed_cells"] = tuple(tuple(c) for c in e["changed_cells"])
            records.append(PairAttribution(**fields))
        except KeyError as err:
            raise ValueError(f"{tensors_path}: record {i} lacks {err}") from err
    return records, {k: v for k, v in card.items() if k != "records"}
