"""Persistence of fitted probes and plan decoders (safetensors + JSON card), of decoded maps and
of predicted plans (HDF5).

Fitted probe: ``<stem>.safetensors`` holds every array of the fitted state (module weights,
standardisation, classes); ``<stem>.json`` is the card: estimator class, hyperparameters, fitted
scalars and training history, metrics, and the activations it was trained on (store path and
checksum, stage, layer). No pickle anywhere: :func:`load_probe` rebuilds the estimator from a
registry of known classes and restores the arrays bit for bit.

Decoded maps: an HDF5 file with ``probs (N, S, S, C)`` float16 and ``row_ids (N,)`` int64, and
file attributes ``schema`` (``"goalprobe.decoded_maps"``), ``schema_version``, ``classes`` (the
``CellType`` value of each probability column), ``probe_card`` (the card as JSON), ``family``
(see :func:`decoded_map_family`) and, when the card names them, ``stage`` and ``layer``.
Version 2 adds ``readout`` (JSON: which read-out produced the cells, the agent and the goal,
:class:`goalprobe.probes.decoder.Readout`), optional ``agent_probs`` / ``goal_probs``
``(N, S, S)`` float16 (the position probes' cell distributions) and optional ``role`` and
``trained_on`` attributes (``headline`` / ``probing`` for the maps ``goalprobe score`` reads
first); version 1 files read with agent and goal from the cell probe.

Plan decoder (:class:`goalprobe.probes.plan_decoder.PlanDecoder`): ``<stem>.safetensors`` holds the
network weights (``network.*``) and the input standardisation (``input_mean``, ``input_scale``),
with ``schema`` / ``schema_version`` in its metadata; ``<stem>.json`` is its card
(:func:`save_plan_decoder`): hyperparameters, fitted scalars and history, plan tokens, metrics
and provenance (store, stage, layer, kind, split).

Step maps: decoded maps keyed by trajectory step rather than store row (:func:`write_step_maps`:
``probs (N, S, S, C)`` float16, ``grid_id``, ``episode``, ``step`` ``(N,)``; attributes
``schema`` ``"goalprobe.step_maps"``, ``schema_version``, ``classes`` and free scalars such as
``stage``, ``layer``, ``probe``), for maps decoded from a store of their own (the false-belief
episodes' visited states).

Predicted plans: an HDF5 file with one group ``runs/<run>`` per decoder run
(:func:`write_predicted_plans`), read by the viewer.

This module imports torch and the estimators lazily, so reading decoded maps or predicted plans
needs neither.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import numpy as np
from goalprobe.probes.plan_metrics import PLAN_TOKENS, validate_plans

CARD_SCHEMA = "goalprobe.probe_card"
CARD_SCHEMA_VERSION = 1
DECODED_MAPS_SCHEMA = "goalprobe.decoded_maps"
DECODED_MAPS_SCHEMA_VERSION = 2
"""Version 2 adds the optional ``agent_probs`` / ``goal_probs`` datasets (the position probes'
cell distributions) and the ``readout`` attribute (:class:`goalprobe.probes.decoder.Readout`);
version-1 files still read (agent and goal from the cell probe's channels)."""
PLAN_CARD_SCHEMA = "goalprobe.plan_decoder"
"""``schema`` field of a plan-decoder JSON card and safetensors metadata."""
PLAN_CARD_SCHEMA_VERSION = 1
"""Version of the plan-decoder card / safetensors layout; bumped on any incompatible change."""
PREDICTED_PLANS_SCHEMA = "goalprobe.predicted_plans"
"""``schema`` attribute of a predicted-plans HDF5 file."""
PREDICTED_PLANS_SCHEMA_VERSION = 1
"""Version of the predicted-plans HDF5 layout."""
SPLIT_NAMES: tuple[str, ...] = ("train", "validation", "test")
"""Meaning of the ``split`` codes 0, 1, 2 in predicted-plans files."""
RENAMED_PLAN_DECODER_PARAMS: dict[str, str] = {
    "lr": "learning_rate",
    "patience": "n_iter_no_change",
}
"""Hyperparameter names of plan-decoder cards written before the decoder took the probes'
scikit-learn names, and their names now (same meaning; such cards still load)."""


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
    from goalprobe.probes.cell_probes import CoordinateCellProbe, MajorityCellBaseline
    from goalprobe.probes.distance import GoalDistanceRegressor
    from goalprobe.probes.per_cell import PerCellProbe
    from goalprobe.probes.position import PositionProbe

    return {
        cls.__name__: cls
        for cls in (
            CoordinateCellProbe,
            PerCellProbe,
            MajorityCellBaseline,
            GoalDistanceRegressor,
            PositionProbe,
        )
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
    return _read_card(card_path, "probe card", CARD_SCHEMA, CARD_SCHEMA_VERSION)


def _read_card(path: Path, what: str, schema: str, version: int) -> dict:
    """A JSON card at ``path``, checked for its ``schema`` and ``schema_version``."""
    if not path.exists():
        raise FileNotFoundError(f"no {what} at {path}")
    try:
        card = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON (line {err.lineno}): {err.msg}") from err
    if card.get("schema") != schema:
        raise ValueError(f"{path}: schema is {card.get('schema')!r}, expected {schema!r}")
    if card.get("schema_version") != version:
        raise ValueError(
            f"{path}: schema_version {card.get('schema_version')!r} is not supported "
            f"(this goalprobe reads {version})"
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
        agent, goal: ``(N, S, S)`` float16 cell distributions of the agent and the goal (the
            position probes' read-out), or None (read from the cell probe's channels).
        readout: which read-out produced each part
            (:class:`goalprobe.probes.decoder.Readout`).
        attrs: the optional ``role`` / ``trained_on`` attributes.
    """

    probs: np.ndarray
    row_ids: np.ndarray
    classes: np.ndarray
    card: dict
    schema_version: int
    agent: np.ndarray | None = None
    goal: np.ndarray | None = None
    readout: object = None
    attrs: dict | None = None


def write_decoded_maps(
    path: str | Path,
    probs: np.ndarray,
    row_ids: np.ndarray,
    card: dict,
    *,
    agent: np.ndarray | None = None,
    goal: np.ndarray | None = None,
    readout=None,
    **attrs,
) -> Path:
    """Write decoded maps to HDF5 (schema version 2).

    Args:
        path: output file.
        probs: ``(N, S, S, C)`` probabilities (stored as float16).
        row_ids: ``(N,)`` int store rows the maps were decoded from.
        card: the decoding probe's card (:func:`probe_card` or :func:`read_probe_card`); its
            ``fitted.classes_`` names the ``CellType`` of each probability column.
        agent, goal: optional ``(N, S, S)`` cell distributions of the agent and the goal
            (the position probes' read-out).
        readout: a :class:`goalprobe.probes.decoder.Readout` (None: every part from the
            cell probe).
        **attrs: further scalar attributes (``role``, ``trained_on``).

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
    from goalprobe.probes.decoder import Readout

    for name, extra in (("agent", agent), ("goal", goal)):
        if extra is not None and np.shape(extra) != p.shape[:3]:
            raise ValueError(f"{name} must have shape {p.shape[:3]}, got {np.shape(extra)}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(out, "w") as f:
        f.attrs["schema"] = DECODED_MAPS_SCHEMA
        f.attrs["schema_version"] = DECODED_MAPS_SCHEMA_VERSION
        f.attrs["readout"] = (readout or Readout()).to_json()
        for name, value in attrs.items():
            f.attrs[name] = value
        for name, extra in (("agent_probs", agent), ("goal_probs", goal)):
            if extra is not None:
                f.create_dataset(
                    name, data=np.asarray(extra).astype(np.float16), compression="gzip"
                )
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
    """Read a file written by :func:`write_decoded_maps` (checks schema and shapes; version-1
    files read with ``agent``/``goal`` None and the cell read-out)."""
    import h5py
    from goalprobe.probes.decoder import Readout

    p = Path(path)
    with h5py.File(p, "r") as f:
        schema = f.attrs.get("schema")
        if schema != DECODED_MAPS_SCHEMA:
            raise ValueError(
                f"{p}: schema attribute is {schema!r}, expected {DECODED_MAPS_SCHEMA!r}"
            )
        version = int(f.attrs["schema_version"])
        if version not in (1, DECODED_MAPS_SCHEMA_VERSION):
            raise ValueError(
                f"{p}: schema_version {version} is not supported (reads 1 and "
                f"{DECODED_MAPS_SCHEMA_VERSION})"
            )
        for name in ("probs", "row_ids"):
            if name not in f:
                raise ValueError(f"{p}: missing dataset {name!r}")
        probs = f["probs"][...]
        row_ids = f["row_ids"][...]
        classes = np.asarray(f.attrs["classes"], dtype=np.uint8)
        card = json.loads(f.attrs["probe_card"])
        agent = f["agent_probs"][...] if "agent_probs" in f else None
        goal = f["goal_probs"][...] if "goal_probs" in f else None
        readout = Readout.from_json(f.attrs.get("readout"))
        extra = {k: f.attrs[k] for k in ("role", "trained_on") if k in f.attrs}
    for name, value in (("agent_probs", agent), ("goal_probs", goal)):
        if value is not None and value.shape != probs.shape[:3]:
            raise ValueError(f"{p}: {name} {value.shape} disagrees with probs {probs.shape}")
    if probs.shape[0] != row_ids.shape[0] or probs.shape[3] != len(classes):
        raise ValueError(
            f"{p}: probs {probs.shape}, row_ids {row_ids.shape} and {len(classes)} classes disagree"
        )
    return DecodedMaps(
        probs=probs,
        row_ids=row_ids,
        classes=classes,
        card=card,
        schema_version=version,
        agent=agent,
        goal=goal,
        readout=readout,
        attrs=extra,
    )


STEP_MAPS_SCHEMA = "goalprobe.step_maps"
"""``schema`` attribute of a step-maps HDF5 file (decoded maps keyed by trajectory step)."""
STEP_MAPS_SCHEMA_VERSION = 2
"""Version of the step-maps HDF5 layout: 2 adds optional ``agent_probs`` / ``goal_probs`` and the
``readout`` attribute, as decoded maps' version 2; version 1 still reads."""


@dataclass(frozen=True, eq=False)
class StepMaps:
    """Decoded maps of trajectory steps read back from HDF5 (:func:`read_step_maps`).

    Attributes:
        probs: ``(N, S, S, C)`` float16 class probabilities.
        grid_id, episode, step: ``(N,)`` the trajectory step of each map.
        classes: ``(C,)`` uint8 ``CellType`` of each probability column.
        attrs: the file's other attributes (``stage``, ``layer``, ``probe``, ``readout``, ...).
        agent, goal: ``(N, S, S)`` position read-outs, or None (version 1, or none written).
    """

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
    """Write decoded maps keyed by trajectory step (for maps decoded outside the activation
    store's rows, e.g. the false-belief episodes' visited states).

    Args:
        path: output file.
        keys: ``(N,)`` ``(grid_id, episode, step)`` of each map.
        probs: ``(N, S, S, C)`` probabilities (stored as float16).
        classes: ``(C,)`` the ``CellType`` of each probability column.
        agent, goal: optional ``(N, S, S)`` cell distributions (the position probes').
        **attrs: further scalar attributes (``stage``, ``layer``, ``probe``, ``readout``).

    Returns:
        ``path``.
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
        if f.attrs.get("schema") != STEP_MAPS_SCHEMA:
            raise ValueError(
                f"{p}: schema attribute is {f.attrs.get('schema')!r}, expected {STEP_MAPS_SCHEMA!r}"
            )
        version = int(f.attrs["schema_version"])
        if version not in (1, STEP_MAPS_SCHEMA_VERSION):
            raise ValueError(f"{p}: schema_version {version} is not supported")
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


# --------------------------------------------------------------------------------------------
# Plan decoders


def save_plan_decoder(
    decoder,
    path: str | Path,
    *,
    metrics: dict | None = None,
    provenance: dict | None = None,
) -> Path:
    """Write a fitted plan decoder as ``<path>`` (safetensors) plus its card (suffix ``.json``).

    Args:
        decoder: a fitted :class:`goalprobe.probes.plan_decoder.PlanDecoder`.
        path: the ``.safetensors`` file to write.
        metrics: JSON-ready evaluation results to record in the card.
        provenance: where the training data came from (store file, stage, layer, split).

    Returns:
        The card's path.
    """
    import torch
    from safetensors.numpy import save_file

    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"{path}: a plan decoder is saved to a .safetensors file")
    tensors, fitted = decoder._fitted_state()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v) for k, v in tensors.items()},
        str(path),
        metadata={"schema": PLAN_CARD_SCHEMA, "schema_version": str(PLAN_CARD_SCHEMA_VERSION)},
    )
    card = {
        "schema": PLAN_CARD_SCHEMA,
        "schema_version": PLAN_CARD_SCHEMA_VERSION,
        "estimator": f"{type(decoder).__module__}.{type(decoder).__name__}",
        "weights_file": path.name,
        "weights_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"goalprobe": _version("goalprobe"), "torch": torch.__version__},
        "hyperparameters": decoder.get_params(deep=False),
        "fitted": fitted,
        "tokens": PLAN_TOKENS,
        "metrics": metrics or {},
        "provenance": provenance or {},
    }
    card_path = path.with_suffix(".json")
    card_path.write_text(json.dumps(_json_ready(card), indent=2, allow_nan=False) + "\n")
    return card_path


def read_plan_decoder_card(path: str | Path) -> dict:
    """Read and check a plan-decoder JSON card (``path``: the card or its ``.safetensors``)."""
    path = Path(path).with_suffix(".json")
    card = _read_card(path, "plan-decoder card", PLAN_CARD_SCHEMA, PLAN_CARD_SCHEMA_VERSION)
    for key in ("hyperparameters", "fitted"):
        if key not in card:
            raise ValueError(f"{path}: field {key!r} is missing")
    return card


def load_plan_decoder(path: str | Path, *, device: str | None = None):
    """Rebuild a decoder written by :func:`save_plan_decoder`; it predicts as the saved one.

    Args:
        path: the ``.safetensors`` file (its card is the same path with suffix ``.json``).
        device: overrides the saved ``device`` hyperparameter (e.g. ``"cpu"``).

    Returns:
        A fitted :class:`goalprobe.probes.plan_decoder.PlanDecoder`.
    """
    from goalprobe.probes.plan_decoder import PlanDecoder
    from safetensors.numpy import load_file

    path = Path(path)
    card = read_plan_decoder_card(path)
    params = {RENAMED_PLAN_DECODER_PARAMS.get(k, k): v for k, v in card["hyperparameters"].items()}
    if device is not None:
        params["device"] = device
    decoder = PlanDecoder(**params)
    try:
        decoder._restore(load_file(str(path)), card["fitted"])
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
    return decoder


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------------------------
# Predicted plans (for the viewer)


@dataclass(frozen=True, eq=False)
class PredictedPlans:
    """One run's predicted plans as stored in HDF5.

    Attributes:
        plans: ``(N, T)`` int8 predicted plans (plan format).
        row_ids: ``(N,)`` int64 rows of the activation store they were predicted for.
        split: ``(N,)`` int8 codes into :data:`SPLIT_NAMES`, or None when not recorded.
        card: the decoder card (hyperparameters, metrics, provenance).
    """

    plans: np.ndarray
    row_ids: np.ndarray
    split: np.ndarray | None
    card: dict


def write_predicted_plans(
    path: str | Path,
    run_name: str,
    plans: np.ndarray,
    row_ids: np.ndarray,
    *,
    card: dict,
    split: np.ndarray | None = None,
    overwrite: bool = False,
) -> None:
    """Add one run's predicted plans to an HDF5 file (created when missing).

    Layout: file attributes ``schema``, ``schema_version``, ``tokens`` (JSON), ``split_names``
    (JSON); group ``runs/<run_name>`` with datasets ``plans (N, T) int8``, ``row_ids (N,)
    int64``, optional ``split (N,) int8``, and attributes ``card`` (JSON), ``horizon``.

    Args:
        path: the ``.h5`` file.
        run_name: group name under ``runs/`` (may contain ``/``), e.g. ``"post/layer15/decoder2"``.
        plans: ``(N, T)`` predicted plans.
        row_ids: ``(N,)`` int store rows.
        card: JSON-ready card of the decoder that produced them.
        split: ``(N,)`` optional split codes (0 train, 1 validation, 2 test).
        overwrite: replace an existing run of that name instead of raising.
    """
    import h5py

    plans = validate_plans(plans, name=f"plans of run {run_name!r}")
    row_ids = np.asarray(row_ids)
    if row_ids.shape != (len(plans),) or not np.issubdtype(row_ids.dtype, np.integer):
        raise ValueError(
            f"row_ids must be ({len(plans)},) integers, got {row_ids.shape} {row_ids.dtype}"
        )
    if split is not None:
        split = np.asarray(split)
        if split.shape != (len(plans),) or ((split < 0) | (split >= len(SPLIT_NAMES))).any():
            raise ValueError(f"split must be ({len(plans)},) codes in 0..{len(SPLIT_NAMES) - 1}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "a") as f:
        if "schema" in f.attrs:
            _check_plans_file(f, path)
        else:
            f.attrs["schema"] = PREDICTED_PLANS_SCHEMA
            f.attrs["schema_version"] = PREDICTED_PLANS_SCHEMA_VERSION
            f.attrs["tokens"] = json.dumps(PLAN_TOKENS)
            f.attrs["split_names"] = json.dumps(list(SPLIT_NAMES))
        name = f"runs/{run_name}"
        if name in f:
            if not overwrite:
                raise ValueError(f"{path}: run {run_name!r} already exists (pass overwrite=True)")
            del f[name]
        group = f.create_group(name)
        group.create_dataset("plans", data=plans, dtype=np.int8)
        group.create_dataset("row_ids", data=row_ids.astype(np.int64))
        if split is not None:
            group.create_dataset("split", data=split.astype(np.int8))
        group.attrs["card"] = json.dumps(card, allow_nan=False)
        group.attrs["horizon"] = plans.shape[1]


def _check_plans_file(f, path: Path) -> None:
    if f.attrs.get("schema") != PREDICTED_PLANS_SCHEMA:
        raise ValueError(
            f"{path}: schema {f.attrs.get('schema')!r} is not {PREDICTED_PLANS_SCHEMA!r}"
        )
    if int(f.attrs.get("schema_version", -1)) != PREDICTED_PLANS_SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema_version {f.attrs.get('schema_version')!r} is not supported "
            f"(this goalprobe reads {PREDICTED_PLANS_SCHEMA_VERSION})"
        )


def list_predicted_plan_runs(path: str | Path) -> list[str]:
    """Names of the runs in a predicted-plans HDF5 file, sorted."""
    import h5py

    path = Path(path)
    names: list[str] = []
    with h5py.File(path, "r") as f:
        _check_plans_file(f, path)
        if "runs" in f:
            f["runs"].visititems(
                lambda name, obj: (
                    names.append(name) if isinstance(obj, h5py.Group) and "plans" in obj else None
                )
            )
    return sorted(names)


def read_predicted_plans(path: str | Path, run_name: str) -> PredictedPlans:
    """Read one run written by :func:`write_predicted_plans`."""
    import h5py

    path = Path(path)
    with h5py.File(path, "r") as f:
        _check_plans_file(f, path)
        name = f"runs/{run_name}"
        if name not in f:
            raise KeyError(f"{path}: no run {run_name!r}")
        group = f[name]
        return PredictedPlans(
            plans=group["plans"][()].astype(np.int8),
            row_ids=group["row_ids"][()].astype(np.int64),
            split=group["split"][()].astype(np.int8) if "split" in group else None,
            card=json.loads(group.attrs["card"]),
        )
