"""Fogged grids (goalprobe.gridworld.fog): visibility rules as properties, the free-space
planner, and the failure-mode counters on constructed episodes."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.core import Action, Grid, State
from goalprobe.gridworld.fog import (
    HIDDEN_SYMBOL,
    bresenham,
    failure_modes,
    fog_accuracy,
    fog_episode,
    free_space_actions,
    free_space_episode,
    known_dead_end,
    line_of_sight,
    render_fogged,
    visible_cells,
)
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.optimal import solve
from hypothesis import given, settings
from hypothesis import strategies as st

U, D, L, R = Action.UP, Action.DOWN, Action.LEFT, Action.RIGHT


def grid_from(rows: list[str]) -> Grid:
    """A grid from its picture; rows of walls are added below to make it square."""
    width = len(rows[0])
    rows = rows + ["#" * width] * (width - len(rows))
    walls = np.array([[ch == "#" for ch in row] for row in rows])
    find = {ch: (r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "AG"}
    return Grid(walls=walls, start=find["A"], goal=find["G"], grid_id="constructed")


grids = st.builds(
    lambda size, density, seed: generate_grid(size, density, np.random.default_rng(seed)),
    size=st.sampled_from([5, 7, 9, 11]),
    density=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)


def test_bresenham_is_a_connected_line_with_both_ends():
    line = bresenham((0, 0), (2, 5))
    assert line[0] == (0, 0) and line[-1] == (2, 5)
    for (r0, c0), (r1, c1) in zip(line, line[1:], strict=False):
        assert max(abs(r1 - r0), abs(c1 - c0)) == 1


@settings(max_examples=40, deadline=None)
@given(grid=grids, data=st.data())
def test_visibility_never_passes_a_wall_and_stays_in_the_radius(grid, data):
    open_cells = [tuple(map(int, rc)) for rc in np.argwhere(~grid.walls)]
    viewer = data.draw(st.sampled_from(open_cells))
    radius = data.draw(st.integers(0, 4))
    seen = visible_cells(grid, viewer, radius)
    assert viewer in seen
    for cell in seen:
        assert max(abs(cell[0] - viewer[0]), abs(cell[1] - viewer[1])) <= radius
        lines = (bresenham(viewer, cell), bresenham(cell, viewer))
        assert any(not any(grid.walls[c] for c in line[1:-1]) for line in lines)
    # the four neighbours are always visible (nothing lies between)
    for action in Action:
        dr, dc = action.delta_row_col
        cell = (viewer[0] + dr, viewer[1] + dc)
        if radius >= 1 and 0 <= cell[0] < grid.size and 0 <= cell[1] < grid.size:
            assert cell in seen


@settings(max_examples=40, deadline=None)
@given(grid=grids, data=st.data())
def test_visibility_between_open_cells_is_symmetric(grid, data):
    open_cells = [tuple(map(int, rc)) for rc in np.argwhere(~grid.walls)]
    a = data.draw(st.sampled_from(open_cells))
    b = data.draw(st.sampled_from(open_cells))
    assert line_of_sight(grid.walls, a, b) == line_of_sight(grid.walls, b, a)
    assert (b in visible_cells(grid, a)) == (a in visible_cells(grid, b))


@settings(max_examples=30, deadline=None)
@given(grid=grids, actions=st.lists(st.sampled_from(list(Action)), max_size=25))
def test_revealed_sets_only_grow_and_hold_what_each_step_sees(grid, actions):
    episode = fog_episode(grid, actions)
    for t, revealed in enumerate(episode.revealed):
        assert visible_cells(grid, episode.states[t].agent) <= revealed
        if t:
            assert episode.revealed[t - 1] <= revealed


def test_a_wall_hides_what_lies_behind_it():
    grid = grid_from(
        [
            "#######",
            "#A#___#",
            "#_#_G_#",
            "#_____#",
            "#######",
        ]
    )
    seen = visible_cells(grid, (1, 1))
    assert (1, 2) in seen  # the wall itself is seen
    assert (1, 3) not in seen  # what lies straight behind it is not
    text = render_fogged(grid, grid.initial_state, seen).splitlines()
    assert text[2].split()[1:4] == ["#", "A", "#"]
    assert text[2].split()[4] == HIDDEN_SYMBOL


def test_render_fogged_shows_one_token_per_cell_and_the_goal_only_once_seen():
    grid = grid_from(["###########", "#A_______G#"])
    state = grid.initial_state
    seen = visible_cells(grid, state.agent)
    rows = render_fogged(grid, state, seen).splitlines()
    assert all(len(row.split()) == grid.size + 1 for row in rows[1:])
    assert "G" not in rows[2]
    assert "G" in render_fogged(grid, state, seen | {grid.goal}).splitlines()[2]


@settings(max_examples=25, deadline=None)
@given(grid=grids)
def test_free_space_planner_equals_the_optimal_policy_once_everything_is_revealed(grid):
    everything = frozenset((r, c) for r in range(grid.size) for c in range(grid.size))
    policy = solve(grid)
    for r, c in np.argwhere(~grid.walls)[:20]:
        state = State(agent=(int(r), int(c)))
        if state.agent == grid.goal:
            continue
        assert free_space_actions(grid, state, everything) == policy.optimal_actions(state)


@settings(max_examples=25, deadline=None)
@given(grid=grids)
def test_free_space_planner_reaches_the_goal(grid):
    episode = free_space_episode(grid, horizon=4 * grid.size * grid.size)
    assert episode.states[-1].agent == grid.goal
    hits, moves = fog_accuracy(episode)
    assert hits == moves


DEAD_END = [
    "#########",
    "#___#___#",
    "#_#_#_#_#",
    "#_#A__#G#",
    "#########",
]


def test_failure_modes_on_a_constructed_episode():
    grid = grid_from(DEAD_END)
    # LEFT into the open pocket (3,2)? (3,2) is a wall: a move into a known wall
    # then RIGHT, LEFT: backtracking onto a visited cell
    episode = fog_episode(grid, [L, R, L, U, D])
    modes = failure_modes(episode)
    assert modes.steps == 5
    assert modes.into_known_walls == 1  # the first LEFT, into the revealed wall at (3, 2)
    assert modes.revisits == 2  # back to (3, 3) after RIGHT->LEFT, and after UP->DOWN


def test_a_known_dead_end_is_one_with_nothing_hidden_and_no_goal():
    grid = grid_from(
        [
            "#######",
            "#_#####",
            "#_#####",
            "#A___G#",
            "#######",
        ]
    )
    everything = frozenset((r, c) for r in range(grid.size) for c in range(grid.size))
    assert known_dead_end(grid, (3, 1), (2, 1), everything)  # the corridor up leads nowhere
    assert not known_dead_end(grid, (3, 1), (3, 2), everything)  # towards the goal
    # with the corridor's end still hidden, going up is exploration, not a known dead end
    assert not known_dead_end(grid, (3, 1), (2, 1), everything - {(1, 1)})


def test_failure_modes_of_the_free_space_planner_have_no_wall_bumps():
    rng = np.random.default_rng(3)
    for _ in range(10):
        grid = generate_grid(9, 0.7, rng)
        episode = free_space_episode(grid, horizon=200)
        modes = failure_modes(episode)
        assert modes.into_known_walls == 0 and modes.into_known_dead_ends == 0


def test_fog_refuses_key_door_grids():
    grid = grid_from(["#####", "#A_G#", "#####"])
    keyed = Grid(walls=grid.walls, start=grid.start, goal=grid.goal, key=(1, 2))
    with pytest.raises(ValueError, match="plain layouts"):
        fog_episode(keyed, [R])
