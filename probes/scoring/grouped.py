"""Pooled scores with grid-bootstrap intervals, overall and by grid size, density and variant.

Every score is a ratio of per-step sums; intervals come from
:class:`goalprobe.stats.GridBootstrap`, all metrics of one call sharing the draws (paired). Also
the long-format rows of ``belief.csv`` and ``meg.csv`` (:data:`CSV_COLUMNS`). No I/O here."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from goalprobe.stats import (
    GridBootstrap,
    RandomState,
    cluster_rate_interval,
    is_count_rate,
)

CSV_COLUMNS = (
    "probe",
    "stage",
    "layer",
    "family",
    "group",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "n",
    "n_grids",
)
"""Columns of the long-format score tables (one row per probe x group x metric)."""

BREAKDOWNS = ("by_size", "by_density", "by_variant")
"""The breakdowns of every score, in table order."""


def seeded_rng(random_state: int, text: str) -> np.random.Generator:
    """A generator seeded by ``random_state`` and a label: each table draws its own bootstrap."""
    return np.random.default_rng([random_state, zlib.crc32(text.encode())])


def trajectory_weights(den: np.ndarray, grid_ids: np.ndarray, episodes: np.ndarray) -> np.ndarray:
    """``(N, M)`` row weights ``w`` turning a ratio of sums into the study's per-grid mean (Figure
    4, appendix B eqs. 2-3): ``sum(w num) / sum(w den)`` over whole grids is the mean over grids
    of the mean over their trajectories of each trajectory's ratio (``episodes``: unique
    trajectory keys)."""
    den = np.asarray(den, dtype=np.float64)
    _, ep = np.unique(np.asarray(episodes).astype(str), return_inverse=True)
    _, grid = np.unique(np.asarray(grid_ids).astype(str), return_inverse=True)
    ep_den = np.zeros((int(ep.max()) + 1 if ep.size else 0, den.shape[1]))
    np.add.at(ep_den, ep, den)
    ep_grid = np.zeros(ep_den.shape[0], dtype=np.int64)
    ep_grid[ep] = grid
    n_eps = np.zeros((int(grid.max()) + 1 if grid.size else 0, den.shape[1]))
    np.add.at(n_eps, ep_grid, (ep_den > 0).astype(np.float64))
    scale = ep_den[ep] * n_eps[grid]
    return np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)


def ratio_stats(
    num: np.ndarray,
    den: np.ndarray,
    grid_codes: np.ndarray,
    names: Sequence[str],
    *,
    n_bootstrap: int,
    confidence_level: float,
    rng: RandomState,
    weights: np.ndarray | None = None,
) -> dict[str, dict]:
    """``{name: {"value", "ci_low", "ci_high", "n", "n_grids"}}`` of ``(N, M)`` ratio-of-sums
    columns (``den`` 0 leaves a row out) with grid-bootstrap percentile intervals (``None`` where
    undefined); a column of counts (:func:`goalprobe.stats.is_count_rate`) gets the
    cluster-adjusted exact interval, honest at 0% and 100%. ``weights``
    (:func:`trajectory_weights`) weight the sums; ``n`` counts unweighted denominators."""
    boot = GridBootstrap.from_grid_ids(
        grid_codes, n_resamples=n_bootstrap, confidence=confidence_level, random_state=rng
    )
    g_den = boot.grid_sums(den)
    if weights is not None:
        num, den = num * weights, den * weights
    samples = boot.ratio(num, den)
    out = {}
    for j, name in enumerate(names):
        stat = boot.summary(samples[:, j])
        if stat["value"] is not None and is_count_rate(num[:, j], den[:, j]):
            rate = cluster_rate_interval(boot.grid_sums(num[:, j]), g_den[:, j], confidence_level)
            stat = {k: rate[k] for k in ("value", "ci_low", "ci_high")}
        out[name] = {**stat, **den_counts(g_den[:, j])}
    return out


def den_counts(grid_den: np.ndarray) -> dict[str, int]:
    """``n`` (summed denominators) and ``n_grids`` (grids with one) of a ``(G,)`` column."""
    return {"n": int(round(grid_den.sum())), "n_grids": int(np.count_nonzero(grid_den > 0))}


def group_keys(size: np.ndarray, density: np.ndarray, variant: np.ndarray) -> dict[str, list]:
    """Breakdown name -> per-row group keys (None: the row joins no group of that breakdown)."""
    return {
        "by_size": [str(int(s)) for s in size],
        "by_density": [None if not math.isfinite(d) else f"{round(d, 6):g}" for d in density],
        "by_variant": [str(v) for v in variant],
    }


def sort_key(key: str) -> tuple:
    """Numeric group keys in numeric order, then the others alphabetically."""
    try:
        return (0, float(key), key)
    except ValueError:
        return (1, 0.0, key)


def grouped_stats(
    num: np.ndarray,
    den: np.ndarray,
    grid_ids: np.ndarray,
    groups: dict[str, list],
    names: Sequence[str],
    *,
    n_bootstrap: int,
    confidence_level: float,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
) -> dict:
    """``overall`` and one dict per breakdown of :func:`ratio_stats` (draws continue from
    ``rng`` in that order; ``weights`` as there, whole grids fall in one group)."""
    common: dict[str, Any] = dict(
        n_bootstrap=n_bootstrap, confidence_level=confidence_level, rng=rng
    )
    out = {"overall": ratio_stats(num, den, grid_ids, names, **common, weights=weights)}
    for breakdown, table in group_rows(groups).items():
        out[breakdown] = {
            key: ratio_stats(
                num[rows],
                den[rows],
                grid_ids[rows],
                names,
                **common,
                weights=None if weights is None else weights[rows],
            )
            for key, rows in table.items()
        }
    return out


def group_rows(groups: dict[str, list]) -> dict[str, dict[str, np.ndarray]]:
    """Breakdown -> group key (in :func:`sort_key` order) -> the rows of that group."""
    out = {}
    for breakdown, keys in groups.items():
        keys_arr = np.asarray(keys, dtype=object)
        present = sorted({k for k in keys if k is not None}, key=sort_key)
        out[breakdown] = {key: np.flatnonzero(keys_arr == key) for key in present}
    return out


def groups_of(entry: Mapping[str, Any]) -> list[tuple[str, dict]]:
    """``[(group label, block)]``: ``all`` then ``size=7``, ``density=0.2``, ``variant=...``."""
    out = [("all", entry["overall"])]
    for breakdown in BREAKDOWNS:
        label = breakdown.removeprefix("by_")
        out += [(f"{label}={key}", block) for key, block in entry[breakdown].items()]
    return out


def stat_rows(base: dict, blocks: list[tuple[str, dict]], prefix: str = "") -> Iterator[dict]:
    """Long-format rows (:data:`CSV_COLUMNS`) of ``[(group, {metric: STAT})]``."""
    for group, stats in blocks:
        for metric, stat in stats.items():
            yield {**base, "group": group, "metric": prefix + metric, **stat}
