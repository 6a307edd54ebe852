"""Iso-difficulty transforms preserve size, density, path length and (mapped) optimal policy."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from goalprobe.gridworld.core import Action, State, Variant
from goalprobe.gridworld.dynamics import step
from goalprobe.gridworld.optimal import bfs_distances, solve
from goalprobe.gridworld.variants import (
    STUDY_TRANSFORMS,
    TRANSFORMS,
    apply_transform,
    generate_variant,
    reflect,
    rotate90,
    start_goal_swap,
    transpose,
)
from hypothesis import given, settings
from hypothesis import strategies as st

GEOMETRIC = ["reflect", "reflect_vertical", "rotate90", "transpose"]
grids = st.builds(
    lambda variant, size, density, seed: generate_variant(
        variant, size, density, np.random.default_rng(seed), grid_id="g"
    ),
    variant=st.sampled_from([Variant.PLAIN, Variant.KEY_DOOR, Variant.TWO_PATH_KEY]),
    size=st.sampled_from([5, 7, 9, 11]),
    density=st.sampled_from([0.0, 0.4, 0.8, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)


def states_of(grid):
    n = grid.size
    return [
        State((r, c), hk, do)
        for hk in (False, True)
        for do in (False, True)
        for r in range(n)
        for c in range(n)
        if not grid.walls[r, c]
    ]


@settings(max_examples=30, deadline=None)
@given(grid=grids, name=st.sampled_from(GEOMETRIC))
def test_geometric_transforms_carry_the_optimal_policy(grid, name):
    t = apply_transform(grid, name)
    new = t.grid
    assert new.size == grid.size and new.walls.sum() == grid.walls.sum()
    assert new.variant == grid.variant and new.density == grid.density
    old_policy, new_policy = solve(grid), solve(new)
    assert new_policy.shortest_path_length == old_policy.shortest_path_length

    def map_state(state):  # the cell mapped, the flags kept
        return replace(state, agent=t.cell_map(state.agent))

    for state in states_of(grid):
        mapped = map_state(state)
        assert new.walls[mapped.agent] == grid.walls[state.agent]
        assert new_policy.distance(mapped) == old_policy.distance(state)
        assert new_policy.optimal_actions(mapped) == {
            t.action_map[a] for a in old_policy.optimal_actions(state)
        }
    # dynamics commute with the transform
    for state in states_of(grid)[:20]:
        for action in Action:
            assert map_state(step(grid, state, action)) == step(
                new, map_state(state), t.action_map[action]
            )


@settings(max_examples=30, deadline=None)
@given(grid=grids)
def test_start_goal_swap(grid):
    if grid.door is not None:
        with pytest.raises(ValueError, match="door"):
            start_goal_swap(grid)
        return
    t = start_goal_swap(grid)
    new = t.grid
    assert (new.start, new.goal) == (grid.goal, grid.start)
    assert np.array_equal(new.walls, grid.walls)
    old_policy, new_policy = solve(grid), solve(new)
    length = old_policy.shortest_path_length
    assert new_policy.shortest_path_length == length
    # an optimal path walked backwards is optimal on the swapped grid
    states, actions = old_policy.optimal_trajectory(np.random.default_rng(0))
    for state, action in zip(reversed(states[1:]), reversed(actions), strict=True):
        opposite = Action(action ^ 1)  # UP <-> DOWN, LEFT <-> RIGHT
        assert opposite in new_policy.optimal_actions(State(state.agent))
    # a cell is on some optimal path of one grid exactly when it is on the other's
    from_start = bfs_distances(grid.walls, grid.start)
    from_goal = bfs_distances(grid.walls, grid.goal)
    on_path = from_start + from_goal == length
    new_on_path = bfs_distances(new.walls, new.start) + bfs_distances(new.walls, new.goal) == length
    assert np.array_equal(on_path, new_on_path)


def test_action_maps_and_compositions():
    grid = generate_variant(Variant.KEY_DOOR, 9, 0.5, np.random.default_rng(3), grid_id="g")
    assert reflect(grid).action_map == {
        Action.UP: Action.UP,
        Action.DOWN: Action.DOWN,
        Action.LEFT: Action.RIGHT,
        Action.RIGHT: Action.LEFT,
    }
    assert rotate90(grid).action_map == {
        Action.UP: Action.RIGHT,
        Action.RIGHT: Action.DOWN,
        Action.DOWN: Action.LEFT,
        Action.LEFT: Action.UP,
    }
    assert transpose(grid).action_map[Action.UP] == Action.LEFT
    assert rotate90(grid).cell_map((0, 0)) == (0, 8)
    once = grid
    for _ in range(4):
        once = rotate90(once).grid
    assert once == grid
    assert reflect(reflect(grid).grid).grid == grid
    assert transpose(transpose(grid).grid).grid == grid
    assert rotate90(grid, 2).grid == rotate90(rotate90(grid).grid).grid
    t = transpose(rotate90(grid).grid)
    assert t.grid.grid_id == "g~rotate90~transpose"
    assert t.grid.extra == {"transforms": ["rotate90", "transpose"], "source_grid_id": "g"}
    assert set(STUDY_TRANSFORMS) == {"reflect", "rotate90", "start_goal_swap", "transpose"}
    assert set(STUDY_TRANSFORMS) < set(TRANSFORMS)
    with pytest.raises(ValueError, match="unknown transform"):
        apply_transform(grid, "shear")
