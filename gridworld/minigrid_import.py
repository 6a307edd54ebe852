"""Convert Farama MiniGrid environments (after ``reset``) into :class:`Grid` objects.

Needs the optional ``minigrid`` extra (``pip install 'goalprobe[minigrid]'``), imported lazily.

MiniGrid indexes cells as ``(x, y) = (col, row)``; everything here converts to ``(row, col)``.
Imported grids may have an even side (any ``n >= 5``; only the generator needs odd sides) but
must be square. Cell mapping:

* empty, ``floor`` -> open; ``wall`` -> wall; ``goal`` -> the goal (exactly one);
* ``key`` -> the key (at most one); a *locked* ``door`` -> the door (at most one, and only with a
  key). Unlocked doors, open or closed, become open cells: this grid world has no toggle action.
* Anything else (``lava``, ``ball``, ``box``, ...) is refused unless its type is listed in
  ``as_walls``. The agent's direction is kept in ``grid.extra`` only (actions here are absolute).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from goalprobe.gridworld.core import Grid, RowCol, Variant


def _require_minigrid():
    try:
        import gymnasium
        import minigrid  # noqa: F401  (importing registers the MiniGrid environments)
    except ImportError as err:
        raise ImportError(
            "MiniGrid import needs the optional 'minigrid' extra: pip install 'goalprobe[minigrid]'"
        ) from err
    return gymnasium


def grid_from_minigrid(
    env: Any, *, grid_id: str = "", as_walls: frozenset[str] = frozenset()
) -> Grid:
    """Convert a reset MiniGrid environment (or a wrapper of one) into a :class:`Grid`.

    Args:
        env: a MiniGrid env after ``reset()``; wrappers are unwrapped.
        grid_id: identifier of the returned grid.
        as_walls: MiniGrid object types to treat as walls (e.g. ``{"lava"}``).

    Raises ``ValueError`` naming the cell ``(row, col)`` of any unsupported content.
    """
    _require_minigrid()
    base = getattr(env, "unwrapped", env)
    mg = getattr(base, "grid", None)
    if mg is None or getattr(base, "agent_pos", None) is None:
        raise ValueError("env has no grid or agent position; call env.reset() first")
    width, height = int(mg.width), int(mg.height)
    if width != height:
        raise ValueError(f"only square grids are supported, got width {width} x height {height}")
    if width < 5:
        raise ValueError(f"grid side must be >= 5, got {width}")
    if getattr(base, "carrying", None) is not None:
        raise ValueError("the agent already carries an object; convert right after reset()")
    n = width
    walls = np.zeros((n, n), dtype=bool)
    found: dict[str, list[RowCol]] = {"goal": [], "key": [], "door": []}
    for row in range(n):
        for col in range(n):
            obj = mg.get(col, row)  # MiniGrid: (x, y) = (col, row)
            kind = None if obj is None else obj.type
            if kind is None or kind == "floor":
                continue
            if kind == "wall" or kind in as_walls:
                walls[row, col] = True
            elif kind in ("goal", "key"):
                found[kind].append((row, col))
            elif kind == "door":
                if obj.is_locked:
                    found["door"].append((row, col))
            else:
                raise ValueError(
                    f"unsupported MiniGrid object {kind!r} at cell (row {row}, col {col}); "
                    f"pass as_walls={{{kind!r}}} to treat it as a wall"
                )
    for kind, limit in (("goal", 1), ("key", 1), ("door", 1)):
        if len(found[kind]) > limit:
            raise ValueError(f"{len(found[kind])} {kind}s at {found[kind]}; at most {limit}")
    if not found["goal"]:
        raise ValueError("the environment has no goal")
    key = found["key"][0] if found["key"] else None
    door = found["door"][0] if found["door"] else None
    if door is not None and key is None:
        raise ValueError(f"locked door at {door} but no key: it could never open")
    agent_col, agent_row = (int(v) for v in base.agent_pos)
    variant = (
        Variant.KEY_DOOR
        if door is not None
        else Variant.KEY_NO_DOOR
        if key is not None
        else Variant.PLAIN
    )
    extra = {
        "source": "minigrid",
        "env_id": getattr(getattr(env, "spec", None), "id", None) or type(base).__name__,
        "agent_dir": int(getattr(base, "agent_dir", 0)),
    }
    return Grid(
        walls=walls,
        goal=found["goal"][0],
        start=(agent_row, agent_col),
        key=key,
        door=door,
        variant=variant,
        grid_id=grid_id,
        extra=extra,
    )


def load_minigrid(
    env_id: str, seed: int, *, grid_id: str = "", as_walls: frozenset[str] = frozenset()
) -> Grid:
    """Make ``env_id`` (e.g. ``"MiniGrid-FourRooms-v0"``), reset it with ``seed``, convert it.

    The grid id defaults to ``"<env_id>-s<seed>"``; ``grid.seed`` records ``seed``.
    """
    gymnasium = _require_minigrid()
    env = gymnasium.make(env_id)
    try:
        env.reset(seed=seed)
        grid = grid_from_minigrid(env, grid_id=grid_id or f"{env_id}-s{seed}", as_walls=as_walls)
    finally:
        env.close()
    extra = dict(grid.extra, env_id=env_id, env_seed=int(seed))
    return replace(grid, seed=int(seed), extra=extra)
