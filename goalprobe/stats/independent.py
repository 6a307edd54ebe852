"""Intervals over independent values (one per grid): scipy's bootstrap for any statistic, and
the mean of per-grid values with a percentile interval, or an exact one for a rate."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import scipy.stats

from goalprobe.stats.bootstrap import RandomState
from goalprobe.stats.estimate import Estimate, finite_or_none
from goalprobe.stats.rates import cluster_rate_interval


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: Callable[..., float] = np.mean,
    *,
    n_resamples: int = 9999,
    confidence: float = 0.95,
    method: str = "BCa",
    random_state: int | np.random.Generator | None = None,
) -> tuple[float, float]:
    """``(low, high)``: :func:`scipy.stats.bootstrap`'s interval (``method``: scipy's names) of
    any ``statistic`` over independent, finite ``(N,)`` ``values`` (one per grid; ratios of
    per-row sums take :class:`GridBootstrap`). ``(nan, nan)`` with fewer than two values; a
    point interval where all values are equal."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("values must be finite (drop undefined entries first)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if x.size < 2:
        return (math.nan, math.nan)
    if np.all(x == x[0]):
        value = float(statistic(x))
        return (value, value)
    res = scipy.stats.bootstrap(
        (x,),
        statistic,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method=method,
        rng=np.random.default_rng(random_state),
    )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def mean_ci(
    values: Sequence[float | None],
    *,
    n_resamples: int,
    random_state: RandomState,
    rate: bool = False,
) -> dict:
    """``{value, ci_low, ci_high, n}``: the mean of the finite values (one per grid) and its
    percentile-bootstrap interval (:func:`bootstrap_ci`); ``None`` where undefined. A ``rate``
    (values in [0, 1]) gets the Clopper-Pearson interval on the grids instead (plus
    ``interval_method``)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return Estimate(None, n=0).to_dict()
    if rate:
        stat = cluster_rate_interval(np.clip(x, 0.0, 1.0), np.ones(x.size))
        return {k: stat[k] for k in ("value", "ci_low", "ci_high", "n", "interval_method")}
    low, high = bootstrap_ci(
        x, n_resamples=n_resamples, method="percentile", random_state=random_state
    )
    return Estimate(
        float(x.mean()), finite_or_none(low), finite_or_none(high), int(x.size)
    ).to_dict()
