"""The conditional wall test (absolute and agent-centred frames) on planted wall maps: it must
say "yes" where walls are planted and "no" where they are not, and its null must be the
same-size-and-density control."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.core import CellType
from goalprobe.probes.cell_probes import CoordinateCellProbe
from goalprobe.probes.splits import split_by_grid
from goalprobe.probes.wall_planting import (
    PowerDesign,
    demo_layouts,
    planted_inputs,
    planted_walls,
    wall_power,
)
from goalprobe.probes.wall_test import (
    OFFSETS,
    ConditionalWallProbe,
    WallPrior,
    WallTestConfig,
    conditional_wall_test,
    group_codes,
    null_inputs,
    rings,
)
from sklearn.base import clone

SMALL = PowerDesign(n_grids=96, sizes=(7, 9), densities=(0.4, 0.8), grid_seed=3)


def _small(frame="absolute", strength=2.0, seed=0):
    data = planted_walls(
        demo_layouts(SMALL),
        frame=frame,
        strength=strength,
        sizes=SMALL.sizes,
        d_model=32,
        random_state=seed,
    )
    split = split_by_grid(data.grid_ids, test_fraction=0.3, stratify=data.grid_sizes)
    return data, split


def test_offsets_are_the_box_around_the_agent_in_rings_of_steps():
    assert OFFSETS.shape == (48, 2)
    assert np.bincount(rings(OFFSETS)).tolist() == [0, 4, 8, 12, 12, 8, 4]
    assert sorted(map(tuple, OFFSETS[rings(OFFSETS) == 1].tolist())) == [
        (-1, 0), (0, -1), (0, 1), (1, 0)
    ]  # fmt: skip
    assert np.all(np.diff(rings(OFFSETS)) >= 0)
    assert not np.any(np.all(OFFSETS == 0, axis=1))


def test_prior_fixes_borders_and_lattice_and_leaves_the_rest_uncertain():
    data, _ = _small()
    X = planted_inputs(data)
    prior = WallPrior().fit(X, data.labels)
    prob, uncertain = prior.proba(X)
    row = int(np.flatnonzero(data.grid_sizes == 9)[0])
    assert not uncertain[row, 0, :].any() and np.all(prob[row, 0, :9] == 1.0)  # border
    assert not uncertain[row, 1, 1] and prob[row, 1, 1] == 0.0  # maze lattice cell
    small = int(np.flatnonzero(data.grid_sizes == 7)[0])
    assert not uncertain[small, 7:, :].any() and np.all(prob[small, 7:, :] == 0)  # off grid
    assert uncertain[row].sum() > 5  # removable walls vary
    assert np.all((prob[uncertain] > 0) & (prob[uncertain] < 1))


def test_null_takes_anchors_of_another_grid_of_the_same_size_and_density():
    data, _ = _small()
    X = planted_inputs(data)
    Xn = null_inputs(X, data.grid_ids, random_state=1)
    assert np.array_equal(Xn[:, -4:], X[:, -4:])  # covariates and agent cell kept
    flat = X[:, :-4]
    source = np.array([int(np.flatnonzero((flat == r).all(axis=1))[0]) for r in Xn[:, :-4]])
    assert np.all(data.grid_ids[source] != data.grid_ids)
    codes = group_codes(data.grid_sizes, data.densities)
    assert np.array_equal(codes[source], codes)


def test_estimator_api_and_penalty_chosen_on_validation_grids():
    data, split = _small()
    X = planted_inputs(data)
    probe = ConditionalWallProbe(alphas=(3.0, 0.3))
    assert clone(probe).get_params() == probe.get_params()
    with pytest.raises(ValueError, match="groups"):
        clone(probe).fit(X[split.train], data.labels[split.train])
    probe.fit(X[split.train], data.labels[split.train], data.grid_ids[split.train])
    assert set(np.unique(probe.alpha_)) <= set(probe.validation_loss_)
    assert np.shape(probe.alpha_) == (probe.coef_.shape[1],)
    p = probe.predict_proba(X[split.test])
    prior, uncertain = probe.prior_proba(X[split.test])
    side = data.labels.shape[1]
    assert p.shape == (len(split.test), side * side)
    assert np.array_equal(p[~uncertain], prior[~uncertain])  # fixed cells stay the prior's
    assert probe.predict(X[split.test]).dtype == bool


@pytest.mark.parametrize("frame", ["absolute", "agent"])
def test_detects_planted_walls_and_not_their_absence(frame):
    """Yes at a strong plant, no without one (small design, so the test is fast)."""
    cfg = WallTestConfig(frame=frame, n_bootstrap=300)
    results = {}
    for strength in (0.0, 3.0):
        data, split = _small(frame, strength)
        results[strength] = conditional_wall_test(
            planted_inputs(data), data.labels, data.grid_ids, split.train, split.test, cfg
        )
    yes, no = results[3.0]["overall"], results[0.0]["overall"]
    assert yes["detected"] and yes["bits"]["difference"]["ci_low"] > 0
    assert not no["detected"]
    assert abs(no["bits"]["difference"]["value"]) < 0.02
    if frame == "agent":
        assert set(results[3.0]["rings"]) == {"1", "2", "3", "4", "5", "6"}
        assert results[3.0]["rings"]["1"]["detected"]
        assert results[3.0]["rings"]["1"]["cells_per_row"] <= 4


def test_an_agent_centred_map_is_missed_by_no_frame_it_is_not_in():
    """Walls planted relative to the agent: the agent-centred read-out finds them at ring 1."""
    data, split = _small("agent", 3.0, seed=1)
    X = planted_inputs(data)
    res = conditional_wall_test(
        X, data.labels, data.grid_ids, split.train, split.test, WallTestConfig(frame="agent")
    )
    ring1 = res["rings"]["1"]
    assert ring1["accuracy"]["probe"]["value"] > ring1["accuracy"]["prior"]["value"] + 0.05


def test_refuses_a_split_that_shares_grids():
    data, split = _small()
    with pytest.raises(ValueError, match="split by grid"):
        conditional_wall_test(
            planted_inputs(data),
            data.labels,
            data.grid_ids,
            np.arange(len(data.grid_ids)),
            split.test,
        )


def test_labels_walls_only():
    """Agent and goal cells are open cells for the wall statistic."""
    data, _ = _small()
    X = planted_inputs(data)
    probe = ConditionalWallProbe(alphas=(1.0,)).fit(X, data.labels)
    target, _ = probe.frame_targets(X, data.labels)
    agent_flat = data.agent_row_col[:, 0] * data.labels.shape[1] + data.agent_row_col[:, 1]
    assert not target[np.arange(len(X)), agent_flat].any()
    assert target.sum() == (data.labels == CellType.WALL).sum()


DEMO = PowerDesign(grid_seed=1)  # the probing set's grids: 5 sizes x 6 densities x 14, 4 rows


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_demo_size_detects_strength_half_and_not_zero(seed):
    """The issue's "done when": at the demo's size, with density planted as real grids carry
    it, strength 0.5 is detected (bits and within-grid AUC intervals above the same-size-and-
    density null) in every seed and strength 0 in none."""
    layouts = demo_layouts(DEMO)
    out = {}
    for strength in (0.0, 0.5):
        data = planted_walls(layouts, strength=strength, random_state=seed)
        split = split_by_grid(
            data.grid_ids, test_fraction=0.25, stratify=data.grid_sizes, random_state=seed
        )
        out[strength] = conditional_wall_test(
            planted_inputs(data),
            data.labels,
            data.grid_ids,
            split.train,
            split.test,
            WallTestConfig(random_state=seed),
        )["overall"]
    assert out[0.5]["detected"]
    assert out[0.5]["bits"]["difference"]["ci_low"] > 0
    assert out[0.5]["auc_within_grid"]["difference"]["ci_low"] > 0
    assert not out[0.0]["detected"]
    assert 40 < out[0.5]["cells_per_row"] < 60  # about 49 prior-uncertain cells per grid


@pytest.mark.slow
def test_regression_the_pooled_auc_minus_prior_statistic_misses_strength_two():
    """The previous statistic (the headline coordinate probe's pooled wall AUC minus the
    strongest control's, ``probes/wall_planting.py``) did not detect a planted wall map of strength 2
    (seed 1 of ``probes/wall_power.json``); the conditional test detects 0.5 (above)."""
    probe = CoordinateCellProbe(
        batch_size=32,
        class_balance="none",
        coordinates="onehot",
        hidden_size=128,
        learning_rate=0.003,
        max_epochs=60,
    )
    design = PowerDesign(grid_seed=1, signals=(2.0,), seeds=(1,), n_bootstrap=300)
    result = wall_power(probe, design)
    assert result["detection"] == {"2": 0.0}
    assert result["minimum_detectable_effect"] is None


@pytest.mark.parametrize("frame", ["absolute", "agent"])
def test_saved_wall_probe_predicts_exactly_as_fitted(tmp_path, frame):
    from goalprobe.probes.serialization import load_probe, save_probe

    data, split = _small(frame=frame, strength=1.0)
    X = planted_inputs(data)
    tr = split.train
    probe = ConditionalWallProbe(frame=frame, alphas=(3.0, 0.3)).fit(
        X[tr], data.labels[tr], data.grid_ids[tr]
    )
    card = save_probe(probe, tmp_path / f"wall_{frame}")
    loaded = load_probe(card)
    np.testing.assert_array_equal(loaded.predict_proba(X), probe.predict_proba(X))
    assert loaded.get_params() == probe.get_params()
    assert loaded.validation_loss_ == probe.validation_loss_


def test_heads_with_no_uncertain_cell_stay_zero_and_leave_the_others_as_they_were():
    from goalprobe.probes.wall_test import fit_offset_logistic

    rng = np.random.default_rng(0)
    Z = rng.normal(size=(60, 5))
    offset = rng.normal(size=(60, 4))
    target = (Z[:, :4] + rng.normal(size=(60, 4)) > 0).astype(float)
    mask = np.ones((60, 4))
    mask[:, 1] = 0  # a head no entry of which counts
    theta = fit_offset_logistic(Z, offset, target, mask, 0.1)
    W, b = theta[:20].reshape(5, 4), theta[20:]
    assert np.all(W[:, 1] == 0) and b[1] == 0
    keep = [0, 2, 3]
    alone = fit_offset_logistic(Z, offset[:, keep], target[:, keep], mask[:, keep], 0.1)
    np.testing.assert_allclose(W[:, keep], alone[:15].reshape(5, 3), atol=1e-6)


def test_null_of_a_tiny_set_pairs_lone_grids_with_other_grids():
    data, _ = _small()
    X = planted_inputs(data)
    # keep one grid per size-and-density stratum but two of one: lone grids must still pair
    codes = group_codes(data.grid_sizes, data.densities)
    keep_ids = []
    for code in np.unique(codes):
        ids = list(dict.fromkeys(data.grid_ids[codes == code]))
        keep_ids += ids[:2] if code == codes[0] else ids[:1]
    rows = np.flatnonzero(np.isin(data.grid_ids, keep_ids))
    Xn = null_inputs(X[rows], data.grid_ids[rows], random_state=0)
    flat = X[rows][:, :-4]
    source = np.array([int(np.flatnonzero((flat == r).all(axis=1))[0]) for r in Xn[:, :-4]])
    assert np.all(data.grid_ids[rows][source] != data.grid_ids[rows])


def test_decoding_reads_a_wall_shown_where_the_prior_never_has_one():
    """A false-belief grid draws walls on cells the generator always leaves open: the statistic's
    probabilities keep the prior's exact 0 there, the decoder's (``decode_proba``) let the
    agent-centred read-out move them. Rows whose activations say "open" stay open; on the
    prior-uncertain cells both agree."""
    data, split = _small("agent", 3.0, seed=1)
    X, ids = planted_inputs(data), np.asarray(data.grid_ids).astype(str)
    probe = ConditionalWallProbe(frame="agent").fit(
        X[split.train], data.labels[split.train], ids[split.train]
    )
    Xt = X[split.test]
    prior, uncertain = probe.prior_proba(Xt)
    fixed_open = ~uncertain & probe.prior_proba(Xt, smooth_fixed=True)[1] & (prior == 0)
    walls, _ = probe.frame_targets(Xt, data.labels[split.test])
    shown = uncertain & walls
    head = int(np.flatnonzero(fixed_open.any(0) & shown.any(0))[0])
    row = int(np.flatnonzero(fixed_open[:, head])[0])
    logit = probe.decision_function(Xt)
    donor = int(np.argmax(np.where(shown[:, head], logit[:, head], -np.inf)))
    fb = Xt.copy()
    fb[row, :-4] = Xt[donor, :-4]  # the anchors of a state whose cell there is a wall
    assert probe.predict_proba(fb)[row, head] == 0.0
    assert probe.decode_proba(fb)[row, head] > 0.5
    assert probe.decode_proba(Xt)[row, head] < 0.01
    np.testing.assert_allclose(
        probe.decode_proba(Xt)[uncertain], probe.predict_proba(Xt)[uncertain]
    )
