"""Subjective MEG per step: on the step's own decoded map, from the state the agent is in (no I/O).

For every decoded step of a grid without key or door (others: ``n_other_states``), the step's
*believed grid* (:func:`goalprobe.probes.scoring.meg_table.decoded_grid`) is started at the
agent's cell ``a_t`` and known-utility MEG (goal utility) of the empirical policy is computed
there over ``H = ceil(1.5 L)``; the same on the true grid from ``a_t`` is the paired true value.
A step whose believed goal is unreachable is counted (``n_unreachable``) and left out, not scored
0. Each ``(grid, cell)`` is solved once; aggregates weight grids as the study's Figure 4."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
from goalprobe.gridworld.core import Grid
from goalprobe.gridworld.mdp import build_mdp
from goalprobe.gridworld.optimal import solve
from goalprobe.probes.scoring.belief_table import StepTable
from goalprobe.probes.scoring.config import ScoreConfig
from goalprobe.probes.scoring.grid_meg import empirical_policy, grid_utility
from goalprobe.probes.scoring.grouped import ratio_stats, seeded_rng, trajectory_weights
from goalprobe.probes.scoring.meg_table import _known_meg, _MEGJob, decoded_grid

STEP_MEG_METRICS = ("subjective", "true", "difference")
"""The per-step MEG values (nats): on the believed grid, on the true grid, and their difference."""


def _from(grid: Grid, cell: tuple[int, int], grid_id: str) -> Grid | None:
    """``grid`` started at ``cell`` (None when the goal is unreachable from it)."""
    moved = dataclasses.replace(grid, start=cell, grid_id=grid_id)
    return moved if solve(moved).is_solvable else None


def step_meg(
    grids: Mapping[str, Grid],
    steps: StepTable,
    rows: list[tuple[int, np.ndarray, np.ndarray | None, np.ndarray | None]],
    classes: list[int],
    config: ScoreConfig,
) -> dict:
    """Per-step subjective and true MEG of one source's decoded ``rows`` (step index, probs, agent
    and goal read-outs): counts and ``overall`` (:func:`ratio_stats` STATs, nats)."""
    state_of: dict[tuple[str, tuple[int, int]], int] = {}
    jobs: list[_MEGJob] = []
    true_jobs: list[_MEGJob] = []
    step_state: list[tuple[int, int]] = []
    unreachable = other = 0
    for j, probs, _, goal in rows:
        gid = steps.grid_id[j]
        grid = grids[gid]
        traj = steps.trajectories[gid]
        cell = (int(steps.agent[j][0]), int(steps.agent[j][1]))
        if grid.key is not None or grid.door is not None or cell == grid.goal:
            other += 1
            continue
        key = (gid, cell)
        if key not in state_of:
            believed = decoded_grid(
                probs, _from_any(grid, cell), classes, goal_readout=goal, grid_id=f"{gid}~{cell}"
            ).grid
            start_b = _from(believed, cell, believed.grid_id)
            start_t = _from(grid, cell, f"{gid}@{cell}")
            if start_b is None or start_t is None:
                state_of[key] = -1
            else:
                state_of[key] = len(jobs)
                for target, g in ((jobs, start_b), (true_jobs, start_t)):
                    mdp = build_mdp(g)
                    policy = empirical_policy(mdp, traj, strict=False).policy
                    target.append(_MEGJob(mdp, policy, grid_utility(mdp, "goal")))
        if state_of[key] < 0:
            unreachable += 1
            continue
        step_state.append((j, state_of[key]))
    what = (
        "how goal-directed the agent's behaviour from its current cell looks towards the goal "
        "it appears to believe at that step, in the world it appears to believe (the step's "
        "decoded map), against the same from the same cell in the true world"
    )
    out = {
        "what": what,
        "n_steps": len(step_state),
        "n_states": len(jobs),
        "n_unreachable": unreachable,
        "n_other_states": other,
    }
    if not step_state:
        out["overall"] = None
        return out
    subj = _known_meg(jobs, config.meg_batch_size)
    true = _known_meg(true_jobs, config.meg_batch_size)
    idx = np.asarray([j for j, _ in step_state])
    s_val = np.asarray([subj[k].meg for _, k in step_state], dtype=np.float64)
    t_val = np.asarray([true[k].meg for _, k in step_state], dtype=np.float64)
    num = np.stack([s_val, t_val, s_val - t_val], axis=1)
    den = np.ones_like(num)
    grid_ids = np.asarray([steps.grid_id[j] for j in idx], dtype=object)
    out["overall"] = ratio_stats(
        num,
        den,
        grid_ids,
        STEP_MEG_METRICS,
        n_bootstrap=config.n_bootstrap,
        confidence_level=config.confidence_level,
        rng=seeded_rng(config.random_state, "step_meg"),
        weights=trajectory_weights(den, grid_ids, steps.episodes(idx))
        if config.weighting == "grid"
        else None,
    )
    return out


def _from_any(grid: Grid, cell: tuple[int, int]) -> Grid:
    """``grid`` with its start at ``cell`` (whether or not the goal is reachable)."""
    return dataclasses.replace(grid, start=cell)
