"""Goal-distance regressors: planted recovery, controls, metrics by hand, pre vs post, persistence."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.probes.distance import GoalDistanceRegressor
from goalprobe.probes.metrics import evaluate_distance
from goalprobe.probes.serialization import load_probe, read_probe_card, save_probe
from goalprobe.probes.splits import shuffle_by_grid, split_by_grid
from goalprobe.probes.wall_planting import planted_cell_data
from sklearn.base import clone
from sklearn.dummy import DummyRegressor
from sklearn.linear_model import Ridge
from sklearn.metrics import mean_absolute_error, r2_score


@pytest.fixture(scope="module")
def planted():
    data = planted_cell_data(400, steps_per_grid=3, sizes=(5, 7), d_model=32, signal=2.0)
    split = split_by_grid(data.grid_ids, test_fraction=0.25, stratify=data.grid_sizes)
    return data, split


@pytest.mark.parametrize("family", ["linear", "mlp"])
def test_regressor_recovers_planted_distance_and_controls_do_not(planted, family):
    data, split = planted
    tr, te = split.train, split.test
    y = data.goal_distance
    kw = dict(family=family, alpha=10.0, hidden_size=64, max_epochs=40, learning_rate=3e-3)
    probe = GoalDistanceRegressor(**kw).fit(data.acts[tr], y[tr], groups=data.grid_ids[tr])
    shuffled = clone(probe).fit(
        data.acts[tr],
        shuffle_by_grid(y[tr], data.grid_ids[tr], strata=data.grid_sizes[tr]),
        groups=data.grid_ids[tr],
    )
    mean = DummyRegressor(strategy="mean").fit(np.zeros((len(tr), 1)), y[tr])
    result = evaluate_distance(
        {
            "probe": probe.predict(data.acts[te]),
            "shuffled": shuffled.predict(data.acts[te]),
            "mean": mean.predict(np.zeros((len(te), 1))),
        },
        y[te],
        data.grid_ids[te],
        grid_sizes=data.grid_sizes[te],
        reference="probe",
        n_boot=200,
    )
    models = result["models"]
    assert models["probe"]["r2"]["value"] > 0.8
    assert models["shuffled"]["r2"]["value"] < 0.15
    assert abs(models["mean"]["r2"]["value"]) < 0.05
    assert models["probe"]["mae"]["value"] < 0.5 * models["mean"]["mae"]["value"]
    assert result["differences"]["probe - mean"]["r2"]["ci_low"] > 0.6
    assert set(result["by_grid_size"]) == {"5", "7"}
    assert probe.score(data.acts[te], y[te]) == pytest.approx(models["probe"]["r2"]["value"])


def test_linear_family_is_ridge_on_standardised_acts(planted):
    data, split = planted
    tr = split.train
    X = data.acts[tr].reshape(len(tr), -1).astype(np.float64)
    probe = GoalDistanceRegressor(family="linear", alpha=3.0).fit(
        data.acts[tr], data.goal_distance[tr]
    )
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    ref = Ridge(alpha=3.0).fit(Z, data.goal_distance[tr])
    np.testing.assert_allclose(probe.predict(data.acts[tr]), ref.predict(Z), atol=1e-3)


def test_distance_metrics_match_sklearn_and_compare_stages():
    rng = np.random.default_rng(0)
    y = rng.integers(1, 20, size=300).astype(float)
    grids = np.repeat(np.arange(60), 5)
    pre = y + rng.normal(0, 3, size=300)
    post = y + rng.normal(0, 1, size=300)
    res = evaluate_distance({"post": post, "pre": pre}, y, grids, reference="post", n_boot=300)
    assert res["models"]["pre"]["mae"]["value"] == pytest.approx(mean_absolute_error(y, pre))
    assert res["models"]["post"]["r2"]["value"] == pytest.approx(r2_score(y, post))
    diff = res["differences"]["post - pre"]
    assert diff["mae"]["ci_high"] < 0  # post is more accurate, and the interval says so
    assert diff["r2"]["ci_low"] > 0
    assert res["n_grids"] == 60
    with pytest.raises(ValueError, match="reference"):
        evaluate_distance({"a": pre}, y, grids, reference="b")


@pytest.mark.parametrize("family", ["linear", "mlp"])
def test_distance_regressor_round_trips(tmp_path, planted, family):
    data, split = planted
    tr = split.train[:200]
    probe = GoalDistanceRegressor(family=family, hidden_size=16, max_epochs=3).fit(
        data.acts[tr], data.goal_distance[tr], groups=data.grid_ids[tr]
    )
    save_probe(probe, tmp_path / "dist")
    loaded = load_probe(tmp_path / "dist.json")
    x = data.acts[split.test]
    np.testing.assert_array_equal(loaded.predict(x), probe.predict(x))
    assert read_probe_card(tmp_path / "dist")["hyperparameters"]["family"] == family


def test_regressor_input_errors(planted):
    data, _ = planted
    with pytest.raises(ValueError, match="groups"):
        GoalDistanceRegressor(family="mlp").fit(data.acts[:20], data.goal_distance[:20])
    y = data.goal_distance[:20].copy()
    y[3] = np.inf
    with pytest.raises(ValueError, match=r"y\[3\]"):
        GoalDistanceRegressor().fit(data.acts[:20], y)
    fitted = GoalDistanceRegressor().fit(data.acts[:20], data.goal_distance[:20])
    with pytest.raises(ValueError, match="features"):
        fitted.predict(np.zeros((2, 5), np.float32))


def test_quadratic_family_passes_the_positive_control_a_linear_read_out_fails():
    """Issue 40: activations that carry the agent's and the goal's cells (each linearly
    decodable, one direction per cell) but not their distance. The distance is a product of
    the two positions, out of a linear read-out's reach (about the prior); the degree-2 kernel
    ridge expresses it from the decoded positions and beats the prior by far."""
    rng = np.random.default_rng(0)
    side, n, d = 5, 900, 64
    cells = side * side
    agent, goal = rng.integers(cells, size=n), rng.integers(cells, size=n)
    basis = rng.normal(size=(2 * cells, d))
    acts = basis[agent] + basis[cells + goal] + rng.normal(0, 0.3, size=(n, d))
    ar, ac = np.divmod(agent, side)
    gr, gc = np.divmod(goal, side)
    distance = (np.abs(ar - gr) + np.abs(ac - gc)).astype(float)
    tr, te = np.arange(600), np.arange(600, n)
    mean = np.full(len(te), distance[tr].mean())
    r2 = {}
    for family in ("linear", "quadratic"):
        probe = GoalDistanceRegressor(family=family, alpha=1.0).fit(acts[tr], distance[tr])
        r2[family] = r2_score(distance[te], probe.predict(acts[te]))
    assert abs(r2_score(distance[te], mean)) < 0.05
    # the ridge reads only how far each cell lies from the centre: little beyond the prior
    assert r2["linear"] < 0.2
    # the quadratic read-out of the decoded positions: far beyond the prior and the ridge
    assert r2["quadratic"] > 0.35 and r2["quadratic"] > r2["linear"] + 0.2


@pytest.mark.parametrize("family", ["quadratic"])
def test_quadratic_family_round_trips(tmp_path, planted, family):
    data, split = planted
    tr, te = split.train[:200], split.test[:50]
    probe = GoalDistanceRegressor(family=family, alpha=3.0).fit(
        data.acts[tr], data.goal_distance[tr]
    )
    from goalprobe.probes.serialization import ActivationSource

    save_probe(probe, tmp_path / "q", source=ActivationSource("s.h5", "x", "pre_reasoning", 1))
    loaded = load_probe(tmp_path / "q.safetensors")
    np.testing.assert_allclose(loaded.predict(data.acts[te]), probe.predict(data.acts[te]))
    # same data twice: the same regressor (closed form, no seed)
    again = GoalDistanceRegressor(family=family, alpha=3.0, random_state=9).fit(
        data.acts[tr], data.goal_distance[tr]
    )
    np.testing.assert_array_equal(again.predict(data.acts[te]), probe.predict(data.acts[te]))
