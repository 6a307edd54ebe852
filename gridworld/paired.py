"""Comparing paired grids: the overlap of two trajectories and the Wilcoxon signed-rank test of
per-grid metrics on base and transformed grids (study, appendix D; section 4.3 compares with-key
and without-key trajectories by their overlap).

Pairs are matched by base grid id (:func:`align_pairs`); the test drops zero differences
(Wilcoxon's original test) and reports the matched-pairs rank-biserial correlation as effect
size. It imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.stats


def jaccard_similarity(states_a: Iterable[Hashable], states_b: Iterable[Hashable]) -> float:
    """Jaccard index ``|S_a & S_b| / |S_a | S_b|`` of two trajectories' unique visited states.

    Pass ``traj.states`` (final state included) or a projection of them, e.g. the agent cells
    ``[s.agent for s in traj.states]`` to compare a with-key and a without-key trajectory.
    NaN when both are empty.
    """
    a, b = set(states_a), set(states_b)
    union = a | b
    return len(a & b) / len(union) if union else math.nan


@dataclass(frozen=True)
class PairedTestResult:
    """A paired Wilcoxon signed-rank test of ``transformed - base``."""

    statistic: float
    """Scipy's Wilcoxon statistic (two-sided: ``min(W+, W-)``; one-sided: ``W+``)."""
    p_value: float
    """The test's p-value; 1.0 when every difference is zero."""
    rank_biserial: float
    """Matched-pairs rank-biserial correlation ``(W+ - W-) / (W+ + W-)`` in [-1, 1]; > 0 when the
    transformed values tend to be larger; 0.0 when every difference is zero. ``W+`` sums the
    ranks of ``|d|`` over positive differences ``d = transformed - base``, ``W-`` over negative
    ones."""
    n_pairs: int
    """Number of pairs."""
    n_nonzero: int
    """Pairs with a non-zero difference (zero differences are dropped, as in Wilcoxon's original
    test, scipy ``zero_method="wilcox"``); 0 when every difference is zero (nothing to test)."""


def paired_wilcoxon(
    base: Sequence[float] | np.ndarray,
    transformed: Sequence[float] | np.ndarray,
    *,
    alternative: str = "two-sided",
) -> PairedTestResult:
    """Wilcoxon signed-rank test of paired per-grid metrics (``(N,)`` ``base`` and
    ``transformed`` in the same order, :func:`align_pairs`), with rank-biserial effect size;
    ``alternative="greater"``: transformed larger.

    When every difference is zero the test has nothing to rank; the result is then
    ``p_value=1.0, rank_biserial=0.0, statistic=0.0`` with ``n_nonzero`` 0, not an error.
    """
    x = np.asarray(base, dtype=float)
    y = np.asarray(transformed, dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(
            f"base and transformed must be 1-D of equal length, got {x.shape} and {y.shape}"
        )
    if x.size == 0:
        raise ValueError("paired_wilcoxon needs at least one pair")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError(
            "base and transformed must be finite (drop grids with undefined metrics first)"
        )
    d = y - x
    nonzero = d[d != 0]
    if nonzero.size == 0:
        return PairedTestResult(0.0, 1.0, 0.0, int(d.size), 0)
    ranks = scipy.stats.rankdata(np.abs(nonzero))
    w_plus = float(ranks[nonzero > 0].sum())
    w_minus = float(ranks[nonzero < 0].sum())
    res = scipy.stats.wilcoxon(d, zero_method="wilcox", alternative=alternative)
    return PairedTestResult(
        statistic=float(res.statistic),
        p_value=float(res.pvalue),
        rank_biserial=(w_plus - w_minus) / (w_plus + w_minus),
        n_pairs=int(d.size),
        n_nonzero=int(nonzero.size),
    )


def align_pairs(
    base: Mapping[str, float], transformed: Mapping[str, float]
) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """Pair per-grid values keyed by base grid id: ``(grid_ids, base (N,), transformed (N,))``
    in sorted id order; ``ValueError`` naming the ids present on one side only."""
    only_base = sorted(set(base) - set(transformed))
    only_trans = sorted(set(transformed) - set(base))
    if only_base or only_trans:
        raise ValueError(
            f"unpaired grids: {len(only_base)} only in base (e.g. {only_base[:3]}), "
            f"{len(only_trans)} only in transformed (e.g. {only_trans[:3]})"
        )
    ids = tuple(sorted(base))
    return (
        ids,
        np.array([base[i] for i in ids], dtype=float),
        np.array([transformed[i] for i in ids], dtype=float),
    )
