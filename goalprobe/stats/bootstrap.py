"""The grid bootstrap: intervals that resample grids (clusters), never rows. No torch.

:class:`GridBootstrap` draws grid multiplicities once and recomputes every ratio-of-per-grid-sums
statistic (rates, means, accuracy, R², confusion matrices) under the same draws, so intervals
of several metrics and their paired differences share one resampling; rates get the intervals
honest at 0% and 100% of :mod:`goalprobe.stats.rates` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.stats

from goalprobe.stats.estimate import Estimate, finite_or_none
from goalprobe.stats.rates import (
    BOUNDED_AGREEMENT_METHOD,
    bounded_agreement_interval,
    cluster_rate_interval,
    is_count_rate,
)

RandomState = int | np.random.Generator | None
"""A seed, a generator (draws continue from it), or None (fresh entropy)."""


def as_generator(random_state: RandomState) -> np.random.Generator:
    """``random_state`` as a generator (a generator is returned as is, not copied)."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    return np.random.default_rng(random_state)


def grid_codes(grid_ids: Sequence | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(uniques, codes)``: the sorted distinct grid ids and each row's index into them."""
    ids = np.asarray(grid_ids)
    if ids.ndim != 1:
        raise ValueError(f"grid_ids must be 1-D, got shape {ids.shape}")
    uniques, codes = np.unique(ids, return_inverse=True)
    return uniques, codes.reshape(-1)


def per_grid_sums(values: np.ndarray, codes: np.ndarray, n_grids: int) -> np.ndarray:
    """``(G, ...)`` sums of a per-row ``(N, ...)`` statistic within each grid."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape[:1] != codes.shape:
        raise ValueError(f"values must have {len(codes)} rows, got shape {values.shape}")
    out = np.zeros((n_grids, *values.shape[1:]))
    np.add.at(out, codes, values)
    return out


def safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` elementwise, ``nan`` where ``den <= 0``."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def percentile_interval(samples: np.ndarray, confidence: float = 0.95) -> np.ndarray:
    """``(2, ...)`` percentile interval over axis 0 of bootstrap ``samples``, ignoring
    undefined (``nan``/``inf``) resamples; ``nan`` where every resample is undefined."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    samples = np.asarray(samples, dtype=np.float64)
    alpha = (1.0 - confidence) / 2.0
    flat = samples.reshape(samples.shape[0], -1)
    flat = np.where(np.isfinite(flat), flat, np.nan)
    defined = ~np.isnan(flat).all(axis=0) if flat.shape[0] else np.zeros(flat.shape[1], bool)
    out = np.full((2, flat.shape[1]), np.nan)
    if defined.any():
        # np.nanquantile loops over columns in Python once any NaN is present: columns without
        # one take the vectorised np.quantile (the same numbers), the others nanquantile
        complete = defined & ~np.isnan(flat).any(axis=0)
        partial = defined & ~complete
        for which, quantile in ((complete, np.quantile), (partial, np.nanquantile)):
            if which.any():
                out[:, which] = quantile(flat[:, which], [alpha, 1.0 - alpha], axis=0)
    return out.reshape(2, *samples.shape[1:])


@dataclass(frozen=True)
class GridBootstrap:
    """Grid-bootstrap draws over the rows of one sample: ``codes``, the ``(N,)`` grid index of
    every row among ``n_grids`` (``G``), and ``weights``, the ``(1 + B, G)`` grid multiplicities
    (row 0 the full sample; ``B = 0`` with fewer than two grids or no resamples: no interval)."""

    codes: np.ndarray
    n_grids: int
    weights: np.ndarray
    confidence: float = 0.95

    @classmethod
    def from_codes(
        cls,
        codes: np.ndarray,
        n_grids: int,
        *,
        n_resamples: int = 1000,
        confidence: float = 0.95,
        random_state: RandomState = 0,
    ) -> GridBootstrap:
        """Draws for rows whose grid indices ``codes`` lie in ``0..n_grids-1``."""
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
        if n_resamples < 0:
            raise ValueError(f"n_resamples must be >= 0, got {n_resamples}")
        full = np.ones((1, n_grids))
        if n_grids >= 2 and n_resamples > 0:
            rng = as_generator(random_state)
            draws = rng.multinomial(n_grids, np.full(n_grids, 1.0 / n_grids), size=n_resamples)
            full = np.concatenate([full, draws.astype(np.float64)])
        return cls(np.asarray(codes, dtype=np.int64), int(n_grids), full, confidence)

    @classmethod
    def from_grid_ids(
        cls,
        grid_ids: Sequence | np.ndarray,
        *,
        n_resamples: int = 1000,
        confidence: float = 0.95,
        random_state: RandomState = 0,
    ) -> GridBootstrap:
        """Draws for rows labelled with their grid ids."""
        uniques, codes = grid_codes(grid_ids)
        return cls.from_codes(
            codes,
            len(uniques),
            n_resamples=n_resamples,
            confidence=confidence,
            random_state=random_state,
        )

    @property
    def n_resamples(self) -> int:
        """``B``, the number of resamples (0: no interval)."""
        return self.weights.shape[0] - 1

    def grid_sums(self, values: np.ndarray) -> np.ndarray:
        """``(G, ...)`` per-grid sums of per-row ``(N, ...)`` values."""
        return per_grid_sums(values, self.codes, self.n_grids)

    def resample(self, sums: np.ndarray) -> np.ndarray:
        """``(1 + B, ...)``: per-grid sums ``(G, ...)`` totalled under every draw (row 0: all)."""
        sums = np.asarray(sums, dtype=np.float64)
        flat = sums.reshape(sums.shape[0], -1)
        return (self.weights @ flat).reshape(self.weights.shape[0], *sums.shape[1:])

    def totals(self, values: np.ndarray) -> np.ndarray:
        """``(1 + B, ...)`` resampled totals of per-row values."""
        return self.resample(self.grid_sums(values))

    def ratio(self, num: np.ndarray, den: np.ndarray | None = None) -> np.ndarray:
        """``(1 + B, ...)`` resampled ``sum(num) / sum(den)`` (``den``: one per row by default);
        ``nan`` where the denominator total is 0."""
        den = np.ones(np.shape(num)) if den is None else den
        return safe_ratio(self.totals(num), self.totals(den))

    def interval(self, samples: np.ndarray) -> np.ndarray:
        """``(2, ...)`` percentile interval of resampled ``samples`` (``nan`` without draws)."""
        samples = np.asarray(samples, dtype=np.float64)
        if self.n_resamples == 0:
            return np.full((2, *samples.shape[1:]), np.nan)
        return percentile_interval(samples[1:], self.confidence)

    def rate_summary(self, num: np.ndarray, den: np.ndarray | None = None) -> dict:
        """:func:`cluster_rate_interval`'s summary of the pooled rate of per-row 0/1 outcomes
        ``num`` over trials ``den`` (one per row by default) on this sample's grids (the
        percentile interval collapses to a point at 0% and 100%)."""
        den = np.ones(np.shape(num)) if den is None else den
        return cluster_rate_interval(self.grid_sums(num), self.grid_sums(den), self.confidence)

    def summary(self, samples: np.ndarray, bounds: tuple[float, float] | None = None) -> dict:
        """``{value, ci_low, ci_high}`` of a scalar statistic's ``(1 + B,)`` samples (row 0 is
        the estimate; ``None`` where undefined). Where every resample equals the estimate the
        percentile interval has no width; with ``bounds`` (the statistic's range) it becomes
        :func:`bounded_agreement_interval` instead (named in ``interval_method``)."""
        samples = np.asarray(samples, dtype=np.float64)
        value = float(samples[0])
        if not math.isfinite(value):
            return Estimate(None).to_dict()
        low, high = self.interval(samples)
        if bounds is not None and self.n_grids >= 2 and math.isfinite(low) and low == high:
            low, high = bounded_agreement_interval(value, self.n_grids, bounds, self.confidence)
            return Estimate(value, low, high, method=BOUNDED_AGREEMENT_METHOD).to_dict()
        return Estimate(value, finite_or_none(low), finite_or_none(high)).to_dict()


def grid_bootstrap_ratio(
    num: Sequence[float] | np.ndarray,
    den: Sequence[float] | np.ndarray | None,
    grid_ids: Sequence | np.ndarray,
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: RandomState = 0,
    rate: bool | None = None,
) -> dict:
    """A ratio of sums over rows (a pooled rate or mean) with its grid-bootstrap interval.

    ``num``, ``den`` (None: one per row; 0 leaves a row out) and ``grid_ids`` are ``(N,)``.
    Returns ``{value, ci_low, ci_high, n, n_grids}`` (``n`` the sum of the denominators,
    ``n_grids`` the grids with a non-zero one). Counts of successes among trials (``rate``;
    None: :func:`is_count_rate` decides, True insists) get :func:`cluster_rate_interval`'s
    interval and its fields, anything else the grid-bootstrap percentile interval.
    """
    num = np.asarray(num, dtype=np.float64)
    den = np.ones(num.shape) if den is None else np.asarray(den, dtype=np.float64)
    if num.ndim != 1 or num.shape != den.shape or len(np.asarray(grid_ids)) != len(num):
        raise ValueError("num, den and grid_ids must be 1-D of the same length")
    if not (np.all(np.isfinite(num)) and np.all(np.isfinite(den))):
        raise ValueError("values must be finite (drop undefined entries first)")
    boot = GridBootstrap.from_grid_ids(
        grid_ids, n_resamples=n_resamples, confidence=confidence, random_state=random_state
    )
    counts = is_count_rate(num, den)
    if rate and not counts:
        raise ValueError("rate=True needs counts: non-negative integers with num <= den")
    if counts if rate is None else rate:
        return boot.rate_summary(num, den)
    stat = boot.summary(boot.ratio(num, den))
    grid_den = boot.grid_sums(den)
    return {**stat, "n": int(round(den.sum())), "n_grids": int(np.count_nonzero(grid_den > 0))}


def grid_mean(
    values: Sequence[float | np.floating | None] | np.ndarray,
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: RandomState = 0,
    rate: bool = False,
) -> dict:
    """``{value, ci_low, ci_high, n}``: the mean of one value per grid (``None`` and
    non-finite values dropped) with its grid-bootstrap interval; a ``rate`` (values in [0, 1])
    gets :func:`cluster_rate_interval` with one trial per grid (honest at 0 and 1)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        return {"value": None, "ci_low": None, "ci_high": None, "n": 0}
    if rate:
        if not np.all((x >= 0) & (x <= 1)):
            raise ValueError("a rate's per-grid values must lie in [0, 1]")
        stat = cluster_rate_interval(x, np.ones(x.size), confidence)
    else:
        stat = grid_bootstrap_ratio(
            x,
            None,
            np.arange(x.size),
            n_resamples=n_resamples,
            confidence=confidence,
            random_state=random_state,
        )
    return {k: stat[k] for k in ("value", "ci_low", "ci_high", "n")}


def grid_ci(
    values: np.ndarray,
    grids: np.ndarray,
    *,
    n_resamples: int,
    confidence: float,
    random_state: RandomState,
) -> tuple[float, float]:
    """``(low, high)``: the grid-clustered interval of the pooled mean of ``values``
    (:func:`grid_bootstrap_ratio`; NaN where undefined)."""
    stat = grid_bootstrap_ratio(
        values,
        None,
        grids,
        n_resamples=n_resamples,
        confidence=confidence,
        random_state=random_state,
    )
    return Estimate.from_dict(stat).bounds()


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
