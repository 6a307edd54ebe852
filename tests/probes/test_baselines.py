"""Baselines and controls a reviewer would accept (issue 22), pinned on constructed data."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.core import CellType
from goalprobe.probes.baselines import CellPrior, GroupMeanRegressor, covariates, uniform_top1
from goalprobe.probes.cell_probes import CoordinateCellProbe, MajorityCellBaseline
from goalprobe.probes.metrics import evaluate_cell_maps, evaluate_distance, grid_weighted_auc
from goalprobe.probes.splits import shuffle_by_grid, split_by_grid
from goalprobe.probes.wall_planting import planted_cell_data
from sklearn.metrics import roc_auc_score

from goalprobe.stats import GridBootstrap

CANVAS = 15


def _room(n: int) -> np.ndarray:
    """An open n x n room walled at its border, agent and goal in opposite corners, padded."""
    labels = np.full((CANVAS, CANVAS), CellType.PADDING, dtype=np.uint8)
    room = np.full((n, n), CellType.OPEN, dtype=np.uint8)
    room[0, :] = room[-1, :] = room[:, 0] = room[:, -1] = CellType.WALL
    room[1, 1], room[n - 2, n - 2] = CellType.AGENT, CellType.GOAL
    labels[:n, :n] = room
    return labels


def _accuracy_no_padding(model, x, labels) -> float:
    probs = model.predict_proba(x)
    metrics = evaluate_cell_maps(
        {"m": (probs, model.classes_)}, labels, np.array(["t"] * len(labels)), n_boot=0
    )
    return metrics["models"]["m"]["accuracy_no_padding"]["value"]


def test_the_canvas_majority_fails_on_a_larger_grid_and_the_size_prior_does_not():
    """Two 7 x 7 rooms and one 11 x 11: the canvas-wide per-cell majority predicts PADDING on
    72 of the 121 cells of an 11 x 11 test room; the per-cell prior by size is exact."""
    train = np.stack([_room(7), _room(7), _room(11)])
    test = np.stack([_room(11)])
    acts = np.zeros((3, 3, 4), dtype=np.float32)
    majority = MajorityCellBaseline().fit(acts, train)
    predicted = majority.predict(acts[:1])[0, :11, :11]
    assert int((predicted == CellType.PADDING).sum()) == 72
    # oracle: the most common of the three training labels at each cell, scored on the room
    votes = np.stack([(train == c).sum(axis=0) for c in range(len(CellType))])
    expected = np.mean(votes.argmax(axis=0)[:11, :11] == test[0, :11, :11])
    assert expected < 0.35
    assert _accuracy_no_padding(majority, acts[:1], test) == pytest.approx(expected)
    prior = CellPrior(by="size").fit(covariates([7, 7, 11], [0.0] * 3), train)
    assert _accuracy_no_padding(prior, covariates([11], [0.0]), test) == 1.0


def test_priors_back_off_to_coarser_groups_and_pad_outside_the_grid():
    train = np.stack([_room(7), _room(9)])
    prior = CellPrior(by="size_density").fit(covariates([7, 9], [0.2, 0.4]), train)
    probs = prior.predict_proba(covariates([9, 11], [0.9, 0.4]))  # unseen density, unseen size
    padding = list(prior.classes_).index(CellType.PADDING)
    assert np.allclose(probs[0], prior.groups_[("size", 9)])  # backed off to the size group
    assert (probs[1, 11:, :, padding] == 1).all() and (probs[1, :, 11:, padding] == 1).all()
    assert np.allclose(probs[1, :11, :11], prior.groups_[("all",)][:11, :11])
    assert np.allclose(probs.sum(axis=-1), 1.0)
    means = GroupMeanRegressor(by="size").fit(covariates([7, 7, 9], [0, 0, 0]), [2.0, 4.0, 10.0])
    assert means.predict(covariates([7, 9, 13], [0, 0, 0])).tolist() == [3.0, 10.0, 16 / 3]
    with pytest.raises(ValueError, match="by must be"):
        CellPrior(by="colour").fit(covariates([7], [0]), train[:1])


def test_uniform_localisation_is_one_over_the_open_cells():
    labels = np.stack([_room(7), _room(11)])
    assert uniform_top1(labels, [7, 11]).tolist() == [1 / 25, 1 / 81]


def test_weighted_auc_equals_sklearn_under_every_draw():
    rng = np.random.default_rng(0)
    cells = rng.integers(0, 7, 400)
    positive = rng.random(400) < 0.3
    scores = np.round(rng.random(400) + 0.5 * positive, 1)  # ties included
    boot = GridBootstrap.from_codes(cells, 7, n_resamples=5, random_state=1)
    auc = grid_weighted_auc(scores, positive, cells, boot)
    for b in range(6):
        weights = boot.weights[b][cells]
        assert auc[b] == pytest.approx(roc_auc_score(positive, scores, sample_weight=weights))


def test_shuffled_control_is_a_derangement_of_grids():
    ids = np.repeat([f"g{i}" for i in range(6)], 3)
    sizes = np.repeat([7, 7, 7, 9, 9, 9], 3)
    for seed in range(20):
        out = shuffle_by_grid(np.arange(18), ids, strata=sizes, random_state=seed)
        sources = ids[out]
        assert not (sources == ids).any()
        assert (sizes[out] == sizes).all()
    with pytest.raises(ValueError, match="one grid"):
        shuffle_by_grid(np.arange(4), ids[:4], strata=np.array([7, 7, 7, 9]))


def _fit_and_score(data, *, informative: bool, class_balance: str):
    split = split_by_grid(data.grid_ids, test_fraction=0.3, random_state=0)
    tr, te = split.train, split.test
    acts = data.acts if informative else np.random.default_rng(1).standard_normal(data.acts.shape)
    probe = CoordinateCellProbe(
        family="mlp",
        hidden_size=64,
        class_balance=class_balance,
        max_epochs=15,
        batch_size=32,
        random_state=0,
    ).fit(acts[tr], data.labels[tr], groups=data.grid_ids[tr])
    cov = covariates(data.grid_sizes, data.densities)
    prior = CellPrior(by="size_density").fit(cov[tr], data.labels[tr])
    majority = MajorityCellBaseline().fit(acts[tr], data.labels[tr])
    metrics = evaluate_cell_maps(
        {
            "probe": (probe.predict_proba(acts[te]), probe.classes_),
            "prior_size_density": (prior.predict_proba(cov[te]), prior.classes_),
            "majority": (majority.predict_proba(acts[te]), majority.classes_),
        },
        data.labels[te],
        data.grid_ids[te],
        grid_sizes=data.grid_sizes[te],
        reference="probe",
        baselines=("prior_size_density", "majority"),
        uniform_localisation=True,
        n_boot=200,
    )
    return metrics["selectivity"]


@pytest.fixture(scope="module")
def planted():
    return planted_cell_data(
        400, steps_per_grid=2, sizes=(4, 5), canvas=5, d_model=64, signal=4.0, random_state=3
    )


@pytest.mark.slow
@pytest.mark.parametrize("class_balance", ["upsample", "none"])
def test_verdicts_do_not_flip_with_class_balancing(planted, class_balance):
    """The rank-based verdicts (AUC of each class against the strongest prior) hold under
    either class balancing: a probe on informative activations is above its baselines, the
    same probe on random features is not, and neither beats the prior on accuracy."""
    real = _fit_and_score(planted, informative=True, class_balance=class_balance)
    noise = _fit_and_score(planted, informative=False, class_balance=class_balance)
    assert real["auc/wall"]["above_baseline"], real["auc/wall"]
    for metric in ("auc_macro", "auc/wall"):
        assert not noise[metric]["above_baseline"], (metric, noise[metric])
    assert noise["accuracy_no_padding"]["baseline"] in ("prior_size_density", "majority")
    assert not noise["accuracy_no_padding"]["above_baseline"]


def test_distance_selectivity_is_against_the_group_mean():
    rng = np.random.default_rng(0)
    sizes = np.repeat([7, 9, 11, 13], 30)
    y = sizes * 1.5 + rng.normal(0, 1, sizes.size)  # size alone predicts most of it
    ids = np.repeat(np.arange(40), 3).astype(str)
    cov = covariates(sizes, np.zeros(sizes.size))
    group = GroupMeanRegressor(by="size").fit(cov, y).predict(cov)
    probe = y + rng.normal(0, 2.5, y.size)  # noisier than the prior
    metrics = evaluate_distance(
        {"probe": probe, "mean_size": group, "mean": np.full(y.size, y.mean())},
        y,
        ids,
        reference="probe",
        baselines=("mean_size", "mean"),
        n_boot=200,
    )
    sel = metrics["selectivity"]
    assert sel["r2"]["baseline"] == "mean_size" and not sel["r2"]["above_baseline"]
    assert sel["mae"]["baseline"] == "mean_size" and sel["mae"]["value"] < 0
