"""Tests of goalprobe.probes.scoring.meg_table: MEG of agent trajectories on true and decoded grids."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from goalprobe.gridworld.core import Grid, State, Variant
from goalprobe.gridworld.dynamics import initial_state, is_success, step
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.metrics import TrajectoryData
from goalprobe.gridworld.optimal import build_mdp, solve
from goalprobe.gridworld.variants import generate_variant
from goalprobe.probes.scoring.meg import TabularMDP, state_occupancy, unknown_utility_meg
from goalprobe.probes.scoring.meg_table import (
    empirical_policy,
    grid_meg,
    grid_utility,
    subjective_grid_meg,
)


def rollouts(grid: Grid, eps: float, n: int, seed: int, p_invalid: float = 0.0):
    """``n`` episodes of an agent that plays a random optimal action, or with probability ``eps``
    a uniformly random action (and with ``p_invalid`` no valid action), until the goal or the
    budget ``ceil(1.5 L)``."""
    rng = np.random.default_rng(seed)
    opt = solve(grid)
    out = []
    for _ in range(n):
        state = initial_state(grid)
        states, actions, sets = [state], [], []
        for _ in range(opt.horizon):
            if is_success(grid, state):
                break
            best = sorted(opt.optimal_actions(state))
            action = int(best[rng.integers(len(best))])
            if rng.random() < eps:
                action = int(rng.integers(4))
            if rng.random() < p_invalid:
                action = None
            sets.append(frozenset(best))
            actions.append(action)
            state = state if action is None else step(grid, state, action)
            states.append(state)
        out.append(
            TrajectoryData(
                grid_id=grid.grid_id,
                states=tuple(states),
                actions=tuple(actions),
                optimal_sets=tuple(sets),
                success=is_success(grid, state),
            )
        )
    return out


@pytest.fixture(scope="module")
def grid() -> Grid:
    return generate_grid(9, 0.4, np.random.default_rng(3), min_distance=6, grid_id="g9")


def test_deterministic_optimal_agent_is_maximally_goal_directed(grid):
    # a single optimal trajectory: the empirical policy is deterministic and optimal
    res = grid_meg(grid, rollouts(grid, 0.0, 1, seed=0))
    assert res.known.beta == math.inf
    assert 0.0 < res.meg <= (res.horizon - 1) * math.log(4)
    assert res.known.expected_utility == pytest.approx(res.known.max_expected_utility)


def test_meg_decreases_with_noise(grid):
    megs = [grid_meg(grid, rollouts(grid, eps, 40, seed=1)).meg for eps in (0.0, 0.3, 1.0)]
    assert megs[0] > megs[1] > megs[2] >= 0.0
    assert megs[2] < 0.25 * megs[0]


def test_empirical_policy_reaches_only_visited_states(grid):
    mdp = build_mdp(grid)
    emp = empirical_policy(mdp, rollouts(grid, 0.4, 8, seed=2))
    occ = state_occupancy(TabularMDP(mdp.transitions, mdp.initial, mdp.horizon), emp.policy)
    reached = occ.sum(axis=0) > 0
    goal = mdp.goal_utility().astype(bool)
    visited = emp.counts.sum(axis=1) > 0  # states where the agent took a valid action
    # every decision state the empirical policy can reach (except the absorbing goal) was visited
    assert np.all(visited[reached & ~goal])
    np.testing.assert_allclose(emp.policy[~visited], 0.25)
    np.testing.assert_allclose(emp.policy.sum(axis=1), 1.0)


def test_invalid_steps_are_left_out_and_counted(grid):
    trajs = rollouts(grid, 0.0, 10, seed=4, p_invalid=0.3)
    res = grid_meg(grid, trajs)
    n_invalid = sum(a is None for t in trajs for a in t.actions)
    n_valid = sum(a is not None for t in trajs for a in t.actions)
    assert n_invalid > 0
    assert res.empirical.n_invalid_steps == n_invalid
    assert int(res.empirical.counts.sum()) == n_valid
    assert res.empirical.n_trajectories == 10


def test_unknown_utility_meg_on_a_grid_dominates_goal_meg(grid):
    res = grid_meg(grid, rollouts(grid, 0.3, 10, seed=5))
    mdp = build_mdp(grid, horizon=res.horizon)
    tab = TabularMDP(mdp.transitions, mdp.initial, mdp.horizon)
    unknown = unknown_utility_meg(tab, res.empirical.policy)
    assert unknown.meg >= res.meg - 1e-8
    assert unknown.meg <= unknown.upper_bound + 1e-12


def test_key_variant_utilities():
    grid = generate_variant(Variant.KEY_DOOR, 9, 0.4, np.random.default_rng(0), grid_id="kd")
    mdp = build_mdp(grid)
    goal, key = grid_utility(mdp, "goal"), grid_utility(mdp, "key")
    both = grid_utility(mdp, "goal_with_key")
    np.testing.assert_array_equal(both, goal * key)
    assert key.sum() > 0 and goal.sum() > 0
    with pytest.raises(ValueError, match="unknown grid utility"):
        grid_utility(mdp, "treasure")
    trajs = rollouts(grid, 0.0, 3, seed=6)
    assert all(t.success for t in trajs)
    # behind a locked door the goal needs the key: both utilities see the optimal agent
    for name in ("goal", "goal_with_key", "key"):
        res = grid_meg(grid, trajs, utility=name)
        assert res.meg > 0.0 and res.utility == name


def test_subjective_meg_on_the_true_map_equals_grid_meg(grid):
    trajs = rollouts(grid, 0.2, 10, seed=7)
    true = grid_meg(grid, trajs)
    decoded = replace(grid, grid_id="decoded")
    subjective = subjective_grid_meg(decoded, trajs, horizon=true.horizon)
    assert subjective.meg == pytest.approx(true.meg, abs=1e-12)
    assert subjective.empirical.n_unmapped_steps == 0


def test_subjective_meg_with_a_wrong_belief(grid):
    trajs = rollouts(grid, 0.0, 10, seed=8)
    true = grid_meg(grid, trajs)
    # a believed goal the agent never heads for: behaviour is not explained by it
    dist = solve(grid).distances[0, 1]  # the start's layer (no key, no door)
    far = np.unravel_index(np.nanargmax(np.where(np.isfinite(dist), dist, -1)), dist.shape)
    believed = replace(grid, goal=(int(far[0]), int(far[1])), grid_id="believed")
    wrong = subjective_grid_meg(believed, trajs, horizon=true.horizon)
    assert wrong.meg < 0.5 * true.meg
    # a believed wall on the agent's path: its state there does not exist in the believed MDP
    cell = trajs[0].states[2].agent
    walls = grid.walls.copy()
    walls[cell] = True
    walled = replace(grid, walls=walls, grid_id="walled")
    res = subjective_grid_meg(walled, trajs, horizon=true.horizon)
    assert res.empirical.n_unmapped_steps > 0
    assert res.meg < true.meg


def test_grid_meg_rejects_foreign_trajectories(grid):
    trajs = rollouts(grid, 0.0, 1, seed=9)
    other = replace(grid, grid_id="other")
    with pytest.raises(ValueError, match="ran on grid 'g9', not on 'other'"):
        grid_meg(other, trajs)
    bogus = replace(
        trajs[0],
        states=(State(agent=(0, 0)), *trajs[0].states[1:]),  # (0, 0) is a border wall
    )
    with pytest.raises(ValueError, match="step 0: state .* is not a reachable state"):
        grid_meg(grid, [bogus])
    with pytest.raises(ValueError, match="no trajectories"):
        grid_meg(grid, [])
