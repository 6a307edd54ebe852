"""Emphasis of the bundled agent's training on its decisive states and tokens
(scripts/agent_training/training_data.py: detour states; training.py: the decision loss)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from agent_fixtures import tiny_training_model
from agent_training.training import (
    TrainingConfig,
    decision_loss,
    training_loss,
)
from agent_training.training_data import (
    TrainingDataConfig,
    encode_batch,
    is_detour_state,
    sample_batch_examples,
    sample_state,
)
from goalprobe.agents.tokenizer import build_tokenizer
from goalprobe.gridworld.core import Action, Grid, State
from goalprobe.gridworld.generator import generate_grid
from goalprobe.gridworld.optimal import solve


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _grid(rows: list[str]) -> Grid:
    """A grid from rows of '#' (wall), '.', 'A' (start) and 'G'."""
    walls = np.array([[ch == "#" for ch in row] for row in rows])
    find = lambda mark: next((r, row.index(mark)) for r, row in enumerate(rows) if mark in row)  # noqa: E731
    return Grid(walls=walls, goal=find("G"), start=find("A"))


def test_detour_state_oracle():
    open_grid = _grid(["#####", "#G..#", "#...#", "#..A#", "#####"])
    policy = solve(open_grid)
    # heading for G (UP or LEFT) is exactly optimal everywhere in an empty room
    for row in range(1, 4):
        for col in range(1, 4):
            if (row, col) != open_grid.goal:
                assert not is_detour_state(open_grid, policy, State(agent=(row, col)))
    # a wall right above A: UP shortens the Manhattan distance but is not optimal
    blocked = _grid(["#######", "#..G..#", "#.###.#", "#..A..#", "#.....#", "#.....#", "#######"])
    policy = solve(blocked)
    assert is_detour_state(blocked, policy, State(agent=(3, 3)))
    assert policy.optimal_actions(State(agent=(3, 3))) == {Action.LEFT, Action.RIGHT}
    assert not is_detour_state(blocked, policy, State(agent=(1, 1)))  # straight RIGHT to G


def test_detour_fraction_concentrates_states_on_detours():
    rng = np.random.default_rng(0)
    grids = []
    while len(grids) < 40:
        grid = generate_grid(9, 0.4, rng)
        if solve(grid).is_solvable:
            grids.append(grid)

    def share(fraction: float, seed: int) -> float:
        draw = np.random.default_rng(seed)
        hits = []
        for grid in grids:
            policy = solve(grid)
            for _ in range(5):
                state = sample_state(grid, policy, 0.3, draw, detour_fraction=fraction)
                hits.append(is_detour_state(grid, policy, state))
        return float(np.mean(hits))

    plain, emphasised = share(0.0, 1), share(1.0, 1)
    assert emphasised > plain + 0.3, (plain, emphasised)


def test_full_detour_fraction_draws_only_detour_states_when_there_are_some():
    grid = _grid(["#######", "#..G..#", "#.###.#", "#..A..#", "#.....#", "#.....#", "#######"])
    policy = solve(grid)
    rng = np.random.default_rng(3)
    # epsilon 0: the episode goes around the wall, through detour and straight states alike
    plain = [sample_state(grid, policy, 0.0, rng) for _ in range(200)]
    emphasised = [sample_state(grid, policy, 0.0, rng, detour_fraction=1.0) for _ in range(200)]
    assert not all(is_detour_state(grid, policy, s) for s in plain)
    assert all(is_detour_state(grid, policy, s) for s in emphasised)


def test_decision_positions_point_at_the_first_planned_move(tokenizer):
    rng = np.random.default_rng(4)
    for key_probability in (0.0, 1.0):
        config = TrainingDataConfig(
            sizes=(5, 7), size_weights=(1.0, 1.0), key_prompt_probability=key_probability
        )
        examples = sample_batch_examples(config, 4, rng)
        batch = encode_batch(examples, tokenizer, tokenizer.pad_token_id)
        for row, example in enumerate(examples):
            at = int(batch.decision_positions[row])
            tokens = tokenizer.convert_ids_to_tokens(batch.suffix_ids[row, at - 2 : at + 1])
            assert tokens == [" Plan", ":", f" {Action(example.plan[0]).name}"]
            assert batch.labels[row, at] == batch.suffix_ids[row, at]  # inside the loss


def test_decision_loss_is_the_first_moves_cross_entropy(tokenizer):
    model = tiny_training_model(tokenizer).eval()
    examples = sample_batch_examples(
        TrainingDataConfig(sizes=(5,), size_weights=(1.0,)), 3, np.random.default_rng(2)
    )
    batch = encode_batch(examples, tokenizer, tokenizer.pad_token_id)
    plain = TrainingConfig(coordinate_loss_weight=0.0, attention_loss_weight=0.0)
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([batch.prefix_ids.expand(3, -1), batch.suffix_ids], 1)
        ).logits[:, batch.prefix_ids.shape[1] :]
        total, parts = training_loss(model, batch, replace(plain, decision_loss_weight=3.0), None)
    expected = 0.0
    for row, example in enumerate(examples):
        at = int(batch.decision_positions[row])
        move = tokenizer.convert_tokens_to_ids(f" {Action(example.plan[0]).name}")
        expected -= torch.log_softmax(logits[row, at - 1], -1)[move].item() / 3
    assert parts["decision_loss"] == pytest.approx(expected, rel=1e-4)
    assert decision_loss(logits, batch).item() == pytest.approx(expected, rel=1e-4)
    assert total.item() == pytest.approx(parts["loss"] + 3.0 * expected, rel=1e-4)
