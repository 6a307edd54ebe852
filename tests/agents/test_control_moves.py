"""scripts/measure_control_moves.py on trajectories made by hand: an agent that follows the true
optimal policy, and one that walks into the wall in front of it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from agent_fixtures import load_script
from goalprobe.gridworld.core import Action, Grid, State, Variant
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import render


def _script():
    return load_script("measure_control_moves")


def _grid(index: int) -> Grid:
    walls = np.zeros((7, 7), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    walls[2, 1:5] = True  # G below a wall: the straight move up from A is blocked
    return Grid(walls=walls, goal=(1, 1), start=(4, 1), variant=Variant.PLAIN, density=0.2,
                grid_id=f"g{index}")  # fmt: skip


def _step(grid: Grid, agent: tuple[int, int], action: Action, step: int) -> dict:
    return {
        "kind": "step", "variant": "plain", "valid": True, "grid_id": grid.grid_id,
        "grid_size": grid.size, "density": grid.density, "step": step,
        "grid_text": render(grid, State(agent=agent)), "agent_row_col": list(agent),
        "goal_row_col": list(grid.goal), "action": action.name,
        "reasoning": f"A is at ({agent[0]}, {agent[1]}). G is at (1, 1). Plan: UP.",
    }  # fmt: skip


def _write(path: Path, bump: bool) -> None:
    lines = []
    for index in range(6):
        grid = _grid(index)
        policy = solve(grid)
        state, agent = State(agent=grid.start), grid.start
        for step in range(3):
            action = Action(sorted(policy.optimal_actions(state))[0])
            if bump and step == 0:
                lines.append(_step(grid, (3, 1), Action.UP, step))  # into the wall at (2, 1)
                continue
            lines.append(_step(grid, agent, action, step))
            d_row, d_col = action.delta_row_col
            agent = (agent[0] + d_row, agent[1] + d_col)
            state = State(agent=agent)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")


def test_an_optimal_agent_follows_the_true_walls_and_never_bumps(tmp_path, capsys):
    _write(tmp_path / "t.jsonl", bump=False)
    assert _script().main([str(tmp_path / "t.jsonl"), "--prior-per-cell", "2",
                           "--out", str(tmp_path / "o.json")]) == 0  # fmt: skip
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["true"]["value"] == 1.0 and out["bumps"]["value"] == 0.0
    assert out["grids"] == 6 and out["steps"] == 18
    assert out["misreads_by_size"]["7"]["agent"] == 0.0


def test_a_bump_into_a_named_wall_counts_against_every_map_that_holds_it(tmp_path, capsys):
    _write(tmp_path / "t.jsonl", bump=True)
    assert _script().main([str(tmp_path / "t.jsonl"), "--prior-per-cell", "2",
                           "--out", str(tmp_path / "o.json")]) == 0  # fmt: skip
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["bumps"]["value"] == pytest.approx(1 / 3)
    # blocked (the one move toward G is the wall) at (3, 1) twice a grid: bumped once, once not
    assert out["bumps_when_blocked"]["value"] == 0.5
    assert out["true"]["value"] == pytest.approx(2 / 3)
    assert out["near"]["value"] == pytest.approx(2 / 3)  # the wall is next to A: near holds it


def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        _script().main([str(tmp_path / "missing.jsonl")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: ")
    (tmp_path / "bad.jsonl").write_text('{"kind": "step"}\n', encoding="utf-8")
    with pytest.raises(SystemExit) as stop:
        _script().main([str(tmp_path / "bad.jsonl"), "--prior-per-cell", "1"])
    assert stop.value.code == 2
    assert "not a trajectory JSONL" in capsys.readouterr().err
