"""Dynamics and exact optimal policies, checked against BFS-free brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from goalprobe.gridworld.core import Action, Grid, State, Variant
from goalprobe.gridworld.dynamics import initial_state, is_success, rollout, settle, step
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.optimal import UnsolvableGridError, default_horizon, solve
from goalprobe.gridworld.text import parse
from goalprobe.gridworld.variants import generate_variant
from hypothesis import given, settings
from hypothesis import strategies as st

KEY_DOOR_TEXT = """  0 1 2 3 4 5 6
0 # # # # # # #
1 # _ _ _ _ _ #
2 # A _ _ _ K #
3 # # # D # # #
4 # _ _ _ _ _ #
5 # _ G _ _ _ #
6 # # # # # # #"""


def key_door_grid() -> Grid:
    grid, _ = parse(KEY_DOOR_TEXT)
    return grid


def all_states(grid: Grid) -> list[State]:
    keys = (False, True) if grid.key is not None else (False,)
    doors = (False, True) if grid.door is not None else (True,)
    n = grid.size
    return [
        State((r, c), hk, do)
        for hk in keys
        for do in doors
        for r in range(n)
        for c in range(n)
        if not grid.walls[r, c] and not ((r, c) == grid.door and not do)
    ]


def brute_force_distances(grid: Grid) -> dict[State, float]:
    """Value iteration with ``dynamics.step`` (no BFS): d(goal) = 0, d = 1 + min_a d(step)."""
    states = all_states(grid)
    dist = {s: (0.0 if is_success(grid, s) else math.inf) for s in states}
    changed = True
    while changed:
        changed = False
        for s in states:
            if is_success(grid, s):
                continue
            best = 1 + min(dist.get(step(grid, s, a), math.inf) for a in Action)
            if best < dist[s]:
                dist[s] = best
                changed = True
    return dist


def shortest_action_sequences(grid: Grid, limit: int) -> tuple[int, set[Action]]:
    """Exhaustive DFS over action sequences (skipping bumps): the shortest length found and the
    set of first actions of all sequences of that length."""
    best = math.inf
    firsts: set[Action] = set()

    def dfs(state: State, depth: int, first: Action | None) -> None:
        nonlocal best, firsts
        if is_success(grid, state):
            if depth < best:
                best, firsts = depth, set()
            if depth == best:
                firsts.add(first)
            return
        if depth >= min(best, limit):
            return
        for a in Action:
            nxt = step(grid, state, a)
            if nxt != state:
                dfs(nxt, depth + 1, a if first is None else first)

    dfs(initial_state(grid), 0, None)
    return best, firsts


def test_moves_walls_and_success():
    grid = generate_grid(7, 0.0, np.random.default_rng(0))
    s = State((1, 1))
    assert step(grid, s, Action.UP) == s  # border wall
    assert step(grid, s, Action.LEFT) == s
    assert step(grid, s, Action.DOWN) == State((2, 1))
    assert step(grid, s, Action.RIGHT) == State((1, 2))
    assert is_success(grid, State(grid.goal))


def test_key_and_door_rules():
    grid = key_door_grid()
    start = initial_state(grid)
    assert start == State((2, 1), has_key=False, door_open=False)
    # a locked door blocks without the key
    at_door = State((2, 3), False, False)
    assert step(grid, at_door, Action.DOWN) == at_door
    # entering the key cell picks the key up
    assert step(grid, State((2, 4)), Action.RIGHT) == State((2, 5), True, False)
    # standing next to the door with the key opens it, then it can be crossed
    opened = step(grid, State((2, 4), True, False), Action.LEFT)
    assert opened == State((2, 3), True, True)
    assert step(grid, opened, Action.DOWN) == State((3, 3), True, True)
    # diagonal neighbours do not open it
    assert step(grid, State((1, 3), True, False), Action.RIGHT) == State((1, 4), True, False)
    # rules apply to the initial state too
    on_key = Grid(grid.walls, goal=grid.goal, start=grid.key, key=grid.key, door=grid.door)
    assert initial_state(on_key).has_key and on_key.initial_state.has_key
    assert settle(grid, State((2, 3), True, False)) == State((2, 3), True, True)


def test_rollout_stops_at_goal():
    grid = key_door_grid()
    states = rollout(
        grid, [Action.RIGHT] * 4 + [Action.LEFT, Action.LEFT] + [Action.DOWN] * 3 + [Action.UP]
    )
    assert states[-1].agent == grid.goal or len(states) == 11
    policy = solve(grid)
    path, actions = policy.optimal_trajectory()
    assert rollout(grid, actions + [Action.UP, Action.UP]) == path


def test_key_door_optimal_policy_goes_through_the_key():
    grid = key_door_grid()
    policy = solve(grid)
    # start -> key: 4 steps; back to (2,3): 2 steps (door opens); down to (5,2): 4 steps
    assert policy.shortest_path_length == 10
    assert policy.horizon == 15
    assert policy.optimal_actions(policy.start_state) == {Action.RIGHT}
    assert policy.distance(State((2, 3), True, True)) == 4
    assert math.isinf(policy.distance(State((0, 0))))
    states, _ = policy.optimal_trajectory()
    assert any(s.agent == grid.key for s in states)


@settings(max_examples=25, deadline=None)
@given(
    variant=st.sampled_from(
        [Variant.PLAIN, Variant.KEY_DOOR, Variant.KEY_NO_DOOR, Variant.TWO_PATH_KEY]
    ),
    size=st.sampled_from([5, 7]),
    density=st.sampled_from([0.0, 0.4, 0.7, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_distances_and_action_sets_equal_brute_force(variant, size, density, seed):
    grid = generate_variant(variant, size, density, np.random.default_rng(seed))
    policy = solve(grid)
    brute = brute_force_distances(grid)
    for state, d in brute.items():
        assert policy.distance(state) == d, state
        expected = (
            frozenset()
            if d in (0, math.inf)
            else frozenset(a for a in Action if brute.get(step(grid, state, a)) == d - 1)
        )
        assert policy.optimal_actions(state) == expected, state
        mask = policy.action_mask(state)
        assert mask.shape == (4,) and set(np.flatnonzero(mask)) == {int(a) for a in expected}
        if expected:
            pi = policy.policy(state)
            assert pi.sum() == pytest.approx(1.0)
            assert np.allclose(pi[mask], 1 / len(expected)) and (pi[~mask] == 0).all()


@settings(max_examples=15, deadline=None)
@given(
    variant=st.sampled_from([Variant.PLAIN, Variant.KEY_DOOR, Variant.TWO_PATH_KEY]),
    density=st.sampled_from([0.0, 0.5, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_start_actions_equal_exhaustive_path_enumeration(variant, density, seed):
    grid = generate_variant(variant, 5, density, np.random.default_rng(seed))
    policy = solve(grid)
    length, firsts = shortest_action_sequences(grid, limit=policy.shortest_path_length + 1)
    assert length == policy.shortest_path_length
    assert firsts == set(policy.optimal_actions(policy.start_state))


def test_policy_undefined_at_goal_and_unreachable():
    grid = generate_grid(7, 1.0, np.random.default_rng(1))
    policy = solve(grid)
    assert policy.optimal_actions(State(grid.goal)) == frozenset()
    with pytest.raises(ValueError, match="goal"):
        policy.policy(State(grid.goal))
    with pytest.raises(ValueError, match="outside"):
        policy.distance(State((7, 0)))


def test_distance_layer_and_horizon():
    grid = generate_grid(9, 0.6, np.random.default_rng(2))
    policy = solve(grid)
    dmap = policy.distances[0, 1]  # the start's layer: no key, and no door (so "open")
    assert dmap.shape == (9, 9)
    assert np.isinf(dmap[grid.walls]).all()
    assert dmap[grid.goal] == 0 and dmap[grid.start] == policy.shortest_path_length
    assert policy.horizon == math.ceil(1.5 * policy.shortest_path_length)
    assert [default_horizon(v) for v in (1, 2, 3, 10)] == [2, 3, 5, 15]
    with pytest.raises(ValueError):
        policy.distances[0, 0, 0, 0] = 3.0  # read-only


def test_unsolvable_grid():
    walls = np.ones((5, 5), dtype=bool)
    walls[1, 1] = walls[3, 3] = False
    policy = solve(Grid(walls, goal=(3, 3), start=(1, 1)))
    assert not policy.is_solvable
    with pytest.raises(UnsolvableGridError):
        _ = policy.shortest_path_length


def test_random_tie_breaking_stays_optimal():
    grid = generate_grid(11, 0.0, np.random.default_rng(3))
    policy = solve(grid)
    rng = np.random.default_rng(0)
    for _ in range(5):
        states, actions = policy.optimal_trajectory(rng)
        assert len(actions) == policy.shortest_path_length
        assert is_success(grid, states[-1])


@pytest.mark.parametrize(
    ("key", "door", "message"),
    [
        ((5, 2), None, "key and goal"),
        ((2, 5), (2, 1), "door"),
        ((2, 5), (5, 2), "door"),
        ((2, 5), (2, 5), "door"),
    ],
)
def test_grid_rejects_overlapping_objects(key, door, message):
    grid = key_door_grid()
    with pytest.raises(ValueError, match=message):
        Grid(grid.walls, goal=grid.goal, start=grid.start, key=key, door=door)
