"""Persistence of fitted probes and plan decoders: safetensors + a JSON card, never pickle
(layouts in docs/formats.md). :func:`load_probe` rebuilds an estimator from the registry of
probe families and restores its arrays bit for bit; :func:`load_plan_decoder` does the same for
a :class:`goalprobe.probes.plan_decoder.PlanDecoder`. Torch and the estimators are imported
lazily.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import numpy as np

from goalprobe.stats import json_ready

CARD_SCHEMA = "goalprobe.probe_card"
"""``schema`` field of a probe card."""
CARD_SCHEMA_VERSION = 1
"""Version of the probe card layout."""
PLAN_CARD_SCHEMA = "goalprobe.plan_decoder"
"""``schema`` field of a plan-decoder JSON card and safetensors metadata."""
PLAN_CARD_SCHEMA_VERSION = 1
"""Version of the plan-decoder card / safetensors layout; bumped on any incompatible change."""


@dataclass(frozen=True)
class ActivationSource:
    """Which activations a probe was trained on (written into its card): the HDF5 store, its
    checksum, the anchor tokens' stage and the residual-stream layer."""

    store_path: str
    store_checksum: str
    stage: str
    layer: int


def stem_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(<stem>.safetensors, <stem>.json)`` of ``path`` (with or without either suffix)."""
    p = Path(path)
    if p.suffix in (".safetensors", ".json"):
        p = p.with_suffix("")
    return p.with_suffix(".safetensors"), p.with_suffix(".json")


def probe_card(
    probe, *, source: ActivationSource | None = None, metrics: dict | None = None
) -> dict:
    """The JSON-ready card of a fitted probe (what :func:`save_probe` writes next to the
    tensors): ``schema``, ``schema_version``, ``class``, ``hyperparameters``, ``fitted``,
    ``metrics`` and ``activations`` (``source``; None: unknown)."""
    from goalprobe.probes.families import probe_classes

    name = type(probe).__name__
    if name not in probe_classes():
        raise TypeError(
            f"{name} is not a goalprobe probe: expected one of {sorted(probe_classes())}"
        )
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
    return json_ready(card)


def save_probe(
    probe,
    path: str | Path,
    *,
    source: ActivationSource | None = None,
    metrics: dict | None = None,
) -> Path:
    """Write a fitted probe as ``<stem>.safetensors`` plus its :func:`probe_card` ``<stem>.json``
    (``path``: the stem or either file); returns the card's path."""
    from safetensors.numpy import save_file

    card = probe_card(probe, source=source, metrics=metrics)
    tensors, _ = probe._fitted_state()
    tensor_path, card_path = stem_paths(path)
    tensor_path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tensor_path))
    card["tensors"] = tensor_path.name
    card_path.write_text(json.dumps(card, indent=2, allow_nan=False) + "\n")
    return card_path


def read_probe_card(path: str | Path) -> dict:
    """The JSON card of a saved probe (``path``: stem or either file)."""
    _, card_path = stem_paths(path)
    return _read_card(card_path, "probe card", CARD_SCHEMA, CARD_SCHEMA_VERSION)


def check_schema(header, schema: str, versions: tuple[int, ...], where) -> int:
    """The ``schema_version`` of ``header`` (a card, a JSON header line or HDF5 attributes) once
    its ``schema`` is ``schema`` and its version one of ``versions``; ValueError naming ``where``
    otherwise."""
    if header.get("schema") != schema:
        raise ValueError(f"{where}: not a {schema} file (schema {header.get('schema')!r})")
    raw = header.get("schema_version")
    version = int(raw) if str(raw).isdigit() else raw  # safetensors metadata holds strings
    if version not in versions:
        raise ValueError(
            f"{where}: schema_version {version!r} is not supported (this goalprobe reads "
            f"{', '.join(map(str, versions))})"
        )
    return int(version)


def _read_card(path: Path, what: str, schema: str, version: int) -> dict:
    """A JSON card at ``path``, checked for its ``schema`` and ``schema_version``."""
    if not path.exists():
        raise FileNotFoundError(f"no {what} at {path}")
    try:
        card = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON (line {err.lineno}): {err.msg}") from err
    check_schema(card, schema, (version,), path)
    return card


def load_probe(path: str | Path):
    """Rebuild a probe saved by :func:`save_probe` (``path``: the stem or either file); its
    predictions match the saved one's exactly."""
    from goalprobe.probes.families import probe_classes
    from safetensors.numpy import load_file

    card = read_probe_card(path)
    tensor_path, card_path = stem_paths(path)
    registry = probe_classes()
    if card["class"] not in registry:
        raise ValueError(f"{card_path}: unknown probe class {card['class']!r}")
    cls = registry[card["class"]]
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in card["hyperparameters"].items()}
    probe = cls(**params)
    probe._restore(load_file(str(tensor_path)), card["fitted"])
    return probe


PLAN_DECODER_ESTIMATOR = "goalprobe.probes.plan_decoder.PlanDecoder"
"""The ``estimator`` a plan-decoder card records (the class's import path)."""


def save_plan_decoder(
    decoder,
    path: str | Path,
    *,
    metrics: dict | None = None,
    provenance: dict | None = None,
) -> Path:
    """Write a fitted plan decoder as the ``.safetensors`` file ``path`` plus its card (suffix
    ``.json``, recording ``metrics`` and the data's ``provenance``); returns the card's path."""
    import torch
    from goalprobe.probes.plan_metrics import PLAN_TOKENS
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
    card_path.write_text(json.dumps(json_ready(card), indent=2, allow_nan=False) + "\n")
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
    """Rebuild a decoder written by :func:`save_plan_decoder` (``path``: its ``.safetensors``);
    it predicts as the saved one. ``device`` overrides the saved hyperparameter."""
    from goalprobe.probes.plan_decoder import PlanDecoder
    from safetensors.numpy import load_file

    path = Path(path)
    card = read_plan_decoder_card(path)
    estimator = card.get("estimator")
    if estimator != PLAN_DECODER_ESTIMATOR:
        raise ValueError(f"{path.with_suffix('.json')}: unknown estimator {estimator!r}")
    params = dict(card["hyperparameters"])
    if device is not None:
        params["device"] = device
    try:
        decoder = PlanDecoder(**params)
    except TypeError as err:  # a name the decoder does not take (an unreleased card's)
        raise ValueError(f"{path.with_suffix('.json')}: hyperparameters: {err}") from err
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
