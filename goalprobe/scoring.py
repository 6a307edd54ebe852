"""``goalprobe score``: policy against decoded belief, its nulls, and grid MEG over a run directory.

The application side of scoring: it finds every input through :class:`RunLayout` (grid set,
trajectories, activation store, decoded maps), joins each decoded-map row ``row_ids -> store
/labels (run_id, grid_id, episode, step) -> trajectory step``, hands arrays to the library
(:mod:`goalprobe.probes.scoring.belief_table`, :mod:`goalprobe.probes.scoring.nulls`,
:mod:`goalprobe.probes.scoring.meg_table`) and writes ``RUN/scoring/``. A missing file, a truncated HDF5,
a row that joins nothing or a store written for another trajectory run raises an error naming the
file; nothing is skipped silently.

Outputs: ``belief.json`` (schema ``goalprobe.scoring.belief`` version 3, described in
:mod:`goalprobe.probes.scoring.belief_table`; version 2 lacks the study's Agreement, the local
scores and the per-grid weighting, version 1 also the nulls) and ``belief.csv``;
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
    BeliefScores,
    MapAccumulator,
    ScoresHeader,
    belief_csv_rows,
    belief_entry,
    belief_method,
    belief_metrics,
    expand_classes,
    pick_meg_probe,
    score_rows,
)
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.probes.scoring.grouped import CSV_COLUMNS
from goalprobe.probes.scoring.meg_table import (
    MEG_GRID_COLUMNS,
    MegScores,
    meg_csv_rows,
    meg_grid_rows,
    meg_method,
    score_meg,
)
from goalprobe.probes.scoring.nulls import score_nulls
from goalprobe.probes.scoring.step_meg import step_meg
from goalprobe.run_layout import RunLayout
from goalprobe.scoring_inputs import (
    decoded_files,
    fit_training_prior,
    headline_key,
    join_rows,
    read_maps,
    read_steps,
    require,
)
from goalprobe.stages.context import write_json

BELIEF_SCHEMA = "goalprobe.scoring.belief"
MEG_SCHEMA = "goalprobe.scoring.meg"
BELIEF_SCHEMA_VERSION = 3
MEG_SCHEMA_VERSION = 2


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
    belief: BeliefScores
    meg: MegScores
    outputs: dict[str, Path] = field(default_factory=dict)
    seconds: float = 0.0


def _score_file(mf, layout, steps, config, accumulator, priors, executor, progress):
    """The ``belief.json`` entry of one decoded-map file, and the probe's classes."""
    maps = read_maps(mf)
    idx, ids = join_rows(layout, mf, maps, steps)
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
            full = expand_classes(maps.probs[i], maps.classes)
            accumulator.add(key[0], (key[1], key[2]), full)
            agent = None if maps.agent is None else maps.agent[i].astype(np.float64)
            goal = None if maps.goal is None else maps.goal[i].astype(np.float64)
            accumulator.rows.append((int(idx[i]), full, agent, goal))
    entry = {**mf.description, **belief_entry(*scores, idx, grid_ids, steps, config, mf.key)}
    if config.nulls:
        trained_on = mf.attrs.get("trained_on")
        decoded = (frozenset(grid_ids.tolist()), trained_on)
        if "prior" in config.nulls and decoded not in priors:
            priors[decoded] = fit_training_prior(layout, decoded[0], trained_on)
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
    require(layout.trajectories, "trajectory file", "run goalprobe rollout")
    require(layout.store, "activation store", "run goalprobe extract")
    require(layout.grids, "grid set", "run goalprobe grids")
    steps = read_steps(layout)  # the trajectory file is validated (in full) first
    files = decoded_files(layout, config)
    meg_key, selected_by = pick_meg_probe(
        {f.key: f.description for f in files}, config.meg_probe or headline_key(files)
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
    header: ScoresHeader = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "package_version": _package_version(),
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
    per_step = step_meg(grids, steps, accumulator.rows, meg_classes, config)
    meg: MegScores = {
        "schema": MEG_SCHEMA,
        "schema_version": MEG_SCHEMA_VERSION,
        **header,
        "method": meg_method(config),
        **meg_body,
        "per_step": per_step,
    }
    outputs = {
        "belief_json": write_json(layout.belief, belief),
        "belief_csv": _write_csv(layout.belief_csv, belief_csv_rows(belief), CSV_COLUMNS),
        "meg_json": write_json(layout.meg, meg),
        "meg_csv": _write_csv(layout.meg_csv, meg_csv_rows(meg), CSV_COLUMNS),
        "meg_grids_csv": _write_csv(layout.meg_grids_csv, meg_grid_rows(meg), MEG_GRID_COLUMNS),
    }
    return ScoreSummary(layout.root, belief, meg, outputs, time.perf_counter() - start)
