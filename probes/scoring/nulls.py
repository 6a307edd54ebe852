"""Nulls of the belief scores: the same scores for decoded maps that carry no information about the
step, and the probe's excess over them (Recovery alone can reward a worse map).

Both nulls keep the probe map's agent/goal read-out, so each excess isolates one part of the
belief. ``other_grid``: the maps the same decoder made on *another* grid of the same size and
density (a seeded derangement within strata, :func:`goalprobe.probes.splits.shuffle_by_grid`,
falling back to size, then one stratum: ``stratified_by``). ``prior``: the cells of
:class:`goalprobe.probes.baselines.CellPrior` ``(by="size_density")`` fitted on the training
grids, which isolates the walls (only when the read-out is informative: with a random read-out
random walls beat it, tests/probes/test_score_nulls.py). The excess is probe minus null (null
minus probe for ``qmdp_regret``) under paired grid-bootstrap draws, per null and over the
strongest (as :func:`goalprobe.probes.metrics.selectivity`); each null's ceiling is the excess
the true walls would have (:func:`true_wall_maps`)."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor

import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.probes.baselines import CellPrior, covariates
from goalprobe.probes.metrics import selectivity
from goalprobe.probes.scoring.belief_table import (
    LOWER_IS_BETTER,
    MAP_FREE,
    StepFacts,
    StepTable,
    belief_metrics,
    bootstrap_args,
    den_counts,
    score_rows,
    trajectory_weights,
)
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.probes.splits import shuffle_by_grid

from goalprobe.stats import GridBootstrap

STRATA = ("size_density", "size", "all")
"""Conditioning levels of the ``other_grid`` derangement, from the finest."""


def _strata(level: str, sizes: np.ndarray, densities: np.ndarray) -> np.ndarray:
    if level == "size_density":
        return np.asarray(
            [f"{int(s)}|{round(float(d), 6):g}" for s, d in zip(sizes, densities, strict=True)]
        )
    if level == "size":
        return np.asarray([str(int(s)) for s in sizes])
    return np.zeros(len(sizes), dtype=np.int64)


def other_grid_sources(
    grid_ids: np.ndarray, sizes: np.ndarray, densities: np.ndarray, random_state: int
) -> tuple[np.ndarray, str] | None:
    """``(source_rows, stratified_by)``: each row's source row, on another grid of its stratum
    (seeded); None when fewer than two grids were decoded."""
    grid_ids = np.asarray(grid_ids)
    if np.unique(grid_ids).size < 2:
        return None
    rows = np.arange(len(grid_ids))
    for level in STRATA:
        strata = _strata(level, sizes, densities)
        per_grid = dict(zip(grid_ids.tolist(), strata.tolist(), strict=True))
        _, counts = np.unique(list(per_grid.values()), return_counts=True)
        if counts.min() >= 2:
            return shuffle_by_grid(rows, grid_ids, strata=strata, random_state=random_state), level
    raise AssertionError("the last level is one stratum of >= 2 grids")


def fit_prior(labels: np.ndarray, sizes: np.ndarray, densities: np.ndarray) -> CellPrior:
    """The size-and-density cell prior of training label maps ``(M, S, S)``."""
    return CellPrior(by="size_density").fit(covariates(sizes, densities), labels)


def true_wall_maps(facts: list[StepFacts], canvas: int) -> tuple[np.ndarray, np.ndarray]:
    """``(probs (N, canvas, canvas, 3), classes)``: every step's true walls one-hot, the nulls'
    ceiling map (doors are not drawn: approximate on key/door grids)."""
    classes = np.asarray([CellType.OPEN, CellType.WALL, CellType.PADDING], dtype=np.int64)
    probs = np.zeros((len(facts), canvas, canvas, 3), dtype=np.float32)
    probs[..., 2] = 1.0
    for i, f in enumerate(facts):
        walls = np.asarray(f.walls, dtype=bool)
        n = f.size
        probs[i, :n, :n] = np.stack([~walls, walls, np.zeros_like(walls)], axis=-1)
    return probs, classes


def null_report(
    probe: tuple[np.ndarray, np.ndarray],
    nulls: Mapping[str, tuple[np.ndarray, np.ndarray]],
    grid_ids: np.ndarray,
    names: tuple[str, ...],
    *,
    n_bootstrap: int,
    confidence_level: float,
    rng: np.random.Generator,
    episodes: np.ndarray | None = None,
    ceiling: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[dict, dict]:
    """Null scores and the probe's excess over them, under shared grid-bootstrap draws.

    ``probe`` and each of ``nulls`` are per-step ``(num, den)`` ``(N, M)`` of metrics ``names``;
    with ``episodes`` every source is weighted as the study's Figure 4; ``ceiling`` is the
    ceiling map's ``(num, den)``. Returns ``(by_null, excess)``: ``by_null[name] = {"overall":
    {metric: STAT}, "excess": {metric: EXCESS}, "ceiling": CEILING}`` and ``excess`` over the
    strongest null (map-free metrics get none); ``CEILING`` is the Acc. Dec. of the ceiling map
    minus the null's, what the agent's actions let any decoded map gain over this null."""
    boot = GridBootstrap.from_grid_ids(
        grid_ids, n_resamples=n_bootstrap, confidence=confidence_level, random_state=rng
    )
    scored = [j for j, m in enumerate(names) if m not in MAP_FREE]

    def samples_of(num: np.ndarray, den: np.ndarray) -> np.ndarray:
        if episodes is None:
            return boot.ratio(num, den)
        w = trajectory_weights(den, grid_ids, episodes)
        return boot.ratio(num * w, den * w)

    ref = samples_of(*probe)
    top = None if ceiling is None else samples_of(*ceiling)
    all_samples = {"probe": {names[j]: ref[:, j] for j in scored}}
    by_null = {}
    for name, (num, den) in nulls.items():
        s = samples_of(num, den)
        all_samples[name] = {names[j]: s[:, j] for j in scored}
        g_den = boot.grid_sums(den)
        overall = {
            metric: {**boot.summary(s[:, j]), **den_counts(g_den[:, j])}
            for j, metric in enumerate(names)
        }
        by_null[name] = {"overall": overall}
        if top is not None:
            dec = names.index("acc_dec")
            by_null[name]["ceiling"] = boot.summary(top[:, dec] - s[:, dec], bounds=(-1.0, 1.0))
    for name in nulls:
        by_null[name]["excess"] = selectivity(
            all_samples, "probe", (name,), boot, lower_is_better=LOWER_IS_BETTER
        )
    excess = selectivity(all_samples, "probe", tuple(nulls), boot, lower_is_better=LOWER_IS_BETTER)
    return by_null, excess


def score_nulls(
    probs: np.ndarray,
    classes: np.ndarray,
    idx: np.ndarray,
    grid_ids: np.ndarray,
    probe_scores: tuple[np.ndarray, np.ndarray],
    steps: StepTable,
    config: ScoreConfig,
    prior: tuple[CellPrior | None, int],
    *,
    seed_text: str,
    agent: np.ndarray | None = None,
    goal: np.ndarray | None = None,
    executor: Executor | None = None,
    progress: bool = False,
) -> dict:
    """The null part of a source's ``belief.json`` entry: ``nulls``, ``nulls_unavailable`` and
    ``excess`` (:func:`null_report`) for decoded maps ``probs`` of steps ``idx``.

    ``probe_scores`` is the source's :func:`score_rows`; ``prior`` is ``(prior fitted on the
    training grids or None, number of training grids)``; ``seed_text`` seeds the bootstrap;
    ``agent`` / ``goal`` are the read-outs (None: the probe's own channels)."""
    from goalprobe.probes.decoded_maps import full_class_probs

    if agent is None or goal is None:  # the read-out is the probe's own channels
        full = full_class_probs(probs, classes)
        agent = full[..., int(CellType.AGENT)] if agent is None else agent
        goal = full[..., int(CellType.GOAL)] if goal is None else goal
    sizes, dens = np.asarray(steps.size)[idx], np.asarray(steps.density)[idx]
    facts = steps.facts(idx)
    scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    extra: dict[str, dict] = {}
    unavailable: dict[str, str] = {}
    run: dict = {"executor": executor, "progress": progress}
    for name in config.nulls:
        if name == "other_grid":
            found = other_grid_sources(grid_ids, sizes, dens, config.random_state)
            if found is None:
                unavailable[name] = "fewer than two decoded grids"
                continue
            null_probs, null_classes = probs[found[0]], classes
            readout = (agent[found[0]], goal[found[0]])
            extra[name] = {"stratified_by": found[1]}
        else:
            if prior[0] is None:
                unavailable[name] = "no training grid (every store grid was decoded)"
                continue
            null_probs = prior[0].predict_proba(covariates(sizes, dens))
            null_classes = prior[0].classes_
            readout = (agent, goal)
            extra[name] = {"n_training_grids": prior[1]}
        scores[name] = score_rows(
            null_probs,
            null_classes,
            facts,
            config.top_k,
            agent=readout[0],
            goal=readout[1],
            label=f"null {name} {seed_text}",
            **run,
        )
    by_null: dict = {}
    excess: dict = {}
    if scores:
        ceiling = None
        if all(f.walls is not None for f in facts):
            top_probs, top_classes = true_wall_maps(facts, probs.shape[1])
            ceiling = score_rows(
                top_probs,
                top_classes,
                facts,
                config.top_k,
                agent=agent,
                goal=goal,
                label=f"ceiling {seed_text}",
                **run,
            )
        by_null, excess = null_report(
            probe_scores,
            scores,
            grid_ids,
            belief_metrics(config.top_k),
            **bootstrap_args(config, "nulls" + seed_text),
            episodes=steps.episodes(idx) if config.weighting == "grid" else None,
            ceiling=ceiling,
        )
    return {
        "nulls": {k: {**v, **extra[k]} for k, v in by_null.items()},
        "nulls_unavailable": unavailable,
        "excess": excess,
    }
