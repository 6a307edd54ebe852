"""The map agent's walls recipe: the copy line of the cells within two steps of A, its attention
targets, the read-outs and the prior-uncertainty weights (scripts/agent_training/)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from agent_training.map_supervision import (
    MapReadout,
    NearReadout,
    near_labels,
    prior_uncertainty,
    prior_wall_frequency,
)
from agent_training.supervision import ANCHOR_QUERIES, NEAR_ANCHOR_SLOTS, NEIGHBOUR_HEAD
from agent_training.training import TrainingConfig, training_loss
from agent_training.training_data import (
    TrainingDataConfig,
    encode_batch,
    sample_batch_examples,
)
from goalprobe.agents.bundled import load_bundled_agent
from goalprobe.agents.reasoning import (
    NEAR_OFFSETS,
    NEAR_PREFIX,
    describe_near,
    parse_near,
    reasoning_text,
)
from goalprobe.agents.tokenizer import unknown_pieces
from goalprobe.gridworld.core import Action, CellType, Grid, State, Variant
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.text import cell_types


@pytest.fixture(scope="module")
def map_agent():
    return load_bundled_agent("cpu", "bundled:map")


def _open_grid(n: int = 7) -> Grid:
    walls = np.zeros((n, n), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    walls[3, 3] = True
    return Grid(walls=walls, goal=(5, 5), start=(1, 2), variant=Variant.PLAIN, density=0.0)


def test_copy_line_round_trips_and_names_outside_cells_walls():
    grid = _open_grid()
    state = State(agent=(1, 2))
    text = reasoning_text(grid, state, (Action.DOWN,), key_variant=False, near=True)
    assert NEAR_PREFIX in text and text.index(NEAR_PREFIX) < text.index("Plan:")
    named = parse_near(text)
    types = cell_types(grid, state)
    expected = []
    for d_row, d_col in NEAR_OFFSETS:
        r, c = 1 + d_row, 2 + d_col
        expected.append(CellType(types[r, c]) if 0 <= r < 7 and 0 <= c < 7 else CellType.WALL)
    assert named == expected
    assert named[0] == CellType.WALL  # (-2, 0) lies outside the grid
    assert named[10] == CellType.OPEN  # (1, 1): (2, 3) is open
    # the line is absent by default, and a cut-off line leaves the missing symbols None
    assert parse_near(reasoning_text(grid, state, (Action.DOWN,), key_variant=False)) is None
    cut = describe_near(grid, state)[: len(NEAR_PREFIX) + 8]
    assert parse_near(cut)[:4] == expected[:4] and parse_near(cut)[4:] == [None] * 8


def test_copy_line_needs_no_new_tokens():
    grid, state = _open_grid(), State(agent=(1, 2))
    text = reasoning_text(grid, state, (Action.DOWN,), key_variant=False, near=True)
    for name in ("bundled", "bundled:map"):
        _, tokenizer = load_bundled_agent("cpu", name)
        assert unknown_pieces(tokenizer, text) == []


def test_near_targets_point_at_the_cells_and_the_anchors(map_agent):
    _, tokenizer = map_agent
    data = TrainingDataConfig(key_prompt_probability=0.0, sizes=(9,), size_weights=(1.0,))
    examples = sample_batch_examples(replace(data, near_line=True), 6, np.random.default_rng(3))
    batch = encode_batch(
        examples, tokenizer, tokenizer.pad_token_id, (1, 2, 3),
        anchor_routing=True, neighbour_lookups=False, near=True,
    )  # fmt: skip
    plain = encode_batch(
        examples, tokenizer, tokenizer.pad_token_id, (1, 2, 3),
        anchor_routing=True, neighbour_lookups=False,
    )  # fmt: skip
    prefix = batch.prefix_ids.shape[1]
    from agent_training.supervision import grid_cell_positions

    added = len(batch.attention_targets) - len(plain.attention_targets)
    assert added > 0
    for row, example in enumerate(examples):
        prompt = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
        positions = grid_cell_positions(prompt, example.grid, example.state, tokenizer)
        targets = batch.attention_targets[batch.attention_targets[:, 2] == row].tolist()
        anchors = {len(prompt) - ANCHOR_QUERIES + k for k in range(ANCHOR_QUERIES)}
        for offset, (anchor, head) in NEAR_ANCHOR_SLOTS.items():
            cell = (example.state.agent[0] + offset[0], example.state.agent[1] + offset[1])
            query = len(prompt) - ANCHOR_QUERIES + anchor - prefix
            hit = [t for t in targets if t[0] == 2 and t[1] == head and t[3] == query]
            assert [t[4] for t in hit] == ([positions[cell]] if cell in positions else [])
        copy = [t for t in targets if t[0] == 3 and t[1] == NEIGHBOUR_HEAD]
        # four direction words and the twelve symbols of the copy line read the anchors
        assert len(copy) == 4 + len(NEAR_OFFSETS)
        assert {t[4] for t in copy} <= anchors
    with pytest.raises(ValueError, match="near targets"):
        encode_batch(examples, tokenizer, tokenizer.pad_token_id, (1, 2, 3), near=True)


def test_prior_uncertainty_is_zero_where_size_and_density_fix_the_cell():
    grids = generate_grid_set(
        GridSetConfig(sizes=(9,), densities=(0.4,), n_per_cell=2, variant=Variant.PLAIN, seed=5)
    )
    weights = prior_uncertainty(grids)
    assert weights.shape == (2, 15, 15)
    assert float(weights[:, 9:, :].abs().sum()) == 0 and float(weights[:, :, 9:].abs().sum()) == 0
    assert float(weights[0, 0, :9].abs().sum()) == 0  # the border is always a wall
    assert float(weights[0].max()) > 0.5 and float(weights[0].max()) <= 1.0
    frequency = prior_wall_frequency(grids[0])
    assert np.array_equal(frequency, prior_wall_frequency(grids[1]))  # same key, same prior
    open_room = replace(grids[0], density=0.0)
    assert float(prior_uncertainty([open_room]).sum()) < float(weights[0].sum())


def test_walls_losses_reach_the_model_and_the_readouts(map_agent):
    model, tokenizer = map_agent
    model = type(model)(model.config)  # a fresh copy: never train the shipped weights
    model.load_state_dict(map_agent[0].state_dict())
    model.set_attn_implementation("eager")
    config = replace(
        TrainingConfig(),
        map_loss_weight=1.0,
        map_cell_weighting="uncertain",
        map_cell_weight=5.0,
        near_loss_weight=3.0,
        anchor_routing=True,
        coordinate_loss_weight=0.0,
        grid_penalty_scope="completion",
    )
    data = TrainingDataConfig(key_prompt_probability=0.0, sizes=(7,), size_weights=(1.0,))
    examples = sample_batch_examples(replace(data, near_line=True), 3, np.random.default_rng(4))
    batch = encode_batch(
        examples, tokenizer, tokenizer.pad_token_id, (1, 2, 3),
        anchor_routing=True, neighbour_lookups=False, near=True,
    )  # fmt: skip
    readout = MapReadout(model.config.hidden_size, config.map_layers)
    near = NearReadout(model.config.hidden_size)
    total, parts = training_loss(model, batch, config, None, readout, examples, near_readout=near)
    total.backward()
    assert np.isfinite(parts["near_loss"]) and parts["near_loss"] > 0
    assert 0 <= parts["near_accuracy"] <= 1
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in near.parameters())
    assert model.model.layers[2].self_attn.q_proj.weight.grad.abs().sum() > 0
    labels = near_labels([e.grid for e in examples], [e.state for e in examples])
    for row, example in enumerate(examples):
        assert parse_near(example.completion) == [CellType(int(t)) for t in labels[row]]
    # the weighted cell term ignores padding: a prediction there changes nothing
    anchors = torch.randn(3, 3, model.config.hidden_size)
    cells = torch.full((3, 15, 15), int(CellType.PADDING))
    weights = torch.zeros(3, 15, 15)
    weights[:, 1, 1] = 1.0
    cells[:, 1, 1] = int(CellType.WALL)
    args = (cells, torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long))
    rest = (torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4))
    a, _ = readout.loss(anchors, *args, *rest, 1, cell_weights=weights)
    cells[:, 5, 5] = int(CellType.OPEN)
    b, _ = readout.loss(anchors, *args, *rest, 1, cell_weights=weights)
    assert torch.isclose(a, b)
    with pytest.raises(ValueError, match="map_cell_weighting"):
        TrainingConfig(map_cell_weighting="x")


def test_the_walls_recipe_starts_from_the_map_agent(capsys):
    from test_map_supervision import _train_script

    script = _train_script()
    config, data = script.walls_phase(TrainingConfig(), TrainingDataConfig(), 50)
    assert config.steps == 50 and data.near_line and data.tie_break == "first"
    assert config.map_cell_weighting == "uncertain" and config.near_loss_weight > 0
    assert config.grid_penalty_scope == "completion" and config.barrier_ramp_steps == 0
    args = ["--map", "--map-recipe", "walls", "--tie-break", "first", "--out", "/nonexistent/x"]
    assert script.main(args) == 2
    assert "--tie-break: only with --map --map-recipe single" in capsys.readouterr().err
    # the map agent's folder where the package reads it (not a path relative to the cwd: from
    # another checkout that path is a different folder, and the script would train into it)
    out = [
        "--map",
        "--map-recipe",
        "walls",
        "--out",
        str(script.bundled_agent_dir(script.MAP_AGENT)),
    ]
    assert script.main(out) == 2  # would overwrite the weights it starts from


def test_a_map_recipe_without_map_is_refused(capsys):
    """``--map-recipe walls-offset`` without ``--map`` would train the default agent from its
    seed into its own folder: refused with one line before anything loads."""
    from test_map_supervision import _train_script

    script = _train_script()
    config, _ = script.walls_offset_phase(TrainingConfig(), TrainingDataConfig(), 10)
    assert config.offset_loss_weight > 0 and config.offset_attention_weight > 0
    assert script.main(["--map-recipe", "walls-offset", "--out", "/nonexistent/x"]) == 2
    assert "--map-recipe walls-offset: only with --map" in capsys.readouterr().err


def test_belief_plans_see_only_the_walls_within_two_steps_of_a():
    """``plan_belief="near"``: a wall three steps ahead is invisible (the plan walks into it as
    into an open cell), one two steps ahead turns the plan; key grids keep the true grid."""
    from agent_training.map_supervision import map_labels
    from agent_training.training_data import near_belief_grid, planning_grid, sample_plan
    from goalprobe.gridworld.optimal import solve

    walls = np.zeros((7, 7), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    walls[1:5, 4] = True  # a wall across the way from (1, 1) to G (1, 5): go around below,
    walls[2, 2:4] = True  # and not through (1, 3), a dead end
    grid = Grid(walls=walls, goal=(1, 5), start=(1, 1), variant=Variant.PLAIN, density=0.4)
    far, near = State(agent=(1, 1)), State(agent=(1, 2))
    rng = np.random.default_rng(0)
    true_plan = sample_plan(grid, solve(grid), far, 1, rng, "first")
    assert true_plan == (Action.DOWN,)
    believed = near_belief_grid(grid, far)
    assert not believed.walls[1, 4] and believed.walls[0, 1] and believed.walls[1, 0]
    assert sample_plan(believed, solve(believed), far, 4, rng, "first")[0] == Action.RIGHT
    believed = near_belief_grid(grid, near)
    assert believed.walls[1, 4] and believed.walls[2, 3]  # two steps from A: seen
    assert sample_plan(believed, solve(believed), near, 1, rng, "first") == (Action.LEFT,)
    _, _, _, _, moves = map_labels([grid], [far], [near_belief_grid(grid, far)])
    _, _, _, _, true_moves = map_labels([grid], [far])
    assert moves[0, Action.RIGHT] == 1 and true_moves[0, Action.RIGHT] == 0
    keyed = replace(grid, variant=Variant.KEY_NO_DOOR)
    assert planning_grid(keyed, far, "near") is keyed
    assert planning_grid(grid, far, "true") is grid
    with pytest.raises(ValueError, match="plan_belief"):
        planning_grid(grid, far, "x")


def test_the_belief_recipe_plans_on_the_near_walls():
    from test_map_supervision import _train_script

    script = _train_script()
    config, data = script.belief_phase(TrainingConfig(), TrainingDataConfig(), 40)
    assert data.plan_belief == "near" and data.near_line and data.tie_break == "first"
    assert config.steps == 40 and config.learning_rate == 1e-3
    examples = sample_batch_examples(
        replace(data, key_prompt_probability=0.0), 6, np.random.default_rng(3)
    )
    for example in examples:
        assert example.planned_on is not None and example.planned_on.variant == Variant.PLAIN
        hidden = example.grid.walls & ~example.planned_on.walls
        rows, cols = np.nonzero(hidden)
        a_row, a_col = example.state.agent
        assert (np.abs(rows - a_row) + np.abs(cols - a_col) > 2).all()


def test_the_blocked_recipe_draws_states_where_every_move_toward_g_is_a_wall():
    from agent_training.training_data import is_blocked_state
    from test_map_supervision import _train_script

    walls = np.zeros((7, 7), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    walls[2, 1:5] = True
    grid = Grid(walls=walls, goal=(1, 1), start=(4, 1), variant=Variant.PLAIN, density=0.2)
    assert is_blocked_state(grid, State(agent=(3, 1)))  # G straight up, the wall in between
    assert not is_blocked_state(grid, State(agent=(4, 1)))  # the move up is open
    assert not is_blocked_state(grid, State(agent=(1, 3)))  # left is open
    script = _train_script()
    config, data = script.blocked_phase(TrainingConfig(), TrainingDataConfig(), 30)
    assert data.blocked_fraction == 0.4 and data.plan_belief == "near"
    assert config.decision_loss_weight == 3.0
    every = replace(
        data, blocked_fraction=1.0, key_prompt_probability=0.0, density_range=(0.6, 1.0)
    )
    examples = sample_batch_examples(every, 12, np.random.default_rng(5))
    share = np.mean([is_blocked_state(e.grid, e.state) for e in examples])
    assert share > 0.5  # every episode with a blocked state gives one
    for e in examples:
        if is_blocked_state(e.grid, e.state):
            d_row, d_col = e.plan[0].delta_row_col
            assert not e.grid.walls[e.state.agent[0] + d_row, e.state.agent[1] + d_col]
