"""Decoded maps with the wall read-outs: the agent-centred probe near the decoded agent, the
conditional probe elsewhere, and the file records which read-out made each cell (schema 3)."""

from __future__ import annotations

import h5py
import numpy as np
from goalprobe.gridworld.core import CellType
from goalprobe.probes.cell_probes import MajorityCellBaseline
from goalprobe.probes.decoded_maps import (
    AGENT_CENTRED_READOUT,
    CONDITIONAL_READOUT,
    WALL_SOURCES,
    Readout,
    combine_walls,
    decode_rows,
    read_decoded_maps,
    write_decoded_maps,
)
from goalprobe.probes.splits import split_by_grid
from goalprobe.probes.wall_planting import PowerDesign, demo_layouts, planted_inputs, planted_walls
from goalprobe.probes.wall_test import OFFSETS, ConditionalWallProbe

SIDE = 15


def test_combine_walls_takes_each_read_out_where_it_belongs():
    probs = np.zeros((1, SIDE, SIDE, len(CellType)), dtype=np.float32)
    probs[..., CellType.OPEN] = 0.5
    probs[..., CellType.WALL] = 0.25
    probs[..., CellType.GOAL] = 0.25
    absolute = np.full((1, SIDE * SIDE), 0.9)
    centred = np.full((1, len(OFFSETS)), 0.1)
    out, source = combine_walls(
        probs, np.array([9]), np.array([[1, 7]]), absolute=absolute, agent_centred=centred
    )
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, atol=1e-6)
    assert source[0, 0, 4] == 2 and out[0, 0, 4, CellType.WALL] == np.float32(0.1)  # ring 3
    assert source[0, 1, 7] == 1  # the agent's own cell is no offset: the conditional probe's
    assert source[0, 5, 7] == 1 and np.isclose(out[0, 5, 7, CellType.WALL], 0.9)  # ring 4
    assert np.all(source[0, 9:, :] == 0) and np.all(source[0, :, 9:] == 0)  # off the grid
    np.testing.assert_array_equal(out[0, 10, 10], probs[0, 10, 10])
    # the other classes keep their proportions
    assert np.isclose(out[0, 5, 7, CellType.OPEN] / out[0, 5, 7, CellType.GOAL], 2.0)
    assert WALL_SOURCES[2] == AGENT_CENTRED_READOUT


def _agent_planted(seed=0):
    design = PowerDesign(n_grids=96, sizes=(7, 9), densities=(0.4, 0.8), grid_seed=5)
    data = planted_walls(
        demo_layouts(design),
        frame="agent",
        strength=3.0,
        sizes=design.sizes,
        d_model=32,
        random_state=seed,
    )
    split = split_by_grid(data.grid_ids, test_fraction=0.3, stratify=data.grid_sizes)
    return data, split


def test_decoded_map_reads_planted_agent_centred_walls_and_records_its_read_outs(tmp_path):
    data, split = _agent_planted()
    X = planted_inputs(data)
    tr, te = split.train, split.test
    fit = {"y": data.labels[tr], "groups": data.grid_ids[tr]}
    absolute = ConditionalWallProbe(alphas=(3.0, 1.0, 0.3)).fit(X[tr], **fit)
    centred = ConditionalWallProbe(frame="agent", alphas=(3.0, 1.0, 0.3)).fit(X[tr], **fit)
    cells = MajorityCellBaseline().fit(data.acts[tr], data.labels[tr])

    class Agent:  # the true agent as the decoded one (a position read-out's interface)
        def cell_proba(self, acts, sizes, canvas):
            out = np.zeros((len(acts), canvas, canvas), dtype=np.float32)
            out[np.arange(len(acts)), data.agent_row_col[te, 0], data.agent_row_col[te, 1]] = 1
            return out

    kwargs = {"agent_probe": Agent(), "densities": data.densities[te]}
    sizes = data.grid_sizes[te]
    both = decode_rows(
        cells,
        data.acts[te],
        sizes,
        wall_probe=absolute,
        agent_wall_probe=centred,
        readout=Readout(wall_probe="w.json", agent_wall_probe="a.json"),
        **kwargs,
    )
    only = decode_rows(cells, data.acts[te], sizes, wall_probe=absolute, **kwargs)
    assert both.readout.walls == CONDITIONAL_READOUT and both.readout.agent_wall_probe == "a.json"
    assert only.readout.agent_wall_probe is None
    walls = data.labels[te] == CellType.WALL
    near = both.wall_source == 2
    assert near.sum() > 10 * len(te)
    near &= absolute.prior_.proba(X[te])[1]  # the cells the prior leaves uncertain

    def accuracy(decoded):
        return np.mean((decoded.probs[..., CellType.WALL] > 0.5)[near] == walls[near])

    # the walls were planted relative to the agent: near it the combined map reads them better
    assert accuracy(both) > accuracy(only) + 0.08
    keep = cells.classes_.astype(np.int64)
    card = {"fitted": {"classes_": [int(c) for c in keep]}, "class": "X"}
    path = write_decoded_maps(
        tmp_path / "m.h5",
        both.probs[..., keep],
        np.arange(len(te)),
        card,
        agent=both.agent,
        readout=both.readout,
        wall_source=both.wall_source,
    )
    maps = read_decoded_maps(path)
    assert maps.schema_version == 3 and maps.readout == both.readout
    np.testing.assert_array_equal(maps.wall_source, both.wall_source)
    with h5py.File(path, "a") as f:  # a version-2 file: no wall_source
        f.attrs["schema_version"] = 2
        del f["wall_source"]
    assert read_decoded_maps(path).wall_source is None
