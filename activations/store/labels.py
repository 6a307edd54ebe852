"""Per-row labels of the store, computed from trajectory episodes (no torch).

Every label describes the state ``s_t`` the agent was shown at step ``t`` (what the probes
decode) or what it did from there on (the plan).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from goalprobe.agents.trajectories import Episode, StepRecord
from goalprobe.gridworld.core import N_ACTIONS, PLAN_END, PLAN_HORIZON, PLAN_PAD, Action, Variant
from goalprobe.gridworld.text import GridParseError, padded_cell_types, parse


def plan_rows(actions: Sequence[Action | None], horizon: int = PLAN_HORIZON) -> np.ndarray:
    """``(T, horizon)`` uint8 plan labels of one episode from its executed ``actions`` (None:
    invalid).

    Step ``t``'s plan is the next executed actions from ``t`` on (invalid steps skipped), then
    ``PLAN_END``, then ``PLAN_PAD`` (a plan with ``horizon`` or more actions left has no
    ``END``)."""
    out = np.full((len(actions), horizon), PLAN_PAD, dtype=np.uint8)
    for t in range(len(actions)):
        future = [int(a) for a in actions[t:] if a is not None][: horizon + 1]
        k = min(len(future), horizon)
        out[t, :k] = future[:k]
        if len(future) < horizon:
            out[t, len(future)] = PLAN_END
    return out


def cell_type_canvas(step: StepRecord) -> np.ndarray:
    """``(15, 15)`` uint8 cell types of the grid shown at ``step``, PADDING outside (a fogged step:
    its true grid; what was revealed depends on the episode)."""
    text = step.grid_text
    if step.variant == Variant.FOG and step.true_grid_text is not None:
        text = step.true_grid_text
    try:
        grid, state = parse(text)
    except GridParseError as err:
        raise ValueError(
            f"step {step.step} of episode {step.episode} on grid {step.grid_id!r}: grid_text "
            f"does not parse ({err})"
        ) from err
    if grid.size != step.grid_size:
        raise ValueError(
            f"step {step.step} of episode {step.episode} on grid {step.grid_id!r}: grid_text is "
            f"{grid.size} x {grid.size} but grid_size is {step.grid_size}"
        )
    return padded_cell_types(grid, state).astype(np.uint8)


def episode_labels(episode: Episode, first_step_index: int) -> dict[str, np.ndarray]:
    """``{field: (T, *shape)}`` labels (all but ``seq_len``) of every step of a finished ``episode``
    whose first step has file-wide index ``first_step_index``."""
    steps = episode.steps
    t = len(steps)
    optimal = np.zeros((t, N_ACTIONS), dtype=bool)
    for i, s in enumerate(steps):
        for a in s.optimal_action_set:
            optimal[i, int(a)] = True
    actions = [s.action_enum for s in steps]
    return {
        "cell_types": np.stack([cell_type_canvas(s) for s in steps]),
        "agent_row_col": np.asarray([s.agent_row_col for s in steps], dtype=np.int16),
        "goal_row_col": np.asarray([s.goal_row_col for s in steps], dtype=np.int16),
        "grid_size": np.asarray([s.grid_size for s in steps], dtype=np.int16),
        "density": np.asarray(
            [np.nan if s.density is None else s.density for s in steps], dtype=np.float32
        ),
        "variant": np.asarray([s.variant for s in steps], dtype=object),
        "distance_to_goal": np.asarray([s.distance_to_goal for s in steps], dtype=np.int32),
        "plan": plan_rows(actions),
        "optimal_actions": optimal,
        "action": np.asarray([0 if a is None else int(a) for a in actions], dtype=np.uint8),
        "action_valid": np.asarray([a is not None for a in actions], dtype=bool),
        "has_key": np.asarray([s.has_key for s in steps], dtype=bool),
        "door_open": np.asarray([s.door_open for s in steps], dtype=bool),
        "run_id": np.asarray([s.run_id for s in steps], dtype=object),
        "grid_id": np.asarray([s.grid_id for s in steps], dtype=object),
        "episode": np.asarray([s.episode for s in steps], dtype=np.int32),
        "step": np.asarray([s.step for s in steps], dtype=np.int32),
        "step_index": np.arange(first_step_index, first_step_index + t, dtype=np.int64),
    }
