"""Tests of goalprobe.stats.bootstrap_ci."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from goalprobe.stats import bootstrap_ci


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


# -- the grid bootstrap -----------------------------------------------------------------------

from goalprobe.stats import (  # noqa: E402
    GridBootstrap,
    clopper_pearson,
    cluster_rate_interval,
    grid_bootstrap_ratio,
    grid_mean,
    intra_grid_correlation,
    percentile_interval,
)


def _brute_force_ratio(num, den, grid_ids, n_resamples, seed, confidence=0.95):
    """Oracle: materialise every resample as a list of rows, grid by grid."""
    grids = sorted(set(grid_ids))
    rows_of = {g: [i for i, h in enumerate(grid_ids) if h == g] for g in grids}
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(len(grids), np.full(len(grids), 1 / len(grids)), size=n_resamples)
    stats = []
    for counts in draws:
        rows = [i for g, c in zip(grids, counts, strict=True) for _ in range(c) for i in rows_of[g]]
        n, d = sum(num[i] for i in rows), sum(den[i] for i in rows)
        if d > 0:
            stats.append(n / d)
    alpha = (1 - confidence) / 2
    return sum(num) / sum(den), np.quantile(stats, [alpha, 1 - alpha])


def test_grid_bootstrap_ratio_equals_brute_force_resampling_of_grids():
    rng = np.random.default_rng(5)
    grid_ids = [f"g{int(g)}" for g in rng.integers(0, 9, size=60)]
    num = rng.integers(0, 2, size=60).astype(float)
    den = rng.integers(0, 3, size=60).astype(float)
    stat = grid_bootstrap_ratio(num, den, grid_ids, n_resamples=400, random_state=11)
    value, (low, high) = _brute_force_ratio(num, den, grid_ids, 400, 11)
    assert stat["value"] == pytest.approx(value)
    assert (stat["ci_low"], stat["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert stat["n"] == int(den.sum())
    assert stat["n_grids"] == len({g for g, d in zip(grid_ids, den, strict=True) if d > 0})


def test_grid_bootstrap_resamples_grids_not_rows():
    # Two grids, each internally constant: a row bootstrap would give a tight interval around
    # 0.5 for 1000 rows; the grid bootstrap knows there are only two independent units.
    values = np.repeat([0.0, 0.5], 500)
    ids = np.repeat(["a", "b"], 500)
    stat = grid_bootstrap_ratio(values, None, ids, n_resamples=500, random_state=0)
    assert stat["value"] == 0.25
    assert stat["ci_low"] == 0.0 and stat["ci_high"] == 0.5
    # The same as 0/1 outcomes is a rate: the cluster-adjusted interval knows the same, with
    # two effective trials (the intra-grid correlation is 1).
    rate = grid_bootstrap_ratio(2 * values, None, ids, n_resamples=500, random_state=0)
    assert rate["n_eff"] == pytest.approx(2.0) and rate["icc"] == 1.0
    assert (rate["ci_low"], rate["ci_high"]) == pytest.approx(clopper_pearson(1, 2))


def test_shared_draws_pair_metrics_and_one_grid_has_no_interval():
    ids = np.array(["a", "a", "b", "c", "c", "d"])
    boot = GridBootstrap.from_grid_ids(ids, n_resamples=300, random_state=2)
    x = np.array([1.0, 0, 1, 1, 0, 1])
    a, b = boot.ratio(x), boot.ratio(x * 0.5)
    assert np.allclose(a, 2 * b)  # same draws for both metrics
    summary = boot.summary(a - b)
    assert summary["value"] == pytest.approx(x.mean() / 2)
    single = GridBootstrap.from_grid_ids(["a", "a"], n_resamples=300, random_state=2)
    assert single.n_resamples == 0
    assert single.summary(single.ratio(np.array([1.0, 0.0]))) == {
        "value": 0.5,
        "ci_low": None,
        "ci_high": None,
    }


def test_grid_mean_drops_undefined_and_matches_ratio_of_one_row_per_grid():
    values = [0.2, None, 0.4, math.nan, 0.9, 0.1]
    stat = grid_mean(values, n_resamples=200, random_state=4)
    kept = [0.2, 0.4, 0.9, 0.1]
    ref = grid_bootstrap_ratio(kept, None, np.arange(4), n_resamples=200, random_state=4)
    assert stat == {k: ref[k] for k in ("value", "ci_low", "ci_high", "n")}
    assert grid_mean([None, math.nan])["n"] == 0


def test_percentile_interval_ignores_undefined_resamples():
    samples = np.array([[0.0, np.nan], [1.0, np.nan], [np.nan, np.nan], [2.0, np.nan]])
    out = percentile_interval(samples, 0.5)
    assert out[:, 0].tolist() == [0.5, 1.5]
    assert np.isnan(out[:, 1]).all()


# -- rates: intervals honest at 0% and 100% -------------------------------------------------


@pytest.mark.parametrize("k,n", [(0, 16), (16, 16), (3, 16), (1, 7), (40, 40)])
def test_clopper_pearson_equals_scipy_exact_interval(k, n):
    ci = scipy.stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert clopper_pearson(k, n) == pytest.approx((ci.low, ci.high))


@pytest.mark.parametrize("rows_per_grid", [1, 3, 10])
def test_rate_at_0_and_100_percent_keeps_a_non_degenerate_interval(rows_per_grid):
    # 16 grids, every row a success (or every row a failure): the percentile bootstrap prints
    # [100, 100]; the honest interval is the exact one on the 16 grids, [79.4%, 100%].
    ids = np.repeat(np.arange(16), rows_per_grid)
    ones, zeros = np.ones(ids.size), np.zeros(ids.size)
    boot = GridBootstrap.from_grid_ids(ids, n_resamples=300, random_state=0)
    assert boot.summary(boot.ratio(ones))["ci_low"] == 1.0  # the collapse being fixed
    full = grid_bootstrap_ratio(ones, None, ids, n_resamples=300, random_state=0)
    none = grid_bootstrap_ratio(zeros, None, ids, n_resamples=300, random_state=0)
    assert full["value"] == 1.0 and full["ci_high"] == 1.0
    assert full["ci_low"] == pytest.approx(0.025 ** (1 / 16))  # 0.794
    assert 0.79 < full["ci_low"] < 0.80
    assert none["value"] == 0.0 and none["ci_low"] == 0.0
    assert none["ci_high"] == pytest.approx(1 - 0.025 ** (1 / 16))  # 0.206: excludes nothing above
    assert full["n_eff"] == pytest.approx(16.0)
    assert full["interval_method"] == "cluster-adjusted Clopper-Pearson"
    assert boot.rate_summary(ones) == full


def test_design_effect_shrinks_n_eff_only_as_far_as_the_grids_are_correlated():
    rng = np.random.default_rng(0)
    n_grids, m = 40, 10
    # independent rows: icc ~ 0, n_eff ~ n; identical rows within a grid: icc = 1, n_eff = G
    k_indep = rng.binomial(m, 0.5, size=n_grids).astype(float)
    k_clustered = m * rng.binomial(1, 0.5, size=n_grids).astype(float)
    n = np.full(n_grids, float(m))
    assert intra_grid_correlation(k_indep, n) < 0.1
    assert intra_grid_correlation(k_clustered, n) == 1.0
    indep, clustered = cluster_rate_interval(k_indep, n), cluster_rate_interval(k_clustered, n)
    assert indep["n_eff"] > 0.5 * n_grids * m
    assert clustered["n_eff"] == pytest.approx(n_grids)
    width = lambda s: s["ci_high"] - s["ci_low"]  # noqa: E731
    assert width(clustered) > 2 * width(indep)


def test_rate_interval_covers_at_its_level_under_clustering():
    # Beta-binomial grids (strong intra-grid correlation): the adjusted interval keeps >= ~95%
    # coverage, where the naive row-level exact interval would not.
    rng = np.random.default_rng(1)
    p, hits, naive_hits, reps = 0.9, 0, 0, 300
    for _ in range(reps):
        q = rng.beta(p * 2, (1 - p) * 2, size=12)
        n = rng.integers(3, 9, size=12).astype(float)
        k = rng.binomial(n.astype(int), q).astype(float)
        s = cluster_rate_interval(k, n)
        hits += s["ci_low"] <= p <= s["ci_high"]
        lo, hi = clopper_pearson(k.sum(), n.sum())
        naive_hits += lo <= p <= hi
    assert hits / reps >= 0.92
    assert naive_hits < hits


def test_rate_interval_validation_and_empty():
    with pytest.raises(ValueError):
        cluster_rate_interval([3.0], [2.0])
    assert cluster_rate_interval([0.0], [0.0])["value"] is None
    assert grid_mean([1.0, 1.0, 1.0], rate=True)["ci_low"] == pytest.approx(0.025 ** (1 / 3))
    with pytest.raises(ValueError):
        grid_mean([1.5, 0.2], rate=True)


def test_holm_matches_the_step_down_rule_and_keeps_missing_entries():
    from goalprobe.stats import holm

    adjusted = holm([0.01, None, 0.04, 0.03, 0.2])
    # sorted 0.01, 0.03, 0.04, 0.2 with m = 4: 0.04, 0.09, max(0.09, 0.08), 0.2
    assert adjusted == pytest.approx([0.04, None, 0.09, 0.09, 0.2])
    assert adjusted[1] is None
    assert holm([]) == []


def test_p_from_interval_reads_the_side_facing_the_baseline():
    from goalprobe.stats import p_from_interval

    # a symmetric 95% interval whose lower end touches the baseline: p = 0.025
    assert p_from_interval(1.0, 0.0, 2.0, 0.0) == pytest.approx(0.025, rel=1e-3)
    assert p_from_interval(1.0, 0.0, 2.0, 0.0, side="less") == pytest.approx(0.975, rel=1e-3)
    assert p_from_interval(1.0, 1.0, 1.0, 0.0) is None
    assert p_from_interval(None, 0.0, 1.0) is None


def test_rate_difference_interval_stays_open_at_100_minus_0():
    from goalprobe.stats import rate_difference_interval

    ones = cluster_rate_interval(np.ones(12), np.ones(12))
    zeros = cluster_rate_interval(np.zeros(12), np.ones(12))
    low, high = rate_difference_interval(ones, zeros)
    assert high == 1.0 and 0.5 < low < 0.8  # not [1, 1]
    assert rate_difference_interval({"value": None}, zeros) == (None, None)


def test_key_variant_rates_keep_an_exact_interval_at_100_percent():
    from goalprobe.gridworld.behaviour import _episode_rate

    stat = _episode_rate([True] * 14, [f"g{i}" for i in range(7) for _ in range(2)])
    assert stat["value"] == 1.0 and stat["n_eff"] == pytest.approx(7.0)
    assert stat["ci_low"] == pytest.approx(0.025 ** (1 / 7))
