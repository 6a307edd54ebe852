"""Training of the bundled agent: the losses, a small GPT-OSS, a shared-prefix loop.

**Data** (:mod:`agent_training.training_data`): one example per episode step, its harmony
prompt and its target completion (reasoning + JSON answer). The loss covers the completion
tokens only; ``decision_loss_weight`` adds a term on the plan's first move (the training script
uses it, with ``detour_fraction``, in a second phase).

**Shared prefix.** Every prompt of one kind (plain or key instructions) starts with the same
system + developer + user-header tokens. A batch holds examples of one kind and one grid size,
so the prefix is run once (batch 1) and its KV cache is repeated for the batch; gradients flow
through it. This gives the same loss as running each full sequence, at a fraction of the cost
(:func:`shared_prefix_loss`; a test checks the equality).

**Auxiliary signals.** :func:`training_loss` adds the training-only losses of
:mod:`agent_training.supervision` (cell-coordinate read-out, attention supervision; weights in
:class:`TrainingConfig`), without which the model never learns to locate A and G.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from goalprobe.agents.bundled import BundledModelConfig, gpt_oss_config
from goalprobe.agents.models import cache_keyword, output_cache
from goalprobe.agents.prompts import uses_key_prompt
from goalprobe.agents.reasoning import PLAN_STEPS
from goalprobe.gridworld.core import Grid
from goalprobe.gridworld.optimal import solve

from agent_training.map_supervision import (
    MapReadout,
    NearReadout,
    OffsetReadout,
    anchor_hooks,
    anchor_positions,
    map_labels,
    move_counterfactual,
    near_labels,
    offset_labels,
    prior_uncertainty,
)
from agent_training.supervision import (
    NEIGHBOUR_HEAD,
    CoordinateReadout,
    attention_loss,
    attention_mass_penalty,
    lookup_attention_penalty,
)
from agent_training.training_data import (
    IGNORE_INDEX,
    Batch,
    Example,
    TrainingDataConfig,
    encode_batch,
    make_example,
    sample_batch_examples,
    sample_plan,
)


def shared_prefix_loss(model, batch: Batch) -> torch.Tensor:
    """Mean next-token cross-entropy over the completion tokens, running the prefix once."""
    return shared_prefix_loss_and_accuracy(model, batch)[0]


def shared_prefix_loss_and_accuracy(model, batch: Batch) -> tuple[torch.Tensor, float]:
    """:func:`shared_prefix_loss` and the teacher-forced accuracy of the answer's action word."""
    return _completion_loss_and_accuracy(_shared_prefix_forward(model, batch), batch)


def _shared_prefix_forward(
    model, batch: Batch, *, hidden_states=False, attentions=False, suffix_hooks=None
):
    """Run the prefix once, then the suffixes on its repeated cache (``suffix_hooks``: an
    optional context manager entered around the suffix run only, e.g.
    :func:`agent_training.map_supervision.anchor_hooks`)."""
    from transformers import DynamicCache

    prefix = model.model(
        input_ids=batch.prefix_ids,
        **{cache_keyword(model): DynamicCache(config=model.config)},
        use_cache=True,
    )
    cache = output_cache(prefix)
    cache.batch_repeat_interleave(batch.suffix_ids.shape[0])
    with suffix_hooks if suffix_hooks is not None else contextlib.nullcontext():
        return model(
            input_ids=batch.suffix_ids,
            **{cache_keyword(model): cache},
            use_cache=True,
            output_hidden_states=hidden_states,
            output_attentions=attentions,
        )


def _completion_loss_and_accuracy(out, batch: Batch) -> tuple[torch.Tensor, float]:
    logits = out.logits[:, :-1].float()
    targets = batch.labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )
    with torch.no_grad():
        rows = torch.arange(targets.shape[0], device=targets.device)
        predicted = logits[rows, batch.answer_positions - 1].argmax(-1)
        accuracy = (predicted == targets[rows, batch.answer_positions - 1]).float().mean()
    return loss, float(accuracy)


def decision_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy of the plan's first move alone (``logits``: ``(B, suffix_len,
    vocab)``, the model's output on ``batch.suffix_ids``)."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    return torch.nn.functional.cross_entropy(
        logits[rows, batch.decision_positions - 1].float(),
        batch.suffix_ids[rows, batch.decision_positions],
    )


def training_loss(
    model,
    batch: Batch,
    config: TrainingConfig,
    readout: CoordinateReadout | None,
    map_readout: MapReadout | None = None,
    examples: list[Example] | None = None,
    capture_anchors: tuple[int, ...] = (),
    near_readout: NearReadout | None = None,
    offset_readout: OffsetReadout | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The training objective: the completion loss plus the weighted auxiliary losses.

    Args:
        readout: the coordinate read-out (required when ``config.coordinate_loss_weight > 0``).
        map_readout: the map read-out of the anchors (required when
            ``config.map_loss_weight > 0``; :mod:`agent_training.map_supervision`), with the
            batch's ``examples`` (its labels).
        capture_anchors: blocks whose outputs at the pre-reasoning anchors are returned in
            ``parts["anchors"]`` (``{block: (B, 3, d_model)}``, with gradients).
        near_readout: the read-out of the cells within two steps of A (required when
            ``config.near_loss_weight > 0``), with the batch's ``examples``.
        offset_readout: each cell's offset from A (needed when ``config.offset_loss_weight > 0``).

    Returns:
        ``(total loss, {"loss", "coordinate_loss", "attention_loss", "map_loss",
        "answer_accuracy", ...})`` (``loss`` is the completion loss alone).
    """
    use_coordinates = config.coordinate_loss_weight > 0
    use_attention = config.attention_loss_weight > 0
    use_map = config.map_loss_weight > 0
    if use_coordinates and readout is None:
        raise ValueError("coordinate_loss_weight > 0 needs a CoordinateReadout")
    if use_map and (map_readout is None or examples is None):
        raise ValueError("map_loss_weight > 0 needs a MapReadout and the batch's examples")
    use_near = config.near_loss_weight > 0
    if use_near and (near_readout is None or examples is None):
        raise ValueError("near_loss_weight > 0 needs a NearReadout and the batch's examples")
    use_offset = config.offset_loss_weight > 0
    if use_offset and offset_readout is None:
        raise ValueError("offset_loss_weight > 0 needs an OffsetReadout")
    positions = anchor_positions(batch.prompt_lengths.tolist(), batch.prefix_ids.shape[1])
    captured_layers = tuple(
        sorted(
            set(capture_anchors)
            | set(config.map_layers if use_map else ())
            | ({config.near_layer} if use_near else set())
        )
    )
    captured: dict[int, torch.Tensor] = {}
    hooks = (
        anchor_hooks(
            model,
            positions.to(batch.suffix_ids.device),
            capture=captured_layers,
            captured=captured,
        )
        if captured_layers
        else None
    )
    out = _shared_prefix_forward(
        model,
        batch,
        hidden_states=use_coordinates or use_offset,
        attentions=use_attention or config.offset_attention_weight > 0,
        suffix_hooks=hooks,
    )
    loss, accuracy = _completion_loss_and_accuracy(out, batch)
    total = loss
    parts: dict = {"loss": loss.item(), "answer_accuracy": accuracy}
    if config.decision_loss_weight > 0:
        decision = decision_loss(out.logits, batch)
        total = total + config.decision_loss_weight * decision
        parts["decision_loss"] = decision.item()
    if use_coordinates and readout is not None:
        hidden = out.hidden_states[config.coordinate_layer]
        coordinate = readout.loss(hidden, batch.cell_rows, batch.cell_cols)
        total = total + config.coordinate_loss_weight * coordinate
        parts["coordinate_loss"] = coordinate.item()
    total = total + _offset_terms(out, batch, config, offset_readout, parts)
    if use_attention:
        attention = attention_loss(out.attentions, batch.attention_targets)
        total = total + config.attention_loss_weight * attention
        parts["attention_loss"] = attention.item()
        if use_near:
            parts["ring2_attention"] = ring2_attention(out.attentions, batch, config.near_layer)
    if config.object_attention_weight > 0:
        if not use_attention:
            raise ValueError("object_attention_weight > 0 needs attention_loss_weight > 0")
        floor = config.grid_attention_floor
        barred = {
            "coordinates": batch.coordinate_queries,
            "reasoning": batch.reasoning_queries,
            "completion": batch.labels != IGNORE_INDEX,
        }[config.grid_penalty_scope]
        mass = attention_mass_penalty(
            out.attentions, batch.object_keys, batch.labels != IGNORE_INDEX, floor
        ) + attention_mass_penalty(out.attentions, batch.grid_keys, barred, floor)
        if config.isolate_objects:
            prefix = batch.prefix_ids.shape[1]
            grid_queries = batch.grid_keys[:, prefix:] & ~batch.object_keys[:, prefix:]
            mass = mass + attention_mass_penalty(
                out.attentions, batch.object_keys, grid_queries, floor
            )
        if config.grid_penalty_scope == "reasoning":
            mass = mass + lookup_attention_penalty(
                out.attentions, batch.grid_keys, batch.lookups, floor
            )
        total = total + config.object_attention_weight * mass
        parts["object_attention_loss"] = mass.item()
    if use_map and map_readout is not None and examples is not None:
        grids, planned_on = [e.grid for e in examples], [e.planned_on or e.grid for e in examples]
        labels = map_labels(grids, [e.state for e in examples], planned_on)
        cells, agents, goals, neighbours, moves = (t.to(batch.suffix_ids.device) for t in labels)
        weights = (
            prior_uncertainty(grids).to(batch.suffix_ids.device)
            if config.map_cell_weighting == "uncertain"
            else None
        )
        map_total: Any = 0.0  # a tensor after the first layer
        map_accuracy = 0.0
        for layer in config.map_layers:
            layer_loss, layer_accuracy = map_readout.loss(
                captured[layer],
                cells,
                agents,
                goals,
                neighbours,
                moves,
                layer,
                cell_weights=weights,
                cell_weight=config.map_cell_weight,
            )
            map_total = map_total + layer_loss / len(config.map_layers)
            map_accuracy += layer_accuracy / len(config.map_layers)
        total = total + config.map_loss_weight * map_total
        parts["map_loss"] = map_total.item()
        parts["map_cell_accuracy"] = map_accuracy
    if use_near and near_readout is not None and examples is not None:
        labels = near_labels([e.grid for e in examples], [e.state for e in examples])
        near, near_accuracy = near_readout.loss(
            captured[config.near_layer], labels.to(batch.suffix_ids.device)
        )
        total = total + config.near_loss_weight * near
        parts["near_loss"] = near.item()
        parts["near_accuracy"] = near_accuracy
    if capture_anchors:
        parts["anchors"] = {layer: captured[layer] for layer in capture_anchors}
    return total, parts


def _offset_terms(out, batch: Batch, config, offset_readout, parts: dict) -> Any:
    """The weighted offset read-out and cell-to-A attention terms of :func:`training_loss` (0
    when both are off); their values go into ``parts``."""
    total: Any = 0.0
    if config.offset_loss_weight > 0 and offset_readout is not None:
        labels = offset_labels(
            batch.cell_rows, batch.cell_cols, batch.agent_rows, batch.agent_cols, IGNORE_INDEX
        )
        offset, offset_accuracy = offset_readout.loss(
            out.hidden_states[config.offset_layer], labels, IGNORE_INDEX
        )
        total = total + config.offset_loss_weight * offset
        parts["offset_loss"] = offset.item()
        parts["offset_accuracy"] = offset_accuracy
    if config.offset_attention_weight > 0:
        to_agent = cell_to_agent_attention(
            out.attentions, batch, config.offset_attention_layer, config.offset_attention_head
        )
        total = total + config.offset_attention_weight * to_agent
        parts["offset_attention_loss"] = to_agent.item()
    return total


def ring2_attention(attentions: tuple[torch.Tensor, ...], batch: Batch, layer: int) -> float:
    """Mean attention weight that the anchors' ring-2 slots
    (:data:`agent_training.supervision.NEAR_ANCHOR_SLOTS` at Manhattan distance 2: heads 0 and 1
    of the first two anchor tokens, every head of the third, in block ``layer``) put on their
    target cells (a progress figure for the training log; NaN when the batch has none)."""
    targets = batch.attention_targets
    if targets.numel() == 0:
        return float("nan")
    head, row, query = targets[:, 1], targets[:, 2], targets[:, 3]
    anchor = query - (batch.prompt_lengths[row] - batch.prefix_ids.shape[1] - 3)
    ring2 = (targets[:, 0] == layer) & (
        (anchor == 2) | ((anchor >= 0) & (anchor <= 1) & (head <= 1))
    )
    if not ring2.any():
        return float("nan")
    chosen = targets[ring2]
    weights = attentions[layer][chosen[:, 2], chosen[:, 1], chosen[:, 3], chosen[:, 4]]
    return float(weights.detach().float().mean())


def cell_to_agent_attention(
    attentions: tuple[torch.Tensor, ...], batch: Batch, layer: int, head: int
) -> torch.Tensor:
    """Mean negative log attention weight from every grid-cell token to A's cell token in
    ``(layer, head)``: each cell reads A's coordinates there, so it can know its offset from A
    by the next block (:class:`agent_training.map_supervision.OffsetReadout`)."""
    rows, queries = torch.nonzero(batch.cell_rows != IGNORE_INDEX, as_tuple=True)
    weights = attentions[layer][rows, head, queries, batch.agent_keys[rows]]
    return -torch.log(weights.float() + 1e-6).mean()


def interchange_loss(
    model,
    examples: list[Example],
    config: TrainingConfig,
    readout: CoordinateReadout | None,
    map_readout: MapReadout | None,
    tokenizer,
    rng: np.random.Generator,
    full_attention: tuple[int, ...],
) -> tuple[torch.Tensor, dict[str, float]] | None:
    """The interchange objective of the map agent (:mod:`agent_training.map_supervision`).

    Each example's state gets a counterfactual (agent or goal moved). The counterfactual batch is
    trained like any batch (:func:`training_loss`) while its anchors' block outputs are captured
    at every block; then the base prompts run with those outputs written over their anchors and
    must write the counterfactuals' completions.

    Returns:
        ``(counterfactual loss + interchange_loss_weight * patched loss, parts)``, or None for
        key-prompt batches and when no example has a counterfactual.
    """
    if any(uses_key_prompt(e.grid.variant) for e in examples):
        return None
    bases, counterfactuals = [], []
    for example in examples:
        moved = move_counterfactual(example.grid, example.state, rng)
        if moved is None:
            continue
        cf_grid, cf_state = moved
        plan = sample_plan(cf_grid, solve(cf_grid), cf_state, PLAN_STEPS, rng)
        bases.append(example)
        counterfactuals.append(make_example(cf_grid, cf_state, plan))
    if not bases:
        return None
    device = next(model.parameters()).device
    cf_batch = encode_batch(
        counterfactuals,
        tokenizer,
        tokenizer.pad_token_id,
        full_attention,
        anchor_routing=config.anchor_routing,
        neighbour_lookups=config.neighbour_lookups,
    ).to(device)
    layers = tuple(range(model.config.num_hidden_layers))
    cf_total, cf_parts = training_loss(
        model, cf_batch, config, readout, map_readout, counterfactuals, capture_anchors=layers
    )
    source = cf_parts.pop("anchors")
    prefix_len = cf_batch.prefix_ids.shape[1]
    suffix_ids = cf_batch.suffix_ids.clone()
    for row, base in enumerate(bases):
        prompt = tokenizer(base.prompt, add_special_tokens=False)["input_ids"]
        if len(prompt) != int(cf_batch.prompt_lengths[row]):
            raise ValueError("a counterfactual prompt does not tokenise to its base's length")
        suffix_ids[row, : len(prompt) - prefix_len] = torch.tensor(prompt[prefix_len:])
    patched = replace(cf_batch, suffix_ids=suffix_ids)
    positions = anchor_positions(cf_batch.prompt_lengths.tolist(), prefix_len).to(device)
    out = _shared_prefix_forward(
        model, patched, suffix_hooks=anchor_hooks(model, positions, write=source)
    )
    patched_loss, patched_accuracy = _completion_loss_and_accuracy(out, patched)
    if config.decision_loss_weight > 0:
        patched_loss = patched_loss + config.decision_loss_weight * decision_loss(
            out.logits, patched
        )
    parts = {f"cf_{k}": v for k, v in cf_parts.items()}
    parts["interchange_loss"] = patched_loss.item()
    parts["interchange_accuracy"] = patched_accuracy
    return cf_total + config.interchange_loss_weight * patched_loss, parts


def full_sequence_loss(model, batch: Batch) -> torch.Tensor:
    """The same loss as :func:`shared_prefix_loss`, running every full sequence (reference)."""
    ids = torch.cat([batch.prefix_ids.expand(batch.suffix_ids.shape[0], -1), batch.suffix_ids], 1)
    logits = model(input_ids=ids).logits[:, batch.prefix_ids.shape[1] : -1].float()
    targets = batch.labels[:, 1:]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )


# ---------------------------------------------------------------------------------------------
# Model and loop
# ---------------------------------------------------------------------------------------------


def with_layer_types(model, layer_types: Sequence[str]):
    """A copy of ``model`` (same weights) whose blocks use ``layer_types`` (``"full_attention"``
    or ``"sliding_attention"``): the map agent turns the shipped agent's third block into full
    attention, so its anchors can read A's neighbours anywhere in a 15 x 15 grid."""
    from transformers import GptOssForCausalLM

    if len(layer_types) != model.config.num_hidden_layers:
        raise ValueError(f"need {model.config.num_hidden_layers} layer types, got {layer_types}")
    config = copy.deepcopy(model.config)
    config.layer_types = list(layer_types)
    rebuilt = GptOssForCausalLM(config)
    rebuilt.load_state_dict(model.state_dict())
    return rebuilt.to(next(model.parameters()).device).eval()


def build_model(model_config: BundledModelConfig, tokenizer, seed: int):
    """A freshly initialised ``GptOssForCausalLM`` (initialisation seeded by ``seed``)."""
    from transformers import GptOssForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GptOssForCausalLM(gpt_oss_config(model_config, tokenizer))


GRID_PENALTY_SCOPES = ("coordinates", "reasoning", "completion")
"""Values of ``TrainingConfig.grid_penalty_scope``."""

MAP_CELL_WEIGHTINGS = ("canvas", "uncertain")
"""Values of ``TrainingConfig.map_cell_weighting``."""


@dataclass(frozen=True)
class TrainingConfig:
    """The optimisation of the bundled agent."""

    steps: int = 1800
    """Optimizer steps."""

    batch_size: int = 24
    """Examples per step."""

    learning_rate: float = 3e-3
    """Peak AdamW learning rate (linear warm-up, cosine decay to 10%)."""

    warmup_steps: int = 60
    """Steps of linear warm-up."""

    weight_decay: float = 0.01
    """AdamW weight decay."""

    grad_clip: float = 1.0
    """Gradient-norm clipping."""

    seed: int = 0
    """Seed of the model initialisation and of the data stream."""

    coordinate_loss_weight: float = 1.0
    """Weight of the auxiliary cell-coordinate loss (:mod:`agent_training.supervision`);
    0 turns it off."""

    coordinate_layer: int = 2
    """Residual stream read by the coordinate read-out: after this many blocks (0 = the
    embeddings)."""

    attention_loss_weight: float = 1.0
    """Weight of the attention-supervision loss (:mod:`agent_training.supervision`); 0 turns
    it off."""

    decision_loss_weight: float = 0.0
    """Extra weight on the cross-entropy of the plan's first move (the decision the answer
    copies; it is one of ~40 completion tokens in the plain loss); 0 turns it off."""

    map_loss_weight: float = 0.0
    """Weight of the map read-out of the pre-reasoning anchors (the map agent,
    :mod:`agent_training.map_supervision`); 0 turns it off."""

    map_layers: tuple[int, ...] = (1, 2)
    """Blocks whose output at the anchors the map read-out reads (one read-out each)."""

    map_cell_weighting: str = "canvas"
    """The map read-out's cell term: ``"canvas"``, the mean over all 225 canvas cells (padding
    included; the shipped ``bundled:map``), or ``"uncertain"``, grid cells only, each weighted by
    how uncertain its wall is given the grid's size and density
    (:func:`agent_training.map_supervision.prior_uncertainty`)."""

    map_cell_weight: float = 1.0
    """Factor of the map read-out's cell term (within ``map_loss_weight``)."""

    near_loss_weight: float = 0.0
    """Weight of the read-out of the 12 cells within two steps of A from the anchors after block
    ``near_layer`` (:class:`agent_training.map_supervision.NearReadout`); 0 turns it off."""

    near_layer: int = 2
    """Block whose anchor output the near read-out reads (the anchors read the cells around A
    in block 2, :data:`agent_training.supervision.NEAR_ANCHOR_SLOTS`)."""

    offset_loss_weight: float = 0.0
    """Weight of the read-out of each grid cell's offset from A from the residual stream after
    ``offset_layer`` (:class:`agent_training.map_supervision.OffsetReadout`); 0 turns it off."""

    offset_layer: int = 2
    """Residual stream the offset read-out reads: after this many blocks (2: the input of the
    block where the anchors read the cells around A)."""

    offset_attention_weight: float = 0.0
    """Weight of the attention supervision from every grid-cell token to A's cell token
    (:func:`cell_to_agent_attention`); 0 turns it off."""

    offset_attention_layer: int = 1
    """Block of that attention supervision (a full-attention block, so every cell reaches A)."""

    offset_attention_head: int = 3
    """Head of that attention supervision (head 3 shares its key-value head with head 2, which
    already reads A at the anchors in block 1)."""

    interchange_loss_weight: float = 0.0
    """Weight of the interchange objective (:func:`interchange_loss`: base prompts run with a
    counterfactual's anchors must write the counterfactual's completion); 0 turns it off."""

    anchor_routing: bool = False
    """Attention supervision routes A and G through the anchors (the map agent) instead of
    straight from the coordinate tokens to the cells."""

    object_attention_weight: float = 0.0
    """Weight of the penalties on attention (every layer and head,
    :func:`agent_training.supervision.attention_mass_penalty`) from the completion tokens to
    A's and G's cells, and from the tokens that write A's and G's coordinates to the whole grid
    text, so the reasoning takes the positions from the anchors; 0 turns it off."""

    grid_penalty_scope: str = "coordinates"
    """Which completion tokens the grid-text penalty covers: ``"coordinates"`` (those that write
    A's and G's coordinates), ``"reasoning"`` (all but the direction words of ``Next to A:``,
    which may read only the neighbour cell they name) or ``"completion"`` (every completion
    token: the reasoning and the answer read the grid only through the anchors)."""

    isolate_objects: bool = False
    """Bar the grid text's own tokens from attending to A's and G's cells (with the attention
    penalties), so no grid token knows where A or G is: a completion token that reads the walls
    then learns nothing about A or G from them, and finds A's neighbours by their coordinates
    (which it takes from the anchors) rather than by an "I am next to A" feature."""

    grid_attention_floor: float | None = None
    """Form of the attention penalties (:func:`agent_training.supervision.mass_penalty`):
    None for ``-log(1 - w)``, a float for the log barrier that drives the mass below it."""

    barrier_ramp_steps: int = 0
    """Steps over which ``object_attention_weight`` rises linearly from 0 to its value (after
    ``readout_warmup_steps``); 0 applies it at once. A barrier of weight 20 switched on cold
    wrecks a warm-started model (docs/map_agent.md)."""

    readout_warmup_steps: int = 0
    """First steps that train only the read-outs (the model's weights stay as they are), so a
    warm-started model is not pushed around by freshly initialised read-outs."""

    def __post_init__(self) -> None:
        if self.grid_penalty_scope not in GRID_PENALTY_SCOPES:
            raise ValueError(
                f"grid_penalty_scope must be one of {GRID_PENALTY_SCOPES}, "
                f"got {self.grid_penalty_scope!r}"
            )
        if self.grid_attention_floor is not None and not 0 < self.grid_attention_floor < 1:
            raise ValueError(
                f"grid_attention_floor must lie in (0, 1), got {self.grid_attention_floor}"
            )
        if self.map_cell_weighting not in MAP_CELL_WEIGHTINGS:
            raise ValueError(
                f"map_cell_weighting must be one of {MAP_CELL_WEIGHTINGS}, "
                f"got {self.map_cell_weighting!r}"
            )
        if self.barrier_ramp_steps < 0:
            raise ValueError(f"barrier_ramp_steps must be >= 0, got {self.barrier_ramp_steps}")

    @property
    def neighbour_lookups(self) -> bool:
        """Whether the direction words look up their neighbour cell in the grid text (not when
        the whole completion is barred from it)."""
        return self.grid_penalty_scope != "completion"


def learning_rate_at(step_index: int, config: TrainingConfig) -> float:
    """The learning rate of step ``step_index`` (0-based)."""
    if step_index < config.warmup_steps:
        return config.learning_rate * (step_index + 1) / config.warmup_steps
    progress = (step_index - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def barrier_weight_at(step_index: int, config: TrainingConfig) -> float:
    """The attention penalties' weight at step ``step_index`` (0-based; see
    ``TrainingConfig.barrier_ramp_steps``)."""
    ramp = config.barrier_ramp_steps
    if ramp <= 0:
        return config.object_attention_weight
    progress = (step_index - config.readout_warmup_steps + 1) / ramp
    return config.object_attention_weight * min(1.0, max(0.0, progress))


def batches(
    data_config: TrainingDataConfig,
    batch_size: int,
    tokenizer,
    seed: int,
    exclude: frozenset[Grid] = frozenset(),
    full_attention_layers: tuple[int, ...] = (1, 3),
    *,
    anchor_routing: bool = False,
    neighbour_lookups: bool = True,
) -> Iterator[tuple[list[Example], Batch]]:
    """The endless, seeded stream of training batches (never a grid of ``exclude``)."""
    rng = np.random.default_rng(seed)
    while True:
        examples = sample_batch_examples(data_config, batch_size, rng, exclude)
        yield (
            examples,
            encode_batch(
                examples,
                tokenizer,
                tokenizer.pad_token_id,
                full_attention_layers,
                anchor_routing=anchor_routing,
                neighbour_lookups=neighbour_lookups,
                near=data_config.near_line,
            ),
        )


def full_attention_layers(model) -> tuple[int, ...]:
    """Indices of the model's full-attention layers (GPT-OSS alternates them with sliding ones)."""
    return tuple(i for i, kind in enumerate(model.config.layer_types) if kind == "full_attention")


def train(
    model,
    tokenizer,
    config: TrainingConfig,
    data_config: TrainingDataConfig,
    *,
    device: str | torch.device = "cpu",
    exclude: frozenset[Grid] = frozenset(),
    on_step: Callable[[dict], bool | None] | None = None,
) -> list[dict]:
    """Train ``model`` in place; returns one log record per step.

    The auxiliary losses of :mod:`agent_training.supervision` (weights in ``config``) need
    the attention weights, so the model runs eager attention while training and gets its
    original attention implementation back afterwards; their read-out is discarded.

    Args:
        exclude: grids never trained on (the held-out evaluation set).
        on_step: called after each step with its log record (``step``, ``loss`` (completion),
            ``coordinate_loss`` and ``attention_loss`` when used, ``answer_accuracy``
            (teacher-forced), ``seconds`` elapsed, ``tokens`` seen); returning True stops the
            training after that step.
    """
    layers = full_attention_layers(model)
    if config.attention_loss_weight > 0 and (
        not layers or model.config.num_attention_heads <= NEIGHBOUR_HEAD
    ):
        raise ValueError(
            "attention supervision needs a full-attention layer and at least "
            f"{NEIGHBOUR_HEAD + 1} heads; set attention_loss_weight=0"
        )
    readout = None
    if config.coordinate_loss_weight > 0:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            readout = CoordinateReadout(model.config.hidden_size, max(data_config.sizes))
        readout.to(device)
    map_readout = None
    if config.map_loss_weight > 0:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed + 1)
            map_readout = MapReadout(model.config.hidden_size, config.map_layers)
        map_readout.to(device)
    near_readout = None
    if config.near_loss_weight > 0:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed + 3)
            near_readout = NearReadout(model.config.hidden_size)
        near_readout.to(device)
    offset_readout = None
    if config.offset_loss_weight > 0:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed + 4)
            offset_readout = OffsetReadout(model.config.hidden_size)
        offset_readout.to(device)
    interchange_rng = np.random.default_rng(config.seed + 2)
    original_attention = model.config._attn_implementation
    if config.attention_loss_weight > 0:
        model.set_attn_implementation("eager")
    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    for head in (readout, map_readout, near_readout, offset_readout):
        if head is not None:
            decay += list(head.parameters())
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.learning_rate,
        betas=(0.9, 0.98),
    )
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    stream = batches(
        data_config,
        config.batch_size,
        tokenizer,
        config.seed + 1,
        exclude,
        layers,
        anchor_routing=config.anchor_routing,
        neighbour_lookups=config.neighbour_lookups,
    )
    log = []
    start = time.perf_counter()
    tokens = 0
    try:
        for step_index in range(config.steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate_at(step_index, config)
            examples, batch = next(stream)
            batch = batch.to(device)
            step_config = replace(
                config, object_attention_weight=barrier_weight_at(step_index, config)
            )
            total, parts = training_loss(
                model,
                batch,
                step_config,
                readout,
                map_readout,
                examples,
                near_readout=near_readout,
                offset_readout=offset_readout,
            )
            if config.interchange_loss_weight > 0:
                interchange = interchange_loss(
                    model,
                    examples,
                    step_config,
                    readout,
                    map_readout,
                    tokenizer,
                    interchange_rng,
                    layers,
                )
                if interchange is not None:
                    total = total + interchange[0]
                    parts.update(interchange[1])
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            if step_index < config.readout_warmup_steps:
                for parameter in model.parameters():
                    parameter.grad = None
            torch.nn.utils.clip_grad_norm_(parameters, config.grad_clip)
            optimizer.step()
            tokens += batch.prefix_ids.numel() + batch.suffix_ids.numel()
            record = {
                "step": step_index,
                **parts,
                "seconds": time.perf_counter() - start,
                "tokens": tokens,
            }
            log.append(record)
            if on_step is not None and on_step(record) is True:
                break  # the caller asked to stop (e.g. a time limit)
    finally:
        model.set_attn_implementation(original_attention)
        model.eval()
    return log
