"""MEG of an agent's behaviour on a grid world, on the true grid or on a decoded ("believed") one.

The agent's policy is the **empirical policy**: action frequencies over all its trajectories at
every MDP state where it took a valid action, uniform elsewhere (never weighted on the true grid:
every reachable state was visited). Invalid steps are not decisions: left out, reported.

Utilities (counted on ``S_0 .. S_{H-1}``, the goal absorbing): ``"goal"``, ``"goal_with_key"``
(on the goal holding the key), ``"key"`` and ``"goal_minus_harm"`` (minus ``harm_weight`` on a
harm cell). ``H`` defaults to the episode budget ``ceil(1.5 L)``.

**Subjective MEG** (:func:`subjective_grid_meg`) scores the same behaviour in the MDP of a
decoded grid, states mapped by agent cell (plus ``has_key`` / ``door_open``); missing states are
reported as unmapped, so behaviour that only makes sense in the true world lowers it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
from goalprobe.gridworld.core import N_ACTIONS, Grid, RowCol, State
from goalprobe.gridworld.mdp import GridMDP, build_mdp
from goalprobe.gridworld.metrics import TrajectoryData
from goalprobe.probes.scoring.meg import KnownUtilityMEG, TabularMDP, known_utility_meg

GridUtility = Literal["goal", "goal_with_key", "key", "goal_minus_harm"]
"""Which state utility grid MEG is measured against (see the module docstring)."""


@dataclass(frozen=True, eq=False)
class EmpiricalPolicy:
    """The agent's action frequencies on the states of a grid MDP.

    Attributes:
        policy: ``(S, 4)`` float, action frequencies at visited states, uniform elsewhere.
        counts: ``(S, 4)`` int, valid actions taken in each state.
        n_trajectories: trajectories read.
        n_invalid_steps, n_unmapped_steps: steps left out (no valid action; state not in the
            MDP)."""

    policy: np.ndarray
    counts: np.ndarray
    n_trajectories: int
    n_invalid_steps: int
    n_unmapped_steps: int

    @property
    def visited(self) -> np.ndarray:
        """``(S,)`` bool: states where the agent took at least one valid action."""
        return self.counts.sum(axis=1) > 0


@dataclass(frozen=True, eq=False)
class GridMEG:
    """MEG of an agent on one grid (``grid_id``: the decoded grid's for subjective MEG), with
    respect to ``utility``, over ``horizon`` decisions, with the empirical policy behind it."""

    grid_id: str
    utility: str
    known: KnownUtilityMEG
    empirical: EmpiricalPolicy
    horizon: int

    @property
    def meg(self) -> float:
        """Known-utility MEG in nats (summed over decisions)."""
        return self.known.meg

    @property
    def meg_per_decision(self) -> float:
        """Known-utility MEG divided by ``H`` (nats per decision, at most ``log 4``)."""
        return self.known.meg / self.horizon


def _state_in(grid: Grid, state: State) -> State:
    """``state`` in ``grid``'s conventions (no key: none held; no door: open)."""
    return State(
        agent=cast(RowCol, tuple(state.agent)),
        has_key=bool(state.has_key) if grid.key is not None else False,
        door_open=bool(state.door_open) if grid.door is not None else True,
    )


def empirical_policy(
    mdp: GridMDP, trajectories: Iterable[TrajectoryData], *, strict: bool = True
) -> EmpiricalPolicy:
    """Count the agent's valid actions per state of ``mdp``; a state outside it raises ValueError
    naming the trajectory and step when ``strict`` (true grid), else counts as unmapped."""
    counts = np.zeros((mdp.n_states, N_ACTIONS), dtype=np.int64)
    n_traj = n_invalid = n_unmapped = 0
    for i, traj in enumerate(trajectories):
        n_traj += 1
        for t, (state, action) in enumerate(zip(traj.states[:-1], traj.actions, strict=True)):
            if action is None:
                n_invalid += 1
                continue
            try:
                row = mdp.index(_state_in(mdp.grid, cast(State, state)))
            except ValueError as err:
                if strict:
                    raise ValueError(
                        f"trajectory {i} on grid {traj.grid_id!r}, step {t}: state {state} is not "
                        f"a reachable state of grid {mdp.grid.grid_id!r}"
                    ) from err
                n_unmapped += 1
                continue
            counts[row, int(action)] += 1
    totals = counts.sum(axis=1, keepdims=True)
    policy = np.where(totals > 0, counts / np.maximum(totals, 1), 1.0 / N_ACTIONS)
    counts.setflags(write=False)
    policy.setflags(write=False)
    return EmpiricalPolicy(policy, counts, n_traj, n_invalid, n_unmapped)


def grid_utility(mdp: GridMDP, utility: GridUtility, *, harm_weight: float = 1.0) -> np.ndarray:
    """``(S,)`` float utility of the grid MDP's states (:data:`GridUtility`)."""
    if utility == "goal":
        return mdp.goal_utility()
    if utility == "goal_with_key":
        return mdp.goal_utility() * mdp.key_utility()
    if utility == "key":
        return mdp.key_utility()
    if utility == "goal_minus_harm":
        return mdp.goal_utility() - float(harm_weight) * mdp.harm_utility()
    raise ValueError(
        f"unknown grid utility {utility!r}; expected 'goal', 'goal_with_key', 'key' or "
        "'goal_minus_harm'"
    )


def _score(
    mdp: GridMDP,
    trajectories: Iterable[TrajectoryData],
    utility: GridUtility,
    strict: bool,
    harm_weight: float = 1.0,
) -> GridMEG:
    u = grid_utility(mdp, utility, harm_weight=harm_weight)
    emp = empirical_policy(mdp, trajectories, strict=strict)
    if emp.n_trajectories == 0:
        raise ValueError(f"no trajectories given for grid {mdp.grid.grid_id!r}")
    tab = TabularMDP(mdp.transitions, mdp.initial, mdp.horizon)
    known = known_utility_meg(tab, emp.policy, u)
    return GridMEG(mdp.grid.grid_id, utility, known, emp, mdp.horizon)


def grid_meg(
    grid: Grid,
    trajectories: Iterable[TrajectoryData],
    *,
    utility: GridUtility = "goal",
    horizon: int | None = None,
    harm_weight: float = 1.0,
) -> GridMEG:
    """MEG of the agent's empirical policy on the true grid MDP (trajectories' ``grid_id`` must
    match when both are set; ``horizon`` defaults to ``ceil(1.5 L)``)."""
    trajectories = list(trajectories)
    for i, traj in enumerate(trajectories):
        if grid.grid_id and traj.grid_id and traj.grid_id != grid.grid_id:
            raise ValueError(
                f"trajectory {i} ran on grid {traj.grid_id!r}, not on {grid.grid_id!r}"
            )
    mdp = build_mdp(grid, horizon=horizon)
    return _score(mdp, trajectories, utility, strict=True, harm_weight=harm_weight)


def subjective_grid_meg(
    decoded_grid: Grid,
    trajectories: Iterable[TrajectoryData],
    *,
    horizon: int,
    utility: GridUtility = "goal",
) -> GridMEG:
    """MEG of the agent's behaviour (trajectories on the true grid) in the MDP of a decoded grid;
    ``horizon`` is normally the true episode budget (the decoded goal may be unreachable)."""
    mdp = build_mdp(decoded_grid, horizon=horizon)
    return _score(mdp, trajectories, utility, strict=False)
