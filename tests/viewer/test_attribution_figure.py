"""The attribution heat map (issue 41, item 4): grid cells laid out as the grid per block, every
prompt position x block below; shapes that disagree are refused."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.viewer.figures.attribution import attribution_map_figure


def test_cells_are_laid_out_as_the_grid_and_positions_by_block():
    positions = np.arange(30)
    cells = np.arange(10, 19).reshape(3, 3)
    values = np.arange(60, dtype=float).reshape(2, 30) - 20
    fig = attribution_map_figure(
        values, positions, cells, anchors=(27, 28, 29), changed_cells=((0, 1), (2, 2))
    )
    grids = [t for t in fig.data if t.type == "heatmap"]
    assert len(grids) == 3  # two blocks' grids and the position x block strip
    for block in (0, 1):
        assert np.array_equal(np.asarray(grids[block].z), values[block][cells])
    assert np.array_equal(np.asarray(grids[2].z), values)
    assert grids[0].zmid == 0  # signed values: a diverging scale centred on 0
    outlined = [s for s in fig.layout.shapes if s.type == "rect" and s.line.width == 2]
    assert len(outlined) == 4  # two changed cells on each of two blocks
    shaded = [s for s in fig.layout.shapes if s.type == "rect" and s.line.width == 0]
    assert [(s.x0, s.x1) for s in shaded] == [(9.5, 18.5)]  # the grid's span
    magnitude = attribution_map_figure(np.abs(values), positions, cells)
    assert magnitude.data[0].colorscale[0][1] != grids[0].colorscale[0][1]


def test_shapes_that_disagree_are_refused():
    with pytest.raises(ValueError, match="positions"):
        attribution_map_figure(np.zeros((2, 5)), np.arange(6), np.zeros((1, 1), dtype=int))
    with pytest.raises(ValueError, match="not attributed"):
        attribution_map_figure(np.zeros((2, 5)), np.arange(5), np.array([[7]]))
    with pytest.raises(ValueError, match="layer labels"):
        attribution_map_figure(np.zeros((2, 5)), np.arange(5), np.array([[1]]), layers=[0])
