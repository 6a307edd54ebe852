"""Per-row labels of the store, computed from trajectory episodes (no torch).

Every label describes the state ``s_t`` the agent was shown at step ``t`` (what the probes
decode) or what it did from there on (the plan).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from goalprobe.activations.store.schema import label_array
from goalprobe.agents.trajectories import Episode, StepRecord
from goalprobe.gridworld.core import N_ACTIONS, PLAN_END, PLAN_HORIZON, PLAN_PAD, Action, Variant
from goalprobe.gridworld.text import GridParseError, padded_cell_types, parse

_STEP_ATTRIBUTES = (
    "agent_row_col",
    "goal_row_col",
    "grid_size",
    "variant",
    "distance_to_goal",
    "has_key",
    "door_open",
    "run_id",
    "grid_id",
    "episode",
    "step",
)
"""Label fields copied from the step record's attribute of the same name."""


def plan_rows(actions: Sequence[Action | None], horizon: int = PLAN_HORIZON) -> np.ndarray:
    """``(T, horizon)`` uint8 plan labels of one episode from its ``actions`` (None: invalid):
    the next executed actions from step ``t`` on, then ``PLAN_END`` (if they end within the
    horizon), then ``PLAN_PAD``."""
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
    columns = {name: [getattr(s, name) for s in steps] for name in _STEP_ATTRIBUTES}
    columns["density"] = [np.nan if s.density is None else s.density for s in steps]
    columns["action"] = [0 if a is None else int(a) for a in actions]
    columns["action_valid"] = [a is not None for a in actions]
    return {
        **{name: label_array(name, values) for name, values in columns.items()},
        "cell_types": np.stack([cell_type_canvas(s) for s in steps]),
        "plan": plan_rows(actions),
        "optimal_actions": optimal,
        "step_index": np.arange(first_step_index, first_step_index + t, dtype=np.int64),
    }
