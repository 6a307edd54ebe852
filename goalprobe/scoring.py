"""``goalprobe score``: policy against decoded belief, its nulls, and grid MEG over a run directory.

The application side of scoring: it finds every input through :class:`RunLayout` (grid set,
trajectories, activation store, decoded maps), joins each decoded-map row ``row_ids -> store
/labels (run_id, grid_id, episode, step) -> trajectory step``, hands arrays to the library
(:mod:`goalprobe.probes.scoring.belief_table`, :mod:`goalprobe.probes.scoring.nulls`,
:mod:`goalprobe.probes.scoring.meg_table`) and writes ``RUN/scoring/``. A missing file, a truncated HDF5,
a row that joins nothing or a store written for another trajectory run raises an error naming the
file; nothing is skipped silently.

Outputs: ``belief.json`` (schema ``goalprobe.scoring.belief`` version 2, described in
:mod:`goalprobe.probes.scoring.belief_table`; version 1 lacks only the nulls) and ``belief.csv``;
``meg.json`` (:mod:`goalprobe.probes.scoring.meg_table`), ``meg.csv``, ``meg_grids.csv``. The figures
(``scoring/figures/``) are drawn by :mod:`goalprobe.viewer.figures` and written by the callers
(:func:`goalprobe.figure_files.write_scoring_figures`).
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from goalprobe.probes.scoring.belief_table import (
    MapAccumulator,
    StepTable,
    belief_csv_rows,
    belief_entry,
    belief_method,
    belief_metrics,
    card_summary,
    check_classes,
    expand_classes,
    pick_meg_probe,
    score_rows,
)
from goalprobe.probes.scoring.config import ScoreConfig, ScoringError
from goalprobe.probes.scoring.grouped import CSV_COLUMNS
from goalprobe.probes.scoring.meg_table import (
    MEG_GRID_COLUMNS,
    meg_csv_rows,
    meg_grid_rows,
    meg_method,
    score_meg,
)
from goalprobe.probes.scoring.nulls import fit_prior, score_nulls
from goalprobe.run_layout import RunLayout
from goalprobe.stages.context import write_json

BELIEF_SCHEMA = "goalprobe.scoring.belief"
MEG_SCHEMA = "goalprobe.scoring.meg"
BELIEF_SCHEMA_VERSION = 3
MEG_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ScoreSummary:
    """What :func:`score_run` wrote.

    Attributes:
        run_dir: the run directory.
        belief: the content of ``scoring/belief.json``.
        meg: the content of ``scoring/meg.json``.
        outputs: name -> written file (``belief_json``, ``belief_csv``, ``meg_json``, ...).
        seconds: wall time.
    """

    run_dir: Path
    belief: dict
    meg: dict
    outputs: dict[str, Path] = field(default_factory=dict)
    seconds: float = 0.0


def _require(path: Path, what: str, hint: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {what} ({hint})")
    return path


def _read_steps(layout: RunLayout) -> StepTable:
    from goalprobe.agents.trajectories import read_run_header, read_trajectories

    path = layout.trajectories
    table = StepTable.from_episodes(read_run_header(path).run_id, read_trajectories(path))
    if not table.action:
        raise ScoringError(f"{path}: no finished episode to score")
    return table


def _store_labels(
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


def _store_ids(layout: RunLayout, rows: np.ndarray, run_id: str) -> list[tuple[str, int, int]]:
    """``(grid_id, episode, step)`` of store ``rows``; checks that they come from ``run_id``."""
    labels = _store_labels(layout, ["run_id", "grid_id", "episode", "step"], rows)
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
class _MapFile:
    """One decoded-map file and what its card says (:func:`card_summary` plus ``file``)."""

    key: str
    path: Path
    description: dict
    attrs: dict = field(default_factory=dict)


def _map_file(layout: RunLayout, path: Path) -> _MapFile:
    import h5py

    from goalprobe.probes.serialization import DECODED_MAPS_SCHEMA

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
    return _MapFile(path.stem, path, described, attrs)


def _decoded_files(layout: RunLayout, config: ScoreConfig) -> list[_MapFile]:
    if config.decoded_maps:
        paths = [
            _require(layout.decoded_map(name), "decoded-map file", "ScoreConfig.decoded_maps")
            for name in config.decoded_maps
        ]
    else:
        paths = layout.decoded_maps()
        if not paths:
            raise FileNotFoundError(
                f"{layout.decoded_dir}: no decoded-map files (*.h5); run `goalprobe train-probe ... --out "
                f"{layout.decoded_dir.parent}` first"
            )
    return [_map_file(layout, p) for p in paths]


def _read_maps(mf: _MapFile):
    from goalprobe.probes.serialization import read_decoded_maps

    try:
        maps = read_decoded_maps(mf.path)
    except (OSError, KeyError) as err:
        raise ScoringError(
            f"{mf.path}: cannot read the decoded maps ({err!r}); the file is truncated or corrupt"
        ) from err
    check_classes(maps.classes, str(mf.path))
    return maps


def _join(layout: RunLayout, mf: _MapFile, maps, steps: StepTable):
    """Trajectory-step index and ``(grid_id, episode, step)`` of every decoded row."""
    ids = _store_ids(layout, np.asarray(maps.row_ids, dtype=np.int64), steps.run_id)
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


def _fit_prior(layout: RunLayout, decoded: frozenset, trained_on: str | None = None) -> tuple:
    """``(size-and-density cell prior or None, n grids)`` fitted on the grids the probe was
    trained on: the probing set's rows for a probe trained there (``trained_on="probing"``),
    else the main store's rows of the grids it did not decode."""
    store = layout.probing_store if trained_on == "probing" else layout.store
    if not store.is_file():
        return None, 0
    labels = _store_labels(layout, ["grid_id", "grid_size", "density"], store_path=store)
    train = np.flatnonzero(~np.isin(labels["grid_id"], list(decoded)))
    if not train.size:
        return None, 0
    cells = _store_labels(layout, ["cell_types"], train, store_path=store)["cell_types"]
    prior = fit_prior(cells, labels["grid_size"][train], labels["density"][train])
    return prior, int(np.unique(labels["grid_id"][train]).size)


def _score_file(mf, layout, steps, config, accumulator, priors, executor, progress):
    """The ``belief.json`` entry of one decoded-map file, and the probe's classes."""
    maps = _read_maps(mf)
    idx, ids = _join(layout, mf, maps, steps)
    scores = score_rows(
        maps.probs,
        maps.classes,
        steps.facts(idx),
        config.top_k,
        agent=maps.agent,
        goal=maps.goal,
        executor=executor,
        progress=progress,
        label=f"belief {mf.key}",
    )
    grid_ids = np.asarray([k[0] for k in ids], dtype=object)
    if accumulator is not None:
        for i, key in enumerate(ids):
            accumulator.add(key[0], (key[1], key[2]), expand_classes(maps.probs[i], maps.classes))
    entry = {**mf.description, **belief_entry(*scores, idx, grid_ids, steps, config, mf.key)}
    if config.nulls:
        trained_on = mf.attrs.get("trained_on")
        decoded = (frozenset(grid_ids.tolist()), trained_on)
        if "prior" in config.nulls and decoded not in priors:
            priors[decoded] = _fit_prior(layout, decoded[0], trained_on)
        entry.update(
            score_nulls(
                maps.probs,
                maps.classes,
                idx,
                grid_ids,
                scores,
                steps,
                config,
                priors.get(decoded, (None, 0)),
                seed_text=mf.key,
                agent=maps.agent,
                goal=maps.goal,
                executor=executor,
                progress=progress,
            )
        )
    return entry, [int(c) for c in maps.classes]


def _headline_key(files: list[_MapFile]) -> str | None:
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


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("goalprobe")
    except PackageNotFoundError:
        return "unknown"


def _write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _write_csv(path: Path, rows: list[dict], columns: Sequence[str]) -> Path:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})
    return _write_text(path, buf.getvalue())


def score_run(
    run_dir: Path | RunLayout, config: ScoreConfig, progress: bool = False
) -> ScoreSummary:
    """Score a run directory: policy against decoded belief (and its nulls) for every
    decoded-map file, and true vs subjective MEG per grid; writes ``RUN/scoring/``.

    Args:
        run_dir: the run directory, or its layout.
        config: what to compute.
        progress: show tqdm progress bars.

    Returns:
        A :class:`ScoreSummary` holding the written JSON contents and paths.

    Raises:
        FileNotFoundError: a required input is missing (the message names it).
        ScoringError: the inputs do not join up or a file is unreadable.
    """
    from goalprobe.gridworld.io import read_grid_set

    start = time.perf_counter()
    layout = run_dir if isinstance(run_dir, RunLayout) else RunLayout(Path(run_dir))
    _require(layout.trajectories, "trajectory file", "run goalprobe rollout")
    _require(layout.store, "activation store", "run goalprobe extract")
    _require(layout.grids, "grid set", "run goalprobe grids")
    steps = _read_steps(layout)  # the trajectory file is validated (in full) first
    files = _decoded_files(layout, config)
    meg_key, selected_by = pick_meg_probe(
        {f.key: f.description for f in files}, config.meg_probe or _headline_key(files)
    )
    accumulator = MapAccumulator(config.subjective_map)
    priors: dict[tuple, tuple] = {}  # (decoded grids, trained_on) -> prior of the training grids
    probes: dict[str, dict] = {}
    meg_classes: list[int] = []
    executor: Executor | None = ProcessPoolExecutor(config.n_jobs) if config.n_jobs > 1 else None
    try:
        for mf in files:
            acc = accumulator if mf.key == meg_key else None
            probes[mf.key], classes = _score_file(
                mf, layout, steps, config, acc, priors, executor, progress
            )
            if acc is not None:
                meg_classes = classes
    finally:
        if executor is not None:
            executor.shutdown()
    header = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "package_version": _package_version(),
        "config": json.loads(json.dumps(asdict(config))),
    }
    belief = {
        "schema": BELIEF_SCHEMA,
        "schema_version": BELIEF_SCHEMA_VERSION,
        **header,
        "inputs": {
            "trajectories": layout.relative(layout.trajectories),
            "trajectory_run_id": steps.run_id,
            "store": layout.relative(layout.store),
            "decoded_maps": [f.description["file"] for f in files],
        },
        "method": belief_method(config),
        "metrics": list(belief_metrics(config.top_k)),
        "default_probe": meg_key,
        "probes": probes,
    }
    grids = {g.grid_id: g for g in read_grid_set(layout.grids)}
    by_key = {f.key: f for f in files}
    meg_body = score_meg(
        grids,
        steps,
        config,
        {"key": meg_key, **by_key[meg_key].description, "selected_by": selected_by},
        accumulator.maps(),
        accumulator.counts,
        meg_classes,
        progress,
        where=str(layout.trajectories),
        grid_set=str(layout.grids),
    )
    meg = {
        "schema": MEG_SCHEMA,
        "schema_version": MEG_SCHEMA_VERSION,
        **header,
        "method": meg_method(config),
        **meg_body,
    }
    outputs = {
        "belief_json": write_json(layout.belief, belief),
        "belief_csv": _write_csv(layout.belief_csv, belief_csv_rows(belief), CSV_COLUMNS),
        "meg_json": write_json(layout.meg, meg),
        "meg_csv": _write_csv(layout.meg_csv, meg_csv_rows(meg), CSV_COLUMNS),
        "meg_grids_csv": _write_csv(layout.meg_grids_csv, meg_grid_rows(meg), MEG_GRID_COLUMNS),
    }
    return ScoreSummary(layout.root, belief, meg, outputs, time.perf_counter() - start)
