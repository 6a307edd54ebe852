"""A small synthetic activation store written by the real StoreWriter: random rows over three
sizes and densities (shared by the store, merge and CLI fuzz tests)."""

from __future__ import annotations

import numpy as np
from goalprobe.activations.store import RowBatch, StoreLayout, StoreWriter
from goalprobe.gridworld.core import LABEL_CANVAS, PLAN_END, PLAN_HORIZON, PLAN_PAD, CellType

LAYOUT = StoreLayout(stages=("pre_reasoning", "post_reasoning"), layers=(1, 3), d_model=8)
SIZES = (5, 7, 9)
DENSITIES = (0.0, 0.4, 1.0)


def make_batch(rng: np.random.Generator, grid_ids: list[str], first_step: int) -> RowBatch:
    """Random rows, one per entry of ``grid_ids`` (a grid's size and density are fixed)."""
    n = len(grid_ids)
    sizes = np.asarray([SIZES[int(g[1:]) % 3] for g in grid_ids], dtype=np.int16)
    cells = np.full((n, LABEL_CANVAS, LABEL_CANVAS), CellType.PADDING, dtype=np.uint8)
    for i, size in enumerate(sizes):
        cells[i, :size, :size] = rng.integers(0, 4, (size, size))
    plan = np.full((n, PLAN_HORIZON), PLAN_PAD, dtype=np.uint8)
    plan[:, 0] = rng.integers(0, 4, n)
    plan[:, 1] = PLAN_END
    labels = {
        "cell_types": cells,
        "agent_row_col": rng.integers(0, 5, (n, 2)).astype(np.int16),
        "goal_row_col": rng.integers(0, 5, (n, 2)).astype(np.int16),
        "grid_size": sizes,
        "density": np.asarray([DENSITIES[int(g[1:]) % 3] for g in grid_ids], dtype=np.float32),
        "variant": np.asarray(["plain"] * n, dtype=object),
        "distance_to_goal": rng.integers(1, 9, n).astype(np.int32),
        "plan": plan,
        "optimal_actions": rng.random((n, 4)) < 0.5,
        "action": rng.integers(0, 4, n).astype(np.uint8),
        "action_valid": rng.random(n) < 0.8,
        "has_key": np.zeros(n, dtype=bool),
        "door_open": np.ones(n, dtype=bool),
        "run_id": np.asarray(["run-a"] * n, dtype=object),
        "grid_id": np.asarray(grid_ids, dtype=object),
        "episode": np.zeros(n, dtype=np.int32),
        "step": np.arange(first_step, first_step + n, dtype=np.int32),
        "step_index": np.arange(first_step, first_step + n, dtype=np.int64),
        "seq_len": rng.integers(50, 90, n).astype(np.int32),
    }
    present = {
        "pre_reasoning": np.ones(n, dtype=bool),
        "post_reasoning": rng.random(n) < 0.7,
    }
    return RowBatch(
        acts={
            s: {x: rng.normal(size=(n, 3, 8)).astype(np.float32) for x in LAYOUT.layers}
            for s in LAYOUT.stages
        },
        positions={s: rng.integers(0, 50, (n, 3)).astype(np.int32) for s in LAYOUT.stages},
        present=present,
        labels=labels,
    )


ATTRS = {
    "model_id": "tiny",
    "model_revision": "",
    "backend": "hooks",
    "config": {"layers": [1, 3]},
    "trajectory_sha256": "ab" * 32,
    "trajectory_steps": 10,
    "shard_index": 0,
    "shard_count": 1,
}


def write_store(path, batches, compression="none", attrs=ATTRS):
    with StoreWriter(path, LAYOUT, attrs, compression=compression) as writer:
        for batch in batches:
            writer.append(batch)
    return path
