"""MiniGrid conversion with real Farama MiniGrid environments."""

from __future__ import annotations

import gymnasium
import minigrid  # noqa: F401  (registers the MiniGrid environments; a test extra)
import pytest
from goalprobe.gridworld.core import Variant
from goalprobe.gridworld.minigrid_import import grid_from_minigrid, load_minigrid
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import parse, render  # noqa: E402


def _reset(env_id: str, seed: int):
    env = gymnasium.make(env_id)
    env.reset(seed=seed)
    return env


@pytest.mark.parametrize(
    "env_id",
    [
        "MiniGrid-Empty-5x5-v0",
        "MiniGrid-Empty-6x6-v0",
        "MiniGrid-FourRooms-v0",
        "MiniGrid-DoorKey-8x8-v0",
    ],
)
def test_cells_are_transposed_from_x_y(env_id):
    env = _reset(env_id, 3)
    grid = grid_from_minigrid(env, grid_id="g")
    mg = env.unwrapped.grid
    assert grid.size == mg.width == mg.height
    for row in range(grid.size):
        for col in range(grid.size):
            obj = mg.get(col, row)  # (x, y) = (col, row)
            assert grid.walls[row, col] == (obj is not None and obj.type == "wall")
            if obj is not None and obj.type in ("goal", "key"):
                assert getattr(grid, obj.type) == (row, col)
    x, y = env.unwrapped.agent_pos
    assert grid.start == (int(y), int(x))
    assert solve(grid).is_solvable
    assert parse(render(grid), variant=grid.variant)[0] == grid
    env.close()


def test_empty_5x5_exact():
    grid = load_minigrid("MiniGrid-Empty-5x5-v0", 0)
    assert (grid.start, grid.goal) == ((1, 1), (3, 3))
    assert grid.walls.sum() == 16 and grid.variant == Variant.PLAIN
    assert solve(grid).shortest_path_length == 4
    assert grid.grid_id == "MiniGrid-Empty-5x5-v0-s0" and grid.seed == 0
    assert grid.extra["source"] == "minigrid"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_door_key(seed):
    grid = load_minigrid("MiniGrid-DoorKey-6x6-v0", seed)
    assert grid.size == 6 and grid.variant == Variant.KEY_DOOR
    assert grid.key is not None and grid.door is not None
    policy = solve(grid)
    states, _ = policy.optimal_trajectory()
    assert any(s.has_key for s in states)
    assert all(s.has_key for s in states if s.agent == grid.door)


def test_unsupported_objects():
    env = _reset("MiniGrid-LavaGapS5-v0", 0)
    with pytest.raises(ValueError, match="lava"):
        grid_from_minigrid(env)
    grid = grid_from_minigrid(env, as_walls=frozenset({"lava"}))
    assert grid.walls.sum() > 16
    env.close()
    fresh = gymnasium.make("MiniGrid-Empty-5x5-v0")
    with pytest.raises(ValueError, match="reset"):
        grid_from_minigrid(fresh)
    fresh.close()
