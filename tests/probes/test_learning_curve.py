"""Learning curves (probes/probe_sweep.py): nested training prefixes, fixed test grids, the
same controls and selectivity as the sweep."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.core import LABEL_CANVAS, CellType
from goalprobe.probes.distance import GoalDistanceRegressor
from goalprobe.probes.probe_sweep import ProbeData, ProbeSweepConfig, grid_counts, learning_curve
from goalprobe.probes.serialization import ActivationSource
from goalprobe.probes.splits import split_by_grid


def planted_distance_data(n_grids: int, steps: int = 4, d_model: int = 48, seed: int = 0):
    """Distance = a fixed linear read-out of the activations + noise; sizes add a prior."""
    rng = np.random.default_rng(seed)
    n = n_grids * steps
    grid_ids = np.repeat([f"g{i:03d}" for i in range(n_grids)], steps).astype(object)
    sizes = np.repeat(rng.choice([7, 9, 11], n_grids), steps)
    acts = rng.standard_normal((n, 3, d_model)).astype(np.float32)
    w = rng.standard_normal(d_model)
    distance = 3 + sizes * 0.5 + 2.0 * acts[:, -1] @ w / np.sqrt(d_model) + rng.normal(0, 0.5, n)
    cells = np.full((n, LABEL_CANVAS, LABEL_CANVAS), CellType.PADDING, dtype=np.uint8)
    return ProbeData(
        acts=acts,
        row_ids=np.arange(n),
        grid_ids=grid_ids,
        grid_sizes=sizes.astype(np.int64),
        densities=np.full(n, 0.2),
        cell_types=cells,
        agent_row_col=np.zeros((n, 2), dtype=np.int64),
        goal_row_col=np.zeros((n, 2), dtype=np.int64),
        goal_distance=distance,
        source=ActivationSource("planted.h5", "-", "pre_reasoning", 0),
    )


def test_grid_counts_are_increasing_and_end_at_every_grid():
    assert grid_counts(100, points=5) == (8, 15, 28, 53, 100)
    assert grid_counts(5, points=4) == (5,)
    assert grid_counts(9, points=3)[-1] == 9
    with pytest.raises(ValueError):
        grid_counts(0)


def test_a_linear_signal_is_learned_with_more_grids_and_beats_the_size_prior():
    data = planted_distance_data(160)
    split = split_by_grid(data.grid_ids, test_fraction=0.25, random_state=0)
    config = ProbeSweepConfig(
        target="distance", stages=("pre_reasoning",), layers=(0,), n_bootstrap=200
    )
    curve = learning_curve(
        data, split.train, split.test, GoalDistanceRegressor(family="linear", alpha=1.0), config,
        counts=(6, 30, 120),
    )  # fmt: skip
    points = curve["points"]
    assert [p["n_train_grids"] for p in points] == [6, 30, 120]
    assert [p["n_train"] for p in points] == [6 * 4, 30 * 4, 120 * 4]
    r2 = [p["models"]["probe"]["r2"]["value"] for p in points]
    assert r2[-1] > r2[0] + 0.2 and r2[-1] > 0.5
    last = points[-1]
    # the controls are the sweep's: mean, size and size-and-density means, shuffled labels
    assert {"mean", "mean_size", "mean_size_density", "shuffled"} <= set(last["models"])
    assert last["selectivity"]["r2"]["above_baseline"]
    assert last["selectivity"]["r2"]["baseline"] in ("mean_size", "mean_size_density")
    assert curve["n_test_grids"] == 40 and curve["metrics"] == ["r2", "mae"]


def test_noise_never_beats_its_prior_at_any_size():
    data = planted_distance_data(120, seed=1)
    noise = ProbeData(**{**data.__dict__, "acts": np.random.default_rng(5).standard_normal(
        data.acts.shape).astype(np.float32)})  # fmt: skip
    split = split_by_grid(noise.grid_ids, test_fraction=0.25, random_state=0)
    config = ProbeSweepConfig(
        target="distance", stages=("pre_reasoning",), layers=(0,), n_bootstrap=200
    )
    curve = learning_curve(
        noise, split.train, split.test, GoalDistanceRegressor(family="linear", alpha=10.0), config,
        counts=(10, 90),
    )  # fmt: skip
    for point in curve["points"]:
        assert not point["selectivity"]["r2"]["above_baseline"], point["selectivity"]["r2"]


def test_bad_inputs_are_refused():
    data = planted_distance_data(20)
    config = ProbeSweepConfig(target="distance", stages=("pre_reasoning",), layers=(0,))
    rows = np.arange(len(data.acts))
    with pytest.raises(ValueError, match="share grids"):
        learning_curve(data, rows, rows, GoalDistanceRegressor(), config)
    split = split_by_grid(data.grid_ids, test_fraction=0.25, random_state=0)
    with pytest.raises(ValueError, match="counts"):
        learning_curve(data, split.train, split.test, GoalDistanceRegressor(), config, counts=(99,))


def test_the_figure_draws_every_model_with_its_band_per_metric():
    from goalprobe.viewer.figures.probes import learning_curve_figure

    data = planted_distance_data(60)
    split = split_by_grid(data.grid_ids, test_fraction=0.25, random_state=0)
    config = ProbeSweepConfig(
        target="distance", stages=("pre_reasoning",), layers=(0,), n_bootstrap=50
    )
    curve = learning_curve(
        data, split.train, split.test, GoalDistanceRegressor(), config, counts=(6, 45)
    )
    figure = learning_curve_figure({**curve, "stage": "pre_reasoning", "layer": 0})
    lines = [t for t in figure.data if t.mode == "lines+markers"]
    names = {t.name for t in lines}
    assert names == {"probe", "shuffled labels", "mean", "size mean", "size-and-density mean"}
    assert len(lines) == 2 * len(names)  # one line per model in each of the r2 and mae panels
    assert all(list(t.x) == [6, 45] for t in lines)
    bands = [t for t in figure.data if t.fill == "toself"]
    assert len(bands) == len(lines)
    empty = learning_curve_figure({"points": [], "metrics": []})
    assert "no learning curve" in empty.layout.annotations[0].text
