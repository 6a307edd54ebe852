"""False-belief grids: the generator, the grid-set schema /2, the rollout's shown grid and the
oracle-belief scoring."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from goalprobe.gridworld.core import CellType, Grid
from goalprobe.gridworld.false_belief import (
    CONTROL,
    FALSE_BELIEF,
    HIDDEN_WALL,
    KINDS,
    PHANTOM_WALL,
    STALE_GOAL,
    FalseBeliefSetConfig,
    differing_cells,
    generate_false_belief_set,
    pair_facts,
    start_optimal,
)
from goalprobe.gridworld.io import (
    GridSetFormatError,
    grid_from_dict,
    grid_to_dict,
    read_grid_set,
    write_grid_set,
)
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import cell_types, render
from hypothesis import given, settings
from hypothesis import strategies as st


def _check_pair(fb: Grid, control: Grid) -> None:
    facts, cfacts = pair_facts(fb), pair_facts(control)
    assert facts["role"] == FALSE_BELIEF and cfacts["role"] == CONTROL
    assert facts["pair_id"] == cfacts["pair_id"]
    assert control.shown is None and fb.shown is not None
    # the control is the same true grid, shown as it is
    assert np.array_equal(control.walls, fb.walls) and control.goal == fb.goal
    assert control.start == fb.start == fb.shown.start
    assert solve(fb).is_solvable and solve(fb.shown).is_solvable
    shown_types, true_types = cell_types(fb.shown), cell_types(fb)
    differs = [tuple(c) for c in facts["differs"]]
    assert differs == differing_cells(fb) and differs
    mask = np.zeros_like(shown_types, dtype=bool)
    for cell in differs:
        mask[cell] = True
    assert np.array_equal(shown_types != true_types, mask)
    kind = facts["kind"]
    for cell in differs:
        pair = (int(shown_types[cell]), int(true_types[cell]))
        if kind == PHANTOM_WALL:
            assert pair == (CellType.WALL, CellType.OPEN)
        elif kind == HIDDEN_WALL:
            assert pair == (CellType.OPEN, CellType.WALL)
        else:
            assert pair in ((CellType.GOAL, CellType.OPEN), (CellType.OPEN, CellType.GOAL))
    if kind == STALE_GOAL:
        assert len(differs) == 2 and np.array_equal(fb.shown.walls, fb.walls)
    else:
        assert fb.shown.goal == fb.goal
    true_first, shown_first = start_optimal(fb), start_optimal(fb.shown)
    assert true_first and shown_first and not true_first & shown_first
    assert facts["true_optimal_start"] == [a.name for a in sorted(true_first)]
    assert facts["shown_optimal_start"] == [a.name for a in sorted(shown_first)]


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    size=st.sampled_from([5, 7, 9]),
    density=st.sampled_from([0.0, 0.2, 0.4]),
)
def test_pairs_differ_exactly_where_stated(seed, size, density):
    grids = generate_false_belief_set(
        FalseBeliefSetConfig(size=size, density=density, pairs_per_kind=2, seed=seed, max_tries=500)
    )
    assert len(grids) == 2 * 2 * len(KINDS)
    assert len({g.grid_id for g in grids}) == len(grids)
    for fb, control in zip(grids[::2], grids[1::2], strict=True):
        _check_pair(fb, control)
    assert [pair_facts(g)["kind"] for g in grids[::4]] == list(KINDS)


def test_generation_is_seeded():
    config = FalseBeliefSetConfig(pairs_per_kind=3, seed=5)
    assert generate_false_belief_set(config) == generate_false_belief_set(config)
    other = generate_false_belief_set(FalseBeliefSetConfig(pairs_per_kind=3, seed=6))
    assert other != generate_false_belief_set(config)


def test_config_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kinds"):
        FalseBeliefSetConfig(kinds=("teleport",))


def test_shown_grid_must_keep_the_start():
    fb = generate_false_belief_set(FalseBeliefSetConfig(pairs_per_kind=1, kinds=(STALE_GOAL,)))[0]
    moved = fb.shown.with_start(_another_open(fb))
    with pytest.raises(ValueError, match="start"):
        Grid(walls=fb.walls, goal=fb.goal, start=fb.start, shown=moved)


def _another_open(grid: Grid):
    n = grid.size
    return next(
        (r, c)
        for r in range(n)
        for c in range(n)
        if not grid.shown.walls[r, c] and (r, c) not in (grid.start, grid.shown.goal)
    )


def test_grid_set_round_trip_with_shown_grids(tmp_path):
    grids = generate_false_belief_set(FalseBeliefSetConfig(pairs_per_kind=2, seed=3))
    path = tmp_path / "fb.jsonl"
    write_grid_set(path, grids)
    back = read_grid_set(path)
    assert back == grids
    assert [g.shown is None for g in back] == [g.shown is None for g in grids]
    for g, b in zip(grids, back, strict=True):
        if g.shown is not None:
            assert render(b.prompt_grid) == render(g.shown)
    # a line must carry shown
    record = grid_to_dict(grids[1])
    record.pop("shown")
    with pytest.raises(GridSetFormatError, match="shown: missing"):
        grid_from_dict(json.loads(json.dumps(record)))


def test_grid_set_rejects_a_bad_shown_grid():
    fb = generate_false_belief_set(FalseBeliefSetConfig(pairs_per_kind=1, kinds=(PHANTOM_WALL,)))[0]
    record = grid_to_dict(fb)
    start = fb.start
    rows = [list(r) for r in record["shown"]["walls"]]
    rows[start[0]][start[1]] = "1"
    record["shown"]["walls"] = ["".join(r) for r in rows]
    with pytest.raises(GridSetFormatError, match="shown"):
        grid_from_dict(record)


# --------------------------------------------------------------------------------------------
# Rollouts on false-belief grids, the trajectory schema /2, the oracle-belief scoring
# --------------------------------------------------------------------------------------------


def _one_pair_per_kind() -> list[Grid]:
    return generate_false_belief_set(FalseBeliefSetConfig(pairs_per_kind=1, seed=11))


def test_oracle_mask_at_the_start_is_the_shown_optimal_set():
    from goalprobe.gridworld.core import Action
    from goalprobe.probes.scoring.false_belief import oracle_optimal_mask

    for grid in _one_pair_per_kind():
        mask = oracle_optimal_mask(grid, grid.initial_state)
        names = [a.name for a in Action if mask[a]]
        assert (
            names == pair_facts(grid)["shown_optimal_start" if grid.shown else "true_optimal_start"]
        )


def test_decoded_cells_tell_shown_from_true():
    from goalprobe.probes.scoring.false_belief import control_cells, decoded_cells, decoded_table

    grids = _one_pair_per_kind()
    rows = []
    for fb, control in zip(grids[::2], grids[1::2], strict=True):
        shown = cell_types(fb.shown, fb.initial_state)
        true = cell_types(fb, fb.initial_state)
        as_shown = decoded_cells(fb, np.eye(len(CellType))[shown])
        assert as_shown and all(r["matches_shown"] and not r["matches_true"] for r in as_shown)
        as_true = decoded_cells(fb, true)
        assert all(r["matches_true"] and not r["matches_shown"] for r in as_true)
        rows += as_shown
        ctl = control_cells(control, fb, true)
        assert len(ctl) == len(as_shown) and all(r["matches_true"] for r in ctl)
        rows += ctl
        with pytest.raises(ValueError, match="not a false-belief grid"):
            decoded_cells(control, true)
    table = decoded_table(rows)
    assert table["all"][FALSE_BELIEF]["matches_shown"]["value"] == 1.0
    assert table["all"][FALSE_BELIEF]["matches_true"]["value"] == 0.0
    assert table["all"][CONTROL]["matches_true"]["value"] == 1.0
    assert set(table) == {*KINDS, "all"}


@pytest.fixture(scope="module")
def fb_rollouts(bundled_agent, tmp_path_factory):
    from goalprobe.agents.local_backend import LocalBackend
    from goalprobe.agents.rollout import RolloutConfig, run_rollouts

    grids = _one_pair_per_kind()
    out = tmp_path_factory.mktemp("fb") / "trajectories.jsonl"
    config = RolloutConfig(
        episodes_per_grid=1, horizon_steps=3, batch_size=6, max_new_tokens=96, seed=2
    )
    run_rollouts(grids, LocalBackend(*bundled_agent), config, out, progress=False)
    return grids, out


@pytest.mark.slow
def test_rollout_shows_the_shown_grid_and_runs_on_the_true_one(fb_rollouts, bundled_agent):
    from goalprobe.agents.trajectories import read_trajectories
    from goalprobe.gridworld.dynamics import step as move

    grids, out = fb_rollouts
    tokenizer = bundled_agent[1]
    by_id = {g.grid_id: g for g in grids}
    episodes = list(read_trajectories(out))
    assert {e.summary.grid_id for e in episodes} == set(by_id)
    n_false = 0
    for episode in episodes:
        grid = by_id[episode.summary.grid_id]
        state = grid.initial_state
        for record in episode.steps:
            assert record.state == state
            assert record.grid_text == render(grid.prompt_grid, state)
            assert record.grid_text in tokenizer.decode(record.prompt_token_ids)
            true_text = render(grid, state)
            if grid.shown is None:
                assert record.true_grid_text is None and record.grid_text == true_text
            else:
                assert record.true_grid_text == true_text != record.grid_text
                n_false += 1
            assert record.optimal_action_set == solve(grid).optimal_actions(state)
            if record.valid:
                state = move(grid, state, record.action_enum)  # the true dynamics
            assert record.next_agent_row_col == state.agent
    assert n_false >= 3


@pytest.mark.slow
def test_oracle_scoring_of_real_rollouts(fb_rollouts):
    from goalprobe.agents.trajectories import read_trajectories
    from goalprobe.probes.scoring.false_belief import Bootstrap, oracle_rows, oracle_table

    grids, out = fb_rollouts
    rows = oracle_rows(read_trajectories(out), {g.grid_id: g for g in grids})
    assert rows
    for r in rows:
        if r["role"] == CONTROL:
            assert r["opt_oracle"] == r["opt_gt"]
        if r["step"] == 0 and r["action"] is not None:
            # first steps: the shown and true optimal sets are disjoint by construction
            assert not (r["follows_shown"] and r["follows_true"])
            if r["role"] == FALSE_BELIEF:
                assert r["follows_shown"] == r["opt_oracle"] and r["follows_true"] == r["opt_gt"]
    table = oracle_table(rows, Bootstrap(n_resamples=50))
    ctl = table["all"][CONTROL]
    assert ctl["acc_oracle"]["value"] == ctl["acc_gt"]["value"]
    fb_rows = [r for r in rows if r["role"] == FALSE_BELIEF]
    assert table["all"][FALSE_BELIEF]["acc_oracle"]["value"] == pytest.approx(
        np.mean([r["opt_oracle"] for r in fb_rows])
    )
    assert table["all"][FALSE_BELIEF]["acc_gt"]["n"] == len(fb_rows)
    assert "difference" in table[PHANTOM_WALL]


def test_trajectory_files_carry_the_true_grid_text(tmp_path):
    from goalprobe.agents.trajectories import TrajectoryFormatError, read_trajectories

    path = _tiny_trajectory(tmp_path)
    episodes = list(read_trajectories(path))
    assert any(s.true_grid_text for e in episodes for s in e.steps)
    lines = path.read_text().splitlines()
    step = next(i for i, line in enumerate(lines) if '"kind":"step"' in line.replace(" ", ""))
    cut = json.loads(lines[step])
    del cut["true_grid_text"]  # a step line without it is refused
    old = tmp_path / "cut.jsonl"
    old.write_text("\n".join([*lines[:step], json.dumps(cut), *lines[step + 1 :]]) + "\n")
    with pytest.raises(TrajectoryFormatError, match="true_grid_text"):
        list(read_trajectories(old))


def _tiny_trajectory(tmp_path):
    """A prompt-only trajectory file of a false-belief pair (no model: a fixed encoder)."""
    from goalprobe.agents.prompt_states import PromptStatesConfig, write_prompt_states

    grids = _one_pair_per_kind()[:2]
    path = tmp_path / "states.jsonl"
    write_prompt_states(
        grids,
        lambda messages, effort: [1, 2, 3],
        PromptStatesConfig(states_per_grid=2),
        path,
        backend_description={"test": "fixed encoder"},
    )
    return path


@pytest.mark.slow
def test_demo_stage_and_report_section_on_the_bundled_agent(tmp_path):
    from goalprobe.agents.agent_config import AgentConfig
    from goalprobe.agents.rollout import RolloutConfig

    from goalprobe.report.page import render_report
    from goalprobe.run_layout import RunLayout
    from goalprobe.sections import ActivationsConfig, FalseBeliefConfig
    from goalprobe.stages import false_belief as stage
    from goalprobe.stages.context import StageContext
    from goalprobe.stages.registry import Settings

    layout = RunLayout(tmp_path)
    section = FalseBeliefConfig(
        grids=FalseBeliefSetConfig(pairs_per_kind=1, seed=4),
        episodes_per_grid=1,
        n_bootstrap=50,
    )
    config = Settings(
        agent=AgentConfig(),
        rollout=RolloutConfig(episodes_per_grid=1, horizon_steps=2, max_new_tokens=96, seed=1),
        activations=ActivationsConfig(),
        false_belief=section,
    )
    from goalprobe.stages import false_belief_rollouts

    # the episodes come from their own stage (generation before any weights load)
    false_belief_rollouts.run(
        StageContext(layout),
        Settings(agent=config.agent, rollout=config.rollout, grids=section.grids),
        tmp_path / "false_belief_rollouts",
    )
    outputs, summary = stage.run(StageContext(layout), config, tmp_path / "false_belief")
    payload = json.loads(outputs["results"].read_text())
    assert payload["schema"] == "goalprobe.false_belief/1"
    assert len(payload["pairs"]) == 3 and summary["steps"] == len(payload["steps"]) > 0
    # no probes stage ran: the probe's reading says why instead of guessing
    assert payload["decoding"] == {
        "available": False,
        "why": "the probes stage left no headline probe",
    }
    assert set(payload["behaviour"]) == {*KINDS, "all"}
    grids = read_grid_set(layout.false_belief_grids)
    assert sum(g.shown is not None for g in grids) == 3
    page = render_report(tmp_path)
    assert "False-belief grids: scoring against a known belief" in page
    assert "Acc. Oracle (all steps)" in page and "no headline probe" in page


def test_prompt_states_at_explicit_states_draw_the_shown_grid(tmp_path):
    from goalprobe.agents.prompt_states import PromptStatesConfig, write_prompt_states
    from goalprobe.agents.trajectories import read_run_header, read_trajectories
    from goalprobe.gridworld.core import State

    fb = _one_pair_per_kind()[0]
    other = _another_open(fb)
    states = {fb.grid_id: [fb.initial_state, State(other, False, True)]}
    path = tmp_path / "explicit.jsonl"
    report = write_prompt_states(
        [fb],
        lambda messages, effort: [7],
        PromptStatesConfig(),
        path,
        backend_description={"test": "fixed encoder"},
        states=states,
    )
    assert report.states_written == 2
    steps = [e.steps[0] for e in read_trajectories(path)]
    assert [s.state for s in steps] == states[fb.grid_id]
    assert [s.grid_text for s in steps] == [render(fb.shown, s) for s in states[fb.grid_id]]
    assert all(s.true_grid_text == render(fb, s.state) for s in steps)
    sampled = _tiny_trajectory(tmp_path)
    assert read_run_header(path).run_id != read_run_header(sampled).run_id


def test_shown_is_part_of_a_grids_identity():
    fb = _one_pair_per_kind()[0]
    plain = replace(fb, shown=None)
    assert fb != plain and hash(fb) != hash(plain)
    assert fb.prompt_grid is fb.shown and plain.prompt_grid is plain
    moved = fb.with_start(_another_open(fb))
    assert moved.shown.start == moved.start != fb.start
