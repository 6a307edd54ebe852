"""Decoding helpers and metrics of cell-type probes and goal-distance regressors.

Pure numpy. Every metric is a function of additive per-grid sums, so intervals come from a
*grid* bootstrap (every row of a drawn grid enters with the grid's multiplicity). Models
evaluated together share the draws, so their differences (probe minus control; pre minus post)
get paired intervals.

**Cell-map metrics**: ``accuracy`` over every queried cell (padding included for a general probe);
``accuracy_no_padding`` over cells whose true class is not ``PADDING`` (a padding prediction on a
grid cell counts as an error); ``balanced_accuracy`` (mean recall over the classes present in the
evaluated rows); ``recall/<class>`` and ``precision/<class>``; ``agent_top1`` and ``goal_top1``
(the most probable cell for the class is the true cell) and ``agent_manhattan`` /
``goal_manhattan`` (mean Manhattan distance from that cell to the true one).

**Distance metrics**: ``mae``, ``rmse`` and ``r2`` (``1 - SS_res / SS_tot`` around the mean of the
evaluated rows, as ``sklearn.metrics.r2_score``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.probes.baselines import uniform_top1

from goalprobe.stats import (
    Estimate,
    GridBootstrap,
    cluster_rate_interval,
    grid_codes,
    p_from_draws,
    safe_ratio,
)

LOCALISED = (CellType.AGENT, CellType.GOAL)
"""Classes with one true cell per map, scored by top-1 localisation."""


def top_k_cells(probs: np.ndarray, classes: np.ndarray, cell_type: int, k: int = 1) -> np.ndarray:
    """``(N, k, 2)`` int64 ``(row, col)`` of the ``k`` cells with the highest probability of
    ``cell_type`` in ``probs (N, S, S, C)`` over ``classes``, most probable first (ties:
    row-major)."""
    p = np.asarray(probs)
    n, side = p.shape[0], p.shape[1]
    if not 1 <= k <= side * side:
        raise ValueError(f"k must lie in 1..{side * side}, got {k}")
    column = np.flatnonzero(np.asarray(classes) == int(cell_type))
    if column.size == 0:
        raise ValueError(
            f"{CellType(cell_type).name} is not among the probe's classes {np.asarray(classes).tolist()}"
        )
    flat = p[..., column[0]].reshape(n, side * side)
    order = np.argsort(-flat, axis=1, kind="stable")[:, :k]
    return np.stack(np.divmod(order, side), axis=-1).astype(np.int64)


def cell_positions(labels: np.ndarray, cell_type: int) -> np.ndarray:
    """``(N, 2)`` int64 ``(row, col)`` of the single ``cell_type`` cell (agent, goal) of every
    ``(N, S, S)`` label map."""
    mask = np.asarray(labels) == int(cell_type)
    counts = mask.sum(axis=(1, 2))
    wrong = np.flatnonzero(counts != 1)
    if wrong.size:
        raise ValueError(
            f"label map row {wrong[0]} has {counts[wrong[0]]} {CellType(cell_type).name} cells "
            f"({wrong.size} such rows); pass its position explicitly"
        )
    side = mask.shape[1]
    flat = mask.reshape(mask.shape[0], -1).argmax(axis=1)
    return np.stack(np.divmod(flat, side), axis=-1).astype(np.int64)


RATE_COUNTS = "_rate_counts"
"""Key under which a model's sample function may also return ``metric -> (k, n)`` per-grid
successes and trials of a rate, reported with :func:`goalprobe.stats.cluster_rate_interval`
(honest at 0% and 100%); paired differences keep the shared draws."""

LOWER_IS_BETTER: frozenset[str] = frozenset({"mae", "rmse", "agent_manhattan", "goal_manhattan"})
"""Metrics where a smaller value is better (selectivity is then baseline minus probe)."""


def selectivity(
    samples: Mapping[str, dict],
    reference: str,
    baselines,
    boot: GridBootstrap,
    lower_is_better: frozenset[str] = LOWER_IS_BETTER,
) -> dict:
    """Per metric: the ``reference``'s advantage over the strongest of ``baselines`` (best point
    value) from ``samples`` (model -> metric -> ``(1 + B,)`` under ``boot``'s draws).

    Returns metric -> ``{value, ci_low, ci_high, baseline, above_baseline, p_draws}``
    (``p_draws``: one-sided p of "above the baseline", absent without draws).
    """
    out = {}
    for metric, ref in samples[reference].items():
        present = [b for b in baselines if b in samples and metric in samples[b]]
        defined = [b for b in present if np.isfinite(samples[b][metric][0])]
        if not defined or not np.isfinite(ref[0]):
            continue
        lower = metric in lower_is_better
        pick = min if lower else max
        strongest = pick(defined, key=lambda b: float(samples[b][metric][0]))
        diff = samples[strongest][metric] - ref if lower else ref - samples[strongest][metric]
        stat = boot.summary(diff)
        stat["baseline"] = strongest
        stat["above_baseline"] = bool(Estimate.from_dict(stat).above(0))
        if boot.n_resamples:  # the one-sided p of "above" from the draws themselves
            stat["p_draws"] = p_from_draws(diff[1:], 0.0)
        out[metric] = stat
    return out


def _evaluate(
    models: Mapping[str, Callable[[np.ndarray, GridBootstrap], dict[str, np.ndarray]]],
    rows: np.ndarray,
    codes: np.ndarray,
    reference: str | None,
    n_boot: int,
    confidence_level: float,
    rng: np.random.Generator,
    baselines: tuple[str, ...] = (),
) -> dict:
    """Metric samples for every model on ``rows``, shared bootstrap draws, paired differences
    and the selectivity of ``reference`` over the strongest of ``baselines``."""
    _, local = np.unique(codes[rows], return_inverse=True)
    boot = GridBootstrap.from_codes(
        local,
        int(local.max()) + 1,
        n_resamples=n_boot,
        confidence=confidence_level,
        random_state=rng,
    )
    samples = {name: fn_(rows, boot) for name, fn_ in models.items()}
    # the RATE_COUNTS entry is a ``metric -> (k, n)`` dict, not one of the metric arrays
    counts: dict[str, Any] = {name: s.pop(RATE_COUNTS, {}) for name, s in samples.items()}

    def summary(name: str, metric: str, values: np.ndarray) -> dict:
        if metric in counts[name] and np.isfinite(values[0]):
            k, n = counts[name][metric]
            stat = cluster_rate_interval(k, n, confidence_level)
            return {key: stat[key] for key in ("value", "ci_low", "ci_high", "n_eff")}
        return boot.summary(values)

    out = {
        "n_examples": len(rows),
        "n_grids": boot.n_grids,
        "models": {
            name: {k: summary(name, k, v) for k, v in s.items()} for name, s in samples.items()
        },
    }
    if reference is not None:
        out["differences"] = {
            f"{reference} - {name}": {
                k: boot.summary(samples[reference][k] - s[k]) for k in s if k in samples[reference]
            }
            for name, s in samples.items()
            if name != reference
        }
        if baselines:
            out["selectivity"] = selectivity(samples, reference, baselines, boot)
    return out


def _grouped(
    models,
    n: int,
    grid_ids,
    groups: Mapping[str, np.ndarray | None],
    reference,
    baselines: tuple[str, ...],
    n_boot: int,
    level: float,
    random_state: int,
    extra: Mapping | None = None,
) -> dict:
    """:func:`_evaluate` on every row and within each value of ``groups`` (``by_<name>``),
    then ``extra``, the confidence level and the number of draws."""
    ids = np.asarray(grid_ids)
    if ids.shape != (n,):
        raise ValueError(f"grid_ids must have shape ({n},), got {ids.shape}")
    codes = grid_codes(ids)[1]
    rng = np.random.default_rng(random_state)
    baselines = tuple(baselines)
    result = _evaluate(models, np.arange(n), codes, reference, n_boot, level, rng, baselines)
    for group_name, values in groups.items():
        if values is None:
            continue
        values = np.asarray(values)
        if values.shape != (n,):
            raise ValueError(f"{group_name} must have shape ({n},), got {values.shape}")
        keys = np.round(values.astype(np.float64), 6)  # NaN (unknown) rows join no group
        result[f"by_{group_name}"] = {
            f"{key:g}": _evaluate(
                models, np.flatnonzero(keys == key), codes, reference, n_boot, level, rng, baselines
            )
            for key in np.unique(keys[np.isfinite(keys)])
        }
    result.update(extra or {})
    result["confidence_level"] = level
    result["n_boot"] = n_boot
    return result


def _check_models(predictions: Mapping, reference: str | None) -> None:
    if not predictions:
        raise ValueError("predictions is empty; pass at least one model")
    if reference is not None and reference not in predictions:
        raise ValueError(f"reference {reference!r} is not one of {list(predictions)}")


def evaluate_cell_maps(
    predictions: Mapping[str, tuple[np.ndarray, np.ndarray]],
    labels: np.ndarray,
    grid_ids: np.ndarray,
    *,
    grid_sizes: np.ndarray | None = None,
    densities: np.ndarray | None = None,
    agent_row_col: np.ndarray | None = None,
    goal_row_col: np.ndarray | None = None,
    reference: str | None = None,
    baselines: tuple[str, ...] = (),
    uniform_localisation: bool = False,
    n_boot: int = 1000,
    confidence_level: float = 0.95,
    random_state: int = 0,
) -> dict:
    """Cell-map metrics with grid-bootstrap intervals, overall and by grid size and density.

    Args:
        predictions: model name -> ``(probs (N, S, S, C), classes (C,))`` on the same rows.
        labels: ``(N, S, S)`` true ``CellType`` maps; ``grid_ids`` ``(N,)`` their grids.
        grid_sizes, densities: optional ``(N,)``, for ``by_grid_size`` / ``by_density``.
        agent_row_col, goal_row_col: optional ``(N, 2)`` true cells (default: from ``labels``).
        reference: model whose paired differences to every other model are reported.
        baselines: models the reference must beat (:func:`selectivity`).
        uniform_localisation: also score ``"uniform"``, a guess uniform among the grid's
            non-wall cells (``agent_top1``/``goal_top1`` only); it joins ``baselines``.

    Returns a JSON-ready dict: ``n_examples``, ``n_grids``, ``models`` (name -> metric ->
    ``{value, ci_low, ci_high}``; ``auc/<class>`` one class against the rest over grid cells,
    ``auc_macro`` their mean), ``differences``, ``selectivity``, and ``by_grid_size`` /
    ``by_density`` (group -> the same structure). Undefined metrics are None.
    """
    _check_models(predictions, reference)
    lab = np.asarray(labels)
    if lab.ndim != 3:
        raise ValueError(f"labels must be (N, S, S), got shape {lab.shape}")
    truth = _CellMapTruth.build(predictions, lab, agent_row_col, goal_row_col)
    models = {name: _cell_map_sampler(p, c, truth) for name, (p, c) in predictions.items()}
    if uniform_localisation:
        sides = (lab != CellType.PADDING).any(axis=2).sum(axis=1)  # rows before the padding
        chance = uniform_top1(lab, sides if grid_sizes is None else grid_sizes)

        def uniform(rows, boot: GridBootstrap):
            return {f"{CellType(c).name.lower()}_top1": boot.ratio(chance[rows]) for c in LOCALISED}

        models["uniform"] = uniform
        baselines = (*baselines, "uniform")
    extra = {"classes": [CellType(c).name.lower() for c in truth.union], "map_side": lab.shape[1]}
    groups = {"grid_size": grid_sizes, "density": densities}
    return _grouped(
        models,
        truth.n,
        grid_ids,
        groups,
        reference,
        baselines,
        n_boot,
        confidence_level,
        random_state,
        extra,
    )


@dataclass(frozen=True)
class _CellMapTruth:
    """The true maps indexed for every model's samples (``union``: the sorted classes of the
    labels and every model; ``grid_cell``: ``(N, S*S)`` cells inside the grid)."""

    n: int
    union: np.ndarray
    lookup: np.ndarray
    true_idx: np.ndarray
    truth: dict
    grid_cell: np.ndarray
    cell_row: np.ndarray
    cell_true: np.ndarray
    auc_classes: list

    @classmethod
    def build(cls, predictions, lab, agent_row_col, goal_row_col) -> _CellMapTruth:
        """Check every model's shape against ``lab`` and index the truth."""
        n = lab.shape[0]
        all_classes = set(np.unique(lab).tolist())
        for name, (probs, classes) in predictions.items():
            shape = np.asarray(probs).shape
            if shape[:3] != lab.shape:
                raise ValueError(f"predictions[{name!r}] has shape {shape}, labels {lab.shape}")
            if shape[3] != len(classes):
                raise ValueError(
                    f"predictions[{name!r}]: {len(classes)} classes for {shape[3]} columns"
                )
            all_classes |= set(np.asarray(classes).tolist())
        union = np.array(sorted(all_classes), dtype=np.int64)
        lookup = np.zeros(int(union.max()) + 1, dtype=np.int64)
        lookup[union] = np.arange(len(union))
        truth = {CellType.AGENT: agent_row_col, CellType.GOAL: goal_row_col}
        for cell_type in LOCALISED:
            if truth[cell_type] is None and (lab == cell_type).any():
                truth[cell_type] = cell_positions(lab, cell_type)
            elif truth[cell_type] is not None:
                truth[cell_type] = np.asarray(truth[cell_type], dtype=np.int64).reshape(n, 2)
        grid_cell = lab.reshape(n, -1) != CellType.PADDING
        cell_true = lab.reshape(n, -1)[grid_cell]
        auc_classes = [c for c in union if c != CellType.PADDING and (cell_true == c).any()]
        true_idx = lookup[lab.reshape(n, -1)]
        cell_row = np.broadcast_to(np.arange(n)[:, None], grid_cell.shape)[grid_cell]
        return cls(n, union, lookup, true_idx, truth, grid_cell, cell_row, cell_true, auc_classes)


def _cell_map_sampler(probs: np.ndarray, classes: np.ndarray, t: _CellMapTruth):
    """One model's ``(rows, boot) -> metric -> (1 + B,)`` for :func:`_evaluate`."""
    probs = np.asarray(probs)
    classes = np.asarray(classes)
    n, n_u = t.n, len(t.union)
    pred_idx = t.lookup[classes[probs.argmax(axis=-1)].reshape(n, -1)]
    flat_probs = probs.reshape(n, -1, len(classes))
    cell_scores = {
        int(c): (
            flat_probs[..., int(np.flatnonzero(classes == c)[0])][t.grid_cell].astype(np.float64)
            if (classes == c).any()
            else np.zeros(len(t.cell_true))
        )
        for c in t.auc_classes
    }
    localised = {}
    for cell_type in LOCALISED:
        if t.truth[cell_type] is None or int(cell_type) not in classes:
            continue
        top = top_k_cells(probs, classes, cell_type, 1)[:, 0]
        dist = np.abs(top - t.truth[cell_type]).sum(axis=1)
        localised[CellType(cell_type).name.lower()] = (dist == 0, dist)

    def samples(rows, boot: GridBootstrap):
        n_grids = boot.n_grids
        flat = (boot.codes[:, None] * n_u + t.true_idx[rows]) * n_u + pred_idx[rows]
        per_grid = np.bincount(flat.ravel(), minlength=n_grids * n_u * n_u)
        per_grid = per_grid.reshape(n_grids, n_u, n_u).astype(np.float64)
        conf = boot.resample(per_grid)
        out = _confusion_metrics(conf, t.union, present=conf[0].sum(axis=1) > 0)
        rates = _confusion_rate_counts(per_grid, t.union)
        for cls_name, (hit, dist) in localised.items():
            out[f"{cls_name}_top1"] = boot.ratio(hit[rows])
            trials = boot.grid_sums(np.ones(len(rows)))
            rates[f"{cls_name}_top1"] = (boot.grid_sums(hit[rows]), trials)
            out[f"{cls_name}_manhattan"] = boot.ratio(dist[rows])
        if cell_scores:
            out.update(_class_aucs(cell_scores, rows, boot, t))
        out[RATE_COUNTS] = rates
        return out

    return samples


def _class_aucs(cell_scores: dict, rows: np.ndarray, boot: GridBootstrap, t: _CellMapTruth) -> dict:
    """``auc/<class>`` (one against the rest over the grid cells of ``rows``) and ``auc_macro``."""
    local = np.full(t.n, -1, dtype=np.int64)
    local[rows] = boot.codes
    keep = local[t.cell_row] >= 0
    out, aucs = {}, []
    for c, scores in cell_scores.items():
        positive = t.cell_true[keep] == c
        if positive.all() or not positive.any():
            continue
        auc = grid_weighted_auc(scores[keep], positive, local[t.cell_row[keep]], boot)
        out[f"auc/{CellType(c).name.lower()}"] = auc
        aucs.append(auc)
    if aucs:
        with np.errstate(invalid="ignore"):
            out["auc_macro"] = np.nanmean(np.stack(aucs), axis=0)
    return out


def grid_weighted_auc(
    scores: np.ndarray, positive: np.ndarray, cell_grid: np.ndarray, boot: GridBootstrap
) -> np.ndarray:
    """``(1 + B,)`` ROC AUC of ``scores`` for ``positive`` under every grid-bootstrap draw.

    Under grid multiplicities ``w`` the AUC is ``w^T C w / ((w . P)(w . N))``, ``C[g, h]`` the
    correctly ordered (positive of grid ``g``, negative of grid ``h``) pairs (ties one half),
    ``P``/``N`` each grid's positives and negatives: exact per draw at ``O(G^2)``. ``scores``,
    ``positive`` and ``cell_grid`` (index into ``boot``) are ``(M,)`` per cell.
    """
    n_grids = boot.n_grids
    pos, neg = positive, ~positive
    g_pos = cell_grid[pos]
    s_pos = scores[pos]
    counts_pos = np.bincount(g_pos, minlength=n_grids).astype(np.float64)
    counts_neg = np.bincount(cell_grid[neg], minlength=n_grids).astype(np.float64)
    pairs = np.zeros((n_grids, n_grids))
    order = np.lexsort((scores[neg], cell_grid[neg]))
    neg_scores, neg_grid = scores[neg][order], cell_grid[neg][order]
    bounds = np.searchsorted(neg_grid, np.arange(n_grids + 1))
    for h in range(n_grids):
        column = neg_scores[bounds[h] : bounds[h + 1]]
        if column.size == 0:
            continue
        below = np.searchsorted(column, s_pos, side="left")
        upto = np.searchsorted(column, s_pos, side="right")
        pairs[:, h] = np.bincount(g_pos, weights=below + 0.5 * (upto - below), minlength=n_grids)
    w = boot.weights
    correct = np.einsum("bg,bg->b", w @ pairs, w)  # a BLAS product: 20x the 3-operand einsum
    return safe_ratio(correct, (w @ counts_pos) * (w @ counts_neg))


def _confusion_rate_counts(conf: np.ndarray, classes: np.ndarray) -> dict:
    """:data:`RATE_COUNTS` of the accuracies of ``(G, C, C)`` per-grid confusion matrices (or of
    ``(B, C, C)`` resampled ones): ``metric -> (correct, cells)``."""
    diag = np.einsum("gcc->gc", conf)
    support = conf.sum(axis=2)
    keep = classes != CellType.PADDING
    return {
        "accuracy": (diag.sum(axis=1), support.sum(axis=1)),
        "accuracy_no_padding": (diag[:, keep].sum(axis=1), support[:, keep].sum(axis=1)),
    }


def _confusion_metrics(conf: np.ndarray, classes: np.ndarray, present: np.ndarray) -> dict:
    """Metrics of ``(B, C, C)`` confusion matrices (rows true, columns predicted)."""
    out = {k: safe_ratio(*v) for k, v in _confusion_rate_counts(conf, classes).items()}
    diag = np.einsum("bcc->bc", conf)
    recall = safe_ratio(diag, conf.sum(axis=2))
    precision = safe_ratio(diag, conf.sum(axis=1))
    with np.errstate(invalid="ignore"):
        out["balanced_accuracy"] = np.nanmean(np.where(present, recall, np.nan), axis=1)
    for i, c in enumerate(classes):
        if not present[i]:
            continue
        name = CellType(int(c)).name.lower()
        out[f"recall/{name}"] = recall[:, i]
        out[f"precision/{name}"] = precision[:, i]
    return out


def evaluate_distance(
    predictions: Mapping[str, np.ndarray],
    y_true: np.ndarray,
    grid_ids: np.ndarray,
    *,
    grid_sizes: np.ndarray | None = None,
    densities: np.ndarray | None = None,
    reference: str | None = None,
    baselines: tuple[str, ...] = (),
    n_boot: int = 1000,
    confidence_level: float = 0.95,
    random_state: int = 0,
) -> dict:
    """MAE, RMSE and R^2 of distance regressors with grid-bootstrap intervals.

    ``predictions``: model name -> ``(N,)`` predicted distances; ``y_true`` the true
    shortest-path distances; the other arguments and the JSON-ready result as in
    :func:`evaluate_cell_maps`.
    """
    _check_models(predictions, reference)
    y = np.asarray(y_true, dtype=np.float64)
    if y.ndim != 1:
        raise ValueError(f"y_true must be 1-D, got shape {y.shape}")
    n = len(y)

    def make_model(pred: np.ndarray):
        pred = np.asarray(pred, dtype=np.float64)
        if pred.shape != y.shape:
            raise ValueError(f"prediction shape {pred.shape} differs from y_true {y.shape}")
        err = pred - y

        def samples(rows, boot: GridBootstrap):
            stats = np.stack(
                [np.ones(len(rows)), np.abs(err[rows]), err[rows] ** 2, y[rows], y[rows] ** 2],
                axis=1,
            )
            s = boot.totals(stats)
            count, abs_sum, sq_sum, y_sum, y_sq = s.T
            ss_tot = y_sq - safe_ratio(y_sum**2, count)
            return {
                "mae": safe_ratio(abs_sum, count),
                "rmse": np.sqrt(safe_ratio(sq_sum, count)),
                "r2": 1.0 - safe_ratio(sq_sum, np.where(ss_tot > 1e-12, ss_tot, 0.0)),
            }

        return samples

    models = {name: make_model(p) for name, p in predictions.items()}
    groups = {"grid_size": grid_sizes, "density": densities}
    return _grouped(
        models, n, grid_ids, groups, reference, baselines, n_boot, confidence_level, random_state
    )
