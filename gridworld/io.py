"""Grid-set JSONL: one grid per line, schema ``goalprobe.gridset/2`` (fields: docs/formats.md).

The reader checks that ``text``, ``shortest_path_length`` and ``horizon`` agree with the grid
they describe, and reports any problem as ``path:line: field: problem``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from goalprobe.gridworld.core import Grid
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import render

SCHEMA = "goalprobe.gridset/2"
"""Schema tag written on every line."""

FIELDS: tuple[str, ...] = (
    "schema",
    "grid_id",
    "size",
    "variant",
    "density",
    "seed",
    "walls",
    "start_row_col",
    "goal_row_col",
    "key_row_col",
    "door_row_col",
    "shortest_path_length",
    "horizon",
    "text",
    "extra",
    "shown",
    "harm_cells",
    "start_has_key",
    "start_door_open",
)
"""Fields of a record."""


class GridSetFormatError(ValueError):
    """A malformed grid-set record; the message names the file, line and field."""


def _cell(value: Any) -> list[int] | None:
    return None if value is None else [int(value[0]), int(value[1])]


def grid_to_dict(grid: Grid) -> dict[str, Any]:
    """The schema ``goalprobe.gridset/2`` record of ``grid`` (requires a solvable grid)."""
    policy = solve(grid)
    try:
        json.dumps(grid.extra)
    except TypeError as err:
        raise ValueError(f"grid {grid.grid_id!r}: extra is not JSON-serialisable: {err}") from err
    return {
        "schema": SCHEMA,
        "grid_id": grid.grid_id,
        "size": grid.size,
        "variant": str(grid.variant),
        "density": None if grid.density is None else float(grid.density),
        "seed": None if grid.seed is None else int(grid.seed),
        "walls": _walls_rows(grid.walls),
        "start_row_col": _cell(grid.start),
        "goal_row_col": _cell(grid.goal),
        "key_row_col": _cell(grid.key),
        "door_row_col": _cell(grid.door),
        "shortest_path_length": policy.shortest_path_length,
        "horizon": policy.horizon,
        "text": render(grid),
        "extra": dict(grid.extra),
        "shown": None
        if grid.shown is None
        else {"walls": _walls_rows(grid.shown.walls), "goal_row_col": _cell(grid.shown.goal)},
        "harm_cells": [_cell(cell) for cell in grid.harm],
        "start_has_key": bool(grid.start_has_key),
        "start_door_open": bool(grid.start_door_open),
    }


def _walls_rows(walls: np.ndarray) -> list[str]:
    return ["".join("1" if w else "0" for w in row) for row in walls.tolist()]


def _fail(where: str, field: str, problem: str) -> GridSetFormatError:
    return GridSetFormatError(f"{where}: {field}: {problem}")


def _read_optional_cell(record: dict, field: str, where: str) -> tuple[int, int] | None:
    return None if record[field] is None else _read_cell(record, field, where)


def _read_cell(record: dict, field: str, where: str) -> tuple[int, int]:
    value = record[field]
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise _fail(where, field, f"expected [row, col] of two ints, got {value!r}")
    return value[0], value[1]


def _read_walls(rows: Any, size: int, where: str, field: str) -> np.ndarray:
    if not isinstance(rows, list) or len(rows) != size:
        raise _fail(where, field, f"expected {size} row strings")
    for row, text in enumerate(rows):
        if not isinstance(text, str) or len(text) != size or set(text) - {"0", "1"}:
            raise _fail(where, field, f"row {row} must be {size} characters of 0/1, got {text!r}")
    return np.array([[ch == "1" for ch in text] for text in rows], dtype=bool)


def _read_shown(record: dict, size: int, where: str) -> tuple[np.ndarray, tuple[int, int]] | None:
    value = record.get("shown")
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"walls", "goal_row_col"}:
        raise _fail(where, "shown", "expected null or an object {walls, goal_row_col}")
    walls = _read_walls(value["walls"], size, where, "shown.walls")
    goal = _read_cell(value, "goal_row_col", f"{where}: shown")
    return walls, goal


def grid_from_dict(record: Any, *, where: str = "record") -> Grid:
    """Rebuild a grid from a decoded ``goalprobe.gridset/2`` record, checking every field;
    ``where`` prefixes error messages (``"grids.jsonl:12"``)."""
    if not isinstance(record, dict):
        raise GridSetFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    schema = record.get("schema")
    if schema != SCHEMA:
        raise _fail(where, "schema", f"expected {SCHEMA!r}, got {schema!r}")
    missing = [f for f in FIELDS if f not in record]
    if missing:
        raise _fail(where, ", ".join(missing), "missing")
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise _fail(where, ", ".join(unknown), "unknown field(s)")
    grid_id = record["grid_id"]
    if not isinstance(grid_id, str) or not grid_id:
        raise _fail(where, "grid_id", f"expected a non-empty string, got {grid_id!r}")
    where = f"{where} ({grid_id})"
    size = record["size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 5:
        raise _fail(where, "size", f"expected an int >= 5, got {size!r}")
    walls = _read_walls(record["walls"], size, where, "walls")
    shown_cells = _read_shown(record, size, where)
    density = record["density"]
    if density is not None:
        if not isinstance(density, int | float) or isinstance(density, bool):
            raise _fail(where, "density", f"expected a number or null, got {density!r}")
        if not 0.0 <= density <= 1.0:
            raise _fail(where, "density", f"must lie in [0, 1], got {density}")
    seed = record["seed"]
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise _fail(where, "seed", f"expected an int or null, got {seed!r}")
    variant = record["variant"]
    if not isinstance(variant, str) or not variant:
        raise _fail(where, "variant", f"expected a non-empty string, got {variant!r}")
    extra = record["extra"]
    if not isinstance(extra, dict):
        raise _fail(where, "extra", f"expected a JSON object, got {extra!r}")
    cells: dict[str, Any] = {
        "start": _read_cell(record, "start_row_col", where),
        "goal": _read_cell(record, "goal_row_col", where),
        "key": _read_optional_cell(record, "key_row_col", where),
        "door": _read_optional_cell(record, "door_row_col", where),
    }
    harm_cells = record["harm_cells"]
    if not isinstance(harm_cells, list):
        raise _fail(where, "harm_cells", f"expected a list of [row, col], got {harm_cells!r}")
    harm = tuple(_read_cell({"harm_cells": cell}, "harm_cells", where) for cell in harm_cells)
    if len(set(harm)) != len(harm):
        raise _fail(where, "harm_cells", "a cell repeats")
    for flag in ("start_has_key", "start_door_open"):
        if not isinstance(record[flag], bool):
            raise _fail(where, flag, f"expected true or false, got {record[flag]!r}")
    shown = None
    if shown_cells is not None:
        try:
            shown = Grid(
                walls=shown_cells[0],
                goal=shown_cells[1],
                start=cells["start"],
                key=cells["key"],
                door=cells["door"],
                harm=harm,
                variant=variant,
                grid_id=grid_id,
            )
        except ValueError as err:
            raise _fail(where, "shown", str(err)) from err
        if not solve(shown).is_solvable:
            raise _fail(where, "shown", "the shown goal cannot be reached from the start")
    try:
        grid = Grid(
            walls=walls,
            variant=variant,
            density=None if density is None else float(density),
            seed=seed,
            grid_id=grid_id,
            extra=extra,
            shown=shown,
            harm=harm,
            start_has_key=record["start_has_key"],
            start_door_open=record["start_door_open"],
            **cells,
        )
    except ValueError as err:
        raise _fail(where, "grid", str(err)) from err
    if record["text"] != render(grid):
        raise _fail(where, "text", "does not match the grid described by the other fields")
    policy = solve(grid)
    if not policy.is_solvable:
        raise _fail(where, "grid", "the goal cannot be reached from the start")
    for field, value in (
        ("shortest_path_length", policy.shortest_path_length),
        ("horizon", policy.horizon),
    ):
        if record[field] != value:
            raise _fail(where, field, f"recorded {record[field]!r}, but the grid gives {value}")
    return grid


def write_grid_set(path: str | Path, grids: Iterable[Grid]) -> int:
    """Write ``grids`` as JSONL to ``path`` (overwrites); returns the number written.

    Raises ``ValueError`` (before touching the file) on an empty or repeated ``grid_id`` or an
    unsolvable grid.
    """
    path = Path(path)
    lines = []
    seen: set[str] = set()
    for i, grid in enumerate(grids):
        if not grid.grid_id:
            raise ValueError(f"grid {i} has an empty grid_id; ids join every artefact to a grid")
        if grid.grid_id in seen:
            raise ValueError(f"grid_id {grid.grid_id!r} repeats")
        seen.add(grid.grid_id)
        lines.append(json.dumps(grid_to_dict(grid), separators=(",", ":")))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)
    return len(lines)


def read_grid_set(path: str | Path) -> list[Grid]:
    """Read a grid-set JSONL file; blank lines are skipped.

    Raises :class:`GridSetFormatError` naming the file, line and field of the first problem.
    """
    path = Path(path)
    grids: list[Grid] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise GridSetFormatError(f"{where}: invalid JSON: {err}") from err
            grid = grid_from_dict(record, where=where)
            if grid.grid_id in seen:
                raise _fail(
                    where, "grid_id", f"{grid.grid_id!r} already used on line {seen[grid.grid_id]}"
                )
            seen[grid.grid_id] = line_no
            grids.append(grid)
    return grids


def index_grid_set(path: str | Path) -> dict[str, tuple[int, int]]:
    """``grid_id -> (byte offset, line)`` of every grid of a grid-set file, for reading one
    grid at a time (:func:`read_indexed_grid`); only the ids are looked at (the first line of a
    repeated id wins), each grid is validated when read. :class:`GridSetFormatError`: a line is
    not a JSON object (file and line named).
    """
    path = Path(path)
    offsets: dict[str, tuple[int, int]] = {}
    offset = 0
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            if raw.strip():
                try:
                    grid_id = json.loads(raw).get("grid_id")
                except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
                    raise GridSetFormatError(f"{path}:{line_no}: not a JSON object") from err
                if isinstance(grid_id, str):
                    offsets.setdefault(grid_id, (offset, line_no))
            offset += len(raw)
    return offsets


def read_indexed_grid(path: str | Path, offset: int, line: int) -> Grid:
    """The grid on the line at byte ``offset`` (line number ``line``, for messages) of a
    grid-set file, validated like every line of :func:`read_grid_set`."""
    path = Path(path)
    with path.open("rb") as handle:
        handle.seek(offset)
        raw = handle.readline()
    where = f"{path}:{line}"
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise GridSetFormatError(f"{where}: invalid JSON: {err}") from err
    return grid_from_dict(record, where=where)
