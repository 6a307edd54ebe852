"""The inputs of ``goalprobe score`` (:func:`goalprobe.scoring.score_run`), found through
:class:`RunLayout` and checked: the trajectory steps, the activation store's labels, the
decoded-map files (schema 1 or 2: with or without the position read-out) joined to the steps,
the size-and-density prior of the probe's training grids, and the headline maps picked when no
probe is named. Every failure names its file (:class:`ScoringError`, ``FileNotFoundError``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from goalprobe.probes.scoring.belief_table import StepTable, card_summary, check_classes
from goalprobe.probes.scoring.config import ScoreConfig, ScoringError
from goalprobe.probes.scoring.nulls import fit_prior
from goalprobe.run_layout import RunLayout


def require(path: Path, what: str, hint: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {what} ({hint})")
    return path


def read_steps(layout: RunLayout) -> StepTable:
    from goalprobe.agents.trajectories import read_run_header, read_trajectories

    path = layout.trajectories
    table = StepTable.from_episodes(read_run_header(path).run_id, read_trajectories(path))
    if not table.action:
        raise ScoringError(f"{path}: no finished episode to score")
    return table


def store_labels(
    layout: RunLayout, fields: list[str], rows: np.ndarray | None = None, store_path=None
) -> dict:
    from goalprobe.activations.store import ActivationStore

    with ActivationStore(store_path or layout.store) as store:
        if rows is not None and rows.size and (rows.min() < 0 or rows.max() >= store.n_rows):
            raise ScoringError(
                f"{layout.store}: decoded maps name rows {rows.min()}..{rows.max()}, but the "
                f"store has {store.n_rows} rows (decoded from another store?)"
            )
        return store.labels(fields, rows)


def store_ids(layout: RunLayout, rows: np.ndarray, run_id: str) -> list[tuple[str, int, int]]:
    """``(grid_id, episode, step)`` of store ``rows``; checks that they come from ``run_id``."""
    labels = store_labels(layout, ["run_id", "grid_id", "episode", "step"], rows)
    foreign = sorted(set(labels["run_id"].tolist()) - {run_id})
    if foreign:
        raise ScoringError(
            f"{layout.store}: rows come from trajectory run {foreign[0]!r}, but "
            f"{layout.trajectories} is run {run_id!r}; the store was extracted from other rollouts"
        )
    return list(
        zip(
            labels["grid_id"].tolist(),
            labels["episode"].astype(int).tolist(),
            labels["step"].astype(int).tolist(),
            strict=True,
        )
    )


@dataclass(frozen=True)
class MapFile:
    """One decoded-map file and what its card says (:func:`card_summary` plus ``file``)."""

    key: str
    path: Path
    description: dict
    attrs: dict = field(default_factory=dict)


def map_file(layout: RunLayout, path: Path) -> MapFile:
    import h5py

    from goalprobe.probes.decoded_maps import DECODED_MAPS_SCHEMA

    try:
        with h5py.File(path, "r") as f:
            schema = f.attrs.get("schema")
            card_text = f.attrs.get("probe_card")
            attrs = {k: str(f.attrs[k]) for k in ("role", "trained_on", "readout") if k in f.attrs}
    except OSError as err:
        raise ScoringError(
            f"{path}: cannot open the decoded maps ({err}); the HDF5 file is truncated or corrupt"
        ) from err
    if schema != DECODED_MAPS_SCHEMA or card_text is None:
        raise ScoringError(
            f"{path}: not a decoded-maps file (schema {schema!r}, expected {DECODED_MAPS_SCHEMA!r})"
        )
    rel = str(path.relative_to(layout.root))
    described = {"file": rel, **card_summary(json.loads(card_text))}
    if "readout" in attrs:
        described["readout"] = json.loads(attrs["readout"])
    if "trained_on" in attrs:
        described["trained_on"] = attrs["trained_on"]
    return MapFile(path.stem, path, described, attrs)


def decoded_files(layout: RunLayout, config: ScoreConfig) -> list[MapFile]:
    if config.decoded_maps:
        paths = [
            require(layout.decoded_map(name), "decoded-map file", "ScoreConfig.decoded_maps")
            for name in config.decoded_maps
        ]
    else:
        paths = layout.decoded_maps()
        if not paths:
            raise FileNotFoundError(
                f"{layout.decoded_dir}: no decoded-map files (*.h5); run `goalprobe train-probe ... --out "
                f"{layout.decoded_dir.parent}` first"
            )
    return [map_file(layout, p) for p in paths]


def read_maps(mf: MapFile):
    from goalprobe.probes.decoded_maps import read_decoded_maps

    try:
        maps = read_decoded_maps(mf.path)
    except (OSError, KeyError) as err:
        raise ScoringError(
            f"{mf.path}: cannot read the decoded maps ({err!r}); the file is truncated or corrupt"
        ) from err
    check_classes(maps.classes, str(mf.path))
    return maps


def join_rows(layout: RunLayout, mf: MapFile, maps, steps: StepTable):
    """Trajectory-step index and ``(grid_id, episode, step)`` of every decoded row."""
    ids = store_ids(layout, np.asarray(maps.row_ids, dtype=np.int64), steps.run_id)
    idx = np.empty(len(ids), dtype=np.int64)
    for i, key in enumerate(ids):
        j = steps.index.get(key)
        if j is None:
            raise ScoringError(
                f"{mf.path}: row {i} (store row {int(maps.row_ids[i])}) is step {key} "
                f"(grid_id, episode, step), which {layout.trajectories} does not hold"
            )
        idx[i] = j
    side = maps.probs.shape[1]
    sizes = np.asarray(steps.size)[idx] if idx.size else np.zeros(0, dtype=np.int64)
    if sizes.size and sizes.max() > side:
        raise ScoringError(
            f"{mf.path}: maps are {side} x {side} but row {int(np.argmax(sizes > side))} is a "
            f"{int(sizes.max())} x {int(sizes.max())} grid"
        )
    return idx, ids


def fit_training_prior(
    layout: RunLayout, decoded: frozenset, trained_on: str | None = None
) -> tuple:
    """``(size-and-density cell prior or None, n grids)`` fitted on the grids the probe was
    trained on: the probing set's rows for a probe trained there (``trained_on="probing"``),
    else the main store's rows of the grids it did not decode."""
    store = layout.probing_store if trained_on == "probing" else layout.store
    if not store.is_file():
        return None, 0
    labels = store_labels(layout, ["grid_id", "grid_size", "density"], store_path=store)
    train = np.flatnonzero(~np.isin(labels["grid_id"], list(decoded)))
    if not train.size:
        return None, 0
    cells = store_labels(layout, ["cell_types"], train, store_path=store)["cell_types"]
    prior = fit_prior(cells, labels["grid_size"][train], labels["density"][train])
    return prior, int(np.unique(labels["grid_id"][train]).size)


def headline_key(files: list[MapFile]) -> str | None:
    """The decoded maps MEG and the report's headline read when no probe is named: the file the
    probes stage wrote with ``role="headline"`` (the probing-set probes' maps of the rollouts),
    else None (best card accuracy). The demo's scoring stage and ``goalprobe score`` both go
    through here, so they pick the same maps."""
    from goalprobe.stages import HEADLINE_PROBE, HEADLINE_STAGE, headline_layer

    for f in files:
        if f.attrs.get("role") == "headline":
            return f.key
    prefix = "cell_type_{}_{}_{}_L".format(*HEADLINE_PROBE, HEADLINE_STAGE)
    layers = {int(f.key.removeprefix(prefix)): f.key for f in files if f.key.startswith(prefix)}
    return layers[headline_layer(layers)] if layers else None
