"""Tabular MDP view: stochastic rows, absorbing goals, consistency with the dynamics."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.core import Action, State, Variant
from goalprobe.gridworld.dynamics import step
from goalprobe.gridworld.optimal import GridMDP, build_mdp, solve
from goalprobe.gridworld.variants import generate_variant
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=20, deadline=None)
@given(
    variant=st.sampled_from([Variant.PLAIN, Variant.KEY_DOOR, Variant.TWO_PATH_KEY]),
    size=st.sampled_from([5, 7, 9]),
    density=st.sampled_from([0.0, 0.5, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_mdp_matches_dynamics(variant, size, density, seed):
    grid = generate_variant(variant, size, density, np.random.default_rng(seed))
    mdp = build_mdp(grid)
    policy = solve(grid)
    S = mdp.n_states
    assert mdp.transitions.shape == (S, 4, S) and mdp.initial.shape == (S,)
    assert np.allclose(mdp.transitions.sum(-1), 1.0)
    assert mdp.initial[mdp.index(policy.start_state)] == 1.0
    assert mdp.horizon == policy.horizon
    goal = mdp.goal_utility()
    assert goal.sum() >= 1 and set(np.unique(goal)) <= {0.0, 1.0}
    for i, state in enumerate(mdp.states):
        assert mdp.index(state) == i
        for action in Action:
            if state.agent == grid.goal:
                assert mdp.transitions[i, action, i] == 1.0
            else:
                assert mdp.transitions[i, action, mdp.index(step(grid, state, action))] == 1.0
    # backward induction on the goal utility recovers L: first step at which reaching is certain
    pi = mdp.optimal_policy_matrix(policy)
    assert np.allclose(pi.sum(1), 1.0)
    occupancy = mdp.initial.copy()
    reach = []
    for _ in range(policy.horizon):
        occupancy = np.einsum("s,sa,sat->t", occupancy, pi, mdp.transitions)
        reach.append(float(occupancy @ goal))
    assert reach.index(1.0) + 1 == policy.shortest_path_length


def test_key_utility_and_errors():
    grid = generate_variant(Variant.KEY_DOOR, 7, 1.0, np.random.default_rng(0))
    mdp = build_mdp(grid, horizon=30)
    assert mdp.horizon == 30
    assert mdp.key_utility().sum() > 0
    assert mdp.goal_utility().sum() > 0
    with pytest.raises(ValueError, match="reachable"):
        mdp.index(State((0, 0)))
    with pytest.raises(ValueError, match="horizon"):
        build_mdp(grid, horizon=0)
    with pytest.raises(ValueError, match="sum to 1"):
        GridMDP(grid, mdp.states, mdp.transitions * 0, mdp.initial, 5)
    with pytest.raises(ValueError):
        mdp.transitions[0, 0, 0] = 0.5
