"""The Estimate and Verdict records read and write the result files' keys unchanged, and the
p-values and detectable effects behave where an interval has no width."""

from __future__ import annotations

import math

import numpy as np
import pytest

from goalprobe.stats import (
    Estimate,
    Verdict,
    cluster_rate_interval,
    detectable_effect,
    grid_bootstrap_ratio,
    p_exact_rate,
    p_from_draws,
)


def test_an_estimate_round_trips_the_files_keys_in_their_order():
    rate = cluster_rate_interval(np.array([3.0, 4.0, 2.0]), np.array([4.0, 4.0, 4.0]))
    assert list(rate) == [
        "value", "ci_low", "ci_high", "n", "n_grids", "n_eff", "design_effect", "icc",
        "interval_method",
    ]  # fmt: skip
    est = Estimate.from_dict(rate)
    assert est.n == 12 and est.clusters == 3 and est.method == rate["interval_method"]
    assert est.to_dict() == rate and list(est.to_dict()) == list(rate)
    mean = grid_bootstrap_ratio([0.2, 0.5, 0.7, 0.1], None, ["a", "b", "c", "d"])
    assert Estimate.from_dict(mean).to_dict() == mean
    selectivity = {"baseline": "prior", "value": 0.1, "ci_low": 0.0, "ci_high": 0.2}
    assert Estimate.from_dict(selectivity).baseline == "prior"
    assert Estimate.from_dict(selectivity).to_dict() == selectivity


def test_an_empty_rate_keeps_its_keys_and_has_no_bounds():
    empty = cluster_rate_interval(np.zeros(2), np.zeros(2))
    assert empty["value"] is None and empty["n"] == 0 and "n_eff" in empty
    low, high = Estimate.from_dict(empty).bounds()
    assert math.isnan(low) and math.isnan(high)


def test_a_verdict_says_only_what_it_may_and_round_trips():
    with pytest.raises(ValueError, match="verdict says one of"):
        Verdict("maybe")
    v = Verdict("undecided", "above random walk", detectable=0.3)
    assert v.to_dict() == {"verdict": "undecided", "question": "above random walk",
                           "detectable": 0.3}  # fmt: skip
    assert Verdict.from_flag(None).answer == "undecided"
    assert Verdict.from_flag(True).answer == "yes"


def test_the_exact_rate_p_is_defined_at_100_percent():
    # 16/16 has a resampled interval of no width; the exact test still gives 2^-16
    assert p_exact_rate(16, 16, 0.5) == pytest.approx(0.5**16)
    assert p_exact_rate(8, 16, 0.5) > 0.4
    assert p_exact_rate(0, 16, 0.5, side="less") == pytest.approx(0.5**16)
    assert p_exact_rate(3, 0, 0.5) is None


def test_a_p_from_draws_is_never_zero_and_reads_the_draws():
    assert p_from_draws(np.full(999, 0.5)) == pytest.approx(1 / 1000)
    assert p_from_draws(np.linspace(-1, 1, 1000)) == pytest.approx(0.5, abs=0.01)
    assert p_from_draws([]) is None


def test_the_detectable_effect_shrinks_with_n_and_exists_without_width():
    wide = detectable_effect(-0.3, 0.3)
    narrow = detectable_effect(-0.1, 0.1)
    assert wide == pytest.approx(3 * narrow)
    assert detectable_effect(1.0, 1.0, n=16) is not None  # degenerate: from n
    assert detectable_effect(None, None, n=100) < detectable_effect(None, None, n=25)
    assert detectable_effect(None, None) is None


def test_selectivity_records_the_p_of_its_draws():
    from goalprobe.probes.metrics import selectivity

    from goalprobe.stats import GridBootstrap

    boot = GridBootstrap.from_codes(np.arange(20), 20, n_resamples=400, random_state=0)
    rng = np.random.default_rng(0)
    good = rng.normal(0.8, 0.05, 20)
    samples = {
        "probe": {"acc": boot.ratio(good)},
        "prior": {"acc": boot.ratio(good - 0.3)},
        "same": {"acc": boot.ratio(good)},
    }
    clear = selectivity(samples, "probe", ("prior",), boot)["acc"]
    assert clear["above_baseline"] and clear["p_draws"] == pytest.approx(1 / 401)
    tie = selectivity(samples, "probe", ("same",), boot)["acc"]
    assert not tie["above_baseline"] and tie["p_draws"] == 1.0


def test_a_no_is_undecided_only_when_its_ceiling_is_below_what_its_n_can_detect():
    from goalprobe.stats import detectable_effect, undetectable_ceiling

    mde = detectable_effect(-0.05, 0.05)  # about 7 points
    assert undetectable_ceiling("no", -0.05, 0.05, 0.02) == pytest.approx(mde)
    assert undetectable_ceiling("no", -0.05, 0.05, 0.30) is None  # the true map would show
    assert undetectable_ceiling("no", -0.05, 0.05, None) is None  # no ceiling: the no stands
    assert undetectable_ceiling("yes", -0.05, 0.05, 0.02) is None  # a yes is never touched
    assert undetectable_ceiling("no", None, None, 0.02, n=None) is None  # nothing to size it


def test_an_interval_verdict_says_what_its_n_could_detect_beside_a_no():
    from goalprobe.stats import interval_verdict

    yes = interval_verdict({"value": 0.1, "ci_low": 0.02, "ci_high": 0.2, "n": 50})
    assert yes.answer == "yes" and yes.detectable is None
    no = interval_verdict({"value": 0.0, "ci_low": -0.05, "ci_high": 0.05, "n": 50})
    assert no.answer == "no" and no.detectable == pytest.approx(
        detectable_effect(-0.05, 0.05), rel=1e-9
    )
    wide = interval_verdict({"value": 0.0, "ci_low": -0.2, "ci_high": 0.2, "n": 50})
    assert wide.detectable > no.detectable
    missing = interval_verdict({"value": 0.3, "ci_low": None, "ci_high": None, "n": 4})
    assert missing.answer == "undecided" and missing.detectable is not None
    assert interval_verdict(Estimate(0.5, 0.45, 0.6), point=0.5).answer == "no"
    assert interval_verdict(Estimate(0.5, 0.51, 0.6), point=0.5).answer == "yes"


def test_json_ready_gives_strict_json_of_numpy_and_non_finite_values():
    import json

    from goalprobe.stats import json_ready

    value = {
        1: (np.float32(0.5), np.int64(3), np.bool_(True)),
        "a": np.array([[1.0, np.nan], [np.inf, 2.0]]),
        "b": [math.nan, -math.inf, 0.25, None, "x"],
    }
    out = json_ready(value)
    assert out == {
        "1": [0.5, 3, True],
        "a": [[1.0, None], [None, 2.0]],
        "b": [None, None, 0.25, None, "x"],
    }
    assert type(out["1"][1]) is int and type(out["1"][2]) is bool
    json.dumps(out, allow_nan=False)  # would raise on a NaN left in
