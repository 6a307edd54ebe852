"""Names and specs of the activation store HDF5 file (schema ``goalprobe.activations``, version
3; layout in docs/formats.md): ``/activations/{stage}/layer_{L}`` holds block ``L``'s output at
the stage's ``K`` tokens (zeros where ``present`` is False); sharding by grid (``--shard i/N``):
a grid's shard is a hash of its id, so shards of one file never overlap whatever its order. No
I/O, no torch."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from goalprobe.gridworld.core import LABEL_CANVAS, N_ACTIONS, PLAN_HORIZON

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

GRID_CELL_TOKENS = LABEL_CANVAS * LABEL_CANVAS
"""Tokens per row of the ``grid_cells`` stage (row-major over the label canvas)."""

ACTIVATION_DTYPE = np.float16
"""On-disk dtype of every activation dataset."""

COMPRESSIONS: tuple[str, ...] = ("none", "lzf", "gzip")
"""Accepted ``compression`` names (``none`` stores chunks uncompressed)."""


def stage_tokens(stage: str) -> int:
    """Tokens per row ``K`` of ``stage``."""
    if stage in ANCHOR_STAGES:
        return ANCHOR_TOKENS
    if stage == GRID_CELLS:
        return GRID_CELL_TOKENS
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
