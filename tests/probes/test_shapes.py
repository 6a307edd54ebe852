"""The shape aliases of goalprobe.stats.shapes describe what the store and the probes really
hand over (checked at run time with jaxtyping's isinstance), and refuse what they do not."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.activations.store import ActivationStore
from goalprobe.gridworld.core import LABEL_CANVAS, CellType
from goalprobe.probes.cell_probes import MajorityCellBaseline
from goalprobe.probes.decoded_maps import full_class_probs
from store_fixtures import LAYOUT, make_batch, write_store

from goalprobe.stats.shapes import (
    CellLabels,
    CellProbs,
    FeatureMatrix,
    GridIds,
    PlanTargets,
    ResidualActs,
    RowIndex,
    RowMask,
    TokenPositions,
)


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    path = write_store(tmp_path / "s.h5", [make_batch(rng, ["g0", "g1", "g2", "g3"], 0)])
    with ActivationStore(path) as opened:
        yield opened


def test_the_store_hands_over_what_its_aliases_say(store):
    rows = store.select("pre_reasoning")
    assert isinstance(rows, RowIndex)
    assert isinstance(store.present("post_reasoning"), RowMask)
    assert isinstance(store.positions("pre_reasoning", rows), TokenPositions)
    acts = store.read("pre_reasoning", LAYOUT.layers[0], rows)
    assert isinstance(acts, ResidualActs) and acts.shape == (len(rows), 3, LAYOUT.d_model)
    labels = store.labels(["cell_types", "plan", "grid_id"], rows)
    assert isinstance(labels["cell_types"], CellLabels)
    assert labels["cell_types"].shape[1:] == (LABEL_CANVAS, LABEL_CANVAS)
    assert isinstance(labels["plan"], PlanTargets)
    assert isinstance(labels["grid_id"], GridIds)


def test_a_probe_takes_and_returns_the_aliased_arrays(store):
    rows = store.select("pre_reasoning")
    acts = store.read("pre_reasoning", LAYOUT.layers[0], rows)
    maps = store.labels(["cell_types"], rows)["cell_types"]
    probe = MajorityCellBaseline().fit(acts, maps)
    assert isinstance(acts.reshape(len(acts), -1), FeatureMatrix)
    probs = probe.predict_proba(acts)
    assert isinstance(probs, CellProbs) and probs.shape[:3] == maps.shape
    assert isinstance(probe.predict(acts), CellLabels)
    full = full_class_probs(probs, [int(c) for c in probe.classes_])
    assert isinstance(full, CellProbs) and full.shape[-1] == len(CellType)


def test_the_aliases_refuse_a_wrong_rank_or_dtype():
    assert not isinstance(np.zeros((4, 8), dtype=np.float16), ResidualActs)  # rank 2
    assert not isinstance(np.zeros((4, 3, 8), dtype=np.int32), ResidualActs)  # not floating
    assert not isinstance(np.zeros((4, 15, 15), dtype=np.float32), CellLabels)  # not uint8
    assert not isinstance(np.zeros((4, 15, 15), dtype=np.uint8), CellProbs)  # rank 3
    assert not isinstance(np.zeros((4, 12), dtype=np.float32), PlanTargets)
    assert not isinstance(np.zeros(4, dtype=np.int64), RowMask)
