"""When the decision is readable: the logit lens's agreement with the final action along the
reasoning and across layers, pooled over steps with grid-bootstrap intervals (no I/O).

Each step contributes its lens distributions (:func:`goalprobe.probes.logit_lens.lens_probs`)
at its chunk ends and at the answer, and the action it answered. A point of a curve is the
share of steps whose lens top choice (at that layer and progress bin) is the final action,
beside the majority action's share and chance (25%).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from goalprobe.probes.logit_lens import first_stable_top

from goalprobe.stats import Estimate, GridBootstrap, grid_bootstrap_ratio

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
            low = margin["ci_low"]
            verdict = "undecided" if low is None else ("yes" if low > 0 else "no")
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
