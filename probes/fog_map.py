"""What the anchors hold under fog: the revealed map (the agent's exact knowledge,
:func:`goalprobe.gridworld.fog.fog_view`) against the true grid, on held-out grids. No I/O.

* :func:`revealed_probe`: does the residual stream hold which cells are revealed? One logistic
  read-out per canvas cell, against the per-cell majority and a read-out from the distance to
  the agent's cell alone (the window around the agent is always revealed).
* :func:`hidden_wall_tracking`: at hidden cells, does the decoded map follow the true grid or
  the knowledge? The headline probe's ``P(WALL)`` there as a detector of true walls (ROC AUC)
  against the size-and-density prior's (:class:`goalprobe.probes.baselines.CellPrior`): a map
  that tracks knowledge carries nothing about hidden walls beyond the prior.
"""

from __future__ import annotations

import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.probes.baselines import CellPrior, covariates
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from goalprobe.stats import (
    Estimate,
    GridBootstrap,
    as_generator,
    interval_verdict,
    percentile_interval,
)
from goalprobe.stats.estimate import finite_or_none


def in_grid_mask(grid_sizes: np.ndarray, side: int) -> np.ndarray:
    """``(N, S, S)`` bool: the cells inside each row's grid."""
    idx = np.arange(side)
    n = np.asarray(grid_sizes)[:, None, None]
    return (idx[None, :, None] < n) & (idx[None, None, :] < n)


def chebyshev_to_agent(agent_row_col: np.ndarray, side: int) -> np.ndarray:
    """``(N, S, S)`` Chebyshev distance of every canvas cell to the row's agent cell."""
    idx = np.arange(side)
    rows = np.abs(idx[None, :, None] - agent_row_col[:, 0, None, None])
    cols = np.abs(idx[None, None, :] - agent_row_col[:, 1, None, None])
    return np.maximum(rows, cols)


def revealed_probe(
    acts: np.ndarray,
    revealed: np.ndarray,
    grid_sizes: np.ndarray,
    agent_row_col: np.ndarray,
    grid_ids: np.ndarray,
    train: np.ndarray,
    *,
    n_resamples: int = 1000,
    random_state: int = 0,
) -> dict:
    """Decode each row's ``revealed (N, S, S)`` cells inside its grid from ``acts (N, ...)``
    (flattened per row), fitted on the ``train`` rows (a split by grid), scored on the others.

    Returns ``{probe, majority, distance, best_baseline, probe_minus_best_baseline, verdict,
    test_grids}`` (and ``detectable``): cell accuracies with grid-bootstrap intervals; the verdict
    on the probe's margin over the stronger baseline (:func:`goalprobe.stats.interval_verdict`).
    """
    acts = np.asarray(acts, dtype=np.float64)
    acts = acts.reshape(len(acts), -1)  # the anchors' positions side by side
    side = revealed.shape[1]
    inside = in_grid_mask(grid_sizes, side)
    test = ~np.asarray(train, dtype=bool)
    mean, std = acts[train].mean(axis=0), acts[train].std(axis=0) + 1e-6
    z = (acts - mean) / std
    probe = np.zeros_like(revealed, dtype=bool)
    majority = np.zeros_like(revealed, dtype=bool)
    for r in range(side):
        for c in range(side):
            rows = train & inside[:, r, c]
            if not rows.any():
                continue
            y = revealed[rows, r, c]
            majority[:, r, c] = y.mean() >= 0.5
            if y.min() == y.max():
                probe[:, r, c] = bool(y[0])
                continue
            model = LogisticRegression(C=0.1, max_iter=500).fit(z[rows], y)
            probe[:, r, c] = model.predict(z)
    dist = chebyshev_to_agent(agent_row_col, side).astype(np.float64)
    features = np.stack([dist, dist**2], axis=-1)
    fit_mask = train[:, None, None] & inside
    distance_model = LogisticRegression(max_iter=500).fit(
        features[fit_mask], revealed[fit_mask].astype(int)
    )
    distance = distance_model.predict(features.reshape(-1, 2)).reshape(revealed.shape).astype(bool)
    boot = GridBootstrap.from_grid_ids(
        grid_ids[test], n_resamples=n_resamples, random_state=random_state
    )
    mask, truth = inside[test], revealed[test]
    cells = mask.reshape(len(mask), -1).sum(axis=1)
    preds = {"probe": probe, "majority": majority, "distance": distance}
    hits = {
        k: ((p[test] == truth) & mask).reshape(len(mask), -1).sum(axis=1) for k, p in preds.items()
    }
    out = {
        k: boot.summary(boot.ratio(h, cells)) | {"n_cells": int(cells.sum())}
        for k, h in hits.items()
    }
    best = max(("majority", "distance"), key=lambda k: out[k]["value"] or 0.0)
    margin = boot.summary(boot.ratio(hits["probe"], cells) - boot.ratio(hits[best], cells))
    return {
        **out,
        "best_baseline": best,
        "probe_minus_best_baseline": margin,
        **interval_verdict(margin).to_dict(),
        "test_grids": int(boot.n_grids),
    }


def _auc(score: np.ndarray, truth: np.ndarray) -> float:
    if truth.min() == truth.max():
        return float("nan")
    return float(roc_auc_score(truth, score))


def hidden_wall_tracking(
    decoded: np.ndarray,
    cell_types: np.ndarray,
    revealed: np.ndarray,
    grid_sizes: np.ndarray,
    densities: np.ndarray,
    grid_ids: np.ndarray,
    train: np.ndarray,
    *,
    n_resamples: int = 200,
    random_state: int = 0,
) -> dict:
    """How well the decoded map's ``P(WALL)`` (``decoded (N, S, S, len(CellType))``) finds the
    true walls at hidden and at revealed cells of the test rows, against the size-and-density
    prior fitted on the ``train`` rows.

    Returns per part (``hidden``, ``revealed``) both AUCs, their difference with a grid-bootstrap
    interval and the cells scored; ``beyond_prior_at_hidden`` is ``yes`` when the hidden cells'
    difference lies above 0.
    """
    train = np.asarray(train, dtype=bool)
    test = ~train
    X = covariates(np.asarray(grid_sizes), np.asarray(densities))
    prior = CellPrior(by="size_density").fit(X[train], cell_types[train])
    wall_index = np.flatnonzero(prior.classes_ == CellType.WALL)
    prior_wall = (
        prior.predict_proba(X[test])[..., wall_index[0]]
        if wall_index.size
        else np.zeros(cell_types[test].shape)
    )
    decoded_wall = decoded[test][..., CellType.WALL]
    truth = cell_types[test] == CellType.WALL
    inside = in_grid_mask(np.asarray(grid_sizes)[test], cell_types.shape[1])
    objects = np.isin(cell_types[test], [CellType.AGENT, CellType.GOAL])
    ids = np.asarray(grid_ids)[test]
    uniques = np.unique(ids)
    rng = as_generator(random_state)
    out: dict = {}
    for part, mask in (
        ("hidden", inside & ~revealed[test] & ~objects),
        ("revealed", inside & revealed[test] & ~objects),
    ):
        row_of_cell = np.broadcast_to(np.arange(mask.shape[0])[:, None, None], mask.shape)[mask]
        d, p, t = decoded_wall[mask], prior_wall[mask], truth[mask]
        values = {"decoded": _auc(d, t), "prior": _auc(p, t)}
        grid_of_cell = np.searchsorted(uniques, ids[row_of_cell])
        cells_of = [np.flatnonzero(grid_of_cell == g) for g in range(len(uniques))]
        draws = []
        for _ in range(n_resamples if len(uniques) >= 2 else 0):
            picks = rng.integers(0, len(uniques), size=len(uniques))
            take = np.concatenate([cells_of[g] for g in picks])
            if take.size:
                draws.append(_auc(d[take], t[take]) - _auc(p[take], t[take]))
        draws_arr = np.asarray([x for x in draws if np.isfinite(x)])
        low, high = percentile_interval(draws_arr) if draws_arr.size >= 2 else (np.nan, np.nan)
        diff = values["decoded"] - values["prior"]
        out[part] = {
            "decoded_auc": finite_or_none(values["decoded"]),
            "prior_auc": finite_or_none(values["prior"]),
            "difference": Estimate(
                finite_or_none(diff), finite_or_none(low), finite_or_none(high)
            ).to_dict(),
            "cells": int(mask.sum()),
        }
    hidden = Estimate.from_dict(out["hidden"]["difference"])
    verdict = interval_verdict(hidden)
    out["beyond_prior_at_hidden"] = verdict.answer
    if verdict.detectable is not None:
        out["beyond_prior_detectable"] = verdict.detectable
    out["test_grids"] = int(len(uniques))
    return out
