"""Key metrics of key-door grids (study, section 4.3, Table 1): accuracy per sub-task (to the
key, to the door, to the goal), key pickup rate and key attraction bias.

They work on :class:`~goalprobe.gridworld.metrics.TrajectoryData` whose states carry
``has_key`` and ``door_open`` (``core.State``), with the conventions of
:mod:`goalprobe.gridworld.metrics` (invalid steps are never optimal; a value over no data is
NaN). It imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from goalprobe.gridworld.core import RowCol
from goalprobe.gridworld.metrics import TrajectoryData, optimal_mask

# --------------------------------------------------------------------------------------------
# Key metrics (section 4.3, Table 1)
# --------------------------------------------------------------------------------------------


class Stage(StrEnum):
    """Sub-task of a key-door episode, determined by the state before the action."""

    TO_KEY = "to_key"
    """The door is closed and the agent has no key."""
    TO_DOOR = "to_door"
    """The agent has the key and the door is still closed."""
    TO_GOAL = "to_goal"
    """The door is open (always so in a grid without a door)."""


def stage_of(state: Hashable) -> Stage:
    """The stage of a state with ``has_key`` and ``door_open`` attributes (``core.State``).

    ``door_open`` wins: in a grid without a door every state is :attr:`Stage.TO_GOAL`, so
    KeyNoDoor grids have no key or door stage (Table 1: N/A).
    """
    has_key, door_open = _flag(state, "has_key"), _flag(state, "door_open")
    if door_open:
        return Stage.TO_GOAL
    return Stage.TO_DOOR if has_key else Stage.TO_KEY


def _flag(state: Hashable, name: str) -> bool:
    try:
        return bool(getattr(state, name))
    except AttributeError as err:
        raise ValueError(
            f"key metrics need states with a {name!r} attribute (core.State), got {state!r}"
        ) from err


@dataclass(frozen=True)
class StageAccuracy:
    """Accuracy per key-door stage.

    For one trajectory: the fraction of its steps in the stage whose action is optimal. For a
    set of trajectories: the mean of that over the trajectories with steps in the stage.
    A stage with no steps is NaN.

    Attributes:
        to_key, to_door, to_goal: accuracy in [0, 1] or NaN.
        n_to_key, n_to_door, n_to_goal: number of steps (one trajectory) or of contributing
            trajectories (a set of trajectories) behind each value.
    """

    to_key: float
    to_door: float
    to_goal: float
    n_to_key: int
    n_to_door: int
    n_to_goal: int

    def __getitem__(self, stage: Stage) -> float:
        """The accuracy of ``stage``."""
        return getattr(self, Stage(stage).value)


def trajectory_stage_accuracy(trajectory: TrajectoryData) -> StageAccuracy:
    """Accuracy of one trajectory within each stage (stage of ``s_t`` decides step ``t``)."""
    mask = optimal_mask(trajectory)
    stages = [stage_of(s) for s in trajectory.states[:-1]]
    values: dict[str, float] = {}
    counts: dict[str, int] = {}
    for stage in Stage:
        sel = np.array([st is stage for st in stages], dtype=bool)
        counts[f"n_{stage.value}"] = int(sel.sum())
        values[stage.value] = float(mask[sel].mean()) if sel.any() else math.nan
    return StageAccuracy(**values, **counts)  # type: ignore[arg-type]


def stage_accuracy(trajectories: Iterable[TrajectoryData]) -> StageAccuracy:
    """Mean per-trajectory stage accuracy over the trajectories that reach each stage."""
    per_traj = [trajectory_stage_accuracy(t) for t in trajectories]
    values: dict[str, float] = {}
    counts: dict[str, int] = {}
    for stage in Stage:
        accs = [a[stage] for a in per_traj if not math.isnan(a[stage])]
        counts[f"n_{stage.value}"] = len(accs)
        values[stage.value] = float(np.mean(accs)) if accs else math.nan
    return StageAccuracy(**values, **counts)  # type: ignore[arg-type]


def key_pickup_rate(trajectories: Iterable[TrajectoryData]) -> float:
    """Fraction of trajectories in which the agent holds the key in some state; NaN when none."""
    flags = [any(_flag(s, "has_key") for s in t.states) for t in trajectories]
    return float(np.mean(flags)) if flags else math.nan


@dataclass(frozen=True)
class KeyAttraction:
    """Key attraction bias (Table 1): share of non-optimal moves that go towards the key.

    Attributes:
        n_non_optimal: non-optimal valid actions taken while the agent did not hold the key.
        n_towards: those of them after which the key distance strictly decreased.
        bias: ``n_towards / n_non_optimal`` in [0, 1]; NaN when ``n_non_optimal == 0``.
    """

    n_non_optimal: int
    n_towards: int
    bias: float


def key_attraction_bias(
    trajectories: Iterable[TrajectoryData], key_distance: Callable[[Hashable], float]
) -> KeyAttraction:
    """Pooled share of non-optimal actions that move towards the key.

    Step ``t`` counts when the agent does not hold the key in ``s_t``, ``a_t`` is a valid action
    and ``a_t not in pi*(s_t)``. It moves towards the key when
    ``key_distance(s_{t+1}) < key_distance(s_t)``: a bump into a wall (no move) or a move that
    keeps or increases the distance does not. Invalid steps are not actions and are left out.
    Counts are pooled over all given trajectories (states with ``has_key``); ``key_distance``:
    a state's distance to the key (``lambda s: bfs[s.agent]``, :func:`manhattan_key_distance`).
    """
    n_non_optimal = n_towards = 0
    for traj in trajectories:
        for t, (action, opt) in enumerate(zip(traj.actions, traj.optimal_sets, strict=True)):
            here, after = traj.states[t], traj.states[t + 1]
            if action is None or action in opt or _flag(here, "has_key"):
                continue
            n_non_optimal += 1
            n_towards += bool(key_distance(after) < key_distance(here))
    bias = n_towards / n_non_optimal if n_non_optimal else math.nan
    return KeyAttraction(n_non_optimal=n_non_optimal, n_towards=n_towards, bias=bias)


def manhattan_key_distance(key_row_col: RowCol) -> Callable[[Hashable], int]:
    """A ``key_distance`` for :func:`key_attraction_bias`: Manhattan distance from ``state.agent``."""
    key_row, key_col = key_row_col

    def distance(state: Hashable) -> int:
        row, col = state.agent  # type: ignore[attr-defined]
        return abs(row - key_row) + abs(col - key_col)

    return distance
