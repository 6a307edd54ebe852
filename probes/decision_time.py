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

import numpy as np
from goalprobe.gridworld.stats import GridBootstrap
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


def _rate(boot: GridBootstrap, hits: np.ndarray, weight: np.ndarray) -> dict:
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
            row.append({"bin": [low, high], **_rate(boot, hits, weight)})
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
        "majority": _rate(boot, (actions == majority_action).astype(float), ones),
        "chance": 0.25,
    }
