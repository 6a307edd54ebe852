"""Grid-set JSONL round trip, error reporting, and the ``goalprobe grids`` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from goalprobe.gridworld.core import Variant
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import (
    SCHEMA,
    GridSetFormatError,
    grid_from_dict,
    grid_to_dict,
    read_grid_set,
    write_grid_set,
)
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import render
from goalprobe.gridworld.variants import generate_key_door_family, rotate90


@pytest.fixture
def grids():
    plain = generate_grid_set(GridSetConfig(sizes=(7, 9), densities=(0.0, 1.0), n_per_cell=2))
    family = generate_key_door_family(9, 0.5, np.random.default_rng(0), grid_id="kd", seed=0)
    turned = rotate90(plain[0]).grid
    return [*plain, family.key_door, turned]


def test_round_trip(tmp_path, grids):
    path = tmp_path / "sub" / "grids.jsonl"
    assert write_grid_set(path, grids) == len(grids)
    back = read_grid_set(path)
    assert back == grids
    for a, b in zip(back, grids, strict=True):
        assert (a.grid_id, a.density, a.seed, a.extra) == (b.grid_id, b.density, b.seed, b.extra)


def test_record_fields(grids):
    grid = grids[-2]  # key_door
    record = grid_to_dict(grid)
    assert record["schema"] == SCHEMA
    assert record["variant"] == Variant.KEY_DOOR
    assert record["key_row_col"] == list(grid.key) and record["door_row_col"] == list(grid.door)
    assert record["text"] == render(grid)
    assert record["shortest_path_length"] == solve(grid).shortest_path_length
    assert record["horizon"] == solve(grid).horizon
    assert len(record["walls"]) == grid.size and set("".join(record["walls"])) <= {"0", "1"}
    json.dumps(record)


def _corrupt(record: dict, **changes) -> dict:
    out = dict(record)
    out.update(changes)
    return out


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"schema": "goalprobe.gridset/0"}, "schema"),
        ({"size": 4}, "size"),
        ({"walls": ["1111111"] * 6}, "walls"),
        ({"start_row_col": [1]}, "start_row_col"),
        ({"goal_row_col": [0, 0]}, "grid"),
        ({"shortest_path_length": 999}, "shortest_path_length"),
        ({"horizon": 1}, "horizon"),
        ({"text": "  0 1\n0 # #"}, "text"),
        ({"density": 1.5}, "density"),
        ({"grid_id": ""}, "grid_id"),
        ({"extra": []}, "extra"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_records_name_file_line_and_field(tmp_path, grids, change, field):
    records = [grid_to_dict(g) for g in grids[:3]]
    records[1] = _corrupt(records[1], **change)
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(GridSetFormatError) as info:
        read_grid_set(path)
    message = str(info.value)
    assert f"{path}:2" in message and f"{field}:" in message


def test_missing_field_invalid_json_and_duplicates(tmp_path, grids):
    record = grid_to_dict(grids[0])
    del record["horizon"]
    with pytest.raises(GridSetFormatError, match="horizon: missing"):
        grid_from_dict(record)
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(grid_to_dict(grids[0])) + "\n\n{not json\n")
    with pytest.raises(GridSetFormatError, match=rf"{path}:3: invalid JSON"):
        read_grid_set(path)
    path.write_text(json.dumps(grid_to_dict(grids[0])) + "\n" + json.dumps(grid_to_dict(grids[0])))
    with pytest.raises(GridSetFormatError, match="already used on line 1"):
        read_grid_set(path)
    with pytest.raises(ValueError, match="repeats"):
        write_grid_set(tmp_path / "dup.jsonl", [grids[0], grids[0]])
    assert not (tmp_path / "dup.jsonl").exists()


def test_cli_writes_grid_set_and_summary(tmp_path, goalprobe_cli):
    out = tmp_path / "grids.jsonl"
    args = ("grids", "--out", out, "--sizes", "7,9", "--densities", "0,1", "--per-cell", 3)
    result = goalprobe_cli(*args, "--seed", 4)
    assert result.exit_code == 0, result.output
    grids = read_grid_set(out)
    assert len(grids) == 12
    assert grids == generate_grid_set(
        GridSetConfig(sizes=(7, 9), densities=(0.0, 1.0), n_per_cell=3, seed=4)
    )
    assert "count / mean" in result.output and "12 grids" in result.output
    tree_9 = [solve(g).shortest_path_length for g in grids if (g.size, g.density) == (9, 1.0)]
    assert f"3 / {np.mean(tree_9):.1f}" in result.output
    # an existing output is never replaced unless asked
    before = out.read_bytes()
    again = goalprobe_cli(*args, "--seed", 5)
    assert again.exit_code == 2 and "--overwrite" in again.output
    assert out.read_bytes() == before
    replaced = goalprobe_cli(*args, "--seed", 5, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert out.read_bytes() != before


def _one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_cli_variant_and_bad_input(tmp_path, goalprobe_cli):
    out = tmp_path / "kd.jsonl"
    result = goalprobe_cli(
        "grids", "--out", out, "--sizes", 7, "--densities", 1, "--per-cell", 2,
        "--variant", "key_door",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert all(g.variant == Variant.KEY_DOOR and g.door is not None for g in read_grid_set(out))
    fresh = tmp_path / "new.jsonl"
    assert "odd" in _one_error_line(goalprobe_cli("grids", "--out", fresh, "--sizes", "8"))
    assert "unknown variant" in _one_error_line(
        goalprobe_cli("grids", "--out", fresh, "--variant", "nope")
    )
    # larger than the activation store's label canvas: refused at the first verb, with the reason
    assert "15 x 15 canvas" in _one_error_line(
        goalprobe_cli("grids", "--out", fresh, "--sizes", 17)
    )
    assert "is a directory" in _one_error_line(goalprobe_cli("grids", "--out", tmp_path))
    assert not fresh.exists()


def test_intervened_start_round_trips(tmp_path, grids):
    from dataclasses import replace

    kd = grids[-2]
    held = replace(kd, grid_id="held", start_has_key=True)
    opened = replace(kd, grid_id="opened", start_door_open=True)
    path = tmp_path / "grids.jsonl"
    write_grid_set(path, [kd, held, opened])
    back = read_grid_set(path)
    assert back == [kd, held, opened] and back[1] != back[0]
    assert back[1].initial_state.has_key and not back[0].initial_state.has_key
    assert back[2].initial_state.door_open and not back[0].initial_state.door_open
    # the held key and the open door render as open cells, as they do later in an episode
    assert "K" not in render(held)
    assert "D" not in render(opened) and "K" in render(opened)
    # a line without the start_* fields is refused (goalprobe.gridset/1 never shipped)
    old = grid_to_dict(kd)
    del old["start_has_key"]
    with pytest.raises(GridSetFormatError, match="start_has_key: missing"):
        grid_from_dict(old)
    bad = grid_to_dict(held)
    bad["start_has_key"] = 1
    with pytest.raises(GridSetFormatError, match="start_has_key"):
        grid_from_dict(bad)
    no_door = grid_to_dict(grids[0])
    no_door["start_door_open"] = True
    with pytest.raises(GridSetFormatError, match="start_door_open needs a door"):
        grid_from_dict(no_door)
