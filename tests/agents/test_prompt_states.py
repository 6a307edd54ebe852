"""Prompt-only states (agents/prompt_states.py, ``goalprobe states``): the same
prompt as a rollout step at the same state, and the same pre-reasoning activations after
extraction as a full replay of that step."""

from __future__ import annotations

import numpy as np
import pytest
from goalprobe.activations.capture import make_backend
from goalprobe.activations.extract import ExtractConfig, extract
from goalprobe.activations.store import ActivationStore
from goalprobe.agents.harmony import encode_prompt
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.prompt_states import (
    PromptStatesConfig,
    is_prompt_only,
    sample_states,
    write_prompt_states,
)
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.trajectories import read_run_header, read_trajectories
from goalprobe.gridworld.core import Variant
from goalprobe.gridworld.dynamics import initial_state
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import write_grid_set
from goalprobe.gridworld.optimal import solve


@pytest.fixture(scope="module")
def agent(bundled_agent):
    return LocalBackend(*bundled_agent)


@pytest.fixture(scope="module")
def grids():
    plain = generate_grid_set(GridSetConfig((7, 9), (0.0, 0.4), 1, seed=3))
    keyed = generate_grid_set(GridSetConfig((7,), (0.4,), 1, variant="key_door", seed=3))
    return plain + keyed


def test_states_are_the_start_then_distinct_reachable_cells(grids):
    for grid in grids:
        states = sample_states(grid, 6, seed=1)
        start = initial_state(grid)
        assert states[0] == start
        cells = [s.agent for s in states]
        assert len(set(cells)) == len(cells) == 6
        policy = solve(grid)
        for s in states:
            assert not grid.walls[s.agent] and s.agent != grid.goal
            assert policy.distance(s) < float("inf")
            assert (s.has_key, s.door_open) == (start.has_key, start.door_open)
        assert sample_states(grid, 6, seed=1) == states  # seeded
        assert sample_states(grid, 10_000, seed=1)[0] == start  # capped by the grid


def test_prompt_only_extraction_equals_a_full_replay_at_the_pre_reasoning_anchors(
    tmp_path, agent, grids
):
    """The start state of every rollout episode and the prompt-only start state get identical
    prompt ids, and extraction stores the same pre-reasoning activations for both (fp16)."""
    rollouts = tmp_path / "rollouts.jsonl"
    run_rollouts(
        grids, agent, RolloutConfig(episodes_per_grid=1, horizon_steps=1, seed=0), rollouts
    )
    states = tmp_path / "states.jsonl"
    report = write_prompt_states(
        grids,
        lambda messages, effort: encode_prompt(agent.tokenizer, messages, effort),
        PromptStatesConfig(states_per_grid=3, seed=0),
        states,
        backend_description={"model": "bundled"},
    )
    assert (report.states_written, report.states_total) == (3 * len(grids), 3 * len(grids))
    again = write_prompt_states(
        grids,
        lambda messages, effort: encode_prompt(agent.tokenizer, messages, effort),
        PromptStatesConfig(states_per_grid=3, seed=0),
        states,
        backend_description={"model": "bundled"},
    )
    assert again.states_written == 0 and again.states_skipped == 3 * len(grids)

    assert is_prompt_only(read_run_header(states)) and not is_prompt_only(read_run_header(rollouts))
    start_of = {e.steps[0].grid_id: e.steps[0] for e in read_trajectories(rollouts)}
    firsts = [e.steps[0] for e in read_trajectories(states) if e.steps[0].episode == 0]
    assert {s.grid_id for s in firsts} == set(start_of)
    for step in firsts:
        assert step.prompt_token_ids == start_of[step.grid_id].prompt_token_ids
        assert step.generated_token_ids == [] and step.action is None and not step.valid
    capture = make_backend("hooks", agent.model, agent.tokenizer)
    config = ExtractConfig(layers=(1, 3), stages=("pre_reasoning",), batch_size=4)
    for path in (rollouts, states):
        extract(path, path.with_suffix(".h5"), capture, agent.tokenizer, config, model_id="bundled")
    with (
        ActivationStore(rollouts.with_suffix(".h5")) as full,
        ActivationStore(states.with_suffix(".h5")) as cheap,
    ):
        full_labels = full.labels(["grid_id", "step"])
        cheap_labels = cheap.labels(["grid_id", "episode", "agent_row_col"])
        assert len(cheap) == 3 * len(grids)
        for grid in grids:
            a = np.flatnonzero(
                (full_labels["grid_id"] == grid.grid_id) & (full_labels["step"] == 0)
            )
            b = np.flatnonzero(
                (cheap_labels["grid_id"] == grid.grid_id) & (cheap_labels["episode"] == 0)
            )
            assert len(a) == len(b) == 1
            assert tuple(cheap_labels["agent_row_col"][b[0]]) == initial_state(grid).agent
            for layer in (1, 3):
                np.testing.assert_allclose(
                    cheap.read("pre_reasoning", layer, b).astype(np.float32),
                    full.read("pre_reasoning", layer, a).astype(np.float32),
                    rtol=2e-3,
                    atol=2e-3,
                )


def test_states_verb_refuses_bad_input_in_one_line(tmp_path, goalprobe_cli, grids):
    path = tmp_path / "grids.jsonl"
    write_grid_set(path, grids)
    out = tmp_path / "states.jsonl"
    ok = goalprobe_cli("states", path, "--out", out, "--per-grid", 2)
    assert ok.exit_code == 0, ok.output
    assert "10 state(s) written" in ok.output
    again = goalprobe_cli("states", path, "--out", out, "--per-grid", 2)
    assert again.exit_code == 2 and "--overwrite" in again.output
    resumed = goalprobe_cli("states", path, "--out", out, "--per-grid", 2, "--resume")
    assert resumed.exit_code == 0 and "10 already there" in resumed.output
    other_run = goalprobe_cli("states", path, "--out", out, "--per-grid", 3, "--resume")
    assert other_run.exit_code == 2 and str(out.name) in other_run.output
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    bad = goalprobe_cli("states", empty, "--out", tmp_path / "s2.jsonl")
    assert bad.exit_code == 2 and "holds no grids" in bad.output
    assert grids[-1].variant == Variant.KEY_DOOR
