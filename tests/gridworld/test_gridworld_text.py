"""Text format: rendering, exact parsing, and errors that name line and column."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.gridworld.core import CellType, Grid, State, Variant
from goalprobe.gridworld.dynamics import step
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import GridParseError, cell_types, padded_cell_types, parse, render
from goalprobe.gridworld.variants import generate_variant
from hypothesis import given, settings
from hypothesis import strategies as st

SMALL = Grid(
    walls=np.array(
        [
            [1, 1, 1, 1, 1],
            [1, 0, 0, 0, 1],
            [1, 0, 0, 0, 1],
            [1, 0, 0, 0, 1],
            [1, 1, 1, 1, 1],
        ],
        dtype=bool,
    ),
    goal=(1, 3),
    start=(2, 1),
)


def test_render_matches_study_format():
    assert render(SMALL) == (
        "  0 1 2 3 4\n0 # # # # #\n1 # _ _ G #\n2 # A _ _ #\n3 # _ _ _ #\n4 # # # # #"
    )


def test_every_cell_and_index_is_one_space_separated_token():
    grid = generate_grid(13, 0.4, np.random.default_rng(0))
    lines = render(grid).split("\n")
    assert lines[0] == "  " + " ".join(str(c) for c in range(13))
    for row, line in enumerate(lines[1:]):
        tokens = line.split(" ")
        assert tokens[0] == str(row)
        assert len(tokens) == 14 and all(len(t) == 1 for t in tokens[1:])


@settings(max_examples=60, deadline=None)
@given(
    variant=st.sampled_from(
        [Variant.PLAIN, Variant.KEY_DOOR, Variant.KEY_NO_DOOR, Variant.TWO_PATH_KEY]
    ),
    size=st.sampled_from([5, 7, 11, 15]),
    density=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip_initial_state(variant, size, density, seed):
    grid = generate_variant(variant, size, density, np.random.default_rng(seed))
    parsed, state = parse(render(grid), variant=grid.variant)
    assert parsed == grid
    assert state == State(agent=grid.start, has_key=False, door_open=grid.door is None)
    assert render(parsed, state) == render(grid)


@settings(max_examples=40, deadline=None)
@given(
    variant=st.sampled_from([Variant.PLAIN, Variant.KEY_DOOR, Variant.TWO_PATH_KEY]),
    seed=st.integers(0, 2**32 - 1),
    actions=st.lists(st.integers(0, 3), max_size=30),
)
def test_later_states_render_parse_render(variant, seed, actions):
    grid = generate_variant(variant, 9, 0.5, np.random.default_rng(seed))
    state = solve(grid).start_state
    for a in actions:
        if state.agent == grid.goal:
            break
        state = step(grid, state, a)
    if state.agent == grid.goal:
        return  # the agent hides the goal; episodes end there
    text = render(grid, state)
    parsed, parsed_state = parse(text)
    assert render(parsed, parsed_state) == text
    assert parsed_state.agent == state.agent
    assert ("K" in text) == (grid.key is not None and not state.has_key)
    assert ("D" in text) == (grid.door is not None and not state.door_open)


def test_parse_accepts_unindented_header_and_trailing_newline():
    text = render(SMALL)
    grid, _ = parse(text.lstrip() + "\n")
    assert grid == SMALL
    grid, _ = parse(text.replace("\n", "\r\n"))
    assert grid == SMALL


def test_cell_types_and_padding():
    types = cell_types(SMALL)
    assert types[2, 1] == CellType.AGENT and types[1, 3] == CellType.GOAL
    assert types[0, 0] == CellType.WALL and types[2, 2] == CellType.OPEN
    padded = padded_cell_types(SMALL)
    assert padded.shape == (15, 15)
    assert (padded[:5, :5] == types).all() and (padded[5:] == CellType.PADDING).all()


GOOD = render(SMALL).split("\n")


def _with(line_index: int, new: str) -> str:
    lines = list(GOOD)
    lines[line_index] = new
    return "\n".join(lines)


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        (_with(0, "  0 1 2 4 3"), 1, 9, "header"),
        (_with(2, "1 # _ _ G"), 3, 10, "ragged"),
        (_with(2, "1 # _ _ G # _"), 3, 13, "ragged"),
        (_with(3, "2 # A x _ #"), 4, 7, "unknown symbol 'x'"),
        (_with(3, "2 # A  _ #"), 4, 7, "one space"),
        (_with(3, "2 # A _ _ # "), 4, 12, "trailing space"),
        (_with(4, "4 # _ _ _ #"), 5, 1, "row index 3"),
        (_with(3, "2 # A A _ #"), 4, 7, "second agent"),
        (_with(1, "0 # # G # #"), 3, 9, "second goal"),
        ("\n".join(GOOD[:-1]), 5, None, "5 rows"),
        ("\n".join([*GOOD, "5 # # # # #"]), 7, None, "5 rows"),
    ],
)
def test_parse_errors_name_line_and_column(text, line, column, fragment):
    with pytest.raises(GridParseError, match=fragment) as info:
        parse(text)
    assert info.value.line == line
    assert info.value.column == column
    assert f"line {line}" in str(info.value)


def test_parse_errors_without_location():
    with pytest.raises(GridParseError, match="no agent"):
        parse(_with(3, "2 # _ _ _ #"))
    with pytest.raises(GridParseError, match="no goal"):
        parse(_with(2, "1 # _ _ _ #"))
    with pytest.raises(GridParseError, match="empty"):
        parse("")
    assert issubclass(GridParseError, ValueError)
