"""Persistence of fitted probes (safetensors + JSON card) and of decoded maps (HDF5).

Fitted probe: ``<stem>.safetensors`` holds every array of the fitted state (module weights,
standardisation, classes); ``<stem>.json`` is the card: estimator class, hyperparameters, fitted
scalars and training history, metrics, and the activations it was trained on (store path and
checksum, stage, layer). No pickle anywhere: :func:`load_probe` rebuilds the estimator from a
registry of known classes and restores the arrays bit for bit.

Decoded maps: an HDF5 file with ``probs (N, S, S, C)`` float16 and ``row_ids (N,)`` int64, and
file attributes ``schema`` (``"goalprobe.decoded_maps"``), ``schema_version``, ``classes`` (the
``CellType`` value of each probability column), ``probe_card`` (the card as JSON), ``family``
(see :func:`decoded_map_family`) and, when the card names them, ``stage`` and ``layer``.

This module imports torch and the estimators lazily, so reading decoded maps needs neither.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

CARD_SCHEMA = "goalprobe.probe_card"
CARD_SCHEMA_VERSION = 1
DECODED_MAPS_SCHEMA = "goalprobe.decoded_maps"
DECODED_MAPS_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ActivationSource:
    """Which activations a probe was trained on (written into its card).

    Attributes:
        store_path: path of the HDF5 activation store.
        store_checksum: checksum of the store (as reported by the store reader).
        stage: reasoning stage of the anchor tokens (e.g. ``"pre"`` or ``"post"``).
        layer: residual-stream layer.
    """

    store_path: str
    store_checksum: str
    stage: str
    layer: int


def _registry() -> dict[str, type]:
    from probes.cell_probes import CoordinateCellProbe, MajorityCellBaseline
    from probes.distance import GoalDistanceRegressor
    from probes.per_cell import PerCellProbe

    return {
        cls.__name__: cls
        for cls in (CoordinateCellProbe, PerCellProbe, MajorityCellBaseline, GoalDistanceRegressor)
    }


def _paths(path: str | Path) -> tuple[Path, Path]:
    p = Path(path)
    if p.suffix in (".safetensors", ".json"):
        p = p.with_suffix("")
    return p.with_suffix(".safetensors"), p.with_suffix(".json")


def _json_ready(value):
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def probe_card(
    probe,
    *,
    source: ActivationSource | None = None,
    metrics: dict | None = None,
) -> dict:
    """The JSON card of a fitted probe (what :func:`save_probe` writes next to the tensors).

    Args:
        probe: a fitted estimator of :mod:`probes`.
        source: the activations it was trained on (None: recorded as unknown).
        metrics: evaluation results to keep with it (JSON-ready).

    Returns:
        JSON-ready dict: ``schema``, ``schema_version``, ``class``, ``hyperparameters``,
        ``fitted`` (scalars, history and, for classifiers, ``classes_``), ``metrics``,
        ``activations``.
    """
    name = type(probe).__name__
    if name not in _registry():
        raise TypeError(f"{name} is not a goalprobe probe: expected one of {sorted(_registry())}")
    _, fitted = probe._fitted_state()
    card = {
        "schema": CARD_SCHEMA,
        "schema_version": CARD_SCHEMA_VERSION,
        "class": name,
        "hyperparameters": probe.get_params(deep=False),
        "fitted": fitted,
        "metrics": metrics,
        "activations": None if source is None else asdict(source),
    }
    return _json_ready(card)


def save_probe(
    probe,
    path: str | Path,
    *,
    source: ActivationSource | None = None,
    metrics: dict | None = None,
) -> Path:
    """Write a fitted probe as ``<stem>.safetensors`` plus the card ``<stem>.json``.

    Args:
        probe: a fitted estimator of :mod:`probes` (cell probes, baseline, distance regressor).
        path: the stem, or either file name.
        source: the activations it was trained on (None: recorded as unknown).
        metrics: evaluation results to keep with it (JSON-ready).

    Returns:
        The card's path.
    """
    from safetensors.numpy import save_file

    card = probe_card(probe, source=source, metrics=metrics)
    tensors, _ = probe._fitted_state()
    tensor_path, card_path = _paths(path)
    tensor_path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tensor_path))
    card["tensors"] = tensor_path.name
    card_path.write_text(json.dumps(card, indent=2, allow_nan=False) + "\n")
    return card_path


def read_probe_card(path: str | Path) -> dict:
    """The JSON card of a saved probe (``path``: stem or either file)."""
    _, card_path = _paths(path)
    if not card_path.exists():
        raise FileNotFoundError(f"no probe card at {card_path}")
    try:
        card = json.loads(card_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{card_path}: not valid JSON (line {err.lineno}): {err.msg}") from err
    if card.get("schema") != CARD_SCHEMA:
        raise ValueError(f"{card_path}: schema is {card.get('schema')!r}, expected {CARD_SCHEMA!r}")
    if card.get("schema_version") != CARD_SCHEMA_VERSION:
        raise ValueError(
            f"{card_path}: schema_version {card.get('schema_version')!r} is not supported "
            f"(this goalprobe reads {CARD_SCHEMA_VERSION})"
        )
    return card


def load_probe(path: str | Path):
    """Rebuild a probe saved by :func:`save_probe`; predictions match the saved one exactly.

    Args:
        path: the stem, or either file name.

    Returns:
        The fitted estimator.
    """
    from safetensors.numpy import load_file

    card = read_probe_card(path)
    tensor_path, card_path = _paths(path)
    registry = _registry()
    if card["class"] not in registry:
        raise ValueError(f"{card_path}: unknown probe class {card['class']!r}")
    cls = registry[card["class"]]
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in card["hyperparameters"].items()}
    probe = cls(**params)
    probe._restore(load_file(str(tensor_path)), card["fitted"])
    return probe


@dataclass(frozen=True)
class DecodedMaps:
    """Decoded cognitive maps read back from HDF5.

    Attributes:
        probs: ``(N, S, S, C)`` float16 class probabilities.
        row_ids: ``(N,)`` int64 store rows they were decoded from.
        classes: ``(C,)`` uint8 ``CellType`` of each probability column.
        card: the card of the probe that decoded them.
        schema_version: the file's schema version.
    """

    probs: np.ndarray
    row_ids: np.ndarray
    classes: np.ndarray
    card: dict
    schema_version: int


def write_decoded_maps(
    path: str | Path, probs: np.ndarray, row_ids: np.ndarray, card: dict
) -> Path:
    """Write decoded maps to HDF5.

    Args:
        path: output file.
        probs: ``(N, S, S, C)`` probabilities (stored as float16).
        row_ids: ``(N,)`` int store rows the maps were decoded from.
        card: the decoding probe's card (:func:`probe_card` or :func:`read_probe_card`); its
            ``fitted.classes_`` names the ``CellType`` of each probability column.

    Returns:
        ``path``.
    """
    import h5py

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
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(out, "w") as f:
        f.attrs["schema"] = DECODED_MAPS_SCHEMA
        f.attrs["schema_version"] = DECODED_MAPS_SCHEMA_VERSION
        f.attrs["classes"] = np.asarray(classes, dtype=np.uint8)
        f.attrs["probe_card"] = json.dumps(_json_ready(card), allow_nan=False)
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
    """Short label of the decoding probe (file attribute ``family``, used by the viewer).

    ``"mlp"`` / ``"linear"`` for the study's coordinate-conditioned probe, ``"per_cell_mlp"`` /
    ``"per_cell_linear"`` for per-cell probes, ``"majority"`` for the baseline.
    """
    family = (card.get("hyperparameters") or {}).get("family")
    name = card.get("class")
    if name == "MajorityCellBaseline":
        return "majority"
    if name == "PerCellProbe":
        return f"per_cell_{family}"
    return str(family or name or "probe")


def read_decoded_maps(path: str | Path) -> DecodedMaps:
    """Read a file written by :func:`write_decoded_maps` (checks schema and shapes)."""
    import h5py

    p = Path(path)
    with h5py.File(p, "r") as f:
        schema = f.attrs.get("schema")
        if schema != DECODED_MAPS_SCHEMA:
            raise ValueError(
                f"{p}: schema attribute is {schema!r}, expected {DECODED_MAPS_SCHEMA!r}"
            )
        version = int(f.attrs["schema_version"])
        if version != DECODED_MAPS_SCHEMA_VERSION:
            raise ValueError(
                f"{p}: schema_version {version} is not supported (reads {DECODED_MAPS_SCHEMA_VERSION})"
            )
        for name in ("probs", "row_ids"):
            if name not in f:
                raise ValueError(f"{p}: missing dataset {name!r}")
        probs = f["probs"][...]
        row_ids = f["row_ids"][...]
        classes = np.asarray(f.attrs["classes"], dtype=np.uint8)
        card = json.loads(f.attrs["probe_card"])
    if probs.shape[0] != row_ids.shape[0] or probs.shape[3] != len(classes):
        raise ValueError(
            f"{p}: probs {probs.shape}, row_ids {row_ids.shape} and {len(classes)} classes disagree"
        )
    return DecodedMaps(
        probs=probs, row_ids=row_ids, classes=classes, card=card, schema_version=version
    )
