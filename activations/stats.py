"""Statistics shared across goalprobe: bootstrap confidence intervals. Imports no torch."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import scipy.stats


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: Callable[..., float] = np.mean,
    *,
    n_resamples: int = 9999,
    confidence: float = 0.95,
    method: str = "BCa",
    random_state: int | np.random.Generator | None = None,
) -> tuple[float, float]:
    """Bootstrap confidence interval of ``statistic`` over independent ``values``.

    A thin wrapper of :func:`scipy.stats.bootstrap`. Resample the independent unit: to get a
    CI over grids, pass one value per grid (never one per step of a grid's trajectories).

    Args:
        values: ``(N,)`` finite floats.
        statistic: a function of a 1-D sample; if it accepts ``axis`` it is called vectorised.
        n_resamples: number of bootstrap resamples.
        confidence: confidence level in (0, 1).
        method: ``"BCa"``, ``"percentile"`` or ``"basic"`` (scipy's names).
        random_state: seed or generator; pass one for reproducible intervals.

    Returns:
        ``(low, high)``. With fewer than two values there is nothing to resample and the result
        is ``(nan, nan)``. With all values equal every resample is the same, so the interval is
        ``(statistic(values), statistic(values))``.
    """
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
