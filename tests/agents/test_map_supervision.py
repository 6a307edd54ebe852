"""Training-only signals of the map agent (scripts/agent_training/map_supervision.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from agent_training.map_supervision import (
    MapReadout,
    anchor_hooks,
    anchor_positions,
    map_labels,
    move_counterfactual,
)
from agent_training.training import (
    TrainingConfig,
    interchange_loss,
    training_loss,
)
from agent_training.training_data import (
    IGNORE_INDEX,
    TrainingDataConfig,
    encode_batch,
    make_example,
    sample_batch_examples,
    sample_plan,
)
from goalprobe.activations.capture import make_backend
from goalprobe.activations.capture.base import Patch
from goalprobe.agents.bundled import load_bundled_agent
from goalprobe.agents.harmony import HarmonyTokenIds, find_anchors
from goalprobe.agents.reasoning import PLAN_STEPS, describe_neighbours
from goalprobe.gridworld.core import SYMBOLS, Action, CellType
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import cell_types, render


@pytest.fixture(scope="module")
def agent():
    return load_bundled_agent("cpu")


def plain_examples(n: int, seed: int):
    data = TrainingDataConfig(key_prompt_probability=0.0, sizes=(7,), size_weights=(1.0,))
    return sample_batch_examples(data, n, np.random.default_rng(seed))


def test_counterfactual_moves_one_object_to_an_open_cell():
    rng = np.random.default_rng(0)
    for example in plain_examples(12, 1):
        moved = move_counterfactual(example.grid, example.state, rng)
        assert moved is not None
        grid, state = moved
        before, after = cell_types(example.grid, example.state), cell_types(grid, state)
        assert int((before != after).sum()) == 2
        assert solve(grid).optimal_actions(state)
        assert len(render(grid, state)) == len(render(example.grid, example.state))


def test_batch_marks_anchors_grid_and_coordinate_queries(agent):
    _, tokenizer = agent
    examples = plain_examples(3, 2)
    batch = encode_batch(examples, tokenizer, tokenizer.pad_token_id, anchor_routing=True)
    prefix = batch.prefix_ids.shape[1]
    special = HarmonyTokenIds.from_tokenizer(tokenizer)
    anchors = anchor_positions(batch.prompt_lengths.tolist(), prefix)
    for row in range(len(examples)):
        ids = torch.cat([batch.prefix_ids[0], batch.suffix_ids[row]]).tolist()
        expected = find_anchors(ids[: int(batch.prompt_lengths[row])], special).pre_reasoning
        assert (anchors[row] + prefix).tolist() == list(expected)
        grid = batch.grid_keys[row].nonzero().flatten()
        assert int(grid.max()) == expected[0] - 1  # the grid text ends at the anchor
        tokens = tokenizer.convert_ids_to_tokens(ids)
        assert sorted(tokens[i].strip() for i in batch.object_keys[row].nonzero()) == ["A", "G"]
        queries = batch.coordinate_queries[row].nonzero().flatten() + prefix
        assert tokens[int(queries.min())] == "<|channel|>"
        assert tokens[int(queries.max())] == "," and tokens[int(queries.max()) - 5] == " G"
        assert (batch.labels[row, queries - prefix] != IGNORE_INDEX).all()
        completion = (batch.labels[row] != IGNORE_INDEX).nonzero().flatten()
        barred = batch.reasoning_queries[row, completion]
        free = [tokens[int(i) + prefix] for i in completion[~barred]]
        assert free == [" UP", " DOWN", " LEFT", " RIGHT"]  # the neighbour look-ups of Next to A
        lookups = batch.lookups[batch.lookups[:, 0] == row]
        assert lookups[:, 1].tolist() == completion[~barred].tolist()
        (agent_row, agent_col), grid = examples[row].state.agent, examples[row].grid
        named = [tokens[int(k)].strip() for k in lookups[:, 2] if k >= 0]
        neighbours = [
            render(grid, examples[row].state).splitlines()[1 + r].split()[1 + c]
            for r, c in ((agent_row - 1, agent_col), (agent_row + 1, agent_col),
                         (agent_row, agent_col - 1), (agent_row, agent_col + 1))
            if 0 <= r < grid.size and 0 <= c < grid.size
        ]  # fmt: skip
        assert named == neighbours


def test_anchor_hooks_patch_equals_the_toolkit_patch(agent):
    """The interchange objective writes the counterfactual's anchors exactly as `goalprobe patch
    --sites pre_reasoning --layers all` does (goalprobe.activations.capture's hooks backend)."""
    model, tokenizer = agent
    base = plain_examples(1, 3)[0]
    grid, state = move_counterfactual(base.grid, base.state, np.random.default_rng(4))
    counterfactual = make_example(
        grid, state, sample_plan(grid, solve(grid), state, PLAN_STEPS, np.random.default_rng(5))
    )
    ids = {
        name: tokenizer(e.prompt, add_special_tokens=False)["input_ids"]
        for name, e in (("base", base), ("cf", counterfactual))
    }
    n = len(ids["base"])
    assert len(ids["cf"]) == n
    positions = torch.tensor([[n - 3, n - 2, n - 1]])
    layers = tuple(range(model.config.num_hidden_layers))
    with torch.no_grad():
        with anchor_hooks(model, positions, capture=layers) as captured:
            model(input_ids=torch.tensor([ids["cf"]]))
        with anchor_hooks(model, positions, write={k: v for k, v in captured.items()}):
            ours = model(input_ids=torch.tensor([ids["base"]])).logits[0, -1]
    values = torch.stack([captured[layer][0] for layer in layers])
    patch = Patch(layers=layers, positions=positions[0], values=values)
    toolkit = make_backend("hooks", model, tokenizer).patched_logits(ids["base"], [patch])[0]
    torch.testing.assert_close(ours.float(), toolkit.float(), atol=1e-4, rtol=1e-4)
    unpatched = model(input_ids=torch.tensor([ids["base"]])).logits[0, -1]
    assert not torch.allclose(unpatched, ours, atol=1e-3)


def test_map_losses_reach_the_model_and_the_readout(agent):
    model, tokenizer = agent
    model = type(model)(model.config)  # a fresh copy: never train the shipped weights
    model.load_state_dict(agent[0].state_dict())
    model.set_attn_implementation("eager")
    config = replace(
        TrainingConfig(),
        map_loss_weight=1.0,
        interchange_loss_weight=1.0,
        object_attention_weight=1.0,
        anchor_routing=True,
        decision_loss_weight=1.0,
        coordinate_loss_weight=0.0,
    )
    examples = plain_examples(2, 5)
    batch = encode_batch(examples, tokenizer, tokenizer.pad_token_id, anchor_routing=True)
    readout = MapReadout(model.config.hidden_size, config.map_layers)
    total, parts = training_loss(model, batch, config, None, readout, examples)
    cf = interchange_loss(
        model, examples, config, None, readout,
        tokenizer, np.random.default_rng(6), (1, 3),
    )  # fmt: skip
    assert cf is not None
    (total + cf[0]).backward()
    for key in ("map_loss", "object_attention_loss", "attention_loss"):
        assert np.isfinite(parts[key]) and parts[key] > 0, (key, parts)
    assert cf[1]["interchange_loss"] > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in readout.parameters())
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    cells, agents, goals, neighbours, moves = map_labels(
        [e.grid for e in examples], [e.state for e in examples]
    )
    assert cells.shape == (2, 15, 15) and int(cells[0, 14, 14]) == CellType.PADDING
    assert agents.tolist() == [list(e.state.agent) for e in examples]
    for row, example in enumerate(examples):
        # the reasoning's own "Next to A" and the optimal set, from the same labels
        symbols = describe_neighbours(example.grid, example.state).rstrip(".").split()[4::2]
        assert [SYMBOLS[CellType(int(t))] for t in neighbours[row]] == symbols
        optimal = solve(example.grid).optimal_actions(example.state)
        assert {Action(i) for i in moves[row].nonzero().flatten().tolist()} == set(optimal)


def test_log_odds_barrier_vanishes_below_the_floor_and_pushes_when_saturated():
    """The map agent's penalty: zero at or below the floor; above it, a gradient that does not
    vanish when the attention saturates on the barred keys (where ``log w`` alone is flat)."""
    from agent_training.supervision import attention_mass_penalty, mass_penalty

    floor = 1e-3
    low = torch.tensor([5e-4, 1e-3]), torch.tensor([0.9995, 0.999])
    assert mass_penalty(*low, floor).tolist() == [0.0, 0.0]
    # -log(1 - w) for the old form, whatever ``rest`` holds
    torch.testing.assert_close(
        mass_penalty(torch.tensor([0.5]), torch.tensor([0.5])), torch.tensor([float(np.log(2.0))])
    )
    for gap in (2.0, 12.0):  # logit of the one barred key over the one allowed key
        logits = torch.tensor([[gap, 0.0]], requires_grad=True)
        weights = torch.softmax(logits, -1)[None, None]  # (batch, heads, query, key)
        keys = torch.tensor([[True, False]])
        penalty = attention_mass_penalty((weights,), keys, torch.tensor([[True]]), floor)
        assert penalty.item() == pytest.approx(gap - np.log(floor / (1 - floor)), rel=1e-4)
        penalty.backward()
        assert float(logits.grad[0, 0]) == pytest.approx(1.0, rel=1e-3)  # log odds: slope 1


def test_completion_scope_bars_every_completion_token_and_drops_the_lookups(agent):
    _, tokenizer = agent
    config = TrainingConfig(grid_penalty_scope="completion", attention_loss_weight=1.0)
    assert not config.neighbour_lookups and TrainingConfig().neighbour_lookups
    examples = plain_examples(2, 5)
    full = (1, 2, 3)  # the map agent's full-attention blocks (neighbours read in block 2)
    with_lookups = encode_batch(
        examples, tokenizer, tokenizer.pad_token_id, full, anchor_routing=True
    )
    without = encode_batch(
        examples,
        tokenizer,
        tokenizer.pad_token_id,
        full,
        anchor_routing=True,
        neighbour_lookups=False,
    )
    with pytest.raises(ValueError, match="three full-attention layers"):
        encode_batch(examples, tokenizer, 0, (1, 3), anchor_routing=True, neighbour_lookups=False)
    # the only targets dropped are the direction words' look-ups (last full layer, one head)
    dropped = {tuple(t) for t in with_lookups.attention_targets.tolist()} - {
        tuple(t) for t in without.attention_targets.tolist()
    }
    queries = {(row, query) for row, query, _ in with_lookups.lookups.tolist()}
    assert dropped and all((row, query) in queries for _, _, row, query, _ in dropped)
    # instead, the first two anchor tokens read A's in-grid neighbours in the middle full layer,
    # and the direction words read those anchor tokens
    from agent_training.supervision import (
        ANCHOR_NEIGHBOUR_HEADS,
        NEIGHBOUR_HEAD,
        grid_cell_positions,
    )

    added = {tuple(t) for t in without.attention_targets.tolist()} - {
        tuple(t) for t in with_lookups.attention_targets.tolist()
    }
    prefix = without.prefix_ids.shape[1]
    for row, example in enumerate(examples):
        prompt = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
        cells = grid_cell_positions(prompt, example.grid, example.state, tokenizer)
        completion = tokenizer.convert_ids_to_tokens(
            tokenizer(example.completion, add_special_tokens=False)["input_ids"]
        )
        expected = set()
        for action in Action:
            d_row, d_col = action.delta_row_col
            cell = (example.state.agent[0] + d_row, example.state.agent[1] + d_col)
            anchor = len(prompt) - 3 + int(action) // 2  # UP, DOWN -> 1st; LEFT, RIGHT -> 2nd
            if cell in cells:
                head = ANCHOR_NEIGHBOUR_HEADS[int(action) % 2]
                expected.add((2, head, row, anchor - prefix, cells[cell]))
            # the direction word then reads that anchor token in the last full layer
            word = completion.index(f" {action.name}", completion.index(" Next"))
            expected.add((3, NEIGHBOUR_HEAD, row, len(prompt) + word - prefix, anchor))
        assert {t for t in added if t[2] == row} == expected


def test_isolating_the_objects_penalises_the_grid_reading_a_and_g(agent):
    """With ``isolate_objects`` the grid's own tokens are barred from A's and G's cells too: on
    the shipped agent, whose cells after A attend to it, the penalty grows by a positive term."""
    model, tokenizer = agent
    examples = plain_examples(2, 9)
    batch = encode_batch(examples, tokenizer, tokenizer.pad_token_id, anchor_routing=True)
    config = TrainingConfig(
        coordinate_loss_weight=0.0, object_attention_weight=1.0, grid_attention_floor=1e-3
    )
    with torch.no_grad():
        _, plain = training_loss(model, batch, config, None)
        _, isolated = training_loss(model, batch, replace(config, isolate_objects=True), None)
    assert isolated["object_attention_loss"] > plain["object_attention_loss"] + 1e-3, (
        plain,
        isolated,
    )


def test_barrier_weight_ramps_after_the_readout_warmup():
    from agent_training.training import barrier_weight_at

    config = TrainingConfig(object_attention_weight=20.0, readout_warmup_steps=5)
    assert barrier_weight_at(0, config) == 20.0  # no ramp: on at once
    ramped = replace(config, barrier_ramp_steps=10)
    weights = [barrier_weight_at(step, ramped) for step in range(20)]
    assert weights[:5] == [0.0] * 5 and weights[5] == pytest.approx(2.0)
    assert weights[14:] == [20.0] * 6
    assert all(a <= b for a, b in zip(weights, weights[1:], strict=False))


@pytest.mark.parametrize(
    "field",
    [
        {"grid_penalty_scope": "everything"},
        {"grid_attention_floor": 0.0},
        {"grid_attention_floor": 1.5},
        {"barrier_ramp_steps": -1},
    ],
)
def test_training_config_rejects_bad_barrier_settings(field):
    with pytest.raises(ValueError, match=next(iter(field))):
        TrainingConfig(**field)


def test_fixed_tie_break_plans_take_the_first_optimal_move():
    from agent_training.training_data import sample_plan

    examples = plain_examples(6, 13)
    for example in examples:
        policy = solve(example.grid)
        plan = sample_plan(
            example.grid, policy, example.state, 4, np.random.default_rng(0), "first"
        )
        assert plan[0] == min(policy.optimal_actions(example.state))
        # the same plan whatever the random stream
        assert plan == sample_plan(
            example.grid, policy, example.state, 4, np.random.default_rng(99), "first"
        )
    with pytest.raises(ValueError, match="tie_break"):
        sample_plan(examples[0].grid, policy, examples[0].state, 4, np.random.default_rng(0), "x")


def _train_script():
    from agent_fixtures import load_script

    return load_script("train_default_agent")


def test_the_map_recipe_is_the_shipped_agents_three_phases(capsys):
    """``--map`` runs the three phases the shipped map agent's training log records (steps,
    learning rates, ramps, tie-breaks), and refuses single-phase options without
    ``--map-recipe single`` (before loading anything)."""
    import json

    from agent_training.training import TrainingConfig
    from goalprobe.agents.bundled import bundled_agent_dir

    script = _train_script()
    phases = script.map_recipe(TrainingConfig(), TrainingDataConfig())
    log = json.loads((bundled_agent_dir("bundled:map") / "training_log.json").read_text())
    shipped = log["info"]["phases"]
    assert [name for name, _, _ in phases] == [p["name"] for p in shipped]
    for (_, config, data), recorded in zip(phases, shipped, strict=True):
        for field in ("steps", "learning_rate", "barrier_ramp_steps", "seed", "batch_size"):
            assert getattr(config, field) == recorded["training_config"][field], field
        assert data.tie_break == recorded["data_config"]["tie_break"]
        assert config.grid_penalty_scope == "completion" and config.anchor_routing
    assert script.main(["--map", "--tie-break", "first", "--out", "/nonexistent/x"]) == 2
    assert "--tie-break: only with --map --map-recipe single" in capsys.readouterr().err
