"""Training-only signals of the map agent (issue 15; `bundled:map`, docs/map_agent.md): route
the grid through the anchors.

The default bundled agent reads the grid by attention while it writes its reasoning, so its
pre-reasoning anchors (``<|end|> <|start|> assistant`` closing the prompt) hold only part of a
map. The map agent is the same model family (its third block full attention rather than a
sliding window) trained, warm-started from the default agent, with extra objectives, all
discarded from the saved model:

* **A barrier between the completion and the grid** (``TrainingConfig.grid_penalty_scope =
  "completion"``, :func:`agent_training.supervision.mass_penalty`): every completion token's
  attention to the grid text, in every block and head, is pushed below a floor of 1e-3 (log
  odds). The reasoning and the answer can then only use what the anchors (and the prompt's
  grid-independent text) hold, so patching the anchors at every block with a counterfactual's
  is, up to that floor, running the counterfactual.
* **Map read-out.** A linear read-out of the three anchor tokens' residual stream (flattened,
  after each block of ``TrainingConfig.map_layers``) must name every cell's type on the 15 x 15
  label canvas (``PADDING`` outside the grid), the agent's and goal's ``(row, col)``, the types
  of A's four neighbours and which moves are optimal (:class:`MapReadout`).
* **Anchor routing of attention** (:func:`agent_training.supervision.attention_targets`
  with ``anchor_routing=True`` and no grid look-ups): the anchors read A's and G's cells in the
  first full-attention block and A's neighbours in the next; the tokens that write coordinates
  and the direction words of ``Next to A:`` read the anchors in the last one.
* **Interchange (counterfactual patching)**, tried and off in ``--map``'s default recipe
  (docs/map_agent.md): the base prompt runs with a counterfactual's anchors written over its own
  at every block (:func:`move_counterfactual`, ``interchange_loss``) and must write the
  counterfactual's completion. Without the barrier the reasoning kept reading A and G from the
  grid; with it the objective is implied.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import torch
from goalprobe.gridworld.core import (
    LABEL_CANVAS,
    STUDY_CELL_TYPES,
    Action,
    CellType,
    Grid,
    State,
)
from goalprobe.gridworld.dynamics import is_success
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import cell_types, padded_cell_types

from agent_training.supervision import ANCHOR_QUERIES as N_ANCHOR_TOKENS


def anchor_positions(prompt_lengths: Sequence[int], prefix_len: int) -> torch.Tensor:
    """``(B, 3)`` suffix indices of each row's pre-reasoning anchor (its prompt's last tokens)."""
    ends = torch.tensor([length - prefix_len for length in prompt_lengths], dtype=torch.long)
    return ends[:, None] - N_ANCHOR_TOKENS + torch.arange(N_ANCHOR_TOKENS)[None, :]


def map_labels(
    grids: Sequence[Grid],
    states: Sequence[State],
    move_grids: Sequence[Grid] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Targets of :class:`MapReadout`: ``(B, 15, 15)`` cell types, ``(B, 2)`` agent and
    ``(B, 2)`` goal cells, ``(B, 4)`` the types of A's neighbours (``WALL`` outside the grid; in
    :class:`~goalprobe.gridworld.core.Action` order) and ``(B, 4)`` the optimal actions (0/1)
    on ``move_grids`` (the grids the plans are optimal on; default ``grids``)."""
    cells = np.stack([padded_cell_types(g, s) for g, s in zip(grids, states, strict=True)])
    agents = np.asarray([s.agent for s in states], dtype=np.int64)
    goals = np.asarray([g.goal for g in grids], dtype=np.int64)
    neighbours = np.full((len(states), len(Action)), int(CellType.WALL), dtype=np.int64)
    moves = np.zeros((len(states), len(Action)), dtype=np.float32)
    move_grids = grids if move_grids is None else move_grids
    for row, (grid, state) in enumerate(zip(grids, states, strict=True)):
        types = cell_types(grid, state)
        for action in Action:
            d_row, d_col = action.delta_row_col
            r, c = state.agent[0] + d_row, state.agent[1] + d_col
            if 0 <= r < grid.size and 0 <= c < grid.size:
                neighbours[row, action] = types[r, c]
        for action in solve(move_grids[row]).optimal_actions(state):
            moves[row, action] = 1.0
    return (
        torch.from_numpy(cells.astype(np.int64)),
        torch.from_numpy(agents),
        torch.from_numpy(goals),
        torch.from_numpy(neighbours),
        torch.from_numpy(moves),
    )


class MapReadout(torch.nn.Module):
    """Linear read-out of the full map from the anchors (training only; discarded).

    Args:
        hidden_size: residual width ``d_model``.
        layers: the blocks read (one read-out each).
        canvas: side of the label canvas (cells outside a grid are ``PADDING``).
    """

    def __init__(self, hidden_size: int, layers: Sequence[int], canvas: int = LABEL_CANVAS):
        super().__init__()
        self.canvas = canvas
        # the study's classes: the agents are trained on grids without harm cells, and a fixed
        # class count keeps a retrained agent identical to the shipped one
        self.n_classes = STUDY_CELL_TYPES
        features = N_ANCHOR_TOKENS * hidden_size
        # per block: cell types of the canvas, agent row, col and goal row, col, the types of
        # A's four neighbours and the four moves' optimality
        n_out = canvas * canvas * self.n_classes + 4 * canvas + len(Action) * (self.n_classes + 1)
        self.heads = torch.nn.ModuleDict(
            {str(layer): torch.nn.Linear(features, n_out) for layer in layers}
        )

    def loss(
        self,
        anchors: torch.Tensor,
        cells: torch.Tensor,
        agents: torch.Tensor,
        goals: torch.Tensor,
        neighbours: torch.Tensor,
        moves: torch.Tensor,
        layer: int,
        cell_weights: torch.Tensor | None = None,
        cell_weight: float = 1.0,
    ) -> tuple[torch.Tensor, float]:
        """Mean cell-type cross-entropy plus the coordinate and neighbour cross-entropies and
        the moves' binary cross-entropy.

        Args:
            anchors: ``(B, 3, d_model)`` anchor residual stream after block ``layer``.
            cells: ``(B, canvas, canvas)`` cell types; agents, goals: ``(B, 2)`` cells;
                neighbours: ``(B, 4)`` types; moves: ``(B, 4)`` optimal (1) or not (0)
                (:func:`map_labels`).
            cell_weights: ``(B, canvas, canvas)`` weight of each cell in the cell term (the
                weighted mean; :func:`prior_uncertainty`: grid cells by how uncertain their
                wall is given size and density); None: the plain mean over the canvas.
            cell_weight: factor of the cell term.

        Returns:
            ``(loss, cell accuracy on grid cells)``.
        """
        x = anchors.reshape(anchors.shape[0], -1).float()
        ce = torch.nn.functional.cross_entropy
        out = self.heads[str(layer)](x)
        n_cells = self.canvas * self.canvas * self.n_classes
        logits = out[:, :n_cells].reshape(-1, self.n_classes)
        target = cells.reshape(-1)
        if cell_weights is None:
            loss = cell_weight * ce(logits, target)
        else:
            w = cell_weights.reshape(-1).float()
            loss = (
                cell_weight
                * (ce(logits, target, reduction="none") * w).sum()
                / w.sum().clamp_min(1e-6)
            )
        n_objects = n_cells + 4 * self.canvas
        objects = out[:, n_cells:n_objects].reshape(x.shape[0], 4, self.canvas)
        coordinates = torch.cat([agents, goals], dim=1)
        loss = loss + ce(objects.reshape(-1, self.canvas), coordinates.reshape(-1))
        n_moves = len(Action)
        around = out[:, n_objects : n_objects + n_moves * self.n_classes]
        loss = loss + ce(around.reshape(-1, self.n_classes), neighbours.reshape(-1))
        loss = loss + torch.nn.functional.binary_cross_entropy_with_logits(
            out[:, n_objects + n_moves * self.n_classes :], moves.float()
        )
        with torch.no_grad():
            inside = target != CellType.PADDING
            accuracy = (logits.argmax(-1)[inside] == target[inside]).float().mean()
        return loss, float(accuracy)


_PRIOR_SAMPLES = 48
"""Grids drawn per (variant, size, density) to estimate the per-cell wall prior."""

_PRIOR_CACHE: dict[tuple[str, int, float], np.ndarray] = {}


def prior_wall_frequency(grid: Grid) -> np.ndarray:
    """``(n, n)`` each cell's wall frequency over :data:`_PRIOR_SAMPLES` grids of the grid's
    variant, size and density (density rounded to 0.02; drawn from a seed of that key, cached):
    the prior given size and density."""
    from goalprobe.gridworld.variants import generate_variant

    density = round(float(grid.density or 0.0) * 50) / 50
    key = (str(grid.variant), int(grid.size), density)
    if key not in _PRIOR_CACHE:
        rng = np.random.default_rng(zlib.crc32(f"{key[0]}/{key[1]}/{density:.2f}".encode()))
        _PRIOR_CACHE[key] = np.mean(
            [generate_variant(key[0], key[1], density, rng).walls for _ in range(_PRIOR_SAMPLES)],
            axis=0,
        )
    return _PRIOR_CACHE[key]


def prior_uncertainty(grids: Sequence[Grid], canvas: int = LABEL_CANVAS) -> torch.Tensor:
    """``(B, canvas, canvas)`` the binary entropy (bits) of each grid cell's wall given the grid's
    variant, size and density (:func:`prior_wall_frequency`); 0 on cells whose wall status that
    prior fixes (border, lattice) and outside the grid. The map agent's walls recipe weights the
    map read-out's cell term by it, so the read-out learns what the grid's size and density do
    not already say."""
    out = np.zeros((len(grids), canvas, canvas), dtype=np.float32)
    for row, grid in enumerate(grids):
        walls = prior_wall_frequency(grid)
        p = np.clip(walls, 1e-6, 1 - 1e-6)
        entropy = -(p * np.log2(p) + (1 - p) * np.log2(1 - p))
        n = grid.size
        out[row, :n, :n] = np.where((walls > 0) & (walls < 1), entropy, 0.0)
    return torch.from_numpy(out)


def near_labels(grids: Sequence[Grid], states: Sequence[State]) -> torch.Tensor:
    """``(B, 12)`` the types of the cells within two steps of A
    (:data:`goalprobe.agents.reasoning.NEAR_OFFSETS`; ``WALL`` outside the grid)."""
    from goalprobe.agents.reasoning import NEAR_OFFSETS

    labels = np.full((len(states), len(NEAR_OFFSETS)), int(CellType.WALL), dtype=np.int64)
    for row, (grid, state) in enumerate(zip(grids, states, strict=True)):
        types = cell_types(grid, state)
        for j, (d_row, d_col) in enumerate(NEAR_OFFSETS):
            r, c = state.agent[0] + d_row, state.agent[1] + d_col
            if 0 <= r < grid.size and 0 <= c < grid.size:
                labels[row, j] = types[r, c]
    return torch.from_numpy(labels)


class NearReadout(torch.nn.Module):
    """Linear read-out of the 12 cells within two steps of A from the anchors after one block
    (training only; discarded): the agent-centred frame the copy line names.

    Args:
        hidden_size: residual width ``d_model``.
    """

    def __init__(self, hidden_size: int, n_cells: int = 12):
        super().__init__()
        self.n_cells = n_cells
        self.n_classes = STUDY_CELL_TYPES
        self.linear = torch.nn.Linear(N_ANCHOR_TOKENS * hidden_size, n_cells * self.n_classes)

    def loss(self, anchors: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, float]:
        """``(mean cross-entropy, accuracy)`` of the 12 cells' types (``labels``: ``(B, 12)``,
        :func:`near_labels`)."""
        logits = self.linear(anchors.reshape(anchors.shape[0], -1).float())
        logits = logits.reshape(-1, self.n_classes)
        target = labels.reshape(-1)
        with torch.no_grad():
            accuracy = (logits.argmax(-1) == target).float().mean()
        return torch.nn.functional.cross_entropy(logits, target), float(accuracy)


OFFSET_REACH = 2
"""The offset read-out names each cell's offset from A within ``|dr|, |dc| <= OFFSET_REACH``."""

OFFSET_CLASSES = (2 * OFFSET_REACH + 1) ** 2 + 1
"""Classes of the offset read-out: the 25 offsets of the 5 x 5 box around A and "farther"."""


def offset_labels(
    cell_rows: torch.Tensor,
    cell_cols: torch.Tensor,
    agent_rows: torch.Tensor,
    agent_cols: torch.Tensor,
    ignore_index: int,
) -> torch.Tensor:
    """``(B, pos)`` offset class of every grid-cell token (``ignore_index`` elsewhere): the
    index of ``(dr, dc)`` in the 5 x 5 box around A, or ``OFFSET_CLASSES - 1`` farther out.

    Args:
        cell_rows, cell_cols: ``(B, pos)`` cell coordinates, ``ignore_index`` off the grid.
        agent_rows, agent_cols: ``(B,)`` A's cell.
    """
    d_row = cell_rows - agent_rows[:, None]
    d_col = cell_cols - agent_cols[:, None]
    near = (d_row.abs() <= OFFSET_REACH) & (d_col.abs() <= OFFSET_REACH)
    width = 2 * OFFSET_REACH + 1
    labels = torch.where(
        near,
        (d_row + OFFSET_REACH) * width + d_col + OFFSET_REACH,
        torch.full_like(d_row, OFFSET_CLASSES - 1),
    )
    return torch.where(cell_rows == ignore_index, torch.full_like(labels, ignore_index), labels)


class OffsetReadout(torch.nn.Module):
    """Linear read-out of each grid-cell token's offset from A (training only; discarded): it
    asks the cells to carry "I am at (dr, dc) from A" by the block it reads, so that the
    anchors' look-ups of the cells around A in the next block can key on the offset instead of
    on A's coordinates plus an offset (the capacity note's finding: with the offset given, rings
    1 and 2 are learnt almost at once).

    Args:
        hidden_size: residual width ``d_model``.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, OFFSET_CLASSES)

    def loss(
        self, hidden: torch.Tensor, labels: torch.Tensor, ignore_index: int
    ) -> tuple[torch.Tensor, float]:
        """``(loss, accuracy on the near cells)``: the mean cross-entropy over the cells near A
        plus the mean over the farther ones (the far class would swamp a plain mean).

        Args:
            hidden: ``(B, pos, d_model)`` residual stream.
            labels: ``(B, pos)`` :func:`offset_labels`.
        """
        logits = self.linear(hidden).float().reshape(-1, OFFSET_CLASSES)
        target = labels.reshape(-1)
        valid = target != ignore_index
        far = valid & (target == OFFSET_CLASSES - 1)
        near = valid & ~far
        ce = torch.nn.functional.cross_entropy
        total = logits.new_zeros(())
        accuracy = 0.0
        if near.any():
            total = total + ce(logits[near], target[near])
            with torch.no_grad():
                accuracy = float((logits[near].argmax(-1) == target[near]).float().mean())
        if far.any():
            total = total + ce(logits[far], target[far])
        return total, accuracy


@contextlib.contextmanager
def anchor_hooks(
    model,
    positions: torch.Tensor,
    *,
    capture: Sequence[int] = (),
    write: dict[int, torch.Tensor] | None = None,
    captured: dict[int, torch.Tensor] | None = None,
) -> Iterator[dict[int, torch.Tensor]]:
    """Capture and/or overwrite the decoder blocks' outputs at the anchor positions.

    Args:
        positions: ``(B, 3)`` indices into the sequence the model runs on.
        capture: blocks whose output at ``positions`` is captured (``(B, 3, d_model)``, with
            gradients) into the yielded dict.
        write: block -> ``(B, 3, d_model)`` values written over the block's output at
            ``positions`` (the patch of ``goalprobe patch --sites pre_reasoning``).
    """
    captured = {} if captured is None else captured
    write = write or {}
    rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
    handles = []

    def make_hook(layer: int):
        def hook(_module, _inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output
            if layer in write:
                hidden = hidden.clone()
                hidden[rows, positions] = write[layer].to(hidden.dtype)
            if layer in capture:
                captured[layer] = hidden[rows, positions]
            if layer in write:
                return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
            return None

        return hook

    for layer in sorted(set(capture) | set(write)):
        handles.append(model.model.layers[layer].register_forward_hook(make_hook(layer)))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def move_counterfactual(
    grid: Grid, state: State, rng: np.random.Generator
) -> tuple[Grid, State] | None:
    """The state with its agent or its goal (equal odds) moved to a random open cell.

    Open cells are those that show ``OPEN`` (not a wall, the agent, the goal, a key or a door),
    so the two grid texts differ in exactly two symbols and tokenise to the same length. None
    when no move leaves a solvable, unfinished state.
    """
    types = cell_types(grid, state)
    open_cells = [(int(r), int(c)) for r, c in np.argwhere(types == CellType.OPEN)]
    if not open_cells:
        return None
    order = rng.permutation(len(open_cells))
    move_agent = bool(rng.random() < 0.5)
    for index in order[:8]:
        cell = open_cells[int(index)]
        if move_agent:
            cf_grid, cf_state = grid, replace(state, agent=cell)
        else:
            cf_grid, cf_state = replace(grid, goal=cell, start=state.agent), state
        if is_success(cf_grid, cf_state):
            continue
        if solve(cf_grid).optimal_actions(cf_state):
            return cf_grid, cf_state
    return None
