"""Policy against decoded belief: is the agent's action optimal on the map it seems to believe?

Study section 5.2, Table 2, Figure 9, appendix E.4. A step's *decoded grid* is read from
``probs (15, 15, C)`` within the true size ``n``: walls are the cells whose argmax is ``WALL``
(and ``DOOR`` while the true door is locked and no key is held); agent and goal are the cells
(top-k for the top-k analysis) most probable under the map's read-out, the position probes'
distributions when the map carries them (``StepBelief.agent`` / ``.goal``), else ``P(AGENT)``
/ ``P(GOAL)``.

An action is optimal for a pair (a, g) when it moves to a neighbour of minimal finite decoded
distance to g; a move into a wall or off the grid is never optimal; a's own cell is never a
wall; a == g has no optimal action and is skipped. :func:`belief_weighted_scores` keeps the
whole distribution, ``b(a, g) ∝ P(AGENT | a) P(GOAL | g)``: the *expected optimality* and the
QMDP score ``Q̄(u) = Σ b(a, g) Q_{a,g}(u)``, ``Q_{a,g}(u) = -(1 + d_g(next(a, u)))``
(unreachable capped at ``n * n``), whether the action maximises ``Q̄`` and its regret.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from goalprobe.gridworld.core import N_ACTIONS, Action, CellType, RowCol
from goalprobe.gridworld.optimal import bfs_distances

TOP_K_DEFAULT = (1, 3, 5, 10)


@dataclass(frozen=True)
class StepBelief:
    """One step to score.

    Attributes:
        probs: ``(canvas, canvas, C)`` class probabilities by :class:`CellType` (C >= 4).
        size: the true grid size n (the decoded grid is ``probs[:n, :n]``).
        action: the agent's :class:`Action` value, or None for an invalid step.
        true_optimal: ``(4,)`` bool, the optimal actions on the true grid in this state.
        door_locked: a door exists and still blocks the agent.
        agent, goal: optional ``(canvas, canvas)`` position read-outs (None: ``P(AGENT)`` /
            ``P(GOAL)``)."""

    probs: np.ndarray
    size: int
    action: int | None
    true_optimal: np.ndarray
    door_locked: bool = False
    agent: np.ndarray | None = None
    goal: np.ndarray | None = None


def decoded_walls(probs: np.ndarray, size: int, *, door_locked: bool = False) -> np.ndarray:
    """``(n, n)`` bool walls of the decoded map (argmax WALL, plus DOOR while the door is locked)."""
    arg = np.asarray(probs)[:size, :size].argmax(axis=-1)
    walls = arg == CellType.WALL
    if door_locked:
        walls |= arg == CellType.DOOR
    return walls


def location(
    probs: np.ndarray, size: int, cell_type: CellType, readout: np.ndarray | None = None
) -> np.ndarray:
    """``(n, n)`` cell scores for the agent or goal: ``readout`` if given, else ``P(cell_type)``."""
    if readout is not None:
        return np.asarray(readout, dtype=np.float64)[:size, :size]
    return np.asarray(probs, dtype=np.float64)[:size, :size, int(cell_type)]


def top_cells(
    probs: np.ndarray,
    size: int,
    cell_type: CellType,
    k: int,
    readout: np.ndarray | None = None,
) -> list[RowCol]:
    """The ``k`` cells of the ``n x n`` grid scoring highest for ``cell_type``
    (:func:`location`)."""
    scores = location(probs, size, cell_type, readout).ravel()
    k = min(k, scores.size)
    order = np.argsort(-scores, kind="stable")[:k]
    return [(int(i // size), int(i % size)) for i in order]


class _GoalDistances:
    """Per-goal BFS results on one decoded wall map, computed once and shared by every score."""

    def __init__(self, walls: np.ndarray) -> None:
        self.walls = walls
        self._cache: dict[RowCol, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def get(self, goal: RowCol) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(walls with goal opened (n, n), dist (n, n), neighbour table (n, n, 4))``."""
        if goal not in self._cache:
            w = self.walls.copy()
            w[goal] = False
            dist = bfs_distances(w, goal)
            n = w.shape[0]
            padded = np.full((n + 2, n + 2), np.inf)
            padded[1:-1, 1:-1] = np.where(w, np.inf, dist)
            table = np.empty((n, n, N_ACTIONS))
            for action in Action:
                dr, dc = action.delta_row_col
                table[..., int(action)] = padded[1 + dr : n + 1 + dr, 1 + dc : n + 1 + dc]
            self._cache[goal] = (w, dist, table)
        return self._cache[goal]


def _masks_from_neighbours(nd: np.ndarray) -> np.ndarray:
    """``(..., 4)`` neighbour distances -> ``(..., 4)`` bool optimal masks (none if all inf)."""
    best = nd.min(axis=-1, keepdims=True)
    return (nd == best) & np.isfinite(best)


def optimal_mask_for_pair(walls: np.ndarray, agent: RowCol, goal: RowCol) -> np.ndarray:
    """``(4,)`` bool optimal actions for agent ``agent`` and goal ``goal`` on ``walls``."""
    if agent == goal:
        return np.zeros(N_ACTIONS, dtype=bool)
    _, _, table = _GoalDistances(walls).get(goal)
    return _masks_from_neighbours(table[agent])


def topk_optimal_mask(
    probs: np.ndarray,
    size: int,
    k: int,
    *,
    door_locked: bool = False,
    agent: np.ndarray | None = None,
    goal: np.ndarray | None = None,
    _goals: _GoalDistances | None = None,
) -> np.ndarray:
    """``(4,)`` bool: actions optimal for at least one top-k agent x top-k goal pair."""
    goals_bfs = _goals or _GoalDistances(decoded_walls(probs, size, door_locked=door_locked))
    agents = top_cells(probs, size, CellType.AGENT, k, agent)
    goals = top_cells(probs, size, CellType.GOAL, k, goal)
    rows, cols = np.array(agents).T
    mask = np.zeros(N_ACTIONS, dtype=bool)
    for cell in goals:
        _, _, table = goals_bfs.get(cell)
        keep = (rows != cell[0]) | (cols != cell[1])
        if keep.any():
            mask |= _masks_from_neighbours(table[rows[keep], cols[keep]]).any(axis=0)
    return mask


@dataclass(frozen=True)
class BeliefWeighted:
    """Belief-weighted scores of one step.

    Attributes:
        expected_optimality: ``E_b[1{action optimal for (a, g)}]`` in [0, 1].
        q_bar: ``(4,)`` QMDP expected action values (negative expected steps to the goal).
        qmdp_optimal: ``(4,)`` bool, the actions maximising ``q_bar`` (ties within 1e-9).
        action_is_qmdp_optimal: the agent's action is among them (False if invalid).
        qmdp_regret: ``max q_bar - q_bar[action]`` in steps (nan for an invalid action)."""

    expected_optimality: float
    q_bar: np.ndarray
    qmdp_optimal: np.ndarray
    action_is_qmdp_optimal: bool
    qmdp_regret: float


def belief_weighted_scores(
    probs: np.ndarray,
    size: int,
    action: int | None,
    *,
    door_locked: bool = False,
    mass: float = 0.99,
    max_cells: int = 25,
    agent: np.ndarray | None = None,
    goal: np.ndarray | None = None,
    _goals: _GoalDistances | None = None,
) -> BeliefWeighted:
    """Score ``action`` against the whole agent/goal distribution (module docstring), keeping the
    most probable cells until ``mass`` of each marginal is covered, at most ``max_cells`` each."""
    cap = float(size * size)
    readouts = {CellType.AGENT: agent, CellType.GOAL: goal}

    def support(cell_type: CellType) -> tuple[list[RowCol], np.ndarray]:
        w = location(probs, size, cell_type, readouts[cell_type]).ravel()
        total = w.sum()
        w = w / total if total > 0 else np.full_like(w, 1.0 / w.size)
        order = np.argsort(-w, kind="stable")
        keep = int(np.searchsorted(np.cumsum(w[order]), mass) + 1)
        keep = max(1, min(keep, max_cells, w.size))
        idx = order[:keep]
        cells = [(int(i // size), int(i % size)) for i in idx]
        return cells, w[idx]

    agents, pa = support(CellType.AGENT)
    goals, pg = support(CellType.GOAL)
    goals_bfs = _goals or _GoalDistances(decoded_walls(probs, size, door_locked=door_locked))
    rows, cols = np.array(agents).T
    q_bar = np.zeros(N_ACTIONS)
    exp_opt = 0.0
    z = 0.0
    for cell, wg in zip(goals, pg, strict=True):
        w, dist, table = goals_bfs.get(cell)
        keep = (rows != cell[0]) | (cols != cell[1])
        if not keep.any():
            continue
        r, c = rows[keep], cols[keep]
        weight = pa[keep] * wg  # (K,)
        nd = table[r, c]  # (K, 4)
        # a blocked move leaves the agent where it is
        with np.errstate(invalid="ignore"):
            own = np.where(w[r, c], 1.0 + nd.min(axis=1), dist[r, c])  # (K,)
        stay = np.where(np.isfinite(nd), nd, own[:, None])
        q_bar += weight @ -(1.0 + np.minimum(stay, cap))
        if action is not None:
            exp_opt += float(weight @ _masks_from_neighbours(nd)[:, int(action)])
        z += float(weight.sum())
    if z > 0:
        q_bar /= z
        exp_opt /= z
    qmdp_opt = q_bar >= q_bar.max() - 1e-9
    if action is None:
        return BeliefWeighted(0.0, q_bar, qmdp_opt, False, float("nan"))
    regret = float(q_bar.max() - q_bar[int(action)])
    return BeliefWeighted(exp_opt, q_bar, qmdp_opt, bool(qmdp_opt[int(action)]), regret)


@dataclass(frozen=True)
class StepScore:
    """Scores of one step (booleans are False for an invalid action).

    Attributes:
        opt_gt, opt_dec: the action is optimal on the true / top-1 decoded grid.
        opt_topk: k -> the action is optimal for some top-k candidate pair.
        belief: the belief-weighted scores.
        agreement: the study's Agreement (section 5.2): the optimal policies on the true and the
            top-1 decoded grid share an optimal action here (defined at invalid steps too).
        dec_optimal: ``(4,)`` bool, the optimal actions on the top-1 decoded grid."""

    opt_gt: bool
    opt_dec: bool
    opt_topk: dict[int, bool]
    belief: BeliefWeighted
    agreement: bool
    dec_optimal: np.ndarray


def score_step(
    step: StepBelief,
    top_k: Sequence[int] = TOP_K_DEFAULT,
    distances: dict[bytes, _GoalDistances] | None = None,
) -> StepScore:
    """Score one step against the true grid and its decoded map; ``distances`` is a caller's cache
    of BFS tables by decoded wall map (the scores do not depend on it)."""
    valid = step.action is not None
    a = int(step.action) if step.action is not None else 0
    opt_gt = valid and bool(np.asarray(step.true_optimal, dtype=bool)[a])
    walls = decoded_walls(step.probs, step.size, door_locked=step.door_locked)
    if distances is None:
        goals = _GoalDistances(walls)
    else:
        key = walls.shape[0].to_bytes(2, "little") + np.packbits(walls).tobytes()
        goals = distances.setdefault(key, _GoalDistances(walls))
    readout: dict[str, Any] = dict(
        door_locked=step.door_locked, agent=step.agent, goal=step.goal, _goals=goals
    )
    masks = {
        int(k): topk_optimal_mask(step.probs, step.size, int(k), **readout)
        for k in sorted(set(top_k) | {1})
    }
    topk = {k: valid and bool(m[a]) for k, m in masks.items()}
    belief = belief_weighted_scores(step.probs, step.size, step.action, **readout)
    agreement = bool((masks[1] & np.asarray(step.true_optimal, dtype=bool)).any())
    return StepScore(opt_gt, topk[1], topk, belief, agreement, masks[1])
