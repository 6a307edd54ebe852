"""The readers the viewer composes, beside their writers: decoded maps and predicted plans read a
few rows at a time with their schema and version checked, the patching records from the bundle
or the CSV, and the prefix accuracy of a stored run on its test rows."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from goalprobe.gridworld.core import PLAN_END, PLAN_PAD, CellType
from goalprobe.probes.decoded_maps import (
    read_decoded_maps,
    read_decoded_maps_info,
    read_decoded_probs,
    read_decoded_row_ids,
    write_decoded_maps,
)
from goalprobe.probes.patching.results import read_records, write_results
from goalprobe.probes.plan_metrics import (
    read_plan_row_ids,
    read_plan_rows,
    read_plan_runs,
    read_predicted_plans,
    stored_run_metrics,
    write_predicted_plans,
)

CLASSES = [int(CellType.OPEN), int(CellType.WALL), int(CellType.GOAL)]


def _maps(tmp_path, *, stage="post", layer=3):
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(len(CLASSES)), size=(5, 4, 4)).astype(np.float32)
    card = {
        "class": "CoordinateCellProbe",
        "hyperparameters": {"family": "mlp"},
        "fitted": {"classes_": CLASSES},
        "activations": {"stage": stage, "layer": layer},
    }
    return write_decoded_maps(tmp_path / "maps.h5", probs, np.array([40, 10, 30, 20, 0]), card)


def test_decoded_maps_are_read_by_row_with_their_attributes(tmp_path):
    path = _maps(tmp_path)
    info = read_decoded_maps_info(path)
    assert (info.stage, info.layer, info.family) == ("post", 3, "mlp")
    assert info.classes == tuple(CLASSES) and info.shape == (5, 4, 4, 3)
    full = read_decoded_maps(path)
    assert read_decoded_row_ids(path).tolist() == [40, 10, 30, 20, 0]
    assert np.array_equal(read_decoded_probs(path, [3, 0, 3]), full.probs[[3, 0, 3]])
    assert read_decoded_probs(path, []).shape == (0, 4, 4, 3)


def test_older_decoded_maps_name_stage_and_layer_in_the_card(tmp_path):
    path = _maps(tmp_path, stage="pre", layer=7)
    with h5py.File(path, "a") as f:
        for name in ("stage", "layer", "family"):
            del f.attrs[name]
    info = read_decoded_maps_info(path)
    assert (info.stage, info.layer, info.family) == ("pre", 7, "mlp")


@pytest.mark.parametrize(
    ("attr", "value", "message"),
    [
        ("schema_version", 4, "schema_version 4 is not supported"),
        ("schema", "goalprobe.step_maps", "not a goalprobe.decoded_maps file"),
    ],
)
def test_decoded_map_readers_check_schema_and_version(tmp_path, attr, value, message):
    path = _maps(tmp_path)
    with h5py.File(path, "a") as f:
        f.attrs[attr] = value
    for read in (read_decoded_maps_info, read_decoded_row_ids, read_decoded_maps):
        with pytest.raises(ValueError, match=message):
            read(path)


def test_plan_runs_are_described_from_attributes_cards_and_names(tmp_path):
    path = tmp_path / "plans.h5"
    plans = np.array([[0, 1, PLAN_END, PLAN_PAD], [2, 2, 3, 3], [1, PLAN_END, PLAN_PAD, PLAN_PAD]])
    write_predicted_plans(path, "post/layer3/decoder2", plans, [7, 5, 6], card={}, split=[2, 0, 2])
    card = {"provenance": {"stage": "pre", "layer": 1, "kind": "decoder"}}
    write_predicted_plans(path, "custom", plans[::-1], [6, 5, 7], card=card)
    runs = {r.run: r for r in read_plan_runs(path)}
    named = runs["post/layer3/decoder2"]
    assert (named.stage, named.layer, named.kind, named.n_layers, named.has_split) == (
        "post",
        3,
        "decoder",
        2,
        True,
    )
    carded = runs["custom"]
    assert (carded.stage, carded.layer, carded.n_layers, carded.has_split) == (
        "pre",
        1,
        None,
        False,
    )
    assert read_plan_row_ids(path, "custom").tolist() == [6, 5, 7]
    stored = read_predicted_plans(path, "post/layer3/decoder2")
    assert np.array_equal(
        read_plan_rows(path, "post/layer3/decoder2", [2, 0]), stored.plans[[2, 0]]
    )
    assert read_plan_rows(path, "custom", []).shape == (0, 4)
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = 2
    for read in (read_plan_runs, lambda p: read_plan_row_ids(p, "custom")):
        with pytest.raises(ValueError, match="schema_version 2 is not supported"):
            read(path)


def test_stored_run_metrics_score_the_test_rows():
    # the decoder is right on its test rows (split 2) and wrong on its training rows
    store_plans = np.array([[0, 1, PLAN_END], [1, 1, 1], [2, PLAN_END, PLAN_PAD], [3, 3, 3]])
    grid_ids = np.array(["a", "b", "c", "d"])
    plans = np.array([[0, 1, PLAN_END], [0, 0, 0], [2, PLAN_END, PLAN_PAD], [0, 0, 0]])
    row_ids = np.array([0, 1, 2, 3])
    split = np.array([2, 0, 2, 0])
    test, rows = stored_run_metrics(plans, row_ids, split, store_plans, grid_ids, n_bootstrap=0)
    assert rows == "test" and test.n_examples == 2
    assert test.prefix_accuracy[0] == 1.0
    every, rows = stored_run_metrics(plans, row_ids, None, store_plans, grid_ids, n_bootstrap=0)
    assert rows == "all" and every.n_examples == 4 and every.prefix_accuracy[0] == 0.5
    # rows outside the store are dropped, not wrapped around
    outside, _ = stored_run_metrics(
        plans, np.array([0, 1, 2, 9]), None, store_plans, grid_ids, n_bootstrap=0
    )
    assert outside.n_examples == 3


def _records():
    return [
        {
            "base_id": f"run/g{i}/0/{i}",
            "site": "pre",
            "ld_target": -1.0 + i,
            "ld_source": 2.0,
            "ld_patched": 0.5,
            "recovered": 0.25 * i,
            "action_changed": i % 2 == 0,
            "into_source_optimal": True,
            "in_target_optimal": False,
        }
        for i in range(3)
    ]


def test_patch_records_read_back_from_the_bundle_and_the_csv(tmp_path):
    paths = write_results(tmp_path, _records(), [], {"run_id": "run"})
    from_json = read_records(paths["results_json"])
    from_csv = read_records(paths["records_csv"])
    assert from_json == _records()
    assert [
        {k: r[k] for k in ("base_id", "ld_target", "recovered", "action_changed")} for r in from_csv
    ] == [
        {k: r[k] for k in ("base_id", "ld_target", "recovered", "action_changed")}
        for r in _records()
    ]
    bad = tmp_path / "other.json"
    bad.write_text('{"schema": "goalprobe.patching/9", "records": []}')
    with pytest.raises(ValueError, match="is not"):
        read_records(bad)
    old = tmp_path / "old.json"  # unreleased version 1 bundles are refused
    old.write_text('{"schema": "goalprobe.patching/1", "records": [{"base_id": "run/g/0/0"}]}')
    with pytest.raises(ValueError, match="is not"):
        read_records(old)
