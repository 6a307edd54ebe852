"""Key variants: layout guarantees, matched controls, optimal policies on the product space."""

from __future__ import annotations

import math

import numpy as np
import pytest
from goalprobe.gridworld.core import Variant
from goalprobe.gridworld.dynamics import step
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.optimal import bfs_distances, solve
from goalprobe.gridworld.variants import (
    VARIANTS,
    generate_key_door_family,
    generate_two_path_family,
    generate_variant,
)
from hypothesis import given, settings
from hypothesis import strategies as st

study_sizes = st.sampled_from([7, 9, 11, 13, 15])
densities = st.sampled_from([0.0, 0.3, 0.6, 1.0])
seeds = st.integers(0, 2**32 - 1)


def count_shortest_paths(grid) -> int:
    policy = solve(grid)
    memo = {}

    def count(state):
        if state.agent == grid.goal:
            return 1
        if state not in memo:
            memo[state] = sum(count(step(grid, state, a)) for a in policy.optimal_actions(state))
        return memo[state]

    return count(policy.start_state)


@settings(max_examples=30, deadline=None)
@given(size=study_sizes, density=densities, seed=seeds)
def test_key_door_layout(size, density, seed):
    family = generate_key_door_family(size, density, np.random.default_rng(seed))
    grid = family.key_door
    assert grid.variant == Variant.KEY_DOOR and grid.key is not None and grid.door is not None
    assert len({grid.start, grid.goal, grid.key, grid.door}) == 4
    # the locked door (a wall without the key) cuts the agent off from the goal ...
    door_as_wall = grid.walls.copy()
    door_as_wall[grid.door] = True
    from_start = bfs_distances(door_as_wall, grid.start)
    assert math.isinf(from_start[grid.goal])
    # ... while the key is on the agent's side
    assert math.isfinite(from_start[grid.key])
    policy = solve(grid)
    assert policy.is_solvable
    # every optimal trajectory collects the key before it crosses the door
    rng = np.random.default_rng(seed)
    for _ in range(3):
        states, _ = policy.optimal_trajectory(rng)
        crossing = next(i for i, s in enumerate(states) if s.agent == grid.door)
        assert states[crossing - 1].has_key and states[crossing].door_open
    # the matched variants share walls, start and goal
    no_door, control = family.key_no_door, family.control
    for other in (no_door, control):
        assert np.array_equal(other.walls, grid.walls)
        assert (other.start, other.goal, other.door) == (grid.start, grid.goal, None)
    assert no_door.key == grid.key and control.key is None
    assert (no_door.variant, control.variant) == (Variant.KEY_NO_DOOR, Variant.KEY_DOOR_CONTROL)
    # the key is useless without the door, so both have the control's optimal policy
    length = solve(control).shortest_path_length
    assert solve(no_door).shortest_path_length == length <= policy.shortest_path_length


@settings(max_examples=30, deadline=None)
@given(size=study_sizes, density=densities, seed=seeds)
def test_two_path_layout(size, density, seed):
    family = generate_two_path_family(size, density, np.random.default_rng(seed))
    grid, control = family.with_key, family.control
    assert grid.variant == Variant.TWO_PATH_KEY and control.variant == Variant.TWO_PATH_NO_KEY
    assert np.array_equal(grid.walls, control.walls) and control.key is None
    assert count_shortest_paths(control) == 2
    assert count_shortest_paths(grid) == 2
    length = solve(control).shortest_path_length
    assert solve(grid).shortest_path_length == length
    # two disjoint paths of length L, the key strictly inside exactly one of them
    key_path, other = family.key_path_cells, family.other_path_cells
    assert len(key_path) == len(other) == length + 1
    assert key_path[0] == other[0] == grid.start and key_path[-1] == other[-1] == grid.goal
    assert grid.key in key_path[1:-1] and grid.key not in other
    assert not set(key_path[1:-1]) & set(other[1:-1])
    # both first moves are optimal: the key does not change pi*
    policy = solve(grid)
    assert len(policy.optimal_actions(policy.start_state)) == 2
    assert policy.optimal_actions(policy.start_state) == solve(control).optimal_actions(
        solve(control).start_state
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_generate_variant_is_deterministic_and_matched(variant):
    a = generate_variant(variant, 9, 0.5, np.random.default_rng(11))
    b = generate_variant(variant, 9, 0.5, np.random.default_rng(11))
    assert a == b and a.variant == variant
    assert solve(a).is_solvable


def test_grid_sets_of_a_family_share_layouts():
    def grid_set(variant):
        config = GridSetConfig(sizes=(7, 11), densities=(0.4,), n_per_cell=3, variant=variant)
        return generate_grid_set(config)

    key_door = grid_set(Variant.KEY_DOOR)
    for variant in (Variant.KEY_NO_DOOR, Variant.KEY_DOOR_CONTROL):
        for a, b in zip(key_door, grid_set(variant), strict=True):
            assert np.array_equal(a.walls, b.walls) and (a.start, a.goal) == (b.start, b.goal)
            assert a.seed == b.seed and a.grid_id != b.grid_id
    for a, b in zip(grid_set(Variant.TWO_PATH_KEY), grid_set(Variant.TWO_PATH_NO_KEY), strict=True):
        assert np.array_equal(a.walls, b.walls) and b.key is None


def test_orientations_vary():
    lines = set()
    for seed in range(40):
        door_row, door_col = generate_key_door_family(
            9, 1.0, np.random.default_rng(seed)
        ).key_door.door
        lines.add("horizontal" if door_row % 2 == 0 else "vertical")
    assert lines == {"horizontal", "vertical"}


def test_errors():
    with pytest.raises(ValueError, match="unknown variant"):
        generate_variant("nope", 7, 0.5, np.random.default_rng(0))
