"""When the decision is readable: the logit lens's agreement with the final action along the
reasoning and across layers, pooled over steps with grid-bootstrap intervals. Computes on what
it is handed (per-step lens distributions); no I/O.

Each step contributes its lens distributions (:func:`goalprobe.probes.logit_lens.lens_probs`) at
the ends of its reasoning chunks and at the answer position, and the action it answered. A
curve's point is the share of steps whose lens top choice (at that layer, in that bin of
reasoning progress) is the final action; its baseline is the share the step's most frequent
action would get (the majority action over the steps, a lens that always says it), and chance
(25%). Intervals resample grids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from goalprobe.gridworld.stats import GridBootstrap, grid_bootstrap_ratio
from goalprobe.probes.logit_lens import first_stable_top

PROGRESS_BINS: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
"""Upper edges of the reasoning-progress bins (fraction of the reasoning's tokens)."""


@dataclass(frozen=True)
class StepLens:
    """The lens on one step.

    Attributes:
        grid_id: the step's grid (intervals resample grids).
        action: the answered action (0..3).
        fractions: ``(C,)`` reasoning progress of each chunk end.
        chunks: ``(n_layers, C, 4)`` the lens at the chunk ends.
        answer: ``(n_layers, 4)`` the lens at the answer position.
    """

    grid_id: str
    action: int
    fractions: np.ndarray
    chunks: np.ndarray
    answer: np.ndarray


def _rate(boot: GridBootstrap, hits: np.ndarray, weight: np.ndarray, ids=None) -> dict:
    """A share over steps with its interval: where ``hits`` are 0/1 counts, the cluster-adjusted
    Clopper-Pearson interval (honest at 0% and 100%; :func:`grid_bootstrap_ratio`), else the
    grid-bootstrap percentile interval of ``boot``."""
    if ids is not None:
        keep = weight > 0
        if not keep.any():  # no step has a chunk end in this bin
            return {"value": None, "ci_low": None, "ci_high": None, "n": 0}
        out = grid_bootstrap_ratio(
            hits[keep],
            weight[keep],
            np.asarray(ids)[keep],
            n_resamples=boot.n_resamples,
            confidence=boot.confidence,
        )
        return {k: out[k] for k in ("value", "ci_low", "ci_high")} | {"n": int(weight.sum())}
    return boot.summary(boot.ratio(hits, weight)) | {"n": int(weight.sum())}


def decision_curves(
    steps: Sequence[StepLens], *, n_resamples: int = 1000, random_state: int = 0
) -> dict:
    """Curves of the lens's agreement with the final action.

    Returns:
        ``answer_by_layer``: per layer, the share of steps whose lens top choice at the answer
        position is the answered action; ``progress_by_layer``: per layer and progress bin, the
        share over the chunk ends in that bin (each step weighs one per bin it has chunks in);
        ``first_stable``: at the last layer, the reasoning progress from which the final action
        stays the top choice (quartiles over the steps where it is the top choice at the end);
        ``majority``: the majority action's share (the baseline); ``chance``: 0.25.
    """
    if not steps:
        raise ValueError("no steps to read")
    ids = [s.grid_id for s in steps]
    boot = GridBootstrap.from_grid_ids(ids, n_resamples=n_resamples, random_state=random_state)
    actions = np.asarray([s.action for s in steps])
    n_layers = steps[0].answer.shape[0]
    majority_action = int(np.bincount(actions, minlength=4).argmax())
    ones = np.ones(len(steps))
    answer = [
        _rate(
            boot,
            np.asarray([s.answer[layer].argmax() == s.action for s in steps], float),
            ones,
            ids,
        )
        for layer in range(n_layers)
    ]
    edges = (0.0, *PROGRESS_BINS)
    progress = []
    for layer in range(n_layers):
        row = []
        for low, high in zip(edges, edges[1:], strict=False):
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
    edges = (0.0, *PROGRESS_BINS)
    out: list[int | None] = []
    for low, high in zip(edges, edges[1:], strict=False):
        inside = np.flatnonzero((fractions > low) & (fractions <= high))
        out.append(int(inside[-1]) if inside.size else None)
    return out


def readout_curves(
    features: np.ndarray,
    present: np.ndarray,
    actions: np.ndarray,
    grid_ids: np.ndarray,
    train: np.ndarray,
    baselines: dict[str, np.ndarray],
    *,
    n_resamples: int = 1000,
    random_state: int = 0,
) -> dict:
    """Decode the answered action from the residual stream at each layer and progress bin.

    Args:
        features: ``(N, L, B, d)`` the residual stream at each bin's last chunk end.
        present: ``(N, B)`` bool, whether the step has a chunk end in the bin.
        actions: ``(N,)`` the answered action.
        grid_ids: ``(N,)``; intervals resample the test grids.
        train: ``(N,)`` bool, a split by grid.
        baselines: name -> ``(N,)`` predicted action of a predictor that needs no activation
            (e.g. the majority action, the optimal policy on the true grid, a read-out of the
            agent's and goal's coordinates), each fitted on the training rows only.

    Returns:
        ``baselines`` (test accuracy of each with its interval), ``strongest`` (its name) and
        ``by_layer`` (per layer, per bin: the probe's test accuracy, its margin over the
        strongest baseline on the same rows with a paired interval, Bonferroni-adjusted over the
        ``family`` of every layer x bin, and the verdict: ``yes`` when that interval excludes 0).
    """
    from sklearn.linear_model import LogisticRegression

    train = np.asarray(train, dtype=bool)
    test = ~train
    boot = GridBootstrap.from_grid_ids(
        np.asarray(grid_ids)[test], n_resamples=n_resamples, random_state=random_state
    )
    truth = actions[test]
    ones = np.ones(int(test.sum()))
    base = {
        name: _rate(boot, (pred[test] == truth).astype(float), ones)
        for name, pred in baselines.items()
    }
    strongest = max(base, key=lambda k: base[k]["value"] or 0.0)
    best_hits = (baselines[strongest][test] == truth).astype(float)
    # the verdicts form one family (every layer x bin): Bonferroni-adjusted margin intervals
    family = int(features.shape[1] * features.shape[2])
    adjusted = GridBootstrap.from_grid_ids(
        np.asarray(grid_ids)[test],
        n_resamples=n_resamples,
        random_state=random_state,
        confidence=1 - 0.05 / family,
    )
    by_layer: list[list[dict[str, Any]]] = []
    for layer in range(features.shape[1]):
        row: list[dict[str, Any]] = []
        for b in range(features.shape[2]):
            rows_train = train & present[:, b]
            rows_test = test & present[:, b]
            weight = present[test, b].astype(float)
            if rows_train.sum() < 2 or len(np.unique(actions[rows_train])) < 2 or not weight.any():
                row.append({"bin": b, "value": None, "verdict": "no", "n": int(weight.sum())})
                continue
            x = features[:, layer, b].reshape(len(actions), -1)
            mean, std = x[rows_train].mean(0), x[rows_train].std(0) + 1e-6
            model = LogisticRegression(C=0.1, max_iter=1000)
            model.fit((x[rows_train] - mean) / std, actions[rows_train])
            pred = np.full(len(actions), -1)
            pred[rows_test] = model.predict((x[rows_test] - mean) / std)
            hits = (pred[test] == truth).astype(float) * weight
            accuracy = boot.summary(boot.ratio(hits, weight))
            margin = adjusted.summary(
                adjusted.ratio(hits, weight) - adjusted.ratio(best_hits * weight, weight)
            )
            low = margin["ci_low"]
            row.append(
                {
                    "bin": b,
                    **accuracy,
                    "n": int(weight.sum()),
                    "margin_over_strongest": margin,
                    "verdict": "yes" if low is not None and low > 0 else "no",
                }
            )
        by_layer.append(row)
    return {
        "baselines": base,
        "strongest": strongest,
        "family": family,
        "margin_confidence": 1 - 0.05 / family,
        "by_layer": by_layer,
    }
