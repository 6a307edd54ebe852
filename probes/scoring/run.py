"""Scoring a run on what it is handed: policy against decoded belief (and its nulls) for every
decoded-map file, and true vs subjective MEG per grid and per step; the application
(:func:`goalprobe.stages.scoring.score_run`) finds the files and writes ``RUN/scoring/``."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from goalprobe.probes.decoded_maps import full_class_probs
from goalprobe.probes.scoring.belief_table import (
    MapAccumulator,
    StepTable,
    belief_entry,
    score_rows,
)
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.probes.scoring.meg_table import score_meg, step_meg
from goalprobe.probes.scoring.nulls import score_nulls

BELIEF_SCHEMA = "goalprobe.scoring.belief"
MEG_SCHEMA = "goalprobe.scoring.meg"
BELIEF_SCHEMA_VERSION = 3
MEG_SCHEMA_VERSION = 2


@dataclass(frozen=True)
class DecodedRows:
    """One decoded-map file's rows, joined to the trajectory steps: its ``key`` (stem), card
    ``description`` (``card_summary`` plus ``file``), ``maps`` (``probs``, ``classes``,
    ``agent``, ``goal``), trajectory-step ``idx`` and ``(grid_id, episode, step)`` ``ids`` of
    every row, and the prior null's ``(cell prior or None, n training grids)``."""

    key: str
    description: dict
    maps: Any
    idx: np.ndarray
    ids: list[tuple[str, int, int]]
    prior: tuple = (None, 0)


@dataclass
class BeliefResult:
    """What :func:`score_beliefs` computed: the ``probes`` entries of ``belief.json`` and the
    MEG probe's accumulated maps and classes."""

    probes: dict[str, dict]
    accumulator: MapAccumulator
    meg_classes: list[int]


def _score_file(rows: DecodedRows, steps, config, accumulator, executor, progress):
    """The ``belief.json`` entry of one decoded-map file, and the probe's classes."""
    maps, idx, ids = rows.maps, rows.idx, rows.ids
    scores = score_rows(
        maps.probs,
        maps.classes,
        steps.facts(idx),
        config.top_k,
        agent=maps.agent,
        goal=maps.goal,
        executor=executor,
        progress=progress,
        label=f"belief {rows.key}",
    )
    grid_ids = np.asarray([k[0] for k in ids], dtype=object)
    if accumulator is not None:
        for i, key in enumerate(ids):
            full = full_class_probs(maps.probs[i], maps.classes)
            accumulator.add(key[0], (key[1], key[2]), full)
            agent = None if maps.agent is None else maps.agent[i].astype(np.float64)
            goal = None if maps.goal is None else maps.goal[i].astype(np.float64)
            accumulator.rows.append((int(idx[i]), full, agent, goal))
    entry = {**rows.description, **belief_entry(*scores, idx, grid_ids, steps, config, rows.key)}
    if config.nulls:
        entry.update(
            score_nulls(
                maps.probs,
                maps.classes,
                idx,
                grid_ids,
                scores,
                steps,
                config,
                rows.prior,
                seed_text=rows.key,
                agent=maps.agent,
                goal=maps.goal,
                executor=executor,
                progress=progress,
            )
        )
    return entry, [int(c) for c in maps.classes]


def score_beliefs(
    steps: StepTable,
    files: Iterable[DecodedRows],
    config: ScoreConfig,
    meg_key: str,
    *,
    progress: bool = False,
) -> BeliefResult:
    """Score every decoded-map file (consumed one at a time) against the agent's actions;
    the maps of ``meg_key`` are accumulated per grid for subjective MEG."""
    accumulator = MapAccumulator(config.subjective_map)
    probes: dict[str, dict] = {}
    meg_classes: list[int] = []
    executor: Executor | None = ProcessPoolExecutor(config.n_jobs) if config.n_jobs > 1 else None
    try:
        for rows in files:
            acc = accumulator if rows.key == meg_key else None
            probes[rows.key], classes = _score_file(rows, steps, config, acc, executor, progress)
            if acc is not None:
                meg_classes = classes
    finally:
        if executor is not None:
            executor.shutdown()
    return BeliefResult(probes, accumulator, meg_classes)


def score_grid_meg(
    grids: dict,
    steps: StepTable,
    config: ScoreConfig,
    probe: dict,
    beliefs: BeliefResult,
    *,
    progress: bool = False,
    where: str = "",
    grid_set: str = "",
) -> dict:
    """The body of ``meg.json``: known-utility MEG on the true and the decoded grids of the
    MEG ``probe`` (per grid, grouped) and per step."""
    body = score_meg(
        grids,
        steps,
        config,
        probe,
        beliefs.accumulator.maps(),
        beliefs.accumulator.counts,
        beliefs.meg_classes,
        progress,
        where=where,
        grid_set=grid_set,
    )
    per_step = step_meg(grids, steps, beliefs.accumulator.rows, beliefs.meg_classes, config)
    return {**body, "per_step": per_step}
