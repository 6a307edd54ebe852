"""Tests of the counterfactual builder: disjoint/identical optimal sets, open cells, alignment."""

from __future__ import annotations

import numpy as np
import pytest
from agent_fixtures import step_record
from goalprobe.gridworld.core import CellType, Grid, State, Variant
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import cell_types, render
from goalprobe.probes.patching.counterfactuals import (
    BaseState,
    CounterfactualConfig,
    base_from_grid,
    base_from_step,
    build_counterfactuals,
    counterfactual_candidates,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def grid_for(seed: int, size: int, density: float) -> Grid:
    rng = np.random.default_rng(seed)
    return generate_grid(size, density, rng, grid_id=f"g{size}-{seed}", min_distance=2)


def check_pair(pair) -> None:
    """Every property a counterfactual pair promises."""
    base = pair.base
    base_types = cell_types(base.grid, base.state)
    cf_types = cell_types(pair.cf_grid, pair.cf_state)
    # the destination was an open cell of the base, and only the two moved cells differ
    assert base_types[pair.to_row_col] == CellType.OPEN
    changed = {(int(r), int(c)) for r, c in np.argwhere(base_types != cf_types)}
    assert changed == {pair.from_row_col, pair.to_row_col}
    moved_type = CellType.AGENT if pair.moved == "agent" else CellType.GOAL
    assert base_types[pair.from_row_col] == moved_type
    assert cf_types[pair.to_row_col] == moved_type
    assert cf_types[pair.from_row_col] == CellType.OPEN
    # same text length, same line structure: positions align
    base_text, cf_text = base.text, pair.cf_text
    assert len(base_text) == len(cf_text)
    assert sum(a != b for a, b in zip(base_text, cf_text, strict=True)) == 2
    # optimal sets recomputed from scratch
    base_opt = solve(base.grid).optimal_actions(base.state)
    cf_opt = solve(pair.cf_grid).optimal_actions(pair.cf_state)
    assert base_opt == pair.base_optimal and cf_opt == pair.cf_optimal
    assert base_opt and cf_opt
    if pair.kind == "disjoint":
        assert base_opt.isdisjoint(cf_opt)
    else:
        assert base_opt == cf_opt


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    size=st.sampled_from([5, 7, 9]),
    density=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_every_candidate_keeps_its_promises(seed, size, density):
    base = base_from_grid(grid_for(seed, size, density))
    pairs = counterfactual_candidates(base)
    for pair in pairs:
        check_pair(pair)
    # completeness: every open cell whose agent move gives a disjoint set is offered
    policy = solve(base.grid)
    base_opt = policy.optimal_actions(base.state)
    expected = {
        (int(r), int(c))
        for r, c in np.argwhere(cell_types(base.grid, base.state) == CellType.OPEN)
        if (opt := policy.optimal_actions(State(agent=(int(r), int(c)))))
        and opt.isdisjoint(base_opt)
    }
    offered = {p.to_row_col for p in pairs if p.moved == "agent" and p.kind == "disjoint"}
    assert offered == expected


def test_open_room_has_both_kinds_and_moves():
    walls = np.zeros((7, 7), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    grid = Grid(walls=walls, goal=(4, 4), start=(2, 2), grid_id="room")
    pairs = counterfactual_candidates(base_from_grid(grid))
    kinds = {(p.moved, p.kind) for p in pairs}
    assert kinds == {
        ("agent", "disjoint"),
        ("agent", "control"),
        ("goal", "disjoint"),
        ("goal", "control"),
    }
    for pair in pairs:
        check_pair(pair)
    # the base's optimal set is {DOWN, RIGHT}; from (4, 1) only RIGHT is optimal: neither kind
    assert all(p.to_row_col != (4, 1) for p in pairs if p.moved == "agent")
    assert any(p.to_row_col == (5, 5) and p.kind == "disjoint" for p in pairs if p.moved == "agent")


def test_key_and_door_cells_are_never_destinations_and_key_is_not_picked_up():
    walls = np.zeros((7, 7), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    walls[3, 1:6] = True
    walls[3, 3] = False
    grid = Grid(
        walls=walls,
        goal=(5, 3),
        start=(1, 1),
        key=(1, 5),
        door=(3, 3),
        variant=Variant.KEY_DOOR,
        grid_id="door",
    )
    base = base_from_grid(grid)
    pairs = counterfactual_candidates(base)
    assert pairs
    for pair in pairs:
        check_pair(pair)
        assert pair.to_row_col not in (grid.key, grid.door)
        assert not pair.cf_state.has_key
        # next to the door without the key is allowed (nothing opens)
        assert pair.cf_state.door_open == base.state.door_open


def test_no_candidates_at_the_goal_or_when_cut_off():
    walls = np.ones((5, 5), dtype=bool)
    walls[1, 1] = walls[1, 3] = walls[3, 3] = False  # three isolated cells
    grid = Grid(walls=walls, goal=(1, 3), start=(1, 1), grid_id="cut")
    assert counterfactual_candidates(base_from_grid(grid)) == []


def test_build_counterfactuals_quotas_and_seed():
    bases = [base_from_grid(grid_for(s, 7, 0.5)) for s in range(6)]
    config = CounterfactualConfig(disjoint_per_move=2, control_per_move=1, random_state=3)
    pairs = build_counterfactuals(bases, config)
    again = build_counterfactuals(bases, config)
    assert [p.pair_id for p in pairs] == [p.pair_id for p in again]
    assert len({p.pair_id for p in pairs}) == len(pairs)
    for base in bases:
        mine = [p for p in pairs if p.base is base]
        candidates = counterfactual_candidates(base)
        for move in ("agent", "goal"):
            for kind, quota in (("disjoint", 2), ("control", 1)):
                available = sum(1 for p in candidates if (p.moved, p.kind) == (move, kind))
                got = sum(1 for p in mine if (p.moved, p.kind) == (move, kind))
                assert got == min(quota, available)
    agent_only = build_counterfactuals(bases, CounterfactualConfig(moves=("agent",)))
    assert {p.moved for p in agent_only} == {"agent"}
    no_control = build_counterfactuals(bases, CounterfactualConfig(control_per_move=0))
    assert {p.kind for p in no_control} == {"disjoint"}
    with pytest.raises(ValueError, match="duplicate base id"):
        build_counterfactuals([bases[0], bases[0]])
    with pytest.raises(ValueError, match="moves"):
        CounterfactualConfig(moves=("key",))


def test_base_from_step_rebuilds_the_state_and_rejects_inconsistent_records():
    grid = grid_for(1, 7, 0.5)
    _, actions = solve(grid).optimal_trajectory()
    state = State(agent=grid.start)
    from goalprobe.gridworld.dynamics import step as take

    state = take(grid, take(grid, state, actions[0]), actions[1])
    base = base_from_step(step_record(grid, state))
    assert isinstance(base, BaseState)
    assert base.state == state and base.grid.goal == grid.goal
    assert np.array_equal(base.grid.walls, grid.walls)
    assert base.base_id == f"run/{grid.grid_id}/0/2"
    assert base.prompt_token_ids == (1, 2, 3) and base.generated_token_ids == (4, 5)
    for pair in counterfactual_candidates(base):
        check_pair(pair)
    with pytest.raises(ValueError, match="agent_row_col"):
        base_from_step(step_record(grid, state, agent_row_col=grid.goal), where="f.jsonl:7")


def test_prompts_of_a_pair_tokenise_to_the_same_length():
    from goalprobe.agents.harmony import render_prompt
    from goalprobe.agents.prompts import build_messages
    from goalprobe.agents.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    bases = [base_from_grid(grid_for(s, size, 0.5)) for s in range(3) for size in (5, 11)]
    pairs = build_counterfactuals(bases)
    assert pairs

    def ids(grid, state):
        messages = build_messages(render(grid, state), variant=grid.variant, has_key=False)
        return tokenizer.encode(render_prompt(messages), add_special_tokens=False)

    for pair in pairs:
        base_ids = ids(pair.base.grid, pair.base.state)
        cf_ids = ids(pair.cf_grid, pair.cf_state)
        assert len(base_ids) == len(cf_ids)
        assert sum(a != b for a, b in zip(base_ids, cf_ids, strict=True)) == 2
