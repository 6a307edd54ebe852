"""``top_region``: where a metric's attribution lies most, on constructed attributions where the
answer is known (the anchors in one case, the changed cells in the other), with its interval
over grids and the share a uniform attribution would give."""

from __future__ import annotations

import numpy as np
from goalprobe.probes.attribution import PairAttribution, top_region

N_LAYERS, LENGTH = 3, 40
CELLS = np.arange(9, dtype=np.int64).reshape(3, 3) * 2 + 10  # grid tokens 10..26
ANCHORS = (35, 36, 37)


def record(grid: str, hot: list[int], metric: str = "coordinates") -> PairAttribution:
    values = np.zeros((N_LAYERS, LENGTH))
    values[1:, hot] = 1.0
    return PairAttribution(
        pair_id=f"{grid}/agent:0,1", grid_id=grid, kind="disjoint", moved="agent", metric=metric,
        layers=tuple(range(N_LAYERS)), positions=np.arange(LENGTH, dtype=np.int64),
        atp=values, graddrop=values, metric_base=0.0, metric_cf=-1.0, prompt_length=LENGTH,
        cell_positions=CELLS, pre_reasoning=ANCHORS, changed_cells=((0, 0), (0, 1)),
        grid_span=(9, 27),
    )  # fmt: skip


def test_the_anchors_when_the_attribution_lies_there():
    records = [record(f"g{i}", list(ANCHORS)) for i in range(6)]
    top = top_region(records, "coordinates")
    assert top["region"] == "pre_reasoning" and top["share"]["value"] == 1.0
    assert top["n_pairs"] == 6 and top["n_grids"] == 6
    # honest at 100%: six grids cannot pin the share at 1
    assert top["share"]["ci_low"] < 1.0 and top["share"]["ci_high"] == 1.0
    affected = LENGTH - 10  # from the first changed cell's token on
    assert np.isclose(top["uniform_share"], len(ANCHORS) / affected)


def test_the_changed_cells_when_the_attribution_lies_there_and_no_other_metric():
    hot = [int(CELLS[0, 0]), int(CELLS[0, 1]), 12 + 4]  # both changed cells, one other cell
    records = [record(f"g{i}", hot) for i in range(4)] + [record("g0", hot, "action")]
    top = top_region(records, "coordinates")
    assert top["region"] == "changed_cells"
    assert np.isclose(top["share"]["value"], 2 / 3)
    assert np.isclose(top["shares"]["other_grid"], 1 / 3) and top["n_pairs"] == 4
    assert top_region(records[:4], "action") is None
