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
from goalprobe.probes.serialization import check_schema

SCHEMA = "goalprobe.attribution"
"""``schema`` of the card and the safetensors metadata."""
SCHEMA_VERSION = 1
"""Layout version; bumped on any incompatible change."""


def attribution_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(<stem>.safetensors, <stem>.json)`` of ``path`` (with or without a suffix)."""
    stem = Path(path)
    if stem.suffix in (".safetensors", ".json"):
        stem = stem.with_suffix("")
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def write_attributions(
    path: str | os.PathLike, records: Sequence[PairAttribution], meta: dict
) -> tuple[Path, Path]:
    """Write ``records`` and ``meta``; returns both paths. The card is written last, so a file
    pair without its card is incomplete."""
    from safetensors.numpy import save

    tensors_path, card_path = attribution_paths(path)
    tensors: dict[str, np.ndarray] = {}
    entries = []
    for i, r in enumerate(records):
        tensors[f"atp.{i}"] = np.ascontiguousarray(r.atp, dtype=np.float32)
        if r.graddrop is not None:
            tensors[f"graddrop.{i}"] = np.ascontiguousarray(r.graddrop, dtype=np.float32)
        tensors[f"positions.{i}"] = np.ascontiguousarray(r.positions, dtype=np.int64)
        tensors[f"cell_positions.{i}"] = np.ascontiguousarray(r.cell_positions, dtype=np.int64)
        tensors[f"readouts.{i}"] = np.ascontiguousarray(r.readouts, dtype=np.int64)
        entries.append(
            {
                "pair_id": r.pair_id,
                "grid_id": r.grid_id,
                "kind": r.kind,
                "moved": r.moved,
                "metric": r.metric,
                "layers": list(r.layers),
                "metric_base": r.metric_base,
                "metric_cf": r.metric_cf,
                "prompt_length": r.prompt_length,
                "pre_reasoning": list(r.pre_reasoning),
                "changed_cells": [list(c) for c in r.changed_cells],
                "graddrop": r.graddrop is not None,
                "grid_span": list(r.grid_span),
            }
        )
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

    tensors_path, card_path = attribution_paths(path)
    card = json.loads(card_path.read_text(encoding="utf-8"))
    check_schema(card, SCHEMA, (SCHEMA_VERSION,), card_path)
    with safe_open(str(tensors_path), framework="numpy") as handle:
        check_schema(handle.metadata() or {}, SCHEMA, (SCHEMA_VERSION,), tensors_path)
    arrays = load_file(str(tensors_path))
    records = []
    for i, e in enumerate(card["records"]):
        try:
            records.append(
                PairAttribution(
                    **{k: e[k] for k in ("pair_id", "grid_id", "kind", "moved", "metric")},
                    layers=tuple(e["layers"]),
                    positions=arrays[f"positions.{i}"],
                    atp=arrays[f"atp.{i}"].astype(np.float64),
                    graddrop=arrays[f"graddrop.{i}"].astype(np.float64) if e["graddrop"] else None,
                    metric_base=float(e["metric_base"]),
                    metric_cf=float(e["metric_cf"]),
                    prompt_length=int(e["prompt_length"]),
                    cell_positions=arrays[f"cell_positions.{i}"],
                    pre_reasoning=tuple(e["pre_reasoning"]),
                    changed_cells=tuple(tuple(c) for c in e["changed_cells"]),
                    readouts=arrays[f"readouts.{i}"],
                    grid_span=tuple(e.get("grid_span", (0, 0))),
                )
            )
        except KeyError as err:
            raise ValueError(f"{tensors_path}: record {i} lacks {err}") from err
    return records, {k: v for k, v in card.items() if k != "records"}
