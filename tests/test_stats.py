"""Tests of activations.stats.bootstrap_ci."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from activations.stats import bootstrap_ci


@pytest.fixture
def sample() -> np.ndarray:
    return np.random.default_rng(1).normal(loc=2.0, scale=1.0, size=40)


def test_matches_scipy_bootstrap_with_same_seed(sample):
    low, high = bootstrap_ci(sample, n_resamples=2000, random_state=3)
    ref = scipy.stats.bootstrap((sample,), np.mean, n_resamples=2000, rng=np.random.default_rng(3))
    assert (low, high) == (ref.confidence_interval.low, ref.confidence_interval.high)


def test_interval_brackets_statistic_and_grows_with_confidence(sample):
    low, high = bootstrap_ci(sample, n_resamples=2000, random_state=0)
    assert low < sample.mean() < high
    # normal theory: half-width ~ 1.96 * sd / sqrt(n); the bootstrap agrees within 30 %
    half = 1.96 * sample.std(ddof=1) / math.sqrt(sample.size)
    assert (high - low) / 2 == pytest.approx(half, rel=0.3)
    narrow = bootstrap_ci(sample, n_resamples=2000, confidence=0.5, random_state=0)
    assert low < narrow[0] < narrow[1] < high


def test_reproducible_and_custom_statistic(sample):
    a = bootstrap_ci(sample, np.median, n_resamples=500, method="percentile", random_state=7)
    b = bootstrap_ci(sample, np.median, n_resamples=500, method="percentile", random_state=7)
    assert a == b and a[0] < np.median(sample) < a[1]
    # a statistic without an `axis` argument is resampled one sample at a time
    spread = bootstrap_ci(
        sample, lambda s: float(np.max(s) - np.min(s)), n_resamples=200, random_state=0
    )
    assert spread[0] <= spread[1] <= np.ptp(sample) + 1e-12


def test_small_and_degenerate_samples():
    assert all(math.isnan(v) for v in bootstrap_ci([]))
    assert all(math.isnan(v) for v in bootstrap_ci([0.3]))
    assert bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    low, high = bootstrap_ci([0.0, 1.0, 1.0, 1.0], n_resamples=999, random_state=0)
    assert 0.0 <= low < high <= 1.0


def test_validation():
    with pytest.raises(ValueError, match="finite"):
        bootstrap_ci([1.0, math.nan])
    with pytest.raises(ValueError, match="1-D"):
        bootstrap_ci(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0, 2.0], confidence=95)
