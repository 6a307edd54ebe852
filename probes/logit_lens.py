"""A logit lens on the answer: which action each layer's residual stream would name, at the
position that predicts the final answer's action token and at the end of each reasoning chunk.

The lens reads ``resid[l]`` (after block ``l``) through the model's final norm and unembedding
(nostalgebraist's logit lens) and keeps the logits of the four candidate action tokens; at the
last block it is the model itself. Positions come from the model's chat format; chunks end
every ``chunk`` reasoning tokens and at the last one. ``probs`` are ``(n_layers, n_positions,
4)`` float32 in the order ``UP, DOWN, LEFT, RIGHT``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from goalprobe.activations.capture.base import ResidualBackend, TokenBatch, get_submodule_path
from goalprobe.agents.chat_format import ChatFormat, chat_format_for
from goalprobe.agents.harmony import reasoning_offsets
from goalprobe.gridworld.core import Action

FINAL_NORM_PATHS: tuple[str, ...] = ("model.norm", "transformer.ln_f", "model.final_layernorm")
"""Where a Hugging Face causal LM keeps its final norm (the first that exists is used)."""


@dataclass(frozen=True)
class StepPositions:
    """Where to read one step: ``answer``, the position predicting the answer's action token
    (at ``action_token``), the token each action would take there (``candidates``), and the
    reasoning chunks' last tokens (positions, offsets in the reasoning, ``(offset + 1) /
    length``)."""

    answer: int
    action_token: int
    candidates: tuple[int, int, int, int]
    chunk_ends: tuple[int, ...]
    chunk_offsets: tuple[int, ...]
    chunk_fractions: tuple[float, ...]


def step_positions(
    tokenizer,
    prompt_ids: Sequence[int],
    generated_ids: Sequence[int],
    action: Action,
    chunk: int,
    chat_format: ChatFormat | None = None,
) -> StepPositions | None:
    """The lens positions of one step (None when the ids hold no final answer naming
    ``action``, e.g. reasoning cut off). ``chat_format``: the tokenizer's (found when None)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    ids = [int(i) for i in (*prompt_ids, *generated_ids)]
    fmt = chat_format_for(tokenizer) if chat_format is None else chat_format
    if fmt.find_anchors(ids).post_reasoning is None:
        return None
    span = fmt.reasoning_span(ids)
    final_start = fmt.answer_start(ids)
    if span is None or final_start is None:
        return None
    start = span.start
    final_ids = ids[final_start:]
    text = tokenizer.decode(final_ids)
    where = text.find(action.name)
    if where < 0:
        return None
    token = next(
        (j for j in range(len(final_ids)) if len(tokenizer.decode(final_ids[: j + 1])) > where),
        None,
    )
    if token is None:
        return None
    prefix = tokenizer.decode(final_ids[:token])
    base = final_ids[:token]
    candidates = []
    for name in (a.name for a in Action):
        encoded = tokenizer.encode(prefix + name, add_special_tokens=False)
        if encoded[: len(base)] == base and len(encoded) > len(base):
            candidates.append(int(encoded[len(base)]))
        else:
            candidates.append(int(tokenizer.encode(name, add_special_tokens=False)[0]))
    if len(set(candidates)) != len(candidates):
        return None
    length = span.length  # an agent may answer with an empty reasoning
    offsets = reasoning_offsets(length, chunk)
    action_token = final_start + token
    return StepPositions(
        answer=action_token - 1,
        action_token=action_token,
        candidates=tuple(candidates),  # type: ignore[arg-type]
        chunk_ends=tuple(start + o for o in offsets),
        chunk_offsets=offsets,
        chunk_fractions=tuple((o + 1) / length for o in offsets),
    )


@torch.no_grad()
def capture_resid(backend: ResidualBackend, ids: Sequence[int], positions: Sequence[int]):
    """``(n_layers, len(positions), d_model)`` the residual stream after every block at
    ``positions`` of ``ids`` (one forward pass)."""
    layers = list(range(backend.n_layers))
    batch = TokenBatch.from_sequences([list(ids)], [list(positions)], backend.pad_token_id or 0)
    resid = backend.capture(batch, layers)
    return torch.stack([resid[layer][0] for layer in layers])


@torch.no_grad()
def lens_from_resid(
    model: torch.nn.Module, resid: torch.Tensor, candidates: Sequence[int]
) -> np.ndarray:
    """The lens's distribution over ``candidates`` (softmax over their logits ``W_U
    norm(resid)``, the final norm at the first of :data:`FINAL_NORM_PATHS`) of residual
    streams ``(..., d_model)``: ``(..., len(candidates))`` float32."""
    norms = (get_submodule_path(model, path) for path in FINAL_NORM_PATHS)
    norm = next((module for module in norms if module is not None), None)
    if norm is None:
        raise ValueError(f"no final norm at any of {FINAL_NORM_PATHS}")
    unembed = model.get_output_embeddings()
    weight = next(unembed.parameters())
    logits = unembed(norm(resid.to(device=weight.device, dtype=weight.dtype))).float().cpu()
    return torch.softmax(logits[..., list(candidates)], dim=-1).numpy().astype(np.float32)


def lens_probs(
    backend: ResidualBackend,
    ids: Sequence[int],
    positions: Sequence[int],
    candidates: Sequence[int],
) -> np.ndarray:
    """``(n_layers, len(positions), len(candidates))`` the lens's distribution over
    ``candidates`` after every block, at ``positions`` of ``ids``."""
    return lens_from_resid(backend.model, capture_resid(backend, ids, positions), candidates)


def first_stable_top(probs: np.ndarray, target: int) -> int | None:
    """Index of the first position from which ``target`` is the top choice at every later
    position (``probs``: ``(P, 4)``), None when it is not the top choice at the last one."""
    top = probs.argmax(axis=-1) == target
    if not top[-1]:
        return None
    misses = np.flatnonzero(~top)
    return int(misses[-1]) + 1 if misses.size else 0
