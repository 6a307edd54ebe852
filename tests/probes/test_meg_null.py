"""MEG's null can fail: a random walk estimated like the demo is not above it; an optimal
agent is."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.optimal import GridMDP, build_mdp
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.probes.scoring.meg import TabularMDP, known_utility_meg
from goalprobe.probes.scoring.meg_table import (
    _meg_group,
    grid_meg,
    grid_utility,
    null_rng,
    random_walk_policy,
)

from tests.probes.test_grid_meg import rollouts


def random_walk_meg(
    mdp: GridMDP,
    utility: np.ndarray,
    n_trajectories: int,
    *,
    random_state: int = 0,
    replicates: int = 4,
) -> float:
    """One grid's null: the mean known-utility MEG (nats) of ``replicates`` random-walk
    empirical policies of ``n_trajectories`` walks of ``mdp.horizon`` moves (unbatched; the
    scoring table batches the same computation)."""
    tab = TabularMDP(mdp.transitions, mdp.initial, mdp.horizon)
    gid = mdp.grid.grid_id or ""
    return float(
        np.mean(
            [
                known_utility_meg(
                    tab,
                    random_walk_policy(
                        mdp, n_trajectories, mdp.horizon, null_rng(random_state, gid, rep)
                    ),
                    utility,
                ).meg
                for rep in range(replicates)
            ]
        )
    )


@pytest.fixture(scope="module")
def grids():
    rng = np.random.default_rng(11)
    return [
        generate_grid(size, 0.3, rng, min_distance=4, grid_id=f"g{i}")
        for i, size in enumerate([5, 7, 9] * 6)
    ]


def _records(grids, eps: float, seed: int, n_traj: int = 2) -> list[dict]:
    out = []
    for i, grid in enumerate(grids):
        res = grid_meg(grid, rollouts(grid, eps, n_traj, seed=seed * 1000 + i))
        mdp = build_mdp(grid)
        null = random_walk_meg(mdp, grid_utility(mdp, "goal"), n_traj, random_state=seed)
        out.append(
            {
                "true": {"meg": res.meg, "meg_per_decision": res.meg / res.horizon},
                "random_walk": {"meg": null, "meg_per_decision": null / mdp.horizon},
                "subjective": None,
            }
        )
    return out


def _verdict(records, seed: int = 0):
    group = _meg_group(records, np.arange(len(records)), ScoreConfig(n_bootstrap=500), str(seed))
    return group["vs_random_walk"]


def test_random_walk_policy_counts_only_moves_before_the_goal(grids):
    mdp = build_mdp(grids[0])
    policy = random_walk_policy(mdp, 3, mdp.horizon, np.random.default_rng(0))
    assert policy.shape == (mdp.n_states, 4)
    assert np.allclose(policy.sum(axis=1), 1.0)
    assert not np.allclose(policy, 0.25)  # 3 walks: far from uniform, which is why MEG > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_random_walk_is_not_above_its_null(grids, seed):
    records = _records(grids, eps=1.0, seed=seed)
    # the old verdict "MEG above 0" passes for a random walk estimated from 2 trajectories
    assert sum(r["true"]["meg"] > 0 for r in records) >= 0.9 * len(records)
    block = _verdict(records, seed)
    assert block["n_grids"] == len(grids)
    assert block["above_null"] is False
    assert block["difference"]["meg"]["ci_low"] < 0 < block["difference"]["meg"]["ci_high"]


def test_an_optimal_agent_is_above_the_null(grids):
    block = _verdict(_records(grids, eps=0.0, seed=5))
    assert block["above_null"] is True
    assert block["agent"]["meg"]["value"] > block["random_walk"]["meg"]["value"]


def test_no_null_without_replicates():
    group = _meg_group(
        [{"true": {"meg": 1.0, "meg_per_decision": 0.1}, "subjective": None}],
        np.arange(1),
        ScoreConfig(),
        "x",
    )
    assert group["vs_random_walk"] is None
