"""Auxiliary training signals of the bundled agent (training only; nothing here ships).

Trained on the next-token loss alone, a small GPT-OSS never learns to read where A and G are:
the answer has to come from one grid token among hundreds, and the gradient that would teach
an attention head to look there is about ``1 / prompt length`` as strong as it needs to be
(measured: teacher-forced coordinate accuracy at chance after 900 steps). Two dense auxiliary
losses remove that plateau:

* **Cell coordinates.** A linear read-out of the residual stream after block
  ``coordinate_layer`` must name the ``(row, col)`` of every grid-cell token of the prompt
  (:func:`cell_coordinate_targets`). The read-out (:class:`CoordinateReadout`) is discarded
  after training; the model learns to carry each cell's coordinates in its residual stream.
* **Attention supervision.** At the completion tokens that precede a coordinate of the
  reasoning (``A is at (r, c)``: the ``(`` predicts ``r``, the ``,`` predicts ``c``), designated
  heads of the full-attention layers must attend to that object's cell; at each direction word
  of ``Next to A: UP _ ...`` one head of the first full-attention layer must attend to A and one
  head of the last full-attention layer to the cell the move would step onto
  (:func:`attention_targets`). The loss is the mean negative log attention weight.

Both act on the model only through gradients; the saved model is a plain
``GptOssForCausalLM`` that reads the grid with its own attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from goalprobe.gridworld.core import Action, Grid, RowCol, State
from goalprobe.gridworld.text import render

OBJECT_HEAD = {"A": 0, "G": 1, "K": 1, "D": 1}
"""Head (of every full-attention layer) that must look at each object while its coordinates are
written: the agent has its own head, the goal, key and door share one."""

ROUTED_OBJECTS = ("A", "G")
"""Objects whose coordinates ``anchor_routing`` routes through the pre-reasoning anchor."""

ANCHOR_QUERIES = 3
"""Tokens of the pre-reasoning anchor (``<|end|> <|start|> assistant``, the prompt's last)."""

NEIGHBOUR_HEAD = 2
"""Head that looks at A (first full-attention layer) and at A's neighbour (last one)."""


@dataclass(frozen=True)
class AttentionTarget:
    """One supervised attention weight: at query ``query`` (index in the full sequence) head
    ``head`` of layer ``layer`` should attend to key ``key`` (index in the full sequence)."""

    layer: int
    head: int
    query: int
    key: int


def grid_cell_positions(prompt_ids: list[int], grid: Grid, state: State, tokenizer) -> dict:
    """Where each grid cell's token is in ``prompt_ids``: ``{(row, col): index}``.

    The grid text (:func:`goalprobe.gridworld.text.render`) is tokenised on its own and
    located as the last occurrence of that token run in the prompt (the prompt's instructions
    hold an example grid, which comes earlier).

    Raises:
        ValueError: the rendered grid is not a token run of the prompt, or a row does not hold
            one token per cell.
    """
    grid_ids = tokenizer(render(grid, state), add_special_tokens=False)["input_ids"]
    start = _last_occurrence(prompt_ids, grid_ids)
    if start is None:
        raise ValueError(f"the rendering of grid {grid.grid_id!r} is not a token run of its prompt")
    newline = tokenizer.convert_tokens_to_ids("\n")
    lines: list[list[int]] = [[]]
    for offset, token in enumerate(grid_ids):
        if token == newline:
            lines.append([])
        else:
            lines[-1].append(start + offset)
    rows = lines[1:]  # line 0 is the column header
    n = grid.size
    if len(rows) != n or any(len(line) != n + 1 for line in rows):
        raise ValueError(f"grid {grid.grid_id!r} does not render as one token per cell")
    return {(r, c): rows[r][1 + c] for r in range(n) for c in range(n)}


def _last_occurrence(sequence: list[int], run: list[int]) -> int | None:
    for start in range(len(sequence) - len(run), -1, -1):
        if sequence[start : start + len(run)] == run:
            return start
    return None


def cell_coordinate_targets(positions: dict[RowCol, int]) -> list[tuple[int, int, int]]:
    """``(index, row, col)`` for every cell token (the coordinate read-out's targets)."""
    return [(index, row, col) for (row, col), index in sorted(positions.items())]


def attention_targets(
    completion_ids: list[int],
    prompt_length: int,
    positions: dict[RowCol, int],
    grid: Grid,
    state: State,
    tokenizer,
    full_attention_layers: list[int],
    *,
    anchor_routing: bool = False,
    neighbour_lookups: bool = True,
    near: bool = False,
) -> list[AttentionTarget]:
    """The supervised attention weights of one example (see the module docstring).

    Args:
        completion_ids: the target completion's tokens (they follow the prompt).
        prompt_length: number of prompt tokens (index of the first completion token).
        positions: :func:`grid_cell_positions` of the prompt.
        full_attention_layers: indices of the model's full-attention layers (the sliding
            window may not reach the grid).
        anchor_routing: route A and G through the pre-reasoning anchor (the prompt's last
            :data:`ANCHOR_QUERIES` tokens; the map agent, :mod:`agent_training.map_supervision`):
            the anchor tokens' object head of the first full-attention layer attends to the
            object's cell, and the coordinate tokens' object head of the last full-attention
            layer attends to the anchor's last token (instead of the cell, in every layer); the
            direction words no longer attend to A.
        neighbour_lookups: the direction words of ``Next to A:`` attend to the neighbour cell
            they name (False: no targets there; the map agent whose completion never reads the
            grid takes the neighbours from the anchors, which read them instead, with
            ``anchor_routing``: :data:`ANCHOR_NEIGHBOUR_HEADS`).
        near: the map agent's copy line of the cells within two steps of A
            (:func:`near_targets`; needs ``anchor_routing`` without look-ups).
    """
    tokens = tokenizer.convert_ids_to_tokens(completion_ids)
    if near:
        if not anchor_routing or neighbour_lookups or len(full_attention_layers) < 3:
            raise ValueError("near targets need anchor routing without look-ups (the map agent)")
        extra = near_targets(tokens, prompt_length, positions, state, full_attention_layers)
        return [
            *attention_targets(
                completion_ids,
                prompt_length,
                positions,
                grid,
                state,
                tokenizer,
                full_attention_layers,
                anchor_routing=anchor_routing,
                neighbour_lookups=neighbour_lookups,
            ),
            *extra,
        ]
    cells = {"A": state.agent, "G": grid.goal, "K": grid.key, "D": grid.door}
    targets: list[AttentionTarget] = []
    for j in range(len(tokens) - 7):
        name = tokens[j].strip()
        if name in cells and tokens[j + 1 : j + 4] == [" is", " at", " ("] and tokens[j + 5] == ",":
            cell = cells[name]
            if cell is None:
                raise ValueError(f"the reasoning names {name} but grid {grid.grid_id!r} has none")
            if anchor_routing and name in ROUTED_OBJECTS:
                first, last = full_attention_layers[0], full_attention_layers[-1]
                head = OBJECT_HEAD[name]
                targets += [
                    AttentionTarget(first, head, prompt_length - k, positions[cell])
                    for k in range(1, ANCHOR_QUERIES + 1)
                ]
                targets += [
                    AttentionTarget(last, head, prompt_length + query, prompt_length - 1)
                    for query in (j + 3, j + 5)
                ]
                continue
            for query in (j + 3, j + 5):  # "(" predicts the row, "," the column
                targets += [
                    AttentionTarget(
                        layer, OBJECT_HEAD[name], prompt_length + query, positions[cell]
                    )
                    for layer in full_attention_layers
                ]
    directions = {f" {a.name}": a for a in Action}
    # the map agent without look-ups: the anchors read A's neighbours in the full layer before
    # the last (they know A's cell from the first), the direction words read the anchors
    anchors_read_neighbours = anchor_routing and not neighbour_lookups
    if anchors_read_neighbours:
        if len(full_attention_layers) < 3:
            raise ValueError(
                "the anchors' neighbour look-ups need three full-attention layers (A in the "
                "first, its neighbours in the next, the completion reads them in the last)"
            )
        targets += _anchor_neighbour_targets(
            prompt_length, positions, state, full_attention_layers[-2]
        )
    elif not neighbour_lookups:
        return targets
    try:
        after = tokens.index(" Next")
    except ValueError:
        return targets
    for j in range(after, min(after + 12, len(tokens))):
        action = directions.get(tokens[j])
        if action is None:
            continue
        if anchors_read_neighbours:  # the anchor token holding this neighbour, last full layer
            anchor = prompt_length - ANCHOR_QUERIES + int(action) // 2
            targets.append(
                AttentionTarget(
                    full_attention_layers[-1], NEIGHBOUR_HEAD, prompt_length + j, anchor
                )
            )
            continue
        query = prompt_length + j
        if not anchor_routing:
            targets.append(
                AttentionTarget(
                    full_attention_layers[0], NEIGHBOUR_HEAD, query, positions[state.agent]
                )
            )
        d_row, d_col = action.delta_row_col
        neighbour = (state.agent[0] + d_row, state.agent[1] + d_col)
        if neighbour in positions:
            targets.append(
                AttentionTarget(
                    full_attention_layers[-1], NEIGHBOUR_HEAD, query, positions[neighbour]
                )
            )
    return targets


ANCHOR_NEIGHBOUR_HEADS = (2, 3)
"""Heads of the full-attention layer before the last with which the anchor tokens read A's
neighbours
(map agent without look-ups): anchor token ``k`` reads the neighbours of moves ``2k`` and
``2k + 1`` (UP, DOWN on the first anchor token; LEFT, RIGHT on the second)."""


def _anchor_neighbour_targets(
    prompt_length: int, positions: dict[RowCol, int], state: State, layer: int
) -> list[AttentionTarget]:
    targets = []
    for action in Action:
        d_row, d_col = action.delta_row_col
        neighbour = (state.agent[0] + d_row, state.agent[1] + d_col)
        if neighbour not in positions:
            continue
        query = prompt_length - ANCHOR_QUERIES + int(action) // 2
        head = ANCHOR_NEIGHBOUR_HEADS[int(action) % 2]
        targets.append(AttentionTarget(layer, head, query, positions[neighbour]))
    return targets


NEAR_ANCHOR_SLOTS: dict[tuple[int, int], tuple[int, int]] = {
    (-1, 0): (0, 2),
    (1, 0): (0, 3),
    (0, -1): (1, 2),
    (0, 1): (1, 3),
    (-2, 0): (0, 0),
    (-1, -1): (0, 1),
    (-1, 1): (1, 0),
    (0, -2): (1, 1),
    (0, 2): (2, 0),
    (1, -1): (2, 1),
    (1, 1): (2, 2),
    (2, 0): (2, 3),
}
"""``(d_row, d_col) -> (anchor token, head)`` with which the anchors read the cells within two
steps of A in the full-attention layer before the last (the map agent's walls recipe): ring 1 as
:data:`ANCHOR_NEIGHBOUR_HEADS` already does, the eight cells at distance 2 on the heads that layer
leaves free (heads 0 and 1 of the first two anchor tokens, every head of the third)."""


def near_targets(
    tokens: list[str],
    prompt_length: int,
    positions: dict[RowCol, int],
    state: State,
    full_attention_layers: list[int],
) -> list[AttentionTarget]:
    """Attention targets of the copy line (``The walls by A: ...``,
    :data:`goalprobe.agents.reasoning.NEAR_OFFSETS`): the anchors read the eight cells at
    distance 2 from A in the layer before the last (:data:`NEAR_ANCHOR_SLOTS`; ring 1 is read
    by :func:`_anchor_neighbour_targets`), and the token before each symbol of the copy line
    reads the anchor token that holds its cell in the last layer (head :data:`NEIGHBOUR_HEAD`).
    Cells outside the grid have no anchor target (they are walls by convention)."""
    from goalprobe.agents.reasoning import NEAR_OFFSETS

    read, last = full_attention_layers[-2], full_attention_layers[-1]
    targets = []
    for offset, (anchor, head) in NEAR_ANCHOR_SLOTS.items():
        cell = (state.agent[0] + offset[0], state.agent[1] + offset[1])
        if abs(offset[0]) + abs(offset[1]) == 2 and cell in positions:
            query = prompt_length - ANCHOR_QUERIES + anchor
            targets.append(AttentionTarget(read, head, query, positions[cell]))
    marker = [" The", " walls", " by", " A", ":"]
    start = next(
        (j for j in range(len(tokens) - len(marker)) if tokens[j : j + len(marker)] == marker),
        None,
    )
    if start is None:
        return targets
    for i, offset in enumerate(NEAR_OFFSETS):
        query = start + len(marker) - 1 + i  # the token before the i-th symbol
        if query + 1 >= len(tokens):
            break
        anchor = prompt_length - ANCHOR_QUERIES + NEAR_ANCHOR_SLOTS[offset][0]
        targets.append(AttentionTarget(last, NEIGHBOUR_HEAD, prompt_length + query, anchor))
    return targets


class CoordinateReadout(torch.nn.Module):
    """Linear read-out of a cell token's ``(row, col)`` from the residual stream (training only).

    Args:
        hidden_size: residual width.
        max_size: largest grid side (coordinates ``0 .. max_size - 1``).
    """

    def __init__(self, hidden_size: int, max_size: int) -> None:
        super().__init__()
        self.max_size = max_size
        self.linear = torch.nn.Linear(hidden_size, 2 * max_size)

    def loss(self, hidden: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of rows and columns.

        Args:
            hidden: ``(batch, pos, d_model)`` residual stream.
            rows, cols: ``(batch, pos)`` targets, ``IGNORE_INDEX`` where not a cell token.
        """
        logits = self.linear(hidden).float()
        row_logits, col_logits = logits[..., : self.max_size], logits[..., self.max_size :]
        ce = torch.nn.functional.cross_entropy
        return ce(row_logits.reshape(-1, self.max_size), rows.reshape(-1)) + ce(
            col_logits.reshape(-1, self.max_size), cols.reshape(-1)
        )


def attention_loss(attentions: tuple[torch.Tensor, ...], targets: torch.Tensor) -> torch.Tensor:
    """Mean negative log attention weight of ``targets``.

    Args:
        attentions: per layer ``(batch, heads, query, key)`` weights (the queries of the run,
            all keys including a cached prefix).
        targets: ``(N, 5)`` long tensor of ``(layer, head, batch, query, key)``, the query
            relative to the run's first position.
    """
    if targets.numel() == 0:
        return attentions[0].new_zeros(())
    weights = []
    for layer in targets[:, 0].unique().tolist():
        chosen = targets[targets[:, 0] == layer]
        weights.append(attentions[layer][chosen[:, 2], chosen[:, 1], chosen[:, 3], chosen[:, 4]])
    return -torch.log(torch.cat(weights).float() + 1e-6).mean()


def mass_penalty(
    mass: torch.Tensor, rest: torch.Tensor | None, floor: float | None = None
) -> torch.Tensor:
    """The penalty on an attention mass ``w`` (on the penalised keys; ``rest``: the mass on
    the other keys, needed only with ``floor``): ``-log(1 - w)`` (``floor`` None), or the
    log-odds barrier ``max(0, log w - log rest - logit(floor))``, which keeps pushing until
    ``w <= floor`` (relative to ``rest``).

    ``-log(1 - w)`` is about ``w`` for small masses, so it tolerates a few percent of attention
    on the grid, and a few percent on a cell token with a large value vector carries that
    cell's content (measured: a map agent trained with it still read A and G from the grid
    under a patch). ``log w`` alone vanishes where ``w`` saturates at 1 (the softmax gradient
    is ``w (1 - w)``), which the few queries that matter most (the column of A, the plan's first
    move) then exploit; the log odds have a gradient of one everywhere.
    """
    if floor is None:
        return -torch.log((1 - mass.float()).clamp_min(1e-6))
    if rest is None:
        raise ValueError("a floor needs the rest mass")
    odds = torch.log(mass.float().clamp_min(1e-30)) - torch.log(rest.float().clamp_min(1e-30))
    return torch.relu(odds - math.log(floor / (1 - floor)))


def attention_mass_penalty(
    attentions: tuple[torch.Tensor, ...],
    key_mask: torch.Tensor,
    query_mask: torch.Tensor,
    floor: float | None = None,
) -> torch.Tensor:
    """Mean :func:`mass_penalty` of the attention weight that the masked queries put on the
    masked keys, over every layer and head (the map agent's penalties on reading the grid while
    writing the reasoning).

    Args:
        attentions: per layer ``(batch, heads, query, key)`` weights; the key axis ends at the
            last query (sliding-window layers may hold fewer keys than the full sequence).
        key_mask: ``(batch, n_keys)`` bool over the full sequence (prefix + suffix), the keys
            penalised.
        query_mask: ``(batch, query)`` bool, the queries penalised.
        floor: see :func:`mass_penalty`.
    """
    if not bool(query_mask.any()):
        return attentions[0].new_zeros(())
    terms = []
    n_full = key_mask.shape[1]
    for weights in attentions:
        keys = key_mask[:, n_full - weights.shape[-1] :].to(weights.dtype)  # the layer's window
        mass = torch.einsum("bhqk,bk->bhq", weights, keys)
        rest = None if floor is None else torch.einsum("bhqk,bk->bhq", weights, 1 - keys)
        terms.append(mass_penalty(mass, rest, floor).mean(1)[query_mask])
    return torch.cat(terms).mean()


def lookup_attention_penalty(
    attentions: tuple[torch.Tensor, ...],
    key_mask: torch.Tensor,
    lookups: torch.Tensor,
    floor: float | None = None,
) -> torch.Tensor:
    """Mean :func:`mass_penalty` of the attention weight that each look-up query puts on the
    masked keys other than its own target key, over every layer and head (the map agent: a
    ``Next to A`` direction word may read the neighbour cell it names and no other grid token).

    Args:
        attentions: as in :func:`attention_mass_penalty`.
        key_mask: ``(batch, n_keys)`` bool over the full sequence, the keys penalised.
        lookups: ``(N, 3)`` long ``(batch row, query index in the run, allowed key index in the
            full sequence or -1 for none)``.
        floor: see :func:`mass_penalty`.
    """
    if lookups.numel() == 0:
        return attentions[0].new_zeros(())
    rows, queries, allowed = lookups.unbind(1)
    n_full = key_mask.shape[1]
    terms = []
    for weights in attentions:
        offset = n_full - weights.shape[-1]
        chosen = weights[rows, :, queries, :]  # (N, heads, keys of the layer)
        keys = key_mask[rows, offset:].to(weights.dtype).clone()
        inside = (allowed - offset >= 0) & (allowed >= 0)
        keys[inside.nonzero().flatten(), (allowed - offset)[inside]] = 0
        mass = torch.einsum("nhk,nk->nh", chosen, keys)
        rest = None if floor is None else torch.einsum("nhk,nk->nh", chosen, 1 - keys)
        terms.append(mass_penalty(mass, rest, floor).mean(1))
    return torch.cat(terms).mean()
