"""The store's read-out over reasoning time in the report and its figure, on a store with a
planted decision time: the reading names where the action becomes readable, and says so when
nothing is."""

from __future__ import annotations

import pytest
from goalprobe.activations.store import ActivationStore
from goalprobe.probes.decision_time import reasoning_readout
from goalprobe.viewer.figures.decision import reasoning_readout_figure
from readout_fixtures import planted_store

from goalprobe.report.decision import readout_blocks, readout_reading


@pytest.fixture(scope="module")
def readout(tmp_path_factory):
    path = planted_store(tmp_path_factory.mktemp("planted") / "planted.h5")
    with ActivationStore(path) as store:
        return reasoning_readout(store, n_resamples=200)


def test_reading_names_where_each_target_becomes_readable(readout):
    text = readout_reading(readout)
    assert "action: strongest baseline" in text
    assert "first beats it at the 60-80% (block 1) and at every later bin" in text
    assert "agent cell: strongest baseline" in text
    assert "goal cell" in text and "beats it at no bin and block" in text


def test_figure_has_a_line_per_target_and_layer_and_the_baselines(readout):
    fig = reasoning_readout_figure(readout)
    layers = [t for t in fig.data if t.name and t.name.startswith("block")]
    # three targets (action, agent cell, goal cell: the first move is the action, issue 40)
    assert len(readout["targets"]) == 3
    assert len(layers) == 3 * len(readout["layers"])
    baselines = [t for t in fig.data if t.name and t.name.startswith("strongest baseline")]
    assert len(baselines) == 3
    action_block1 = layers[1]
    assert list(action_block1.marker.symbol)[4:] == ["circle", "circle", "circle"]
    empty = reasoning_readout_figure(None)
    assert not empty.data


def test_blocks_hold_the_reading_the_figure_and_a_table_per_target(readout):
    blocks = readout_blocks(readout, lambda figure: figure)
    assert len(blocks) == 2 + 3
