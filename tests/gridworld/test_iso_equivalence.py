"""Iso-difficulty verdicts that can come out every way: equivalent, different, inconclusive."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.behaviour import BehaviourConfig, iso_tests

from goalprobe.stats import equivalence_verdict


@pytest.mark.parametrize(
    "low,high,verdict",
    [
        (-0.03, 0.04, "equivalent"),
        (0.01, 0.03, "equivalent"),  # excludes 0 but smaller than the margin
        (0.02, 0.12, "different"),
        (-0.20, -0.07, "different"),
        (-0.02, 0.09, "inconclusive"),
        (-0.3, 0.3, "inconclusive"),
        (None, 0.1, None),
    ],
)
def test_equivalence_verdict_on_constructed_intervals(low, high, verdict):
    assert equivalence_verdict(low, high, 0.05) == verdict


def _rows(n_pairs: int, shift: float, noise: float, seed: int):
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.3, 0.9, size=n_pairs)
    moved = np.clip(base + shift + rng.normal(0, noise, size=n_pairs), 0, 1)
    keys = ("accuracy", "success_rate", "entropy", "jsd")
    base_rows = {f"g{i}": {k: float(base[i]) for k in keys} for i in range(n_pairs)}
    trans = {f"g{i}": {k: float(moved[i]) for k in keys} for i in range(n_pairs)}
    return base_rows, {"reflect": trans}


def _accuracy_test(n_pairs, shift, noise, seed=0):
    base, trans = _rows(n_pairs, shift, noise, seed)
    tests = iso_tests(base, trans, BehaviourConfig(n_bootstrap=500, seed=seed))
    return next(t for t in tests if t["metric"] == "accuracy")


def test_30_pairs_of_an_unchanged_agent_are_equivalent():
    t = _accuracy_test(30, 0.0, 0.04)
    assert t["n_pairs"] == 30 and t["margin"] == 0.05
    assert t["equivalence"] == "equivalent"


def test_30_pairs_of_a_changed_agent_are_different():
    t = _accuracy_test(30, -0.15, 0.04)
    assert t["equivalence"] == "different"


def test_6_noisy_pairs_are_inconclusive_not_equivalent():
    # the old reading ("p >= 0.05: no change") would have said "no change" here
    t = _accuracy_test(6, 0.0, 0.2, seed=3)
    assert t["p_value"] >= 0.05
    assert t["equivalence"] == "inconclusive"


def test_few_non_zero_pairs_bound_the_reachable_p_value():
    base, trans = _rows(6, 0.0, 0.0, 0)
    for i in range(3):  # 3 non-zero pairs of 6
        trans["reflect"][f"g{i}"]["accuracy"] += 0.2
    t = next(
        t
        for t in iso_tests(base, trans, BehaviourConfig(n_bootstrap=200))
        if t["metric"] == "accuracy"
    )
    assert t["n_nonzero"] == 3 and t["min_p_value"] == 0.25
    assert t["p_value"] >= t["min_p_value"]
    entropy = next(
        t
        for t in iso_tests(base, trans, BehaviourConfig(n_bootstrap=200))
        if t["metric"] == "entropy"
    )
    assert entropy["equivalence"] is None  # no margin outside the rates
