"""Probe families (goalprobe.probes.families): the worked example of docs/extending.md, a
toy family registered from a module of its own, fitted by ``goalprobe train-probe`` and by the
probes stage's task, its cards read back by ``load_probe``."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from goalprobe.probes.families import (
    make_probe,
    probe_families,
    probe_family,
    register_probe_family,
    unregister_probe_family,
)
from goalprobe.probes.probe_sweep import ProbeSweepConfig
from goalprobe.probes.serialization import load_probe
from goalprobe.probes.wall_planting import planted_cell_data
from test_cell_probes import _write_store

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def _example_source() -> str:
    """The python block of the guide's "Add a probe family" section."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Add a probe family", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "the section holds one worked example"
    return blocks[0]


@pytest.fixture
def ridge_cells(tmp_path):
    """The guide's family, imported from a module written out of the guide."""
    module = tmp_path / "ridge_cells_family.py"
    module.write_text(_example_source(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("ridge_cells_family", module)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    yield loaded.RidgeCellProbe
    unregister_probe_family("ridge_cells")
    sys.modules.pop(spec.name, None)


@pytest.fixture
def store(tmp_path):
    """A real activation store with the cell types planted at pre_reasoning, layer 5."""
    data = planted_cell_data(200, steps_per_grid=2, sizes=(5, 7), canvas=15, d_model=32, signal=4.0)
    return _write_store(tmp_path / "acts.h5", data, layers=(3, 5))


def test_the_built_in_families_are_registered():
    families = probe_families()
    assert {"coordinate", "per_cell", "distance", "position", "majority"} <= set(families)
    assert families["distance"].target == "distance"
    # each family takes those of the shared options it has
    probe = make_probe("per_cell", family="linear", coordinates="onehot", alpha=3.0)
    assert probe.get_params()["family"] == "linear" and "coordinates" not in probe.get_params()
    with pytest.raises(ValueError, match="unknown probe family 'nope'"):
        probe_family("nope")


def test_a_family_missing_part_of_the_interface_is_refused():
    class NoSave:
        def fit(self, X, y):
            return self

    with pytest.raises(ValueError, match="lacks"):
        register_probe_family("no_save", NoSave)
    with pytest.raises(ValueError, match="target"):
        register_probe_family("bad_target", NoSave, target="plans")
    assert "no_save" not in probe_families()


def test_train_probe_fits_a_registered_toy_family(ridge_cells, store, tmp_path, goalprobe_cli):
    assert probe_family("ridge_cells").cls is ridge_cells
    out = tmp_path / "ridge"
    result = goalprobe_cli(
        "train-probe", store, "--out", out, "--probe", "ridge_cells", "--stages",
        "pre_reasoning", "--layers", "3,5", "--n-bootstrap", "50", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["estimator"] == {"class": "RidgeCellProbe", "hyperparameters": {"alpha": 1.0}}
    runs = {r["layer"]: r for r in sweep["runs"]}
    agent = {k: r["metrics"]["models"]["probe"]["agent_top1"]["value"] for k, r in runs.items()}
    assert agent[5] > 0.6 and agent[3] < 0.3  # the planted layer, not the noise
    prior = runs[5]["metrics"]["models"]["prior_size_density"]["agent_top1"]["value"]
    assert prior < 0.1  # what a map without the activations finds
    # its card loads back into the same predictions
    card = Path(runs[5]["model_path"])
    assert card.name == "cell_type_ridge_cells_probe_pre_reasoning_L5.json"
    probe = load_probe(card)
    assert isinstance(probe, ridge_cells) and probe.alpha == 1.0
    assert (out / "decoded" / "cell_type_ridge_cells_probe_pre_reasoning_L5.h5").is_file()


def test_the_probes_stage_task_fits_a_registered_toy_family(ridge_cells, store, tmp_path):
    from goalprobe.stages.probes import train_probe

    params = dict(family="mlp", hidden_size=8, class_balance="none", random_state=0)
    result = train_probe(
        store, tmp_path / "stage", "ridge_cells", params, ProbeSweepConfig(stages=(), layers=())
    )
    assert [(r["stage"], r["layer"]) for r in result["runs"]] == [
        ("pre_reasoning", 3), ("pre_reasoning", 5), ("post_reasoning", 3), ("post_reasoning", 5)
    ]  # fmt: skip
    probe = load_probe(result["runs"][1]["model_path"])
    probs = probe.predict_proba(np.zeros((2, probe.coef_.shape[1]), np.float32))
    assert probs.shape[:3] == (2, 15, 15) and np.allclose(probs.sum(-1), 1.0, atol=1e-5)
