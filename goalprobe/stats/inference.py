"""Tests on estimates: equivalence against a margin, Holm's correction, one-sided p-values
(exact, from bootstrap draws, or from an interval), the effect an n could detect, and seeds
pooled by Rubin's rules."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.stats

from goalprobe.stats.estimate import Estimate, Verdict

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


def seed_pooled(
    stats: Sequence[dict], confidence: float = 0.95, bounds: tuple[float, float] | None = None
) -> dict:
    """One statistic estimated under several training seeds (same data and split), pooled so
    the seed spread widens the interval (Rubin's rules): the mean of the estimates
    ``± z * sqrt(W + (1 + 1/S) B)``, ``W`` the mean squared standard error (from each interval's
    width), ``B`` the variance between seeds; widened to the envelope of the seeds' intervals,
    then cut to ``bounds`` (the statistic's range). Returns ``{value, ci_low, ci_high, n_seeds,
    seed_sd, values}`` (no interval where a seed has none)."""
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
    # and never narrower than any single seed's interval reaches (their envelope)
    low = min(out["value"] - half, *(s["ci_low"] for s in defined))
    high = max(out["value"] + half, *(s["ci_high"] for s in defined))
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    out.update(ci_low=float(low), ci_high=float(high))
    return out


def p_exact_rate(k: float, n: float, baseline: float, *, side: str = "greater") -> float | None:
    """Exact one-sided binomial p of "the rate ``k / n`` exceeds ``baseline``" (``side="less"``:
    lies below it), on the effective ``n`` where a design effect shrank it (``k`` and ``n``
    rounded to the nearest trial). Defined at 0% and 100%, where an interval from resamples has
    no width: 16/16 against 50% gives 2^-16. None without trials or a baseline in (0, 1)."""
    if not n or n < 1 or not 0 < baseline < 1 or side not in ("greater", "less"):
        return None
    trials = int(round(n))
    successes = min(max(int(round(k)), 0), trials)
    return float(scipy.stats.binomtest(successes, trials, baseline, alternative=side).pvalue)


def p_from_draws(
    draws: Sequence[float] | np.ndarray, baseline: float = 0.0, *, side: str = "greater"
) -> float | None:
    """One-sided bootstrap p of "the statistic exceeds ``baseline``" (``side="less"``: lies
    below it) from its resampled values themselves: the share of draws on the wrong side of
    the baseline, with the add-one correction ``(1 + #wrong) / (1 + B)`` so that it is never 0
    (the smallest p that B draws can show). None without draws."""
    x = np.asarray(draws, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0 or side not in ("greater", "less"):
        return None
    wrong = np.count_nonzero(x <= baseline if side == "greater" else x >= baseline)
    return float((1 + wrong) / (1 + x.size))


def detectable_effect(
    ci_low: float | None,
    ci_high: float | None,
    *,
    n: float | None = None,
    power: float = 0.8,
    confidence: float = 0.95,
) -> float | None:
    """The smallest effect an estimate's sample could detect (one-sided at ``confidence``'s
    level, with ``power``): ``(z_alpha + z_power) * se``. The standard error comes from the
    interval's width (``width / (2 z)``) where it has one; from ``n`` trials at 50% (the
    largest binomial variance) where the interval is degenerate or missing. None where neither
    is known."""
    z_half = float(scipy.stats.norm.ppf(0.5 + confidence / 2))
    z = z_half + float(scipy.stats.norm.ppf(power))
    se = None
    if ci_low is not None and ci_high is not None and ci_high - ci_low > 0:
        se = (ci_high - ci_low) / (2 * z_half)
    elif n is not None and n > 0:
        se = math.sqrt(0.25 / n)
    return None if se is None else z * se


def undetectable_ceiling(
    answer: str | None,
    ci_low: float | None,
    ci_high: float | None,
    ceiling: float | None,
    *,
    n: float | None = None,
) -> float | None:
    """The effect an excess's sample could detect (:func:`detectable_effect`) when its "no"
    cannot mean no: its ceiling (the most any estimate could reach here, e.g. the excess the
    true map would have over the same null) lies below that effect, so the answer is
    "undecided"; None when the answer stands."""
    if answer != "no" or ceiling is None:
        return None
    mde = detectable_effect(ci_low, ci_high, n=n)
    return mde if mde is not None and ceiling < mde else None


def interval_verdict(
    estimate: Estimate | Mapping[str, Any], point: float = 0.0, question: str = ""
) -> Verdict:
    """Whether an estimate lies above ``point``, as the headline answers it: ``yes`` where its
    interval lies above, ``no`` where it does not, ``undecided`` without an interval; a ``no``
    or ``undecided`` carries the smallest effect its n could detect (:func:`detectable_effect`),
    which a reader must state beside it."""
    est = estimate if isinstance(estimate, Estimate) else Estimate.from_dict(estimate)
    above = est.above(point)
    if above:
        return Verdict("yes", question)
    low, high = (b if math.isfinite(b) else None for b in est.bounds())
    n = None if est.n is None else float(est.n)
    answer = "undecided" if above is None else "no"
    return Verdict(answer, question, detectable=detectable_effect(low, high, n=n))
