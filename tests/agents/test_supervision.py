"""The bundled agent's auxiliary training signals (scripts/agent_training/supervision.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from agent_fixtures import tiny_training_model
from agent_training.supervision import (
    NEIGHBOUR_HEAD,
    OBJECT_HEAD,
    CoordinateReadout,
    attention_loss,
    attention_targets,
    grid_cell_positions,
)
from agent_training.training import (
    TrainingConfig,
    shared_prefix_loss,
    train,
    training_loss,
)
from agent_training.training_data import (
    IGNORE_INDEX,
    TrainingDataConfig,
    encode_batch,
    sample_batch_examples,
)
from goalprobe.agents.tokenizer import build_tokenizer
from goalprobe.gridworld.core import SYMBOLS, Action, CellType
from goalprobe.gridworld.text import cell_types


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _examples(key_probability: float, seed: int, n: int = 4, sizes=(5, 7, 11)):
    config = TrainingDataConfig(
        sizes=sizes, size_weights=(1.0,) * len(sizes), key_prompt_probability=key_probability
    )
    return sample_batch_examples(config, n, np.random.default_rng(seed))


@pytest.mark.parametrize("key_probability", [0.0, 1.0])
def test_cell_positions_point_at_each_cells_symbol(tokenizer, key_probability):
    for example in _examples(key_probability, seed=3):
        ids = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
        tokens = tokenizer.convert_ids_to_tokens(ids)
        positions = grid_cell_positions(ids, example.grid, example.state, tokenizer)
        types = cell_types(example.grid, example.state)
        n = example.grid.size
        assert len(positions) == n * n
        for (row, col), index in positions.items():
            assert tokens[index].strip() == SYMBOLS[CellType(types[row, col])]
            # the row label opens each row; the cell is col + 1 tokens after it
            assert tokens[index - col - 1] == str(row)
        # the grid of the prompt, not the instructions' example grid (which comes earlier)
        assert min(positions.values()) > tokens.index("Current")


def test_cell_positions_reject_a_prompt_without_the_grid(tokenizer):
    example, other = _examples(0.0, seed=4, n=2, sizes=(7,))
    ids = tokenizer(other.prompt, add_special_tokens=False)["input_ids"]
    assert (other.grid, other.state) != (example.grid, example.state)  # seeded: two grids
    with pytest.raises(ValueError, match="not a token run"):
        grid_cell_positions(ids, example.grid, example.state, tokenizer)


@pytest.mark.parametrize("key_probability", [0.0, 1.0])
def test_attention_targets_look_at_the_named_cells(tokenizer, key_probability):
    layers = [1, 3]
    for example in _examples(key_probability, seed=5):
        prompt = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
        completion = tokenizer(example.completion, add_special_tokens=False)["input_ids"]
        tokens = tokenizer.convert_ids_to_tokens(prompt + completion)
        positions = grid_cell_positions(prompt, example.grid, example.state, tokenizer)
        targets = attention_targets(
            completion, len(prompt), positions, example.grid, example.state, tokenizer, layers
        )
        named = {"A": example.state.agent, "G": example.grid.goal}
        if example.grid.key is not None and not example.state.has_key:
            named["K"] = example.grid.key
        if example.grid.door is not None and not example.state.door_open:
            named["D"] = example.grid.door
        object_targets = [t for t in targets if t.head != NEIGHBOUR_HEAD]
        # two queries ("(" and ",") per named object, on every full-attention layer
        assert len(object_targets) == 2 * len(named) * len(layers)
        for target in object_targets:
            assert target.query >= len(prompt)  # queries are completion tokens
            assert tokens[target.query] in (" (", ",")
            # the query's coordinate is the attended cell's coordinate
            row_or_col = tokens[target.query + 1].strip()
            cell = next(c for c, index in positions.items() if index == target.key)
            assert int(row_or_col) == (cell[0] if tokens[target.query] == " (" else cell[1])
            opening = target.query if tokens[target.query] == " (" else target.query - 2
            name = tokens[opening - 3].strip()
            assert named[name] == cell and target.head == OBJECT_HEAD[name]
        neighbour_targets = [t for t in targets if t.head == NEIGHBOUR_HEAD]
        to_agent = [t for t in neighbour_targets if t.layer == layers[0]]
        assert len(to_agent) == 4
        assert all(t.key == positions[example.state.agent] for t in to_agent)
        for target in (t for t in neighbour_targets if t.layer == layers[-1]):
            action = Action[tokens[target.query].strip()]
            d_row, d_col = action.delta_row_col
            row, col = example.state.agent
            assert target.key == positions[(row + d_row, col + d_col)]
            # the reasoning's next word is the symbol at that cell
            assert tokens[target.query + 1] == tokens[target.key]


def test_attention_loss_is_mean_negative_log_weight():
    attentions = tuple(torch.full((2, 3, 4, 6), 0.1) for _ in range(2))
    attentions[1][1, 2, 3, 5] = 0.5
    attentions[0][0, 1, 0, 0] = 0.25
    targets = torch.tensor([[1, 2, 1, 3, 5], [0, 1, 0, 0, 0]])
    loss = attention_loss(attentions, targets)
    expected = -(np.log(0.5 + 1e-6) + np.log(0.25 + 1e-6)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert attention_loss(attentions, torch.zeros((0, 5), dtype=torch.long)).item() == 0.0


def test_coordinate_readout_ignores_non_cell_tokens():
    torch.manual_seed(0)
    readout = CoordinateReadout(hidden_size=8, max_size=5)
    hidden = torch.randn(2, 4, 8)
    rows = torch.full((2, 4), IGNORE_INDEX)
    cols = rows.clone()
    rows[0, 1], cols[0, 1] = 3, 2
    logits = readout.linear(hidden[0, 1])
    expected = -(torch.log_softmax(logits[:5], -1)[3] + torch.log_softmax(logits[5:], -1)[2])
    torch.testing.assert_close(readout.loss(hidden, rows, cols), expected)


def test_training_loss_adds_the_weighted_auxiliary_terms(tokenizer):
    model = tiny_training_model(tokenizer).eval()
    model.set_attn_implementation("eager")
    examples = _examples(1.0, seed=6, n=3, sizes=(5,))
    batch = encode_batch(examples, tokenizer, tokenizer.pad_token_id, full_attention_layers=(1,))
    assert batch.attention_targets.shape[1] == 5 and len(batch.attention_targets) > 0
    assert (batch.cell_rows != IGNORE_INDEX).sum() > 0
    readout = CoordinateReadout(32, 5)
    plain = TrainingConfig(coordinate_loss_weight=0.0, attention_loss_weight=0.0)
    total, parts = training_loss(model, batch, plain, None)
    torch.testing.assert_close(total, shared_prefix_loss(model, batch))
    assert set(parts) == {"loss", "answer_accuracy"}
    weighted = replace(plain, coordinate_loss_weight=0.5, attention_loss_weight=2.0)
    total, parts = training_loss(model, batch, weighted, readout)
    expected = parts["loss"] + 0.5 * parts["coordinate_loss"] + 2.0 * parts["attention_loss"]
    assert total.item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="CoordinateReadout"):
        training_loss(model, batch, weighted, None)


def test_auxiliary_training_lowers_both_auxiliary_losses(tokenizer):
    model = tiny_training_model(tokenizer)
    original = model.config._attn_implementation
    data = TrainingDataConfig(sizes=(5,), size_weights=(1.0,), key_prompt_probability=0.0)
    config = TrainingConfig(steps=30, batch_size=4, warmup_steps=5, learning_rate=1e-2)
    log = train(model, tokenizer, config, data)
    first = np.mean([r["attention_loss"] for r in log[:5]])
    last = np.mean([r["attention_loss"] for r in log[-5:]])
    assert last < first - 0.5, (first, last)
    assert np.mean([r["coordinate_loss"] for r in log[-5:]]) < log[0]["coordinate_loss"]
    assert model.config._attn_implementation == original and not model.training


def test_attention_supervision_needs_enough_heads(tokenizer):
    model = tiny_training_model(tokenizer, heads=2)
    data = TrainingDataConfig(sizes=(5,), size_weights=(1.0,))
    with pytest.raises(ValueError, match="at least 3 heads"):
        train(model, tokenizer, TrainingConfig(steps=1, batch_size=2), data)
