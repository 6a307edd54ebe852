"""Cell-type probes: planted-map recovery, controls, factorised = materialised, scikit-learn
agreement, persistence, decoded maps, metrics and splits by grid."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from goalprobe.gridworld.core import CellType
from goalprobe.probes.cell_probes import (
    CoordinateCellProbe,
    MajorityCellBaseline,
    PerCellProbe,
    validate_label_maps,
)
from goalprobe.probes.decoded_maps import read_decoded_maps, write_decoded_maps
from goalprobe.probes.metrics import cell_positions, evaluate_cell_maps, top_k_cells
from goalprobe.probes.serialization import (
    ActivationSource,
    load_probe,
    probe_card,
    read_probe_card,
    save_probe,
)
from goalprobe.probes.splits import carve_validation, shuffle_by_grid, split_by_grid
from goalprobe.probes.wall_planting import planted_cell_data
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression


@pytest.fixture(scope="module")
def planted():
    """A planted map with walls; grids 4x4 and 5x5 on a 5x5 canvas (padding present)."""
    data = planted_cell_data(600, steps_per_grid=2, sizes=(4, 5), d_model=64, signal=4.0)
    split = split_by_grid(data.grid_ids, test_fraction=0.25, stratify=data.grid_sizes)
    return data, split


@pytest.fixture(scope="module")
def fitted_per_cell(planted):
    data, split = planted
    tr = split.train
    probe = PerCellProbe(family="linear", weight_decay=1e-3)
    return probe.fit(data.acts[tr], data.labels[tr], groups=data.grid_ids[tr])


def _evaluate(data, rows, **models):
    preds = {name: (m.predict_proba(data.acts[rows]), m.classes_) for name, m in models.items()}
    return evaluate_cell_maps(
        preds,
        data.labels[rows],
        data.grid_ids[rows],
        grid_sizes=data.grid_sizes[rows],
        densities=data.densities[rows],
        agent_row_col=data.agent_row_col[rows],
        goal_row_col=data.goal_row_col[rows],
        reference="probe" if "probe" in models else None,
        n_boot=200,
    )


def test_per_cell_probe_recovers_planted_map_and_beats_controls(planted, fitted_per_cell):
    data, split = planted
    tr, te = split.train, split.test
    shuffled = clone(fitted_per_cell).fit(
        data.acts[tr],
        shuffle_by_grid(data.labels[tr], data.grid_ids[tr], strata=data.grid_sizes[tr]),
        groups=data.grid_ids[tr],
    )
    majority = MajorityCellBaseline().fit(data.acts[tr], data.labels[tr])
    result = _evaluate(data, te, probe=fitted_per_cell, shuffled=shuffled, majority=majority)
    probe = result["models"]["probe"]
    assert probe["accuracy"]["value"] > 0.97
    assert probe["accuracy_no_padding"]["value"] > 0.97
    assert probe["agent_top1"]["value"] > 0.9 and probe["goal_top1"]["value"] > 0.9
    assert probe["agent_manhattan"]["value"] < 0.3
    # shuffled labels: no better than a label-only guess; agent/goal at chance (1 / cells)
    ctrl = result["models"]["shuffled"]
    assert ctrl["agent_top1"]["value"] < 0.15 and ctrl["goal_top1"]["value"] < 0.15
    assert ctrl["balanced_accuracy"]["value"] < 0.5
    assert (
        ctrl["accuracy_no_padding"]["value"]
        < result["models"]["majority"]["accuracy_no_padding"]["value"] + 0.05
    )
    sel = result["differences"]["probe - shuffled"]["accuracy_no_padding"]
    assert sel["ci_low"] > 0.5
    assert sel["ci_low"] <= sel["value"] <= sel["ci_high"]
    assert set(result["by_grid_size"]) == {"4", "5"}
    assert set(result["by_density"]) == {"0", "0.2", "0.4"}
    assert result["by_grid_size"]["4"]["n_examples"] + result["by_grid_size"]["5"][
        "n_examples"
    ] == len(te)


def test_coordinate_mlp_recovers_planted_agent_and_goal():
    # no walls: the map is agent + goal + open + padding, which the study's probe must localise
    data = planted_cell_data(
        600, steps_per_grid=1, sizes=(4, 5), densities=(0.0,), d_model=64, signal=4.0
    )
    split = split_by_grid(data.grid_ids, test_fraction=0.25, stratify=data.grid_sizes)
    probe = CoordinateCellProbe(
        family="mlp",
        coordinates="onehot",
        hidden_size=128,
        max_epochs=25,
        batch_size=64,
        learning_rate=1e-2,
        n_iter_no_change=5,
    )
    probe.fit(data.acts[split.train], data.labels[split.train], groups=data.grid_ids[split.train])
    result = _evaluate(data, split.test, probe=probe)["models"]["probe"]
    assert result["accuracy"]["value"] > 0.95
    assert result["agent_top1"]["value"] > 0.9 and result["goal_top1"]["value"] > 0.9


@pytest.mark.parametrize("family", ["linear", "mlp"])
@pytest.mark.parametrize("coordinates", ["raw", "onehot"])
def test_factorised_equals_materialised(family, coordinates):
    data = planted_cell_data(40, steps_per_grid=2, sizes=(4, 5), d_model=16)
    kw = dict(
        family=family,
        coordinates=coordinates,
        hidden_size=32,
        max_epochs=2,
        batch_size=16,
        early_stopping=False,
    )
    fact = CoordinateCellProbe(**kw).fit(data.acts, data.labels)
    logits = fact.decision_function(data.acts)
    fact.set_params(materialise=True)  # same weights, naive rows
    np.testing.assert_allclose(fact.decision_function(data.acts), logits, atol=1e-5, rtol=0)
    # training on the naive rows follows the same trajectory
    naive = CoordinateCellProbe(materialise=True, **kw).fit(data.acts, data.labels)
    np.testing.assert_allclose(naive.decision_function(data.acts), logits, atol=1e-4, rtol=0)
    rows = fact.materialised_rows(data.acts.reshape(len(data.acts), -1), np.arange(3))
    assert rows.shape == (3 * 25, 3 * 16 + (2 if coordinates == "raw" else 10))


def test_linear_probe_agrees_with_sklearn_logistic_regression():
    data = planted_cell_data(
        100, steps_per_grid=2, sizes=(4, 5), d_model=16, signal=3.0, random_state=1
    )
    tr, te = np.arange(140), np.arange(140, 200)
    n_rows, C = len(tr) * 25, 1.0
    # the same objective as scikit-learn's: C * sum(loss) + |w|^2 / 2 == mean loss + l2/2 |w|^2
    # (the bias penalised too: scikit-learn's intercept as a column of ones)
    probe = CoordinateCellProbe(
        family="linear", class_balance="none", weight_decay=1.0 / (C * n_rows)
    ).fit(data.acts[tr], data.labels[tr])
    assert probe.converged_
    X = data.acts.reshape(len(data.acts), -1)
    ones = np.ones((n_rows, 1))
    rows_tr = np.hstack([probe.materialised_rows(X, tr).numpy(), ones])
    rows_te = np.hstack([probe.materialised_rows(X, te).numpy(), ones[: len(te) * 25]])
    sk = LogisticRegression(C=C, fit_intercept=False, max_iter=2000, tol=1e-8).fit(
        rows_tr, data.labels[tr].reshape(-1)
    )
    ours = probe.predict(data.acts[te]).reshape(-1)
    theirs = sk.predict(rows_te)
    assert np.mean(ours == theirs) > 0.995
    # same probabilities (scikit-learn's coefficients are ours up to a per-row constant)
    np.testing.assert_allclose(
        probe.predict_proba(data.acts[te]).reshape(-1, len(probe.classes_)),
        sk.predict_proba(rows_te),
        atol=2e-3,
    )


@pytest.mark.parametrize("make", [CoordinateCellProbe, PerCellProbe])
def test_linear_probes_are_deterministic_and_seed_free(planted, make):
    data, split = planted
    tr = split.train[:200]
    kw = dict(family="linear", class_balance="weighted_loss")
    a = make(random_state=0, **kw).fit(data.acts[tr], data.labels[tr], groups=data.grid_ids[tr])
    b = make(random_state=0, **kw).fit(data.acts[tr], data.labels[tr], groups=data.grid_ids[tr])
    c = make(random_state=7, **kw).fit(data.acts[tr], data.labels[tr], groups=data.grid_ids[tr])
    x = data.acts[split.test[:50]]
    # same data twice: identical; another seed: the same probe (nothing random in the fit)
    np.testing.assert_array_equal(a.decision_function(x), b.decision_function(x))
    np.testing.assert_array_equal(a.decision_function(x), c.decision_function(x))
    # a thread count changes summation order only: the unique optimum moves within tolerance
    threads = torch.get_num_threads()
    torch.set_num_threads(2 if threads == 1 else 1)
    try:
        d = make(random_state=3, **kw).fit(data.acts[tr], data.labels[tr])
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_allclose(d.predict_proba(x), a.predict_proba(x), atol=1e-4)
    assert a.converged_ and a.history_[0]["solver"] == "lbfgs"


def test_linear_probe_with_balanced_classes_learns_the_rare_class():
    # one rare class (the agent: one cell of 25) readable from the activations; unweighted
    # logistic regression under a strong penalty never predicts it, the balanced fit does
    data = planted_cell_data(
        200, steps_per_grid=2, sizes=(5,), densities=(0.0,), d_model=32, signal=0.5
    )
    tr, te = np.arange(300), np.arange(300, 400)
    agent = int(CellType.AGENT)
    recall = {}
    for balance in ("none", "weighted_loss"):
        probe = PerCellProbe(family="linear", class_balance=balance, weight_decay=1.0).fit(
            data.acts[tr], data.labels[tr]
        )
        truth = data.labels[te] == agent
        recall[balance] = float(np.mean(probe.predict(data.acts[te])[truth] == agent))
    assert recall["weighted_loss"] > 0.7
    assert recall["none"] < 0.4


def test_size_specific_probe_reads_only_its_grid(planted):
    data, split = planted
    rows = split.train[data.grid_sizes[split.train] == 4]
    probe = PerCellProbe(grid_size=4, max_epochs=2, early_stopping=False).fit(
        data.acts[rows], data.labels[rows]
    )
    assert CellType.PADDING not in probe.classes_
    assert probe.predict_proba(data.acts[rows[:3]]).shape == (3, 4, 4, len(probe.classes_))
    mixed = split.train[:20]
    with pytest.raises(ValueError, match="is not a 4 x 4 grid"):
        PerCellProbe(grid_size=4, early_stopping=False).fit(data.acts[mixed], data.labels[mixed])


def test_general_probe_classes_follow_labels_including_key_and_door():
    data = planted_cell_data(30, steps_per_grid=2, sizes=(4, 5), d_model=8)
    labels = data.labels.copy()
    labels[:, 0, 0] = np.where(labels[:, 0, 0] == CellType.OPEN, CellType.KEY, labels[:, 0, 0])
    labels[0, 1, 1] = CellType.DOOR
    probe = CoordinateCellProbe(family="linear", max_epochs=1, early_stopping=False).fit(
        data.acts, labels
    )
    assert CellType.KEY in probe.classes_ and CellType.DOOR in probe.classes_
    assert probe.predict(data.acts).dtype == np.uint8


def test_upsampling_weights_balance_classes(planted):
    from goalprobe.probes.cell_probes import _upsampling_multiplicities

    data, _ = planted
    codes = data.labels[:200].reshape(200, -1).astype(np.int64)
    counts = np.bincount(codes.ravel(), minlength=7)
    weights = _upsampling_multiplicities(codes, counts, np.random.default_rng(0))
    for c in np.flatnonzero(counts):
        assert weights[codes == c].sum() == counts.max()  # every class upsampled to the largest
    assert np.all(weights == np.round(weights))


def test_early_stopping_needs_grids_and_uses_training_grids_only(planted):
    data, split = planted
    with pytest.raises(ValueError, match="groups"):
        PerCellProbe(family="mlp").fit(data.acts[:50], data.labels[:50])
    fit_rows, val_rows = carve_validation(split.train, data.grid_ids, 0.2, random_state=0)
    assert np.intersect1d(data.grid_ids[fit_rows], data.grid_ids[val_rows]).size == 0
    assert np.intersect1d(val_rows, split.test).size == 0


def test_bad_labels_get_clear_errors():
    with pytest.raises(ValueError, match=r"labels\[0, 1, 2\] = 9 is not a CellType"):
        labels = np.zeros((2, 3, 3), dtype=np.uint8)
        labels[0, 1, 2] = 9
        validate_label_maps(labels, None)
    with pytest.raises(ValueError, match="square maps"):
        validate_label_maps(np.zeros((2, 3, 4), dtype=np.uint8), None)
    probe = CoordinateCellProbe(early_stopping=False, max_epochs=1)
    with pytest.raises(ValueError, match="acts has 3 rows but labels has 2"):
        probe.fit(np.zeros((3, 3, 4), np.float32), np.zeros((2, 3, 3), np.uint8))


@pytest.mark.parametrize(
    "make",
    [
        lambda: CoordinateCellProbe(
            family="mlp", hidden_size=16, coordinates="onehot", max_epochs=2
        ),
        lambda: CoordinateCellProbe(family="linear", classes=(0, 1, 2, 3, 4, 6), max_epochs=2),
        lambda: PerCellProbe(family="mlp", hidden_size=16, max_epochs=2),
        lambda: MajorityCellBaseline(strategy="global"),
    ],
)
def test_save_load_round_trips_exactly(tmp_path, planted, make):
    data, split = planted
    tr = split.train[:120]
    probe = make().fit(data.acts[tr], data.labels[tr], groups=data.grid_ids[tr])
    source = ActivationSource("store.h5", "abc123", "pre_reasoning", 15)
    card_path = save_probe(probe, tmp_path / "probe", source=source, metrics={"accuracy": 0.5})
    assert card_path.suffix == ".json" and (tmp_path / "probe.safetensors").exists()
    loaded = load_probe(tmp_path / "probe.safetensors")
    assert type(loaded) is type(probe) and loaded.get_params() == probe.get_params()
    x = data.acts[split.test[:40]]
    np.testing.assert_array_equal(loaded.predict_proba(x), probe.predict_proba(x))
    card = read_probe_card(tmp_path / "probe")
    assert card["activations"] == {
        "store_path": "store.h5",
        "store_checksum": "abc123",
        "stage": "pre_reasoning",
        "layer": 15,
    }
    assert card["metrics"] == {"accuracy": 0.5} and card["class"] == type(probe).__name__
    assert b"pickle" not in (tmp_path / "probe.safetensors").read_bytes()[:200]


def test_load_probe_rejects_foreign_cards(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ValueError, match="schema"):
        load_probe(tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        load_probe(tmp_path / "missing")


def test_decoded_maps_round_trip(tmp_path, planted, fitted_per_cell):
    data, split = planted
    rows = split.test[:30]
    probs = fitted_per_cell.predict_proba(data.acts[rows])
    card = probe_card(fitted_per_cell, source=ActivationSource("s.h5", "ff", "post_reasoning", 7))
    path = write_decoded_maps(tmp_path / "maps.h5", probs, rows, card)
    maps = read_decoded_maps(path)
    assert maps.probs.dtype == np.float16 and maps.probs.shape == probs.shape
    np.testing.assert_allclose(maps.probs, probs, atol=1e-3)
    np.testing.assert_array_equal(maps.row_ids, rows)
    np.testing.assert_array_equal(maps.classes, fitted_per_cell.classes_)
    assert maps.card["activations"]["layer"] == 7 and maps.schema_version == 3
    assert maps.agent is None and maps.goal is None and maps.readout.agent == "cell probe"
    np.testing.assert_array_equal(
        maps.classes[maps.probs.argmax(axis=-1)], fitted_per_cell.predict(data.acts[rows])
    )
    with h5py.File(path, "a") as f:
        f.attrs["schema"] = "nope"
    with pytest.raises(ValueError, match="schema"):
        read_decoded_maps(path)
    with pytest.raises(ValueError, match="classes_"):
        write_decoded_maps(tmp_path / "bad.h5", probs[..., :2], rows, card)


def test_decoding_helpers_and_metrics_by_hand():
    labels = np.full((2, 3, 3), CellType.OPEN, dtype=np.uint8)
    labels[:, 0, 0] = CellType.AGENT
    labels[:, 2, 2] = CellType.GOAL
    labels[1, 2, 0] = CellType.PADDING
    classes = np.array([CellType.OPEN, CellType.GOAL, CellType.AGENT, CellType.PADDING], np.uint8)
    probs = np.zeros((2, 3, 3, 4), np.float32)
    probs[..., 0] = 0.5
    probs[0, 0, 0, 2] = 0.9  # agent right in map 0
    probs[1, 1, 1, 2] = 0.9  # agent 2 cells off in map 1 (open cell mislabelled agent)
    probs[:, 2, 2, 1] = 0.9  # goal right in both
    np.testing.assert_array_equal(
        top_k_cells(probs, classes, CellType.AGENT, 1)[:, 0], [[0, 0], [1, 1]]
    )
    assert top_k_cells(probs, classes, CellType.GOAL, 2).shape == (2, 2, 2)
    np.testing.assert_array_equal(cell_positions(labels, CellType.GOAL), [[2, 2], [2, 2]])
    res = evaluate_cell_maps({"m": (probs, classes)}, labels, np.array(["a", "b"]), n_boot=50)
    m = res["models"]["m"]
    # map 0: 9/9 right; map 1: agent cell -> open (wrong), (1,1) -> agent (wrong), padding -> open (wrong)
    assert m["accuracy"]["value"] == pytest.approx(15 / 18)
    assert m["accuracy_no_padding"]["value"] == pytest.approx(15 / 17)
    assert m["agent_top1"]["value"] == 0.5 and m["agent_manhattan"]["value"] == 1.0
    assert m["goal_top1"]["value"] == 1.0
    assert m["recall/padding"]["value"] == 0.0 and m["precision/agent"]["value"] == 0.5
    assert res["classes"] == ["open", "goal", "agent", "padding"]


def test_bootstrap_resamples_grids_not_rows(planted, fitted_per_cell):
    data, split = planted
    rows = split.test[:100]
    probs = fitted_per_cell.predict_proba(data.acts[rows])
    base = evaluate_cell_maps(
        {"p": (probs, fitted_per_cell.classes_)}, data.labels[rows], data.grid_ids[rows], n_boot=300
    )
    # tripling every row within its grid changes no grid-level statistic nor any interval
    rep = np.repeat(np.arange(len(rows)), 3)
    tripled = evaluate_cell_maps(
        {"p": (probs[rep], fitted_per_cell.classes_)},
        data.labels[rows][rep],
        data.grid_ids[rows][rep],
        n_boot=300,
    )
    for key in ("accuracy", "agent_top1", "balanced_accuracy"):
        assert tripled["models"]["p"][key] == pytest.approx(base["models"]["p"][key])


@settings(max_examples=40, deadline=None)
@given(
    n_grids=st.integers(2, 40),
    steps=st.lists(st.integers(1, 5), min_size=40, max_size=40),
    test_fraction=st.floats(0.05, 0.6),
    validation_fraction=st.floats(0.0, 0.5),
    seed=st.integers(0, 10_000),
)
def test_splits_never_share_grids(n_grids, steps, test_fraction, validation_fraction, seed):
    grid_ids = np.repeat([f"g{i}" for i in range(n_grids)], steps[:n_grids])
    order = np.random.default_rng(seed).permutation(len(grid_ids))
    grid_ids = grid_ids[order]  # rows of a grid are scattered
    sizes = np.array([5 + 2 * (int(g[1:]) % 3) for g in grid_ids])
    split = split_by_grid(
        grid_ids,
        test_fraction=test_fraction,
        validation_fraction=validation_fraction,
        stratify=sizes,
        random_state=seed,
    )
    split.check_disjoint(grid_ids)
    parts = [split.train, split.validation, split.test]
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(grid_ids)))
    for a in range(3):
        for b in range(a + 1, 3):
            assert not set(grid_ids[parts[a]]) & set(grid_ids[parts[b]])
    again = split_by_grid(
        grid_ids,
        test_fraction=test_fraction,
        validation_fraction=validation_fraction,
        stratify=sizes,
        random_state=seed,
    )
    np.testing.assert_array_equal(again.test, split.test)  # seeded
    grids_per_size = {
        size: len(set(grid_ids[sizes == size].tolist())) for size in set(sizes.tolist())
    }
    if min(grids_per_size.values()) < 2:
        with pytest.raises(ValueError, match="one grid"):
            shuffle_by_grid(np.arange(len(grid_ids)), grid_ids, strata=sizes, random_state=seed)
        return
    shuffled = shuffle_by_grid(np.arange(len(grid_ids)), grid_ids, strata=sizes, random_state=seed)
    for g in np.unique(grid_ids):
        sources = set(grid_ids[shuffled[grid_ids == g]])
        assert len(sources) == 1  # a grid's targets all come from one grid ...
        source = next(iter(sources))
        assert source != g  # ... never its own (a derangement) ...
        assert sizes[grid_ids == source][0] == sizes[grid_ids == g][0]  # ... of its size


def test_split_rejects_stratum_varying_within_grid():
    with pytest.raises(ValueError, match="varies within grid"):
        split_by_grid(np.array(["a", "a", "b"]), stratify=np.array([5, 7, 5]))


def _write_store(path, data, layers=(3, 5)):
    """A real activation store: planted activations at pre-reasoning layer 5, noise elsewhere."""
    from goalprobe.activations.store import RowBatch, StoreLayout, StoreWriter
    from goalprobe.gridworld.core import PLAN_PAD

    n, d_model = data.acts.shape[0], data.acts.shape[2]
    rng = np.random.default_rng(1)
    stages = ("pre_reasoning", "post_reasoning")
    acts = {
        s: {
            layer: data.acts
            if (s, layer) == ("pre_reasoning", 5)
            else rng.normal(size=data.acts.shape).astype(np.float32)
            for layer in layers
        }
        for s in stages
    }
    labels = {
        "cell_types": data.labels,
        "agent_row_col": data.agent_row_col.astype(np.int16),
        "goal_row_col": data.goal_row_col.astype(np.int16),
        "grid_size": data.grid_sizes.astype(np.int16),
        "density": data.densities.astype(np.float32),
        "variant": np.array(["plain"] * n, dtype=object),
        "distance_to_goal": data.goal_distance.astype(np.int32),
        "plan": np.full((n, 10), PLAN_PAD, np.uint8),
        "optimal_actions": np.ones((n, 4), bool),
        "action": np.zeros(n, np.uint8),
        "action_valid": np.ones(n, bool),
        "has_key": np.zeros(n, bool),
        "door_open": np.zeros(n, bool),
        "run_id": np.array(["r"] * n, dtype=object),
        "grid_id": data.grid_ids.astype(object),
        "episode": np.zeros(n, np.int32),
        "step": np.arange(n, dtype=np.int32),
        "step_index": np.arange(n, dtype=np.int64),
        "seq_len": np.full(n, 64, np.int32),
    }
    with StoreWriter(path, StoreLayout(stages, layers, d_model), {"model_id": "planted"}) as writer:
        writer.append(
            RowBatch(
                acts=acts,
                positions={s: np.zeros((n, 3), np.int32) for s in stages},
                present={s: np.ones(n, bool) for s in stages},
                labels=labels,
            )
        )
    return path


@pytest.mark.slow  # end to end (a whole script, verb or trained agent): the full suite runs it
def test_train_probe_cli_sweeps_a_real_store(tmp_path):
    import typer
    from goalprobe.activations.extract import sha256_file
    from typer.testing import CliRunner

    from goalprobe.commands.train_probe import command

    data = planted_cell_data(200, steps_per_grid=2, sizes=(5, 7), canvas=15, d_model=64, signal=4.0)
    store = _write_store(tmp_path / "acts.h5", data)
    app = typer.Typer()
    app.command()(command)
    out = tmp_path / "run" / "probes"
    common = [
        "--stages",
        "pre_reasoning,post_reasoning",
        "--layers",
        "3,5",
        "--n-bootstrap",
        "50",
        "--no-progress",
    ]
    res = CliRunner().invoke(
        app,
        [
            str(store),
            "--out",
            str(out),
            "--probe",
            "per-cell",
            "--family",
            "linear",
            "--lr",
            "0.03",
            "--max-epochs",
            "15",
            *common,
        ],
        env={"COLUMNS": "250"},
    )
    assert res.exit_code == 0, res.output
    sweep = json.loads((out / "sweep.json").read_text())
    runs = {(r["stage"], r["layer"]): r for r in sweep["runs"]}
    assert len(runs) == 4 and (out / "sweep_figure.html").exists()
    acc = {k: r["metrics"]["models"]["probe"]["agent_top1"]["value"] for k, r in runs.items()}
    assert acc[("pre_reasoning", 5)] > 0.6
    assert max(v for k, v in acc.items() if k != ("pre_reasoning", 5)) < 0.3
    # one split for every stage and layer, by grid
    test_rows = {
        k: set(read_decoded_maps(r["decoded_maps_path"]).row_ids.tolist()) for k, r in runs.items()
    }
    assert len({frozenset(v) for v in test_rows.values()}) == 1
    rows = np.array(sorted(test_rows[("pre_reasoning", 5)]))
    assert set(np.flatnonzero(np.isin(data.grid_ids, data.grid_ids[rows]))) == set(rows.tolist())
    assert sweep["split"]["n_train_grids"] + sweep["split"]["n_test_grids"] == 200
    card = read_probe_card(runs[("pre_reasoning", 5)]["model_path"])
    assert card["activations"] == {
        "store_path": str(store),
        "store_checksum": sha256_file(store),
        "stage": "pre_reasoning",
        "layer": 5,
    }
    comparison = next(c for c in sweep["stage_comparisons"] if c["layer"] == 5)
    assert (
        comparison["metrics"]["differences"]["pre_reasoning - post_reasoning"]["agent_top1"][
            "ci_low"
        ]
        > 0.3
    )
    assert "pre_reasoning" in res.output and "acc (grid)" in res.output
    # distance target, ridge, one stage and layer
    res = CliRunner().invoke(
        app,
        [
            str(store),
            "--out",
            str(tmp_path / "dist"),
            "--target",
            "distance",
            "--family",
            "linear",
            "--layer",
            "5",
            "--n-bootstrap",
            "50",
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    run = json.loads((tmp_path / "dist" / "sweep.json").read_text())["runs"][0]
    assert run["metrics"]["models"]["probe"]["r2"]["value"] > 0.5
    bad = CliRunner().invoke(app, [str(store), "--out", str(tmp_path / "x"), "--layers", "4"])
    assert bad.exit_code != 0 and "not in the store" in bad.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_probe_matches_cpu():
    data = planted_cell_data(40, steps_per_grid=2, sizes=(4, 5), d_model=16)
    kw = dict(hidden_size=32, max_epochs=2, batch_size=16, early_stopping=False)
    cpu = CoordinateCellProbe(**kw).fit(data.acts, data.labels)
    gpu = CoordinateCellProbe(device="cuda", **kw).fit(data.acts, data.labels)
    np.testing.assert_allclose(
        gpu.predict_proba(data.acts), cpu.predict_proba(data.acts), atol=1e-3
    )
