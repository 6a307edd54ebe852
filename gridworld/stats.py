"""Statistics shared across goalprobe: the grid bootstrap, and a plain bootstrap. No torch.

Every interval goalprobe reports resamples *grids* (clusters), never rows: the steps of one
grid's trajectories are not independent. :class:`GridBootstrap` is the one engine: it draws
grid multiplicities once (``rng.multinomial(G, uniform, size=B)``), and every statistic that is
a ratio of per-grid sums (a pooled rate, a pooled mean, accuracy, R², a confusion matrix) is
recomputed under the same draws, so intervals of several metrics, and their paired differences,
share one resampling. A statistic averaged over grids with equal weight is the special case of
one row per grid.

Intervals of general statistics are percentile intervals of the resampled statistic; resamples
where the statistic is undefined (an empty subset, a zero denominator) are left out.

A *rate* (k successes of n trials, pooled over grids) gets an interval that stays honest at 0% and
100%, where every percentile resample of 16/16 is 16/16: :func:`cluster_rate_interval`, the
Clopper-Pearson interval on the effective number of trials ``n_eff = n / deff``, with the design
effect ``deff = 1 + (m - 1) * icc`` from the intra-grid correlation (one-way ANOVA estimator,
``m`` the size-weighted mean trials per grid). Where the correlation is not estimable (every row
alike, as at 0% and 100%), ``icc = 1``: the grids are the independent units, so 16/16 over 16
grids gives [79.4%, 100%] whatever the rows per grid. :func:`grid_bootstrap_ratio` uses it for
counts, :meth:`GridBootstrap.rate_summary` for rates computed under shared draws, and
:func:`grid_mean` for a mean of per-grid values in [0, 1] (one trial per grid).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.stats

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


def _none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


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
    """A pooled rate ``sum(k) / sum(n)`` over grids with an interval honest at 0% and 100%.

    Args:
        k: ``(G,)`` successes per grid.
        n: ``(G,)`` trials per grid (grids with none are left out).
        confidence: the interval level.

    Returns:
        ``{value, ci_low, ci_high, n, n_grids, n_eff, design_effect, icc, interval_method}``:
        the Clopper-Pearson interval on ``n_eff = n / deff`` trials with ``value * n_eff``
        successes (see the module docstring); ``None`` values where there are no trials, and
        no interval from fewer than two grids (as the grid bootstrap: nothing to say how grids
        vary).
    """
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    if k.shape != n.shape or k.ndim != 1:
        raise ValueError("k and n must be 1-D of the same length")
    if np.any(n < 0) or np.any(k < 0) or np.any(k > n + 1e-9):
        raise ValueError("need 0 <= k <= n per grid")
    total = float(n.sum())
    n_grids = int(np.count_nonzero(n > 0))
    if total <= 0:
        return {
            "value": None, "ci_low": None, "ci_high": None, "n": 0, "n_grids": 0,
            "n_eff": None, "design_effect": None, "icc": None,
            "interval_method": RATE_INTERVAL_METHOD,
        }  # fmt: skip
    value = float(k.sum() / total)
    icc = intra_grid_correlation(k, n)
    m = float(np.sum(n**2) / total)
    deff = 1.0 + (m - 1.0) * icc
    n_eff = total / deff
    low: float | None
    high: float | None
    low, high = clopper_pearson(value * n_eff, n_eff, confidence)
    if n_grids < 2:
        low = high = None
    return {
        "value": value,
        "ci_low": low,
        "ci_high": high,
        "n": int(round(total)),
        "n_grids": n_grids,
        "n_eff": n_eff,
        "design_effect": deff,
        "icc": icc,
        "interval_method": RATE_INTERVAL_METHOD,
    }


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


@dataclass(frozen=True)
class GridBootstrap:
    """Grid-bootstrap draws over the rows of one sample.

    Attributes:
        codes: ``(N,)`` grid index of every row.
        n_grids: ``G``, the number of distinct grids.
        weights: ``(1 + B, G)`` float grid multiplicities; row 0 is the full sample (all ones),
            rows 1..B the resamples (each sums to ``G``). ``B = 0`` when fewer than two grids
            or no resamples were asked for (then no interval is defined).
        confidence: the interval level.
    """

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
        """``(1 + B, ...)`` resampled ratio of sums ``sum(num) / sum(den)`` (``den`` defaults to
        one per row: the pooled mean). ``nan`` where the denominator total is 0."""
        num = np.asarray(num, dtype=np.float64)
        den = np.ones(num.shape) if den is None else np.asarray(den, dtype=np.float64)
        return safe_ratio(self.totals(num), self.totals(den))

    def interval(self, samples: np.ndarray) -> np.ndarray:
        """``(2, ...)`` percentile interval of resampled ``samples`` (``nan`` without draws)."""
        samples = np.asarray(samples, dtype=np.float64)
        if self.n_resamples == 0:
            return np.full((2, *samples.shape[1:]), np.nan)
        return percentile_interval(samples[1:], self.confidence)

    def rate_summary(self, num: np.ndarray, den: np.ndarray | None = None) -> dict:
        """``{value, ci_low, ci_high, n, n_grids, n_eff, design_effect, icc, interval_method}``
        of the pooled rate of per-row 0/1 outcomes ``num`` over trials ``den`` (one per row by
        default): :func:`cluster_rate_interval` on this sample's grids, not the percentile
        interval, which collapses to a point at 0% and 100%."""
        num = np.asarray(num, dtype=np.float64)
        den = np.ones(num.shape) if den is None else np.asarray(den, dtype=np.float64)
        return cluster_rate_interval(self.grid_sums(num), self.grid_sums(den), self.confidence)

    def summary(self, samples: np.ndarray) -> dict:
        """``{value, ci_low, ci_high}`` of a scalar statistic's ``(1 + B,)`` samples (row 0 is
        the estimate); ``None`` where undefined, and no interval for an undefined estimate."""
        samples = np.asarray(samples, dtype=np.float64)
        value = float(samples[0])
        if not math.isfinite(value):
            return {"value": None, "ci_low": None, "ci_high": None}
        low, high = self.interval(samples)
        return {"value": value, "ci_low": _none(low), "ci_high": _none(high)}


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

    Args:
        num: ``(N,)`` per-row numerators (e.g. 0/1 outcomes).
        den: ``(N,)`` per-row denominators (None: one per row, the pooled mean; 0 leaves a row
            out of the statistic).
        grid_ids: ``(N,)`` the grid of every row.
        n_resamples, confidence, random_state: the bootstrap.
        rate: whether ``num / den`` are counts of successes among trials (None: decided by
            :func:`is_count_rate`; pass False for a mean whose values merely happen to be 0 or
            1, True to insist, which raises where they are not counts).

    Returns:
        ``{value, ci_low, ci_high, n, n_grids}`` (``None`` where undefined; ``n`` is the sum of
        the denominators, ``n_grids`` the grids with a non-zero denominator). Where ``num`` and
        ``den`` are counts (:func:`is_count_rate`, e.g. 0/1 outcomes) the interval is
        :func:`cluster_rate_interval`'s and the dict also holds ``n_eff``, ``design_effect``,
        ``icc`` and ``interval_method``; otherwise it is the grid-bootstrap percentile interval.
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
    """Mean of one value per grid, with its grid-bootstrap interval.

    ``None`` and non-finite values are dropped first (an undefined per-grid metric). For a
    ``rate`` (every value in [0, 1]) the interval is :func:`cluster_rate_interval` with one
    trial per grid (Clopper-Pearson on the grids: honest at 0 and 1; conservative for a mean of
    bounded values, whose variance is at most the binomial one).

    Returns:
        ``{value, ci_low, ci_high, n}``, ``n`` the number of grids averaged.
    """
    x = np.asarray(
        [v for v in values if v is not None and math.isfinite(v)], dtype=np.float64
    ).reshape(-1)
    if x.size == 0:
        return {"value": None, "ci_low": None, "ci_high": None, "n": 0}
    if rate:
        if not np.all((x >= 0) & (x <= 1)):
            raise ValueError("a rate's per-grid values must lie in [0, 1]")
        stat = cluster_rate_interval(x, np.ones(x.size), confidence)
        return {k: stat[k] for k in ("value", "ci_low", "ci_high", "n")}
    stat = grid_bootstrap_ratio(
        x,
        None,
        np.arange(x.size),
        n_resamples=n_resamples,
        confidence=confidence,
        random_state=random_state,
    )
    return {k: stat[k] for k in ("value", "ci_low", "ci_high", "n")}


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: Callable[..., float] = np.mean,
    *,
    n_resamples: int = 9999,
    confidence: float = 0.95,
    method: str = "BCa",
    random_state: int | np.random.Generator | None = None,
) -> tuple[float, float]:
    """Bootstrap confidence interval of any ``statistic`` over independent ``values``.

    A thin wrapper of :func:`scipy.stats.bootstrap`, for statistics that are not ratios of
    sums (a median, a spread). Resample the independent unit: for a CI over grids pass one value
    per grid; for ratios of per-row sums use :class:`GridBootstrap`.

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


EQUIVALENCE_VERDICTS = ("equivalent", "different", "inconclusive")
"""The outcomes of :func:`equivalence_verdict`."""


def equivalence_verdict(ci_low: float | None, ci_high: float | None, margin: float) -> str | None:
    """A TOST-style reading of a paired difference's two-sided interval against ``±margin``.

    ``"equivalent"``: the interval lies inside ``(-margin, margin)`` (both one-sided tests of
    "the difference is at least the margin" reject, at half the interval's error rate each);
    ``"different"``: otherwise, where the interval excludes 0; ``"inconclusive"``: the interval
    holds 0 and reaches a margin (too few pairs to tell "no change" from a change of the margin's
    size). ``None`` without an interval.
    """
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    if ci_low is None or ci_high is None or not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return None
    if -margin < ci_low and ci_high < margin:
        return "equivalent"
    if ci_low > 0 or ci_high < 0:
        return "different"
    return "inconclusive"


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (family-wise error control) of the defined entries;
    None stays None. A verdict holds across the family where its adjusted p is below alpha."""
    defined = {i: p for i, p in enumerate(p_values) if p is not None and math.isfinite(p)}
    order = sorted(defined, key=lambda i: defined[i])
    m = len(order)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(defined[i])))
        out[i] = running
    return out


def p_from_interval(
    value: float | None,
    ci_low: float | None,
    ci_high: float | None,
    baseline: float = 0.0,
    *,
    confidence: float = 0.95,
    side: str = "greater",
) -> float | None:
    """One-sided p-value of "the statistic exceeds ``baseline``" (``side="less"``: lies below
    it) recovered from a reported estimate and its two-sided interval by the normal
    approximation (standard error = interval width / (2 z)); the interval side facing the
    baseline is used, so skewed intervals are read on the side that matters. None where
    undefined or the interval has no width on that side (the verdict then rests on the
    interval alone)."""
    if value is None or ci_low is None or ci_high is None or side not in ("greater", "less"):
        return None
    z_level = float(scipy.stats.norm.ppf(0.5 + confidence / 2))
    half = (value - ci_low) if side == "greater" else (ci_high - value)
    if not half > 0:
        return None
    z = (value - baseline) / (half / z_level)
    return float(scipy.stats.norm.sf(z if side == "greater" else -z))


def rate_difference_interval(first: dict, second: dict) -> tuple[float | None, float | None]:
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


def seed_pooled(
    stats: Sequence[dict],
    confidence: float = 0.95,
    bounds: tuple[float, float] | None = None,
) -> dict:
    """One statistic estimated under several training seeds (same data, same split), each with
    its own interval, pooled so the seed spread widens the interval (Rubin's rules): the mean
    of the estimates ``± z * sqrt(W + (1 + 1/S) B)``, ``W`` the mean squared standard error
    (each from its interval's width), ``B`` the variance between seeds; widened further to the
    envelope of the seeds' own intervals where that reaches further; then cut to ``bounds``,
    the statistic's range (a rate's [0, 1]: seeds that disagree widely must give [0, 100%],
    never [-8%, 140%]).

    Returns:
        ``{value, ci_low, ci_high, n_seeds, seed_sd, values}`` (``None`` values without a
        defined estimate; no interval where a seed has none).
    """
    defined = [s for s in stats if s.get("value") is not None]
    if not defined:
        return {"value": None, "ci_low": None, "ci_high": None, "n_seeds": 0, "seed_sd": None}
    values = np.array([s["value"] for s in defined], dtype=np.float64)
    out = {
        "value": float(values.mean()),
        "ci_low": None,
        "ci_high": None,
        "n_seeds": len(defined),
        "seed_sd": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
        "values": values.tolist(),
    }
    if any(s.get("ci_low") is None or s.get("ci_high") is None for s in defined):
        return out
    z = float(scipy.stats.norm.ppf(0.5 + confidence / 2))
    se = np.array([(s["ci_high"] - s["ci_low"]) / (2 * z) for s in defined])
    between = float(values.var(ddof=1)) if len(values) > 1 else 0.0
    half = z * math.sqrt(float(np.mean(se**2)) + (1 + 1 / len(values)) * between)
    lows = min(s["ci_low"] for s in defined)
    highs = max(s["ci_high"] for s in defined)
    # and never narrower than any single seed's interval reaches (their envelope)
    out["ci_low"] = float(min(out["value"] - half, lows))
    out["ci_high"] = float(max(out["value"] + half, highs))
    if bounds is not None:
        out["ci_low"] = float(max(out["ci_low"], bounds[0]))
        out["ci_high"] = float(min(out["ci_high"], bounds[1]))
    return out
