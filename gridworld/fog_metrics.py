"""Behaviour under fog: each episode against the reference policies, the study's failure modes,
and the agent's moves scored against what it could know. No torch.

A POMDP has no cheap exact optimum here, so an episode is read against three references on the
same fogged grid (:func:`reference_rows`): the omniscient optimal policy on the true grid (the
shortest path ``L``, a lower bound no fogged agent reaches in general), the free-space planner
(:func:`goalprobe.gridworld.fog.free_space_episode`: shortest paths on the revealed map with
hidden cells open, replanned each step), and a uniformly random walk.

Per episode (:func:`episode_row`): success, moves, the failure modes of the study's A.1
(revisits, moves into known walls, moves into known dead ends), and two accuracies on the moves
taken: ``fog_hits`` (a free-space optimal move on the knowledge of that step: Acc. Oracle under
fog, the knowledge being the revealed map, known exactly) and ``gt_hits`` (an optimal move on
the true grid: Acc. GT). :func:`fog_summary` pools rows per policy with grid-bootstrap
intervals (grids resampled, never steps) and reads the agent against the random walk, paired by
grid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from goalprobe.gridworld.core import Action, Grid
from goalprobe.gridworld.dynamics import step
from goalprobe.gridworld.fog import (
    DEFAULT_RADIUS,
    FogEpisode,
    failure_modes,
    fog_accuracy,
    fog_episode,
    fog_radius,
    free_space_episode,
)
from goalprobe.gridworld.optimal import solve

from goalprobe.stats import GridBootstrap, detectable_effect

AGENT = "agent"
FREE_SPACE = "free_space"
RANDOM_WALK = "random_walk"
POLICIES: tuple[str, ...] = (AGENT, FREE_SPACE, RANDOM_WALK)
"""The policies a fog summary compares, the agent first."""


@dataclass(frozen=True)
class FogRow:
    """One fogged episode of one policy.

    Attributes:
        grid_id: the fogged grid.
        policy: ``agent``, ``free_space`` or ``random_walk``.
        success: whether the episode reached the goal.
        moves: moves taken (valid actions; an invalid answer moves nothing and is not counted).
        shortest: the omniscient shortest path ``L`` from the start.
        revisits, into_known_walls, into_known_dead_ends: the failure modes
            (:class:`goalprobe.gridworld.fog.FailureModes`).
        fog_hits: moves that are free-space optimal on the knowledge of their step.
        gt_hits: moves that are optimal on the true grid.
    """

    grid_id: str
    policy: str
    success: bool
    moves: int
    shortest: int
    revisits: int
    into_known_walls: int
    into_known_dead_ends: int
    fog_hits: int
    gt_hits: int

    def to_dict(self) -> dict:
        return asdict(self)


_MODES = ("revisits", "into_known_walls", "into_known_dead_ends")
"""The failure modes of :class:`~goalprobe.gridworld.fog.FailureModes` a row counts."""


def episode_row(grid: Grid, actions: Sequence[Action | int], policy: str) -> FogRow:
    """Score one episode of ``policy`` on ``grid`` (the actions it took, in order)."""
    return _row(fog_episode(grid, actions, fog_radius(grid)), policy)


def _row(episode: FogEpisode, policy: str) -> FogRow:
    grid = episode.grid
    optimal = solve(grid)
    modes = failure_modes(episode)
    fog_hits, moves = fog_accuracy(episode, goal_known=False)
    gt_hits = sum(
        action in optimal.optimal_actions(state)
        for state, action in zip(episode.states, episode.actions, strict=False)
    )
    return FogRow(
        grid_id=grid.grid_id,
        policy=policy,
        success=episode.states[-1].agent == grid.goal,
        moves=moves,
        shortest=int(optimal.shortest_path_length),
        **{mode: getattr(modes, mode) for mode in _MODES},
        fog_hits=fog_hits,
        gt_hits=int(gt_hits),
    )


def reference_rows(
    grid: Grid, horizon: int, rng: np.random.Generator, n_walks: int
) -> list[FogRow]:
    """The free-space planner's episode and ``n_walks`` random walks on ``grid``, each up to
    ``horizon`` moves or the goal (the random walk draws its moves at once)."""
    radius = fog_radius(grid) if "fog_radius" in grid.extra else DEFAULT_RADIUS
    rows = [_row(free_space_episode(grid, horizon, radius=radius, goal_known=False), FREE_SPACE)]
    for _ in range(n_walks):
        state, taken = grid.initial_state, []
        for move in rng.integers(0, 4, size=horizon).tolist():
            if state.agent == grid.goal:
                break
            taken.append(move)
            state = step(grid, state, move)
        rows.append(_row(fog_episode(grid, taken, radius), RANDOM_WALK))
    return rows


def _rate(boot: GridBootstrap, num: np.ndarray, den: np.ndarray, *, rate: bool) -> dict:
    """A ratio of per-grid sums: a rate of counts gets the cluster-adjusted Clopper-Pearson
    interval (honest at 0% and 100%), a mean per episode the grid-bootstrap percentile one."""
    value = float(num.sum() / den.sum()) if den.sum() else None
    if rate and den.sum():
        bounds = {k: boot.rate_summary(num, den)[k] for k in ("ci_low", "ci_high")}
        return {"value": value, **bounds, "n": int(den.sum())}
    return {**boot.summary(boot.ratio(num, den)), "value": value, "n": int(den.sum())}


def fog_summary(rows: Sequence[FogRow], *, n_resamples: int = 1000, random_state: int = 0) -> dict:
    """Per policy: success rate, moves per successful episode over ``L``, failure modes per
    episode, Acc. Oracle under fog and Acc. GT (pooled over moves), each with a 95%
    grid-bootstrap interval; and the agent's Acc. Oracle minus the random walk's, paired by
    grid (same resamples), with its verdict."""
    grid_ids = sorted({r.grid_id for r in rows})
    boot = GridBootstrap.from_grid_ids(grid_ids, n_resamples=n_resamples, random_state=random_state)
    code = {g: i for i, g in enumerate(grid_ids)}
    out: dict[str, dict] = {}
    per_policy: dict[str, Mapping[str, np.ndarray]] = {}
    for policy in POLICIES:
        mine = [r for r in rows if r.policy == policy]
        if not mine:
            continue
        counted = ("success", "moves", "fog_hits", "gt_hits", *_MODES)
        keys = ("episodes", *counted, "success_moves", "success_shortest")
        sums = {key: np.zeros(len(grid_ids)) for key in keys}
        for r in mine:
            i = code[r.grid_id]
            sums["episodes"][i] += 1
            for key in counted:
                sums[key][i] += getattr(r, key)
            if r.success:
                sums["success_moves"][i] += r.moves
                sums["success_shortest"][i] += r.shortest
        per_policy[policy] = sums
        out[policy] = {
            "episodes": len(mine),
            "success": _rate(boot, sums["success"], sums["episodes"], rate=True),
            "acc_oracle_fog": _rate(boot, sums["fog_hits"], sums["moves"], rate=True),
            "acc_gt": _rate(boot, sums["gt_hits"], sums["moves"], rate=True),
            "moves_over_shortest": _rate(
                boot, sums["success_moves"], sums["success_shortest"], rate=False
            ),
            **{
                f"{mode}_per_episode": _rate(boot, sums[mode], sums["episodes"], rate=False)
                for mode in _MODES
            },
        }
    if AGENT in per_policy and RANDOM_WALK in per_policy:
        a, w = per_policy[AGENT], per_policy[RANDOM_WALK]
        diff = boot.ratio(a["fog_hits"], a["moves"]) - boot.ratio(w["fog_hits"], w["moves"])
        summary = boot.summary(diff)
        lo, hi = summary["ci_low"], summary["ci_high"]
        # a zero-width interval detects any difference: 0.0 (where the stats' function says None)
        mde = 0.0 if lo is not None and lo == hi else detectable_effect(lo, hi)
        out["agent_minus_random_walk_acc_oracle_fog"] = {
            **summary,
            "verdict": "yes" if lo is not None and lo > 0 else "undecided",
            "detectable_effect": mde,
        }
    return out


def fog_readings(
    rows: Sequence[FogRow],
    cut_rows: Sequence[FogRow],
    *,
    n_resamples: int = 1000,
    random_state: int = 0,
) -> dict:
    """:func:`fog_summary` of ``rows`` (the agent's finished episodes and the references), its
    agent-minus-random-walk difference with ``truncated_episodes`` and ``with_truncated``: the
    same difference with ``cut_rows`` (the agent's episodes the token limit cut off, scored on
    the moves made before the cut, no success) counted in, so both readings are reported."""
    table = fog_summary(rows, n_resamples=n_resamples, random_state=random_state)
    key = "agent_minus_random_walk_acc_oracle_fog"
    if key in table:
        diff = table[key]
        with_cut = (
            fog_summary([*rows, *cut_rows], n_resamples=n_resamples, random_state=random_state)[key]
            if cut_rows
            else dict(diff)
        )
        diff["truncated_episodes"] = len(cut_rows)
        diff["with_truncated"] = with_cut
    return table
