"""Learning curves: a probe and its controls against the number of training grids.

A flat curve with the probe at its prior says more than a null on a few dozen grids; a rising
one says "collect more data". For a fixed test split the training grids are shuffled once
(seeded, within sizes, taken round-robin across sizes) and everything is refit on nested
prefixes, each point scored as the probe sweep scores a run
(:func:`goalprobe.probes.probe_sweep.fit_and_score`), keeping the metrics named in ``metrics``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from goalprobe.probes.probe_sweep import ProbeData, ProbeSweepConfig, fit_and_score

CELL_METRICS: tuple[str, ...] = ("accuracy_no_padding", "agent_top1", "goal_top1", "auc/wall")
"""What a cell-type curve keeps per model (the rest of each point's metrics is dropped)."""

DISTANCE_METRICS: tuple[str, ...] = ("r2", "mae")
"""What a distance curve keeps per model."""


def grid_counts(n_train_grids: int, points: int = 5, smallest: int = 8) -> tuple[int, ...]:
    """Up to ``points`` training-set sizes spaced geometrically from ``smallest`` to every
    training grid (distinct, increasing, the last always ``n_train_grids``)."""
    if n_train_grids < 1:
        raise ValueError("no training grids")
    low = min(smallest, n_train_grids)
    counts = np.unique(np.geomspace(low, n_train_grids, num=max(points, 1)).round().astype(int))
    return tuple(int(c) for c in counts)


def _interleaved_by_size(data: ProbeData, train, train_grids, random_state) -> np.ndarray:
    """The training grids shuffled within each grid size, then taken round-robin across sizes,
    so every prefix holds the sizes in proportion (and the shuffled control, which permutes
    within sizes, has at least two grids per size once the prefix holds two per size)."""
    rng = np.random.default_rng(random_state)
    size_of = dict(zip(data.grid_ids[train], data.grid_sizes[train].tolist(), strict=True))
    by_size = [
        rng.permutation([g for g in train_grids if size_of[g] == size]).tolist()
        for size in sorted(set(size_of.values()))
    ]
    order = [g for rank in itertools.zip_longest(*by_size) for g in rank if g is not None]
    return np.asarray(order, dtype=object)


def learning_curve(
    data: ProbeData,
    train: np.ndarray,
    test: np.ndarray,
    estimator,
    config: ProbeSweepConfig,
    *,
    counts: Sequence[int] | None = None,
    metrics: Sequence[str] | None = None,
) -> dict:
    """Fit and score ``estimator`` and its controls on growing subsets of the training grids.

    ``train``/``test``: row positions in ``data`` (split by grid; the test rows the same for
    every point); ``counts``: numbers of training grids (default :func:`grid_counts`);
    ``metrics``: kept per model (default by target). Returns ``{n_train_grids_total,
    n_test_grids, metrics, points: [{n_train_grids, n_train, models, selectivity}]}``.
    """
    train, test = np.asarray(train), np.asarray(test)
    train_grids = np.unique(data.grid_ids[train])
    if set(train_grids.tolist()) & set(np.unique(data.grid_ids[test]).tolist()):
        raise ValueError("training and test rows share grids; split by grid first")
    counts = tuple(counts) if counts is not None else grid_counts(len(train_grids))
    if not counts or min(counts) < 1 or max(counts) > len(train_grids):
        raise ValueError(f"counts must lie in [1, {len(train_grids)}], got {counts}")
    keep = tuple(metrics or (CELL_METRICS if config.target == "cell_type" else DISTANCE_METRICS))
    order = _interleaved_by_size(data, train, train_grids, config.random_state)
    points = []
    for count in sorted(set(counts)):
        rows = train[np.isin(data.grid_ids[train], order[:count])]
        _, overall, _, _ = fit_and_score(config, estimator, data, rows, test)
        points.append(
            {
                "n_train_grids": int(count),
                "n_train": int(len(rows)),
                "models": {
                    name: {m: values[m] for m in keep if m in values}
                    for name, values in overall["models"].items()
                },
                "selectivity": {
                    m: v for m, v in overall.get("selectivity", {}).items() if m in keep
                },
            }
        )
    return {
        "n_train_grids_total": int(len(train_grids)),
        "n_test_grids": int(np.unique(data.grid_ids[test]).size),
        "metrics": list(keep),
        "points": points,
    }
