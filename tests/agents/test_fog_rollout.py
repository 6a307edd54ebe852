"""Rollouts on fogged grids with the bundled agent: each step's prompt draws what the episode
has revealed (hidden cells as ``*``) and carries the past moves; the true grid is recorded
beside it; the failure-mode counters read the recorded episode back."""

from __future__ import annotations

import pytest
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.core import Action, State
from goalprobe.gridworld.fog import (
    HIDDEN_SYMBOL,
    failure_modes,
    fog_episode,
    fog_view,
    generate_fog_set,
)
from goalprobe.gridworld.generator import GridSetConfig


@pytest.fixture(scope="module")
def fog_run(tmp_path_factory, bundled_agent):
    model, tokenizer = bundled_agent
    grids = generate_fog_set(GridSetConfig(sizes=(9,), densities=(1.0,), n_per_cell=2, seed=5))
    out = tmp_path_factory.mktemp("fog") / "trajectories.jsonl"
    config = RolloutConfig(episodes_per_grid=1, horizon_steps=3, max_new_tokens=96, seed=3)
    run_rollouts(grids, LocalBackend(model, tokenizer), config, out, progress=False)
    return grids, list(read_trajectories(out))


def test_each_step_draws_the_revealed_map_and_the_history(fog_run):
    grids, trajectories = fog_run
    by_id = {g.grid_id: g for g in grids}
    assert trajectories
    for episode in trajectories:
        grid = by_id[episode.summary.grid_id]
        visited = [grid.initial_state]
        history = []
        for step in episode.steps:
            text, past = fog_view(grid, visited, history)
            assert step.grid_text == text
            assert HIDDEN_SYMBOL in step.grid_text  # a 9 x 9 maze is never seen whole at once
            assert step.true_grid_text is not None and HIDDEN_SYMBOL not in step.true_grid_text
            visited.append(State(step.next_agent_row_col))
            if step.action is not None:
                history.append((step.agent_row_col, Action[step.action]))


def test_recorded_episodes_replay_under_fog(fog_run):
    grids, trajectories = fog_run
    by_id = {g.grid_id: g for g in grids}
    for episode in trajectories:
        grid = by_id[episode.summary.grid_id]
        actions = [Action[s.action] for s in episode.steps if s.action is not None]
        replay = fog_episode(grid, actions)
        assert replay.states[-1].agent == episode.summary.final_agent_row_col
        modes = failure_modes(replay)
        assert modes.steps == len(actions)
        assert 0 <= modes.revisits + modes.into_known_walls + modes.into_known_dead_ends


def test_the_viewer_step_view_draws_the_knowledge_beside_the_true_grid(fog_run):
    import numpy as np
    from goalprobe.gridworld.core import CellType
    from goalprobe.gridworld.fog import free_space_actions, revealed_sets
    from goalprobe.viewer.run_files import FogEpisodes, fog_step_view

    grids, trajectories = fog_run
    fog = FogEpisodes(
        {g.grid_id: g for g in grids},
        {f"{e.summary.grid_id}:{e.summary.episode}": e for e in trajectories},
    )
    key = next(iter(fog.episodes))
    last = len(fog.episodes[key].steps) - 1
    view = fog_step_view(fog, key, last + 5)  # clipped to the episode
    assert view.step == last
    grid = fog.grids[fog.episodes[key].summary.grid_id]
    hidden = np.zeros_like(view.true_types, dtype=bool)
    for cell in view.hidden:
        hidden[cell] = True
    assert hidden.any() and not hidden[view.agent]
    assert (view.shown_types[hidden] == CellType.PADDING).all()
    assert (view.shown_types[~hidden] == view.true_types[~hidden]).all()
    steps = fog.episodes[key].steps
    cells = [grid.start, *(tuple(s.next_agent_row_col) for s in steps[:last])]
    known = revealed_sets(grid, cells)[-1]
    assert view.free_space == free_space_actions(grid, State(view.agent), known, goal_known=False)
