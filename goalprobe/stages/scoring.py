"""Stage ``scoring``: the agent's actions against its decoded beliefs, and MEG on the true and
the decoded grids (``RUN/scoring/``).

:func:`score_run` is the one path of the analysis (``goalprobe score RUN`` and :func:`run`). It
finds every input through :class:`RunLayout`, joins each decoded-map row ``row_ids -> store
/labels (run_id, grid_id, episode, step) -> trajectory step``, hands arrays to the library
(:mod:`goalprobe.probes.scoring.run`) and writes ``RUN/scoring/``: ``belief.json``, ``belief.csv``,
``meg.json``, ``meg.csv``, ``meg_grids.csv`` and the figures. A missing file, a truncated HDF5,
a row that joins nothing or a store of another trajectory run is an error naming the file.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from goalprobe.probes.scoring.belief_table import (
    CSV_COLUMNS,
    BeliefScores,
    ScoresHeader,
    StepTable,
    belief_csv_rows,
    belief_method,
    belief_metrics,
    card_summary,
    check_classes,
    pick_meg_probe,
)
from goalprobe.probes.scoring.config import ScoreConfig, ScoringError
from goalprobe.probes.scoring.meg_table import (
    MEG_GRID_COLUMNS,
    MegScores,
    meg_csv_rows,
    meg_grid_rows,
    meg_method,
)
from goalprobe.probes.scoring.nulls import fit_prior
from goalprobe.probes.scoring.run import (
    BELIEF_SCHEMA,
    BELIEF_SCHEMA_VERSION,
    MEG_SCHEMA,
    MEG_SCHEMA_VERSION,
    DecodedRows,
    score_beliefs,
    score_grid_meg,
)
from goalprobe.run_layout import RunLayout, write_atomic
from goalprobe.stages.context import StageContext, write_json
from goalprobe.stages.registry import Stage, register
from goalprobe.version import package_version
from goalprobe.viewer.figures.scoring import belief_figure, meg_figure, topk_figure


def run(context: StageContext, config: ScoreConfig, stage_dir: Path):
    """Score every decoded-map file of the run, as ``goalprobe score`` does (:func:`score_run`)."""
    scores = score_run(context.layout, config, progress=context.progress)
    return {"belief": scores.outputs["belief_json"], "meg": scores.outputs["meg_json"]}, {}


@dataclass(frozen=True)
class ScoreSummary:
    """What :func:`score_run` wrote: the contents of ``belief.json`` and ``meg.json``, every
    written file by name, and the wall time."""

    run_dir: Path
    belief: BeliefScores
    meg: MegScores
    outputs: dict[str, Path] = field(default_factory=dict)
    seconds: float = 0.0


def score_run(
    run_dir: Path | RunLayout, config: ScoreConfig, progress: bool = False
) -> ScoreSummary:
    """Score a run directory (or its layout): policy against decoded belief (and its nulls) for
    every decoded-map file, and true vs subjective MEG per grid, into ``RUN/scoring/`` with its
    figures. ``FileNotFoundError`` names a missing input; ``ScoringError``: inputs that do not
    join up, or an unreadable file."""
    from goalprobe.gridworld.io import read_grid_set

    start = time.perf_counter()
    layout = run_dir if isinstance(run_dir, RunLayout) else RunLayout(Path(run_dir))
    require(layout.trajectories, "trajectory file", "run goalprobe rollout")
    require(layout.store, "activation store", "run goalprobe extract")
    require(layout.grids, "grid set", "run goalprobe grids")
    steps = read_steps(layout)  # the trajectory file is validated (in full) first
    files = decoded_files(layout, config)
    meg_key, selected_by = pick_meg_probe(
        {f.key: f.description for f in files}, config.meg_probe or headline_key(files)
    )
    beliefs = score_beliefs(
        steps, joined_rows(layout, files, steps, config), config, meg_key, progress=progress
    )
    header: ScoresHeader = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "package_version": package_version(),
        "config": json.loads(json.dumps(asdict(config))),
    }
    belief: BeliefScores = {
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
        "probes": beliefs.probes,
    }
    grids = {g.grid_id: g for g in read_grid_set(layout.grids)}
    by_key = {f.key: f for f in files}
    meg: MegScores = {  # type: ignore[typeddict-item]  # the aggregates come from score_grid_meg
        "schema": MEG_SCHEMA,
        "schema_version": MEG_SCHEMA_VERSION,
        **header,
        "method": meg_method(config),
        **score_grid_meg(
            grids,
            steps,
            config,
            {"key": meg_key, **by_key[meg_key].description, "selected_by": selected_by},
            beliefs,
            progress=progress,
            where=str(layout.trajectories),
            grid_set=str(layout.grids),
        ),
    }
    outputs = {
        "belief_json": write_json(layout.belief, belief),
        "belief_csv": _write_csv(layout.belief_csv, belief_csv_rows(belief), CSV_COLUMNS),
        "meg_json": write_json(layout.meg, meg),
        "meg_csv": _write_csv(layout.meg_csv, meg_csv_rows(meg), CSV_COLUMNS),
        "meg_grids_csv": _write_csv(layout.meg_grids_csv, meg_grid_rows(meg), MEG_GRID_COLUMNS),
    }
    outputs.update(write_scoring_figures(layout, belief, meg))
    return ScoreSummary(layout.root, belief, meg, outputs, time.perf_counter() - start)


def joined_rows(
    layout: RunLayout, files: list[MapFile], steps: StepTable, config: ScoreConfig
) -> Iterator[DecodedRows]:
    """Each decoded-map file read and joined to the steps, one at a time, with the prior of
    the grids its probe was trained on (fitted once per decoded grid set and training set)."""
    priors: dict[tuple, tuple] = {}
    for mf in files:
        maps = read_maps(mf)
        idx, ids = join_rows(layout, mf, maps, steps)
        prior: tuple = (None, 0)
        if config.nulls and "prior" in config.nulls:
            decoded = (frozenset(k[0] for k in ids), mf.attrs.get("trained_on"))
            if decoded not in priors:
                priors[decoded] = fit_training_prior(layout, *decoded)
            prior = priors[decoded]
        yield DecodedRows(mf.key, mf.description, maps, idx, ids, prior)


def _write_csv(path: Path, rows: list[dict], columns: Sequence[str]) -> Path:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)  # None is written as an empty field
    return write_atomic(path, buf.getvalue())


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


def store_ids(layout: RunLayout, rows: np.ndarray, run_id: str) -> list[tuple[str, int, int]]:
    """``(grid_id, episode, step)`` of store ``rows``; checks that the store has them and that
    they come from ``run_id``."""
    from goalprobe.activations.store import ActivationStore

    with ActivationStore(layout.store) as store:
        if rows.size and (rows.min() < 0 or rows.max() >= store.n_rows):
            raise ScoringError(
                f"{layout.store}: decoded maps name rows {rows.min()}..{rows.max()}, but the "
                f"store has {store.n_rows} rows (decoded from another store?)"
            )
        labels = store.labels(["run_id", "grid_id", "episode", "step"], rows)
    foreign = sorted(set(labels["run_id"].tolist()) - {run_id})
    if foreign:
        raise ScoringError(
            f"{layout.store}: rows come from trajectory run {foreign[0]!r}, but "
            f"{layout.trajectories} is run {run_id!r}; the store was extracted from other rollouts"
        )
    columns = (labels["grid_id"], labels["episode"].astype(int), labels["step"].astype(int))
    return list(zip(*(c.tolist() for c in columns), strict=True))


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
    described = {"file": str(path.relative_to(layout.root)), **card_summary(json.loads(card_text))}
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
    from goalprobe.activations.store import ActivationStore

    path = layout.probing_store if trained_on == "probing" else layout.store
    if not path.is_file():
        return None, 0
    with ActivationStore(path) as store:
        labels = store.labels(["grid_id", "grid_size", "density"])
        train = np.flatnonzero(~np.isin(labels["grid_id"], list(decoded)))
        if not train.size:
            return None, 0
        cells = store.labels(["cell_types"], train)["cell_types"]
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


def write_scoring_figures(layout: RunLayout, belief: Mapping, meg: Mapping) -> dict[str, Path]:
    """Write the scoring figures (``fig.to_json()``) into ``scoring/figures/``; returns
    ``figure_<name>`` -> written path."""
    figures = {
        "belief_by_size": belief_figure(dict(belief)),
        "topk": topk_figure(dict(belief)),
        "meg": meg_figure(dict(meg)),
    }
    return {
        f"figure_{name}": write_atomic(layout.scoring_figure(name), fig.to_json())
        for name, fig in figures.items()
    }


STAGE = register(
    Stage(
        name="scoring",
        run=run,
        reads=("grids", "rollouts", "activations", "probes"),
        writes=("belief scoring", "MEG scoring", "scoring figures"),
        section="scoring",
        control=True,
        seconds=40,
        torch_threads=1,
    )
)
