"""Baselines a plan read-out must beat, and the verdict against the strongest.

A decoder that "reads the first move" from the anchors may read the *state* (agent and goal
cells), not a plan: heading for the goal already predicts much of an optimal agent's moves.
So beside the study's ``0.25 ** N`` line, the majority plan and the shuffled control, every N
gets :class:`StatePlanDecoder` (a one-shot decoder from the agent's and goal's coordinates and
the grid's size) and :func:`optimal_plans` (the optimal policy's plan, no training);
:func:`prefix_verdicts` compares the decoder with the strongest of them, paired on the same
rows (:func:`goalprobe.stats.grid_bootstrap_ratio`). :func:`departure_mask` marks the rows
whose first step departs from the optimal policy or breaks a tie: the only rows where a plan
read-out can beat every state-only predictor. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from goalprobe.gridworld.core import CellType, Grid, State
from goalprobe.gridworld.optimal import solve
from goalprobe.probes.plan_metrics import canonical_plans, encode_plans
from sklearn.ensemble import RandomForestClassifier

from goalprobe.stats import grid_bootstrap_ratio, interval_verdict

CHANCE = "chance 0.25^N"
"""Name of the ``0.25 ** N`` line among the baselines of :func:`prefix_verdicts`."""


def state_features(agent_row_col: np.ndarray, goal_row_col: np.ndarray, sizes) -> np.ndarray:
    """``(N, 7)`` float: agent row and column, goal row and column, their differences (goal
    minus agent) and the grid's side."""
    agent = np.asarray(agent_row_col, dtype=np.float64).reshape(-1, 2)
    goal = np.asarray(goal_row_col, dtype=np.float64).reshape(-1, 2)
    size = np.asarray(sizes, dtype=np.float64).reshape(-1, 1)
    if not len(agent) == len(goal) == len(size):
        raise ValueError("agent_row_col, goal_row_col and sizes must have one row per example")
    return np.concatenate([agent, goal, goal - agent, size], axis=1)


class StatePlanDecoder:
    """A one-shot plan decoder from :func:`state_features`: a multi-output random forest
    (each step from the state alone), its settings fixed in advance."""

    def __init__(
        self, n_estimators: int = 200, min_samples_leaf: int = 2, random_state: int = 0
    ) -> None:
        self.forest = RandomForestClassifier(
            n_estimators=n_estimators,
            min_samples_leaf=min_samples_leaf,
            random_state=random_state,
            n_jobs=1,
        )

    def fit(self, features: np.ndarray, plans: np.ndarray) -> StatePlanDecoder:
        """Fit ``(N, 7)`` features to ``(N, T)`` plan tokens."""
        self.forest.fit(np.asarray(features), np.asarray(plans, dtype=np.int64))
        return self

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``(N, T)`` int8 canonical plans (tokens after a predicted END become PAD)."""
        raw = np.asarray(self.forest.predict(np.asarray(features))).astype(np.int64)
        raw = raw.reshape(len(features), -1)
        return canonical_plans(np.minimum(raw, 4))


def optimal_plans(
    cell_types: np.ndarray,
    agent_row_col: np.ndarray,
    goal_row_col: np.ndarray,
    sizes: np.ndarray,
    horizon: int,
) -> np.ndarray | None:
    """``(N, horizon)`` int8: the optimal policy's plan (lowest-index tie-break) on the true
    grid ``cell_types (N, C, C)`` from every row's state, or None when a row shows a key or a
    door, puts the agent or goal on a wall, or cannot reach its goal."""
    cells = np.asarray(cell_types)
    if np.isin(cells, (CellType.KEY, CellType.DOOR)).any():
        return None
    sequences: list[list[int]] = []
    cache: dict[bytes, Any] = {}
    for types, agent, goal, size in zip(cells, agent_row_col, goal_row_col, sizes, strict=True):
        n = int(size)
        walls = np.ascontiguousarray(types[:n, :n] == CellType.WALL)
        goal_cell = (int(goal[0]), int(goal[1]))
        agent_cell = (int(agent[0]), int(agent[1]))
        if walls[agent_cell] or walls[goal_cell]:
            return None  # the labels do not describe a state of a grid
        if agent_cell == goal_cell:
            sequences.append([])
            continue
        key = walls.tobytes() + bytes(goal_cell) + bytes([n])
        if key not in cache:  # distances do not depend on the start
            cache[key] = solve(Grid(walls=walls, goal=goal_cell, start=agent_cell))
        policy = cache[key]
        state = State(agent=agent_cell)
        if not np.isfinite(policy.distance(state)):
            return None
        _, actions = policy.optimal_trajectory(start=state)
        sequences.append([int(a) for a in actions[:horizon]])
    return encode_plans(sequences, horizon)


def departure_mask(
    plans: np.ndarray, optimal_actions: np.ndarray, action: np.ndarray, action_valid: np.ndarray
) -> np.ndarray:
    """``(N,)`` bool: the row's first plan step is its own valid action, and that action is
    not optimal or is one of several optimal actions (a departure or a tie)."""
    plans = np.asarray(plans)
    mask = np.asarray(optimal_actions, dtype=bool)
    act = np.asarray(action, dtype=np.int64)
    own = np.asarray(action_valid, dtype=bool) & (plans[:, 0] == act) & (act < mask.shape[1])
    chosen = mask[np.arange(len(act)), np.clip(act, 0, mask.shape[1] - 1)]
    return own & (~chosen | (mask.sum(axis=1) > 1))


def prefix_verdicts(
    hits: Mapping[str, np.ndarray],
    decoder: str,
    grid_ids: np.ndarray,
    *,
    rows: np.ndarray | None = None,
    horizons: range | None = None,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> list[dict]:
    """The decoder against the strongest baseline at every N, paired on the same rows.

    ``hits``: name -> ``(N_rows, T)`` bool prefix hits of the ``decoder`` and every baseline;
    ``rows``: an optional mask or indices judged (e.g. :func:`departure_mask`); ``horizons``:
    the N judged (default ``1..T``). Returns per N ``{n, n_rows, baselines (with
    :data:`CHANCE`), strongest, decoder, difference (paired), verdict}`` (and ``detectable``):
    :func:`goalprobe.stats.interval_verdict` on the difference (``no`` only below 0).
    """
    ids = np.asarray(grid_ids)
    select = np.arange(len(ids)) if rows is None else np.asarray(rows)
    if select.dtype == bool:
        select = np.flatnonzero(select)
    ids = ids[select]
    table = {name: np.asarray(h, dtype=bool)[select] for name, h in hits.items()}
    horizon = table[decoder].shape[1]
    boot: dict[str, Any] = dict(
        n_resamples=n_resamples, confidence=confidence, random_state=random_state
    )
    out = []
    for n in horizons or range(1, horizon + 1):
        if len(select) == 0:
            out.append({"n": n, "n_rows": 0, "verdict": "undecided"})
            continue
        column = {name: h[:, n - 1].astype(np.float64) for name, h in table.items()}
        baselines = {name: float(c.mean()) for name, c in column.items() if name != decoder}
        baselines[CHANCE] = 0.25**n
        strongest = max(baselines, key=lambda name: (baselines[name], name == CHANCE))
        rate = grid_bootstrap_ratio(column[decoder], None, ids, **boot)
        if strongest == CHANCE:
            diff = {
                k: None if rate[k] is None else rate[k] - baselines[CHANCE]
                for k in ("value", "ci_low", "ci_high")
            }
            diff.update(n=rate["n"], n_grids=rate["n_grids"])
        else:
            diff = grid_bootstrap_ratio(column[decoder] - column[strongest], None, ids, **boot)
        out.append(
            {
                "n": n,
                "n_rows": int(len(select)),
                "baselines": baselines,
                "strongest": strongest,
                "decoder": rate,
                "difference": diff,
                **interval_verdict(diff).to_dict(),
            }
        )
    return out
