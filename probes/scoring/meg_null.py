"""The null that MEG can fail: a random walk's MEG, estimated exactly like the agent's.

MEG is never negative and an empirical policy from few trajectories is never uniform, so "MEG
above 0" passes for anything. The null: per grid, as many uniformly random walks as the agent has
trajectories, with its step budget (stopping at the goal), read into an empirical policy and
scored with the same utility and horizon (``replicates`` averaged). The verdict is "above the
random walk's MEG" only when the paired (by grid) difference's interval excludes 0. No I/O."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np
from goalprobe.gridworld.core import N_ACTIONS
from goalprobe.gridworld.dynamics import is_success
from goalprobe.gridworld.mdp import GridMDP

from goalprobe.stats import Estimate

NULL_NAME = "random_walk"
"""The null's name in ``meg.json`` (per grid ``random_walk``, per group ``vs_random_walk``)."""

NULL_METHOD = (
    "random walk's MEG estimated like the agent's: per grid, as many uniform random walks as "
    "the agent's trajectories, each of the agent's step budget (stopping at the goal), read "
    "into an empirical policy and scored with the same utility and horizon; mean of "
    "{replicates} replicate(s); verdict on the paired (by grid) difference agent minus null"
)
"""How the null is made (``meg.json``'s ``method.null``; format with ``replicates``)."""


def random_walk_policy(
    mdp: GridMDP, n_trajectories: int, n_steps: int, rng: np.random.Generator
) -> np.ndarray:
    """``(S, 4)`` empirical policy of ``n_trajectories`` uniform random walks of at most
    ``n_steps`` moves from the start (stopping on success), uniform at unvisited states."""
    if n_trajectories < 1 or n_steps < 1:
        raise ValueError(f"need n_trajectories, n_steps >= 1, got {n_trajectories}, {n_steps}")
    successor = mdp.transitions.argmax(axis=2)  # deterministic grid dynamics
    success = np.array([is_success(mdp.grid, s) for s in mdp.states])
    counts = np.zeros((mdp.n_states, N_ACTIONS), dtype=np.int64)
    start = int(mdp.initial.argmax())
    for actions in rng.integers(0, N_ACTIONS, size=(n_trajectories, n_steps)):
        s = start
        for a in actions:
            if success[s]:
                break
            counts[s, a] += 1
            s = int(successor[s, a])
    totals = counts.sum(axis=1, keepdims=True)
    return np.where(totals > 0, counts / np.maximum(totals, 1), 1.0 / N_ACTIONS)


def null_rng(random_state: int, grid_id: str, replicate: int) -> np.random.Generator:
    """The generator of one grid's replicate (independent of grid order and of other grids)."""
    return np.random.default_rng([random_state, zlib.crc32(grid_id.encode()), replicate])


def paired_null_rows(records: Sequence[Mapping], values: Sequence[str]) -> np.ndarray:
    """``(G, 3 * len(values))``: agent, null and agent minus null of each of ``values`` on the
    records that have a null, for one shared-draws bootstrap."""
    rows = [r for r in records if r.get(NULL_NAME) is not None]
    agent = np.asarray([[r["true"][k] for k in values] for r in rows], dtype=np.float64)
    null = np.asarray([[r[NULL_NAME][k] for k in values] for r in rows], dtype=np.float64)
    if not rows:
        return np.zeros((0, 3 * len(values)))
    return np.concatenate([agent, null, agent - null], axis=1)


def above_null(difference: Mapping | None) -> bool | None:
    """Whether the paired difference's interval lies above 0 (None without an interval)."""
    return Estimate.from_dict(difference).above(0)
