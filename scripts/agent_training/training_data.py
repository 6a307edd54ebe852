"""Training data of the bundled agent: examples drawn from the grid world and their batches.

Each example is one step of an episode. A grid is drawn (size, density and variant from
:class:`TrainingDataConfig`), an episode is played from its start by an epsilon-perturbed optimal
policy (a random action with probability ``epsilon``), and one of its non-goal states is taken.
The prompt is the harmony rendering of :func:`goalprobe.agents.prompts.build_messages` for that
state; the target is :func:`goalprobe.agents.harmony.render_completion` of the reasoning
(:mod:`goalprobe.agents.reasoning`: where A and G are, then the next ``PLAN_STEPS`` moves of a
shortest path, each drawn uniformly among the optimal actions) and the JSON answer (the plan's
first move). ``detour_fraction`` draws states among detour states (:func:`is_detour_state`).

:func:`encode_batch` turns examples of one prompt kind and one grid size into a :class:`Batch`:
the shared system + developer + user-header prefix once, the suffixes padded, the completion
labels, and the positions the training-only signals of :mod:`agent_training.supervision` and
:mod:`agent_training.map_supervision` need. The losses and the loop are in
:mod:`agent_training.training`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np
import torch
from goalprobe.agents.harmony import ReasoningEffort, render_completion, render_prompt
from goalprobe.agents.prompts import build_messages, uses_key_prompt
from goalprobe.agents.reasoning import (
    NEAR_OFFSETS,
    PLAN_PREFIX,
    PLAN_STEPS,
    final_text,
    reasoning_text,
)
from goalprobe.gridworld.core import Action, Grid, State, Variant
from goalprobe.gridworld.dynamics import initial_state, is_success, step
from goalprobe.gridworld.optimal import OptimalPolicy, solve
from goalprobe.gridworld.text import render
from goalprobe.gridworld.variants import generate_variant

from agent_training.supervision import (
    attention_targets,
    cell_coordinate_targets,
    grid_cell_positions,
)

IGNORE_INDEX = -100
"""Label of positions without loss (prompt and padding)."""


@dataclass(frozen=True)
class TrainingDataConfig:
    """What the training examples are drawn from."""

    sizes: tuple[int, ...] = (5, 7, 9, 11, 13, 15)
    """Grid sides to draw from (odd; 5 x 5 grids are a cheap warm-up of the same skills)."""

    size_weights: tuple[float, ...] = (0.12, 0.22, 0.22, 0.2, 0.13, 0.11)
    """Relative probability of each size (smaller grids are cheaper and the core of the test)."""

    density_range: tuple[float, float] = (0.0, 1.0)
    """Densities are drawn uniformly from this interval."""

    key_prompt_probability: float = 0.3
    """Probability that a batch uses the key-and-door prompt (key variants and controls)."""

    key_variant_weights: dict[str, float] = field(
        default_factory=lambda: {
            Variant.KEY_DOOR: 0.45,
            Variant.KEY_NO_DOOR: 0.2,
            Variant.KEY_DOOR_CONTROL: 0.1,
            Variant.TWO_PATH_KEY: 0.15,
            Variant.TWO_PATH_NO_KEY: 0.1,
        }
    )
    """Relative probability of each variant within key-prompt batches."""

    epsilon: float = 0.3
    """Probability of a random action in the episodes states are taken from."""

    detour_fraction: float = 0.0
    """Probability that an example's state is drawn among its episode's detour states
    (:func:`is_detour_state`: where heading straight for G is not exactly optimal), when the
    episode has any; otherwise among all its non-goal states."""

    blocked_fraction: float = 0.0
    """Probability that an example's state is drawn among its episode's blocked states
    (:func:`is_blocked_state`: every move toward G runs into a wall), when it has any; drawn
    before ``detour_fraction`` (blocked states are detour states)."""

    plan_steps: int = PLAN_STEPS
    """Moves planned in the reasoning."""

    tie_break: str = "random"
    """How plans choose among equally short moves (:data:`TIE_BREAKS`): at random, or the first
    in action order, so an agent's choice depends on its state's optimal set alone (the map
    agent's control pairs share that set)."""

    plan_belief: str = "true"
    """What plans (and the map read-out's optimal moves) are optimal on (:data:`PLAN_BELIEFS`):
    the true grid, or (``"near"``, plain grids only) :func:`near_belief_grid`, the true walls
    within two steps of A and open cells elsewhere: the map agent's belief recipe, whose every
    move is a function of what its anchors hold (A, G and the copy line's 12 cells)."""

    near_line: bool = False
    """Reasoning with the copy line of the 12 cells within two steps of A (``The walls by A:``,
    :func:`goalprobe.agents.reasoning.describe_near`), and attention supervision of the anchors
    reading them and of the copy line reading the anchors
    (:func:`agent_training.supervision.near_targets`; the map agent's walls recipe)."""


@dataclass(frozen=True)
class Example:
    """One training example: a state and its target.

    Attributes:
        grid: the grid.
        state: the state the prompt shows.
        plan: the next moves of a shortest path from ``state`` (first = the answer).
        prompt: the harmony prompt text.
        completion: the target completion text.
        planned_on: the grid the plan is optimal on (:func:`planning_grid`; None: ``grid``).
    """

    grid: Grid
    state: State
    plan: tuple[Action, ...]
    prompt: str
    completion: str
    planned_on: Grid | None = None


TIE_BREAKS = ("random", "first")
"""How training plans choose among equally short moves (``TrainingDataConfig.tie_break``)."""

PLAN_BELIEFS = ("true", "near")
"""What training plans are optimal on (``TrainingDataConfig.plan_belief``)."""


def near_belief_grid(grid: Grid, state: State) -> Grid:
    """``grid`` as an agent that knows only the walls within two steps of A (the copy line's
    cells, :data:`~goalprobe.agents.reasoning.NEAR_OFFSETS`) believes it: those walls, every
    other cell open. Key variants are returned unchanged (their plans stay on the true grid)."""
    if grid.variant != Variant.PLAIN:
        return grid
    walls = np.zeros_like(np.asarray(grid.walls))
    row, col = state.agent
    for d_row, d_col in NEAR_OFFSETS:
        r, c = row + d_row, col + d_col
        if 0 <= r < grid.size and 0 <= c < grid.size:
            walls[r, c] = grid.walls[r, c]
    return replace(grid, walls=walls, grid_id=f"{grid.grid_id}|near{row},{col}")


def planning_grid(grid: Grid, state: State, plan_belief: str) -> Grid:
    """The grid a training plan from ``state`` is optimal on (:data:`PLAN_BELIEFS`)."""
    if plan_belief not in PLAN_BELIEFS:
        raise ValueError(f"plan_belief must be one of {PLAN_BELIEFS}, got {plan_belief!r}")
    return near_belief_grid(grid, state) if plan_belief == "near" else grid


def sample_plan(
    grid: Grid,
    policy: OptimalPolicy,
    state: State,
    steps: int,
    rng: np.random.Generator,
    tie_break: str = "random",
) -> tuple[Action, ...]:
    """The next ``steps`` moves (fewer near the goal) of a shortest path: ties between optimal
    moves broken uniformly at random (``tie_break="random"``) or by the first in
    :class:`~goalprobe.gridworld.core.Action` order (``"first"``: UP, DOWN, LEFT, RIGHT)."""
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
    plan: list[Action] = []
    while len(plan) < steps and not is_success(grid, state):
        options = sorted(policy.optimal_actions(state))
        if not options:
            raise ValueError(f"state {state} of grid {grid.grid_id!r} cannot reach the goal")
        action = options[0] if tie_break == "first" else options[int(rng.integers(len(options)))]
        plan.append(Action(action))
        state = step(grid, state, action)
    return tuple(plan)


def is_detour_state(grid: Grid, policy: OptimalPolicy, state: State) -> bool:
    """Whether the optimal moves of ``state`` differ from the moves that shorten the Manhattan
    distance to G (an obstacle is in the way, or the shortest path turns away from G)."""
    towards = set(towards_moves(grid, state))
    return towards != {Action(a) for a in policy.optimal_actions(state)}


def towards_moves(grid: Grid, state: State) -> list[Action]:
    """The moves that shorten the Manhattan distance from A to G."""
    (row, col), (goal_row, goal_col) = state.agent, grid.goal
    return [
        action
        for action, closer in (
            (Action.UP, goal_row < row),
            (Action.DOWN, goal_row > row),
            (Action.LEFT, goal_col < col),
            (Action.RIGHT, goal_col > col),
        )
        if closer
    ]


def is_blocked_state(grid: Grid, state: State) -> bool:
    """Whether every move toward G runs into a wall next to A (the agent must turn away from G
    on what its neighbours say, whatever lies further on)."""
    moves = towards_moves(grid, state)
    row, col = state.agent
    return bool(moves) and all(
        grid.walls[row + a.delta_row_col[0], col + a.delta_row_col[1]] for a in moves
    )


def sample_state(
    grid: Grid,
    policy: OptimalPolicy,
    epsilon: float,
    rng: np.random.Generator,
    detour_fraction: float = 0.0,
    blocked_fraction: float = 0.0,
) -> State:
    """A non-goal state of an epsilon-perturbed optimal episode from the grid's start.

    With probability ``blocked_fraction`` the state is drawn among the episode's blocked states
    (:func:`is_blocked_state`), else with probability ``detour_fraction`` among its detour
    states (:func:`is_detour_state`), each when there are any.
    """
    state = initial_state(grid)
    horizon = 2 * policy.shortest_path_length + 2
    visited = [state]
    for _ in range(horizon):
        if rng.random() < epsilon:
            action = Action(int(rng.integers(4)))
        else:
            options = sorted(policy.optimal_actions(state))
            action = options[int(rng.integers(len(options)))]
        state = step(grid, state, action)
        if is_success(grid, state):
            break
        visited.append(state)
    if blocked_fraction > 0 and rng.random() < blocked_fraction:
        blocked = [s for s in visited if is_blocked_state(grid, s)]
        if blocked:
            return blocked[int(rng.integers(len(blocked)))]
    if detour_fraction > 0 and rng.random() < detour_fraction:
        detours = [s for s in visited if is_detour_state(grid, policy, s)]
        if detours:
            return detours[int(rng.integers(len(detours)))]
    return visited[int(rng.integers(len(visited)))]


def make_example(
    grid: Grid,
    state: State,
    plan: tuple[Action, ...],
    *,
    reasoning_effort: ReasoningEffort = "low",
    near: bool = False,
) -> Example:
    """Render the prompt and the target completion of one state (``near``: with the copy line
    of the cells within two steps of A)."""
    key_variant = uses_key_prompt(grid.variant)
    messages = build_messages(render(grid, state), variant=grid.variant, has_key=state.has_key)
    prompt = render_prompt(messages, reasoning_effort)
    reasoning = reasoning_text(grid, state, plan, key_variant=key_variant, near=near)
    return Example(grid, state, plan, prompt, render_completion(reasoning, final_text(plan[0])))


def sample_batch_examples(
    config: TrainingDataConfig,
    batch_size: int,
    rng: np.random.Generator,
    exclude: frozenset[Grid] = frozenset(),
) -> list[Example]:
    """``batch_size`` examples sharing one prompt kind and one grid size.

    Args:
        exclude: grids never used (the held-out evaluation grids; equality is layout, start,
            goal, key, door and variant).
    """
    size = int(
        rng.choice(config.sizes, p=np.asarray(config.size_weights) / sum(config.size_weights))
    )
    key_prompt = rng.random() < config.key_prompt_probability
    names = list(config.key_variant_weights)
    weights = np.asarray([config.key_variant_weights[v] for v in names], dtype=float)
    examples: list[Example] = []
    while len(examples) < batch_size:
        variant = (
            names[int(rng.choice(len(names), p=weights / weights.sum()))]
            if key_prompt
            else Variant.PLAIN
        )
        density = float(rng.uniform(*config.density_range))
        grid = generate_variant(variant, size, density, rng)
        if grid in exclude:
            continue
        policy = solve(grid)
        if not policy.is_solvable:
            continue
        state = sample_state(
            grid, policy, config.epsilon, rng, config.detour_fraction, config.blocked_fraction
        )
        believed = planning_grid(grid, state, config.plan_belief)
        if believed is not grid:
            policy = solve(believed)
        plan = sample_plan(believed, policy, state, config.plan_steps, rng, config.tie_break)
        example = make_example(grid, state, plan, near=config.near_line)
        examples.append(replace(example, planned_on=None if believed is grid else believed))
    return examples


# ---------------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """Token tensors of a batch whose prompts share a prefix.

    Attributes:
        prefix_ids: ``(1, prefix_len)`` the shared prompt prefix.
        suffix_ids: ``(B, suffix_len)`` rest of each prompt + completion, right-padded.
        labels: ``(B, suffix_len)`` next-token targets aligned with ``suffix_ids`` (the label at
            ``t`` is the token at ``t``; shifted inside the loss), ``IGNORE_INDEX`` on prompt
            tokens and padding.
        answer_positions: ``(B,)`` index in ``suffix_ids`` of the action word of the final
            answer (for the answer accuracy).
        decision_positions: ``(B,)`` index in ``suffix_ids`` of the plan's first move (the
            decision the answer copies).
        cell_rows, cell_cols: ``(B, suffix_len)`` the (row, col) of each grid-cell token of the
            suffix, ``IGNORE_INDEX`` elsewhere (targets of the coordinate read-out).
        attention_targets: ``(N, 5)`` ``(layer, head, batch row, query index in suffix_ids,
            key index in prefix + suffix)`` of the supervised attention weights.
        prompt_lengths: ``(B,)`` tokens of each prompt (prefix included).
        object_keys: ``(B, prefix + suffix)`` bool, the agent's and the goal's cell tokens.
        grid_keys: ``(B, prefix + suffix)`` bool, the tokens of the grid text (header, row
            numbers, cells, newlines) up to the pre-reasoning anchor.
        coordinate_queries: ``(B, suffix)`` bool, the completion tokens up to the one that
            predicts G's column (the reasoning's ``A is at (r, c). G is at (r, c``).
        reasoning_queries: ``(B, suffix)`` bool, every completion token but the direction words
            of ``Next to A:`` (whose next symbol is a neighbour cell of the grid).
        lookups: ``(N, 3)`` ``(batch row, suffix index of a direction word, index in prefix +
            suffix of the neighbour cell it names or -1 outside the grid)``.
        agent_rows, agent_cols: ``(B,)`` A's cell (targets of the offset read-out with
            ``cell_rows`` / ``cell_cols``).
        agent_keys: ``(B,)`` index in prefix + suffix of A's cell token.
    """

    prefix_ids: torch.Tensor
    suffix_ids: torch.Tensor
    labels: torch.Tensor
    answer_positions: torch.Tensor
    decision_positions: torch.Tensor
    cell_rows: torch.Tensor
    cell_cols: torch.Tensor
    attention_targets: torch.Tensor
    prompt_lengths: torch.Tensor
    object_keys: torch.Tensor
    grid_keys: torch.Tensor
    coordinate_queries: torch.Tensor
    reasoning_queries: torch.Tensor
    lookups: torch.Tensor
    agent_rows: torch.Tensor
    agent_cols: torch.Tensor
    agent_keys: torch.Tensor

    def to(self, device: str | torch.device) -> Batch:
        """The batch on ``device``."""
        return Batch(*(getattr(self, f.name).to(device) for f in fields(self)))


def encode_batch(
    examples: list[Example],
    tokenizer,
    pad_token_id: int,
    full_attention_layers: tuple[int, ...] = (1, 3),
    *,
    anchor_routing: bool = False,
    neighbour_lookups: bool = True,
    near: bool = False,
) -> Batch:
    """Tokenise examples of one prompt kind into a :class:`Batch` (prefix = common prompt start).

    Args:
        full_attention_layers: the model's full-attention layers (where attention is supervised,
            :mod:`agent_training.supervision`).
        anchor_routing: route A and G through the pre-reasoning anchor in the attention targets
            (:func:`agent_training.supervision.attention_targets`).
        neighbour_lookups: supervise the direction words' look-ups of the neighbour cells
            (same function).
        near: supervise the copy line's attention (same function; the examples carry it).
    """
    prompts = [tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    completions = [tokenizer(e.completion, add_special_tokens=False)["input_ids"] for e in examples]
    prefix_len = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for ids in prompts[1:]:
        prefix_len = min(
            prefix_len,
            next(
                (i for i, (a, b) in enumerate(zip(first, ids, strict=False)) if a != b), prefix_len
            ),
        )
    suffixes = [p[prefix_len:] + c for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in suffixes)
    suffix_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    answers = torch.zeros(len(examples), dtype=torch.long)
    decisions = torch.zeros(len(examples), dtype=torch.long)
    plan_marker = tokenizer.convert_tokens_to_ids([f" {PLAN_PREFIX[:-1]}", ":"])
    cell_rows = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    cell_cols = cell_rows.clone()
    supervised: list[tuple[int, int, int, int, int]] = []
    object_keys = torch.zeros((len(examples), prefix_len + width), dtype=torch.bool)
    grid_keys = object_keys.clone()
    coordinate_queries = torch.zeros((len(examples), width), dtype=torch.bool)
    neighbour_queries = torch.zeros((len(examples), width), dtype=torch.bool)
    lookups: list[tuple[int, int, int]] = []
    agent_keys: list[int] = []
    directions = {tokenizer.convert_tokens_to_ids(f" {a.name}") for a in Action}
    next_id = tokenizer.convert_tokens_to_ids(" Next")
    for row, (example, prompt, completion) in enumerate(
        zip(examples, prompts, completions, strict=True)
    ):
        start = len(prompt) - prefix_len
        suffix_ids[row, : start + len(completion)] = torch.tensor(prompt[prefix_len:] + completion)
        labels[row, start : start + len(completion)] = torch.tensor(completion)
        answers[row] = start + len(completion) - len(_ANSWER_TAIL)
        decisions[row] = start + _first_plan_move_index(completion, plan_marker)
        positions = grid_cell_positions(prompt, example.grid, example.state, tokenizer)
        object_keys[row, [positions[example.state.agent], positions[example.grid.goal]]] = True
        agent_keys.append(positions[example.state.agent])
        grid_keys[row, min(positions.values()) - 2 * example.grid.size : len(prompt) - 3] = True
        coordinate_queries[row, start : start + _goal_column_query(completion, tokenizer) + 1] = (
            True
        )
        after = completion.index(next_id) if next_id in completion else len(completion)
        for j in range(after, min(after + 12, len(completion))):
            if completion[j] in directions:
                neighbour_queries[row, start + j] = True
                action = Action[tokenizer.convert_ids_to_tokens(completion[j]).strip()]
                d_row, d_col = action.delta_row_col
                agent_row, agent_col = example.state.agent
                key = positions.get((agent_row + d_row, agent_col + d_col), -1)
                lookups.append((row, start + j, key))
        for index, cell_row, cell_col in cell_coordinate_targets(positions):
            if index >= prefix_len:
                cell_rows[row, index - prefix_len] = cell_row
                cell_cols[row, index - prefix_len] = cell_col
        for target in attention_targets(
            completion,
            len(prompt),
            positions,
            example.grid,
            example.state,
            tokenizer,
            list(full_attention_layers),
            anchor_routing=anchor_routing,
            neighbour_lookups=neighbour_lookups,
            near=near,
        ):
            supervised.append(
                (target.layer, target.head, row, target.query - prefix_len, target.key)
            )
    return Batch(
        torch.tensor([first[:prefix_len]], dtype=torch.long),
        suffix_ids,
        labels,
        answers,
        decisions,
        cell_rows,
        cell_cols,
        torch.tensor(supervised, dtype=torch.long).reshape(-1, 5),
        torch.tensor([len(p) for p in prompts], dtype=torch.long),
        object_keys,
        grid_keys,
        coordinate_queries,
        (labels != IGNORE_INDEX) & ~neighbour_queries,
        torch.tensor(lookups, dtype=torch.long).reshape(-1, 3),
        torch.tensor([e.state.agent[0] for e in examples], dtype=torch.long),
        torch.tensor([e.state.agent[1] for e in examples], dtype=torch.long),
        torch.tensor(agent_keys, dtype=torch.long),
    )


def _first_plan_move_index(completion: list[int], plan_marker: list[int]) -> int:
    """Index in ``completion`` of the move right after the plan marker (`` Plan`` ``:``)."""
    for index in range(len(completion) - len(plan_marker)):
        if completion[index : index + len(plan_marker)] == plan_marker:
            return index + len(plan_marker)
    raise ValueError(f"the completion has no {PLAN_PREFIX!r} followed by a move")


def _goal_column_query(completion: list[int], tokenizer) -> int:
    """Index in ``completion`` of the ``,`` that predicts G's column (``G is at (r, c)``)."""
    tokens = tokenizer.convert_ids_to_tokens(completion)
    for j in range(len(tokens) - 5):
        if tokens[j].strip() == "G" and tokens[j + 1 : j + 4] == [" is", " at", " ("]:
            return j + 5
    raise ValueError("the completion names no goal position")


_ANSWER_TAIL = ("UP", '"', "}", "<|return|>")
"""The last tokens of every completion, from the action word on (see ``final_text``)."""
