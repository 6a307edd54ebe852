"""False-belief grids: the generator, the grid-set schema /2, the rollout's shown grid and the
oracle-belief scoring."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activations.gridworld.core import CellType, Grid
from activations.gridworld.false_belief import (
    CONTROL,
    FALSE_BELIEF,
    HIDDEN_WALL,
    KINDS,
    PHANTOM_WALL,
    STALE_GOAL,
    FalseBeliefConfig,
    differing_cells,
    generate_false_belief_set,
    pair_facts,
    start_optimal,
)
from activations.gridworld.io import (
    SCHEMA_V1,
    GridSetFormatError,
    grid_from_dict,
    grid_to_dict,
    read_grid_set,
    write_grid_set,
)
from activations.gridworld.optimal import solve
from activations.gridworld.text import cell_types, render


def _check_pair(fb: Grid, control: Grid) -> None:
    facts, cfacts = pair_facts(fb), pair_facts(control)
    assert facts["role"] == FALSE_BELIEF and cfacts["role"] == CONTROL
    assert facts["pair_id"] == cfacts["pair_id"]
    assert control.shown is None and fb.shown is not None
    # the control is the same true grid, shown as it is
    assert np.array_equal(control.walls, fb.walls) and control.goal == fb.goal
    assert control.start == fb.start == fb.shown.start
    assert solve(fb).is_solvable and solve(fb.shown).is_solvable
    shown_types, true_types = cell_types(fb.shown), cell_types(fb)
    differs = [tuple(c) for c in facts["differs"]]
    assert differs == differing_cells(fb) and differs
    mask = np.zeros_like(shown_types, dtype=bool)
    for cell in differs:
        mask[cell] = True
    assert np.array_equal(shown_types != true_types, mask)
    kind = facts["kind"]
    for cell in differs:
        pair = (int(shown_types[cell]), int(true_types[cell]))
        if kind == PHANTOM_WALL:
            assert pair == (CellType.WALL, CellType.OPEN)
        elif kind == HIDDEN_WALL:
            assert pair == (CellType.OPEN, CellType.WALL)
        else:
            assert pair in ((CellType.GOAL, CellType.OPEN), (CellType.OPEN, CellType.GOAL))
    if kind == STALE_GOAL:
        assert len(differs) == 2 and np.array_equal(fb.shown.walls, fb.walls)
    else:
        assert fb.shown.goal == fb.goal
    true_first, shown_first = start_optimal(fb), start_optimal(fb.shown)
    assert true_first and shown_first and not true_first & shown_first
    assert facts["true_optimal_start"] == [a.name for a in sorted(true_first)]
    assert facts["shown_optimal_start"] == [a.name for a in sorted(shown_first)]


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    size=st.sampled_from([5, 7, 9]),
    density=st.sampled_from([0.0, 0.2, 0.4]),
)
def test_pairs_differ_exactly_where_stated(seed, size, density):
    grids = generate_false_belief_set(
        FalseBeliefConfig(size=size, density=density, pairs_per_kind=2, seed=seed, max_tries=500)
    )
    assert len(grids) == 2 * 2 * len(KINDS)
    assert len({g.grid_id for g in grids}) == len(grids)
    for fb, control in zip(grids[::2], grids[1::2], strict=True):
        _check_pair(fb, control)
    assert [pair_facts(g)["kind"] for g in grids[::4]] == list(KINDS)


def test_generation_is_seeded():
    config = FalseBeliefConfig(pairs_per_kind=3, seed=5)
    assert generate_false_belief_set(config) == generate_false_belief_set(config)
    other = generate_false_belief_set(FalseBeliefConfig(pairs_per_kind=3, seed=6))
    assert other != generate_false_belief_set(config)


def test_config_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kinds"):
        FalseBeliefConfig(kinds=("teleport",))


def test_shown_grid_must_keep_the_start():
    fb = generate_false_belief_set(FalseBeliefConfig(pairs_per_kind=1, kinds=(STALE_GOAL,)))[0]
    moved = fb.shown.with_start(_another_open(fb))
    with pytest.raises(ValueError, match="start"):
        Grid(walls=fb.walls, goal=fb.goal, start=fb.start, shown=moved)


def _another_open(grid: Grid):
    n = grid.size
    return next(
        (r, c)
        for r in range(n)
        for c in range(n)
        if not grid.shown.walls[r, c] and (r, c) not in (grid.start, grid.shown.goal)
    )


def test_grid_set_v2_round_trip_and_v1_still_read(tmp_path):
    grids = generate_false_belief_set(FalseBeliefConfig(pairs_per_kind=2, seed=3))
    path = tmp_path / "fb.jsonl"
    write_grid_set(path, grids)
    back = read_grid_set(path)
    assert back == grids
    assert [g.shown is None for g in back] == [g.shown is None for g in grids]
    for g, b in zip(grids, back, strict=True):
        if g.shown is not None:
            assert render(b.prompt_grid) == render(g.shown)
    # a /1 line (no shown field) is still read, as a grid shown as it is
    record = grid_to_dict(grids[1])
    record.pop("shown")
    record["schema"] = SCHEMA_V1
    assert grid_from_dict(json.loads(json.dumps(record))) == grids[1]
    # a /2 line must carry shown; a /1 line must not
    record["shown"] = None
    with pytest.raises(GridSetFormatError, match="unknown field"):
        grid_from_dict(record)


def test_grid_set_rejects_a_bad_shown_grid():
    fb = generate_false_belief_set(FalseBeliefConfig(pairs_per_kind=1, kinds=(PHANTOM_WALL,)))[0]
    record = grid_to_dict(fb)
    start = fb.start
    rows = [list(r) for r in record["shown"]["walls"]]
    rows[start[0]][start[1]] = "1"
    record["shown"]["walls"] = ["".join(r) for r in rows]
    with pytest.raises(GridSetFormatError, match="shown"):
        grid_from_dict(record)
