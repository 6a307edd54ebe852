"""Names and specs of the activation store HDF5 file (schema ``goalprobe.activations``, version
3; layout in docs/formats.md): ``/activations/{stage}/layer_{L}`` holds block ``L``'s output at
the stage's ``K`` tokens (zeros where ``present`` is False); the per-row labels, computed from
trajectory episodes, describe the state ``s_t`` the agent was shown at step ``t`` (what the
probes decode) or what it did from there on (the plan); sharding by grid (``--shard i/N``): a
grid's shard is a hash of its id, so shards of one file never overlap whatever its order. No
I/O, no torch."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from goalprobe.agents.trajectories import Episode, StepRecord
from goalprobe.gridworld.core import (
    LABEL_CANVAS,
    N_ACTIONS,
    PLAN_END,
    PLAN_HORIZON,
    PLAN_PAD,
    Action,
    Variant,
)
from goalprobe.gridworld.text import GridParseError, padded_cell_types, parse

SCHEMA = "goalprobe.activations"
"""Value of the root ``schema`` attribute."""

SCHEMA_VERSION = 3
"""Value of the root ``schema_version`` attribute written; bumped on any incompatible change
(2: the ``/reasoning`` group of ragged reasoning rows; 3: the ``chat_format`` attribute)."""

READABLE_VERSIONS: tuple[int, ...] = (2, 3)
"""Schema versions a reader opens (2: harmony rows, written before chat formats existed)."""

CHAT_FORMAT_ATTR = "chat_format"
"""Root attribute (version 3) naming the chat format of the rows (JSON)."""

DEFAULT_CHAT_FORMAT: dict[str, str] = {"name": "harmony"}
"""The chat format of a store without ``chat_format`` (version 2)."""

REASONING = "reasoning"
"""Group of the ragged reasoning rows (schema version 2)."""

REASONING_FIELDS: dict[str, type] = {
    "positions": np.int32,
    "tokens": np.int32,
    "fraction": np.float32,
}
"""Per-reasoning-row datasets beside the activations (``(R,)`` each)."""

ANCHOR_STAGES: tuple[str, ...] = ("pre_reasoning", "post_reasoning")
"""The two anchor stages."""

GRID_CELLS = "grid_cells"
"""Optional stage: the token of every cell of the 15 x 15 label canvas."""

ALL_STAGES: tuple[str, ...] = (*ANCHOR_STAGES, GRID_CELLS)

ANCHOR_TOKENS = 3
"""Tokens per anchor in every chat format (harmony: ``<|end|> <|start|> assistant``; think-tag:
see :mod:`goalprobe.agents.chat_format`)."""

ACTIVATION_DTYPE = np.float16
"""On-disk dtype of every activation dataset."""

COMPRESSIONS: tuple[str, ...] = ("none", "lzf", "gzip")
"""Accepted ``compression`` names (``none`` stores chunks uncompressed)."""


def stage_tokens(stage: str) -> int:
    """Tokens per row ``K`` of ``stage``."""
    if stage in ANCHOR_STAGES:
        return ANCHOR_TOKENS
    if stage == GRID_CELLS:
        return LABEL_CANVAS * LABEL_CANVAS  # row-major over the label canvas
    raise ValueError(f"unknown stage {stage!r}; expected one of {ALL_STAGES}")


def layer_name(layer: int) -> str:
    """Dataset name of decoder block ``layer``'s output (``layer_15``)."""
    return f"layer_{int(layer)}"


@dataclass(frozen=True)
class LabelField:
    """One ``/labels`` dataset.

    Attributes:
        dtype: numpy dtype on disk (``str`` for variable-length UTF-8 strings).
        shape: per-row shape (``()`` for a scalar per row).
        doc: what the field holds (written as the dataset's ``doc`` attribute).
    """

    dtype: type | np.dtype
    shape: tuple[int, ...]
    doc: str


LABEL_FIELDS: dict[str, LabelField] = {
    "cell_types": LabelField(
        np.uint8,
        (LABEL_CANVAS, LABEL_CANVAS),
        "CellType of every cell of the state shown to the agent, padded to 15 x 15 with "
        "PADDING (attribute 'vocabulary' maps names to values)",
    ),
    "agent_row_col": LabelField(np.int16, (2,), "agent cell (row, col) in s_t"),
    "goal_row_col": LabelField(np.int16, (2,), "goal cell (row, col)"),
    "grid_size": LabelField(np.int16, (), "grid side n"),
    "density": LabelField(np.float32, (), "obstacle density of the grid; NaN when unknown"),
    "variant": LabelField(str, (), "grid variant name"),
    "distance_to_goal": LabelField(np.int32, (), "shortest path length from s_t to the goal"),
    "plan": LabelField(
        np.uint8,
        (PLAN_HORIZON,),
        "next executed actions from s_t on (invalid steps execute nothing and are skipped), "
        "then PLAN_END, then PLAN_PAD",
    ),
    "optimal_actions": LabelField(np.bool_, (N_ACTIONS,), "pi*(s_t) as a mask over Action"),
    "action": LabelField(
        np.uint8, (), "the executed Action; only meaningful where action_valid is True"
    ),
    "action_valid": LabelField(np.bool_, (), "whether the step named a valid action"),
    "has_key": LabelField(np.bool_, (), "whether the agent holds the key in s_t"),
    "door_open": LabelField(np.bool_, (), "whether the door is open in s_t"),
    "run_id": LabelField(str, (), "trajectory run id"),
    "grid_id": LabelField(str, (), "grid id (splits are by grid)"),
    "episode": LabelField(np.int32, (), "episode index on its grid"),
    "step": LabelField(np.int32, (), "step index t in its episode"),
    "step_index": LabelField(
        np.int64, (), "0-based index of the step among all steps of the trajectory file"
    ),
    "seq_len": LabelField(np.int32, (), "tokens replayed for the row (prompt + generated, cut)"),
}
"""Every ``/labels`` dataset, in write order."""


def label_array(name: str, values) -> np.ndarray:
    """``values`` of label field ``name`` as an array of its dtype (strings as objects)."""
    dtype = LABEL_FIELDS[name].dtype
    return np.asarray(values, dtype=object if dtype is str else dtype)


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
    optimal = [[a in s.optimal_action_set for a in Action] for s in steps]
    actions = [s.action_enum for s in steps]
    columns = {name: [getattr(s, name) for s in steps] for name in _STEP_ATTRIBUTES}
    columns["density"] = [np.nan if s.density is None else s.density for s in steps]
    columns["action"] = [0 if a is None else int(a) for a in actions]
    columns["action_valid"] = [a is not None for a in actions]
    return {
        **{name: label_array(name, values) for name, values in columns.items()},
        "cell_types": np.stack([cell_type_canvas(s) for s in steps]),
        "plan": plan_rows(actions),
        "optimal_actions": np.asarray(optimal, dtype=bool).reshape(t, N_ACTIONS),
        "step_index": np.arange(first_step_index, first_step_index + t, dtype=np.int64),
    }


class StoreFormatError(ValueError):
    """A file is not a readable goalprobe activation store; the message names the file."""


class IncompleteStoreError(StoreFormatError):
    """A store whose writer did not finish (``complete`` is False)."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count`` (``0 <= index < count``)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard must satisfy 0 <= i < N, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Parse ``"i/N"`` (e.g. ``"3/8"``)."""
        parts = str(text).split("/")
        try:
            index, count = (int(p) for p in parts)
        except ValueError as err:
            raise ValueError(f"shard {text!r} is not of the form i/N (e.g. 0/4)") from err
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, grid_id: str) -> bool:
        """Whether the steps of ``grid_id`` belong to this shard."""
        return shard_of(grid_id, self.count) == self.index


def shard_of(grid_id: str, count: int) -> int:
    """The shard (``0 .. count-1``) of a grid: first 8 bytes of sha256(grid_id) mod ``count``."""
    digest = hashlib.sha256(str(grid_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % int(count)
