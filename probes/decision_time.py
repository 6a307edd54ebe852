"""Where along the reasoning the decision is made: a logit lens on the answer, its agreement
with the final action over reasoning time, and the decision read out of the activation store.

**Logit lens.** Which action each layer's residual stream would name, at the position that
predicts the final answer's action token and at the end of each reasoning chunk. The lens reads
``resid[l]`` (after block ``l``) through the model's final norm and unembedding
(nostalgebraist's logit lens) and keeps the logits of the four candidate action tokens; at the
last block it is the model itself. Positions come from the model's chat format; chunks end
every ``chunk`` reasoning tokens and at the last one. ``probs`` are ``(n_layers, n_positions,
4)`` float32 in the order ``UP, DOWN, LEFT, RIGHT``.

**Decision curves.** Each step contributes its lens distributions (:func:`lens_probs`) at its
chunk ends and at the answer, and the action it answered. A point of a curve is the share of
steps whose lens top choice (at that layer and progress bin) is the final action, beside the
majority action's share and chance (25%), pooled over steps with grid-bootstrap intervals.

**Read-out over reasoning time.** For every store row (one step) the residual stream is read
at seven bins in reasoning order: the pre-reasoning anchor, the last stored reasoning row of
each fifth of the reasoning and the post-reasoning anchor (at an anchor, its last token). Per
bin and layer the estimators are trained on half the grids and scored on the others
(:func:`readout_curves`) for the targets ``action`` (the executed action on valid steps) and
``agent cell`` / ``goal cell`` (:class:`PositionProbe`). Baselines, fitted on the training
grids: for the action the majority move, the optimal policy and a state-only decoder; for the
cells :class:`PositionPrior` and a uniform guess among open cells. No I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from goalprobe.activations.capture.base import ResidualBackend, TokenBatch, get_submodule_path
from goalprobe.activations.store.reader import ActivationStore
from goalprobe.agents.chat_format import ChatFormat, chat_format_for
from goalprobe.agents.harmony import reasoning_offsets
from goalprobe.gridworld.core import Action
from goalprobe.probes.baselines import uniform_top1
from goalprobe.probes.plan_sweep import StatePlanDecoder, state_features
from goalprobe.probes.position import PositionPrior, PositionProbe
from goalprobe.probes.splits import split_by_grid

from goalprobe.stats import Estimate, GridBootstrap, Verdict, grid_bootstrap_ratio

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


PROGRESS_BINS: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
"""Upper edges of the reasoning-progress bins (fraction of the reasoning's tokens)."""
_BIN_EDGES = tuple(zip((0.0, *PROGRESS_BINS[:-1]), PROGRESS_BINS, strict=True))


@dataclass(frozen=True)
class StepLens:
    """The lens on one step: ``chunks (n_layers, C, 4)`` at the chunk ends (reasoning progress
    ``fractions (C,)``), ``answer (n_layers, 4)`` at the answer, and the answered action."""

    grid_id: str
    action: int
    fractions: np.ndarray
    chunks: np.ndarray
    answer: np.ndarray


def _rate(boot: GridBootstrap, hits: np.ndarray, weight: np.ndarray, ids) -> dict:
    """A share over steps with :func:`grid_bootstrap_ratio`'s interval."""
    keep = weight > 0
    if not keep.any():  # no step has a chunk end in this bin
        return Estimate(None, n=0).to_dict()
    out = grid_bootstrap_ratio(
        hits[keep],
        weight[keep],
        np.asarray(ids)[keep],
        n_resamples=boot.n_resamples,
        confidence=boot.confidence,
    )
    return {k: out[k] for k in ("value", "ci_low", "ci_high")} | {"n": int(weight.sum())}


def decision_curves(
    steps: Sequence[StepLens], *, n_resamples: int = 1000, random_state: int = 0
) -> dict:
    """Curves of the lens's agreement with the final action: ``answer_by_layer`` (at the answer
    position), ``progress_by_layer`` (per progress bin, each step weighing one per bin it has
    chunks in), ``first_stable`` (quartiles of the progress from which the final action stays
    the last layer's top choice), ``majority`` (the baseline) and ``chance`` (0.25)."""
    if not steps:
        raise ValueError("no steps to read")
    ids = [s.grid_id for s in steps]
    boot = GridBootstrap.from_grid_ids(ids, n_resamples=n_resamples, random_state=random_state)
    actions = np.asarray([s.action for s in steps])
    n_layers = steps[0].answer.shape[0]
    majority_action = int(np.bincount(actions, minlength=4).argmax())
    ones = np.ones(len(steps))
    tops = np.stack([s.answer.argmax(axis=-1) for s in steps], axis=1) == actions  # (L, N)
    answer = [_rate(boot, hits.astype(float), ones, ids) for hits in tops]
    progress = []
    for layer in range(n_layers):
        row = []
        for low, high in _BIN_EDGES:
            hits, weight = np.zeros(len(steps)), np.zeros(len(steps))
            for i, s in enumerate(steps):
                inside = (s.fractions > low) & (s.fractions <= high)
                if inside.any():
                    top = s.chunks[layer, inside].argmax(axis=-1) == s.action
                    hits[i], weight[i] = top.mean(), 1.0
            row.append({"bin": [low, high], **_rate(boot, hits, weight, ids)})
        progress.append(row)
    stable = []
    for s in steps:
        probs = np.concatenate([s.chunks[-1], s.answer[-1][None]], axis=0)
        index = first_stable_top(probs, s.action)
        if index is not None:
            stable.append(1.0 if index >= len(s.fractions) else float(s.fractions[index]))
    return {
        "steps": len(steps),
        "grids": int(boot.n_grids),
        "layers": n_layers,
        "answer_by_layer": answer,
        "progress_by_layer": progress,
        "first_stable": {
            "steps": len(stable),
            "quartiles": np.quantile(stable, [0.25, 0.5, 0.75]).tolist() if stable else None,
        },
        "majority": _rate(boot, (actions == majority_action).astype(float), ones, ids),
        "chance": 0.25,
    }


def bin_positions(fractions: np.ndarray) -> list[int | None]:
    """For each progress bin, the index of the last chunk end inside it (None: no chunk)."""
    bins = [np.flatnonzero((fractions > low) & (fractions <= high)) for low, high in _BIN_EDGES]
    return [int(inside[-1]) if inside.size else None for inside in bins]


def action_probe():
    """The read-out of a discrete target: a logistic regression on standardised features
    (fixed in advance)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=1000))


def readout_curves(
    features: np.ndarray,
    present: np.ndarray,
    actions: np.ndarray,
    grid_ids: np.ndarray,
    train: np.ndarray,
    baselines: dict[str, np.ndarray],
    *,
    estimator: Callable[[], Any] = action_probe,
    baseline_rates: dict[str, np.ndarray] | None = None,
    n_resamples: int = 1000,
    random_state: int = 0,
) -> dict:
    """Decode a target from the residual stream at each layer and progress bin.

    Args:
        features: ``(N, L, B, d)`` the residual stream at each bin's position (``present (N,
            B)``: the row has one).
        actions: ``(N,)`` classes or ``(N, k)`` (a cell's ``(row, col)``: a hit when every column
            matches).
        train: ``(N,)`` bool, a split by grid; intervals resample the test grids.
        baselines: name -> predictions needing no activation, fitted on the training rows.
        estimator: a factory of a fresh scikit-learn estimator.
        baseline_rates: name -> ``(N,)`` probability that a random predictor is right.

    Returns ``baselines`` (test accuracy of each), ``strongest`` and ``by_layer`` (per layer
    and bin: the probe's test accuracy and its paired margin over the strongest baseline,
    Bonferroni-adjusted over the ``family`` of every layer x bin, with the verdict ``yes``
    when that interval lies above 0, ``no`` when not, ``undecided`` without one). Accuracies
    carry :func:`grid_bootstrap_ratio`'s intervals.
    """
    train = np.asarray(train, dtype=bool)
    test = ~train
    ids = np.asarray(grid_ids)
    truth = np.asarray(actions).reshape(len(train), -1)
    boot: dict[str, Any] = {"n_resamples": n_resamples, "random_state": random_state}

    def hits_of(pred: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        want = truth if rows is None else truth[rows]
        return (np.asarray(pred).reshape(want.shape) == want).all(axis=1).astype(float)

    base_hits = {name: hits_of(pred) for name, pred in baselines.items()}
    base_hits.update({k: np.asarray(v, dtype=float) for k, v in (baseline_rates or {}).items()})
    base = {
        name: _summary(grid_bootstrap_ratio(h[test], None, ids[test], **boot))
        for name, h in base_hits.items()
    }
    strongest = max(base, key=lambda k: base[k]["value"] or 0.0)
    # the verdicts form one family (every layer x bin): Bonferroni-adjusted margin intervals
    family = int(features.shape[1] * features.shape[2])
    confidence = 1 - 0.05 / family
    tail = boot | {
        "confidence": confidence,
        "n_resamples": max(n_resamples, TAIL_RESAMPLES) if n_resamples else 0,
    }
    target = truth[:, 0] if truth.shape[1] == 1 else truth
    by_layer: list[list[dict[str, Any]]] = []
    for layer in range(features.shape[1]):
        row: list[dict[str, Any]] = []
        for b in range(features.shape[2]):
            rows_train = train & present[:, b]
            rows_test = test & present[:, b]
            kinds = np.unique(truth[rows_train], axis=0)
            if rows_train.sum() < 2 or len(kinds) < 2 or not rows_test.any():
                row.append({"bin": b, "value": None, "verdict": "undecided", "n": 0})
                continue
            x = features[:, layer, b].reshape(len(train), -1).astype(np.float32)
            model = estimator().fit(x[rows_train], target[rows_train])
            hits = hits_of(model.predict(x[rows_test]), rows_test)
            accuracy = _summary(grid_bootstrap_ratio(hits, None, ids[rows_test], **boot))
            gain = hits - base_hits[strongest][rows_test]
            margin = _summary(grid_bootstrap_ratio(gain, None, ids[rows_test], **tail))
            verdict = Verdict.from_flag(Estimate.from_dict(margin).above(0)).answer
            row.append({"bin": b, **accuracy, "margin_over_strongest": margin, "verdict": verdict})
        by_layer.append(row)
    return {
        "baselines": base,
        "strongest": strongest,
        "family": family,
        "margin_confidence": confidence,
        "by_layer": by_layer,
    }


TAIL_RESAMPLES = 20_000
"""Fewest resamples of a Bonferroni-adjusted margin interval (its bound is a far tail quantile,
which 1,000 resamples leave to a handful of draws)."""


def _summary(stat: dict) -> dict:
    """``value, ci_low, ci_high, n, n_grids`` of a :func:`grid_bootstrap_ratio` result."""
    return {k: stat.get(k) for k in ("value", "ci_low", "ci_high", "n", "n_grids")}


READOUT_BINS: tuple[str, ...] = (
    "pre-reasoning anchor",
    *(f"{round(100 * lo)}-{round(100 * hi)}%" for lo, hi in _BIN_EDGES),
    "post-reasoning anchor",
)
"""The read-out's bins, in reasoning order."""

ANCHOR_TOKEN = 2
"""Which of the anchor's three tokens a bin reads (``assistant``)."""

_FIELDS = (
    "cell_types",
    "action",
    "action_valid",
    "plan",
    "agent_row_col",
    "goal_row_col",
    "grid_size",
    "grid_id",
    "optimal_actions",
)


def bin_features(
    store: ActivationStore, layers: tuple[int, ...] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(features (N, L, 7, d_model) float32, present (N, 7) bool)``: the residual stream of
    every store row at each of :data:`READOUT_BINS` (zeros where absent)."""
    layers = store.layers if layers is None else tuple(layers)
    n, nb = len(store), len(READOUT_BINS)
    features = np.zeros((n, len(layers), nb, store.d_model), dtype=np.float32)
    present = np.zeros((n, nb), dtype=bool)
    along = store.reasoning_rows()
    # the last reasoning row of each (row, fifth): fifths are (low, high] of the fraction
    # exact fractions from the integer offsets (the stored float32 0.2 lies above 0.2)
    exact = (along.tokens.astype(np.float64) + 1) / np.maximum(along.length, 1)
    fifth = np.searchsorted(np.asarray(PROGRESS_BINS), exact, side="left")
    keys = along.row * len(PROGRESS_BINS) + fifth
    _, last = np.unique(keys[::-1], return_index=True)
    pick = len(keys) - 1 - last
    rows, bins = along.row[pick], fifth[pick] + 1
    present[rows, bins] = True
    anchors = [(0, "pre_reasoning"), (-1, "post_reasoning")]
    anchors = [(b, stage) for b, stage in anchors if stage in store.stages]
    for b, stage in anchors:
        present[:, b] = store.present(stage)
    for j, layer in enumerate(layers):
        for b, stage in anchors:
            at = np.flatnonzero(present[:, b])
            if at.size:
                features[at, j, b] = store.read(stage, layer, at)[:, ANCHOR_TOKEN]
        if len(pick):
            features[rows, j, bins] = store.read_reasoning(layer, along.index[pick])
    return features, present


def reasoning_readout(
    store: ActivationStore,
    *,
    test_fraction: float = 0.5,
    n_resamples: int = 1000,
    random_state: int = 0,
) -> dict[str, Any]:
    """The three targets read out of the store at every bin and stored layer.

    Without reasoning rows in the store only the anchors are read; ``test_fraction`` of the
    grids is held out. Returns ``{bins, layers, every, anchor_token, rows, grids, test_grids,
    rows_by_bin, targets}``, ``targets``: name -> ``rows`` and :func:`readout_curves`'s result.
    """
    labels = store.labels(list(_FIELDS))
    ids = labels["grid_id"].astype(str)
    if len(np.unique(ids)) < 4:
        raise ValueError(
            f"{store.path}: {len(np.unique(ids))} grid(s); a read-out split by grid needs >= 4"
        )
    features, present = bin_features(store)
    split = split_by_grid(ids, test_fraction=test_fraction, random_state=random_state)
    train = np.zeros(len(ids), dtype=bool)
    train[split.train] = True
    state = state_features(labels["agent_row_col"], labels["goal_row_col"], labels["grid_size"])
    sizes = labels["grid_size"].astype(np.int64)
    optimal = np.where(
        labels["optimal_actions"].any(axis=1), labels["optimal_actions"].argmax(axis=1), -1
    )
    y, keep = labels["action"].astype(np.int64), labels["action_valid"].astype(bool)
    plans = labels["plan"].astype(np.int64)
    with_move = train & (plans[:, 0] < 4)
    decoder = StatePlanDecoder(random_state=random_state).fit(state[with_move], plans[with_move])
    fit = train & keep
    majority = int(np.bincount(y[fit], minlength=4).argmax()) if fit.any() else 0
    baselines = {
        "majority move": np.full(len(y), majority),
        "optimal policy (true grid)": optimal,
        "state-only decoder": decoder.predict(state)[:, 0].astype(np.int64),  # the first move
    }
    rows = (features, present, ids, train)
    boot = {"n_resamples": n_resamples, "random_state": random_state}
    targets = {"action": _curves(rows, y, keep, baselines, action_probe, None, boot)}
    chance = {"uniform guess among open cells": uniform_top1(labels["cell_types"], sizes)}
    for name, field in (("agent cell", "agent_row_col"), ("goal cell", "goal_row_col")):
        y = labels[field].astype(np.int64)
        prior = PositionPrior().fit(sizes[train], y[train]).predict(sizes)
        baseline = {"most frequent cell of the size": prior}
        every = np.ones(len(y), dtype=bool)
        targets[name] = _curves(rows, y, every, baseline, PositionProbe, chance, boot)
    return {
        "bins": list(READOUT_BINS),
        "layers": list(store.layers),
        "every": int(store.reasoning_every),
        "anchor_token": ANCHOR_TOKEN,
        "rows": len(ids),
        "grids": int(len(np.unique(ids))),
        "test_grids": int(len(np.unique(ids[~train]))),
        "rows_by_bin": present.sum(axis=0).astype(int).tolist(),
        "targets": targets,
    }


def _curves(rows, y, keep, baselines, estimator, rates, boot) -> dict:
    """:func:`readout_curves` on the rows ``keep`` of ``rows`` (features, present, grid ids,
    train), the target ``y`` and the baselines' predictions and ``rates``."""
    features, present, ids, train = (a[keep] for a in rows)
    kept = {k: np.asarray(v)[keep] for k, v in baselines.items()}
    rates = {k: np.asarray(v)[keep] for k, v in (rates or {}).items()}
    curves = readout_curves(
        features,
        present,
        y[keep],
        ids,
        train,
        kept,
        estimator=estimator,
        baseline_rates=rates,
        **boot,
    )
    return {"rows": int(keep.sum()), **curves}


def first_readable(target: dict) -> dict | None:
    """The first bin (in reasoning order) at which some layer's read-out beats the strongest
    baseline (verdict ``yes``), with that layer; None when no bin does."""
    for b in range(len(READOUT_BINS)):
        for layer, cells in enumerate(target["by_layer"]):
            if cells[b].get("verdict") == "yes":
                return {"bin": b, "name": READOUT_BINS[b], "layer_index": layer}
    return None
