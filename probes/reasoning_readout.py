"""The decision read out of the activation store over reasoning time.

For every store row (one step) the residual stream is read at seven bins in reasoning order:
the pre-reasoning anchor, the last stored reasoning row of each fifth of the reasoning and the
post-reasoning anchor (at an anchor, its last token). Per bin and layer the estimators are
trained on half the grids and scored on the others
(:func:`goalprobe.probes.decision_time.readout_curves`) for the targets ``action`` (the
executed action on valid steps) and ``agent cell`` / ``goal cell`` (:class:`PositionProbe`).

Baselines, fitted on the training grids: for the action the majority move, the optimal policy
and a state-only decoder; for the cells :class:`PositionPrior` and a uniform guess among open
cells. No I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from goalprobe.activations.store.reader import ActivationStore
from goalprobe.probes.baselines import uniform_top1
from goalprobe.probes.decision_time import PROGRESS_BINS, action_probe, readout_curves
from goalprobe.probes.plan_baselines import StatePlanDecoder, state_features
from goalprobe.probes.position import PositionPrior, PositionProbe
from goalprobe.probes.splits import split_by_grid

READOUT_BINS: tuple[str, ...] = (
    "pre-reasoning anchor",
    *(
        f"{round(100 * lo)}-{round(100 * hi)}%"
        for lo, hi in zip((0.0, *PROGRESS_BINS[:-1]), PROGRESS_BINS, strict=True)
    ),
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
    present[:, 0] = store.present("pre_reasoning") if "pre_reasoning" in store.stages else False
    post = "post_reasoning" in store.stages
    if post:
        present[:, -1] = store.present("post_reasoning")
    for j, layer in enumerate(layers):
        if present[:, 0].any():
            at = np.flatnonzero(present[:, 0])
            features[at, j, 0] = store.read("pre_reasoning", layer, at)[:, ANCHOR_TOKEN]
        if post and present[:, -1].any():
            at = np.flatnonzero(present[:, -1])
            features[at, j, -1] = store.read("post_reasoning", layer, at)[:, ANCHOR_TOKEN]
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
