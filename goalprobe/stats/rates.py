"""Rates (successes among trials, pooled over grids) and their intervals, honest at 0% and 100%.

Every percentile resample of 16/16 is 16/16, so a rate's interval is not a bootstrap one:
:func:`cluster_rate_interval` is the Clopper-Pearson interval on the effective number of
trials ``n_eff = n / deff``, with the design effect ``deff = 1 + (m - 1) * icc`` from the
intra-grid correlation (one-way ANOVA estimator, ``m`` the size-weighted mean trials per grid).
Where the correlation is not estimable (every row alike, as at 0% and 100%), ``icc = 1``: the
grids are the independent units, so 16/16 over 16 grids gives [79.4%, 100%] whatever the rows
per grid. :func:`rate_difference_interval` combines two such intervals (Newcombe), and
:func:`wilson_interval` is the plain binomial interval of a pre-flight count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import scipy.stats

from goalprobe.stats.estimate import Estimate

RATE_INTERVAL_METHOD = "cluster-adjusted Clopper-Pearson"
"""How a rate's interval is made (recorded beside it as ``interval_method``)."""


def clopper_pearson(k: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a binomial proportion ``k / n``, extended to
    non-integer ``k`` and ``n`` (an effective sample) through the beta quantiles; equal to
    ``scipy.stats.binomtest(k, n).proportion_ci("exact")`` for integers. ``(nan, nan)`` for
    ``n <= 0``."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if not n > 0:
        return (math.nan, math.nan)
    k = min(max(float(k), 0.0), float(n))
    alpha = 1.0 - confidence
    low = 0.0 if k <= 0 else float(scipy.stats.beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k >= n else float(scipy.stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return (low, high)


def intra_grid_correlation(k: np.ndarray, n: np.ndarray) -> float:
    """One-way ANOVA estimate of the intra-grid correlation of 0/1 rows from per-grid successes
    ``k`` and trials ``n``, clipped to [0, 1]; 1 where it is not estimable (fewer than two
    grids with trials, no spread within or between grids: the conservative choice)."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    keep = n > 0
    k, n = k[keep], n[keep]
    n_total, n_groups = float(n.sum()), len(n)
    if n_groups < 2 or n_total <= n_groups:
        return 1.0
    p, p_g = k.sum() / n_total, k / n
    msb = float(np.sum(n * (p_g - p) ** 2) / (n_groups - 1))
    msw = float(np.sum(k * (1 - p_g)) / (n_total - n_groups))
    n0 = (n_total - float(np.sum(n**2)) / n_total) / (n_groups - 1)
    den = msb + (n0 - 1) * msw
    if not den > 0:
        return 1.0
    return float(np.clip((msb - msw) / den, 0.0, 1.0))


def cluster_rate_interval(
    k: Sequence[float] | np.ndarray, n: Sequence[float] | np.ndarray, confidence: float = 0.95
) -> dict:
    """The pooled rate ``sum(k) / sum(n)`` of ``(G,)`` successes ``k`` among trials ``n`` per
    grid, with the Clopper-Pearson interval on ``n_eff = n / deff`` trials (module docstring):
    ``{value, ci_low, ci_high, n, n_grids, n_eff, design_effect, icc, interval_method}``;
    ``None`` values without trials, and no interval from fewer than two grids."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    if k.shape != n.shape or k.ndim != 1:
        raise ValueError("k and n must be 1-D of the same length")
    if np.any(n < 0) or np.any(k < 0) or np.any(k > n + 1e-9):
        raise ValueError("need 0 <= k <= n per grid")
    total = float(n.sum())
    n_grids = int(np.count_nonzero(n > 0))
    if total <= 0:
        empty = {"n_eff": None, "design_effect": None, "icc": None}
        return Estimate(None, None, None, 0, 0, RATE_INTERVAL_METHOD, extra=empty).to_dict()
    value = float(k.sum() / total)
    icc = intra_grid_correlation(k, n)
    m = float(np.sum(n**2) / total)
    deff = 1.0 + (m - 1.0) * icc
    n_eff = total / deff
    low, high = clopper_pearson(value * n_eff, n_eff, confidence)
    return Estimate(
        value,
        low if n_grids >= 2 else None,
        high if n_grids >= 2 else None,
        int(round(total)),
        n_grids,
        RATE_INTERVAL_METHOD,
        extra={"n_eff": n_eff, "design_effect": deff, "icc": icc},
    ).to_dict()


def is_count_rate(num: np.ndarray, den: np.ndarray) -> bool:
    """Whether per-row ``num`` / ``den`` are counts of successes among trials (non-negative
    integers, ``num <= den``): a rate, whose interval is :func:`cluster_rate_interval`."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return bool(
        num.size > 0
        and np.all(num >= 0)
        and np.all(num <= den)
        and np.all(num == np.round(num))
        and np.all(den == np.round(den))
    )


def rate_difference_interval(first: Mapping, second: Mapping) -> tuple[float | None, float | None]:
    """Newcombe's hybrid interval of the difference ``first - second`` of two rates from their
    own honest intervals (e.g. :func:`cluster_rate_interval`'s): it stays open at 100% - 0%,
    where every bootstrap resample of a paired difference is 1. Ignoring the pairing, it is
    conservative when the two rates are positively correlated. ``(None, None)`` where either
    rate has no interval."""
    p1, l1, u1 = first.get("value"), first.get("ci_low"), first.get("ci_high")
    p2, l2, u2 = second.get("value"), second.get("ci_low"), second.get("ci_high")
    if p1 is None or l1 is None or u1 is None or p2 is None or l2 is None or u2 is None:
        return (None, None)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return (max(-1.0, low), min(1.0, high))


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of ``k`` in ``n`` (scipy; inside [0, 1] and honest at 0 and n);
    ``(0, 1)`` without trials."""
    if n == 0:
        return (0.0, 1.0)
    ci = scipy.stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


BOUNDED_AGREEMENT_METHOD = "Clopper-Pearson on the grids within the statistic's bounds"
"""How a statistic on which every grid agrees gets its interval (``interval_method``)."""


def bounded_agreement_interval(
    value: float, n_grids: int, bounds: tuple[float, float], confidence: float = 0.95
) -> tuple[float, float]:
    """An interval for a mean over ``n_grids`` grids that all gave ``value``, the statistic
    bounded by ``bounds``: the Clopper-Pearson interval of ``value`` rescaled to [0, 1] with
    one trial per grid, mapped back (as :func:`grid_mean` does for a rate). 12 grids that all
    say -1 within [-1, 1] give [-1, -0.47]: the grids not drawn may disagree, by at most the
    bounds, and 12 grids cannot rule out a quarter of them doing so."""
    lo, hi = float(bounds[0]), float(bounds[1])
    if not hi > lo:
        raise ValueError(f"bounds must be increasing, got {bounds}")
    share = min(max((value - lo) / (hi - lo), 0.0), 1.0)
    low, high = clopper_pearson(share * n_grids, n_grids, confidence)
    return (lo + low * (hi - lo), lo + high * (hi - lo))
