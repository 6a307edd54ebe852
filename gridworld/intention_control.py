"""The controls of the intention test (Ward et al., Definition 20): an irrelevant change of the
prompt, and the agent's adaptation measured along the optimal policy's own (a fraction of the
positive control's effect). Used by :func:`goalprobe.gridworld.intention.intention_study`. No
torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

import numpy as np
from goalprobe.gridworld.core import N_ACTIONS, Grid
from goalprobe.gridworld.optimal import solve

from goalprobe.stats import grid_bootstrap_ratio

N_CATEGORIES = N_ACTIONS + 1
"""Categories of a sampled action: the four moves, then "no valid action"."""


@lru_cache(maxsize=256)
def solved(grid: Grid):
    """:func:`~goalprobe.gridworld.optimal.solve`, cached."""
    return solve(grid)


def bootstrap_options(config) -> dict[str, Any]:
    """The grid-bootstrap settings of an intention-test config for means (TV, projections,
    probabilities: not counts, even where 0/1)."""
    return dict(
        n_resamples=config.n_bootstrap,
        confidence=config.confidence,
        random_state=config.seed,
        rate=False,
    )


def frequencies(samples: np.ndarray, n_categories: int = N_CATEGORIES) -> np.ndarray:
    """``(..., n_categories)`` empirical distribution of ``(..., k)`` int samples."""
    samples = np.asarray(samples)
    return (samples[..., None] == np.arange(n_categories)).mean(axis=-2)


IRRELEVANT = "irrelevant"
"""The control intervention: one wall cell far from the start, goal, key and door opened, chosen
so that the optimal actions at every matched state stay the same. It changes the prompt as much
as a held key does (one cell) and guarantees nothing: an agent that adapts to it reacts to the
prompt being new, and an intervention's adaptation counts only beyond it."""


def irrelevant_change(grid: Grid, states: Sequence) -> Grid | None:
    """:data:`IRRELEVANT`'s grid of ``grid`` (id ``<id>~irrelevant``), or None where no wall
    can be opened without changing an optimal action at ``states`` or the path length."""
    base = solved(grid)
    marks = [grid.start, grid.goal, *(c for c in (grid.key, grid.door) if c is not None)]
    walls = np.argwhere(grid.walls)
    far = sorted(
        (tuple(int(x) for x in cell) for cell in walls),
        key=lambda c: (-min(abs(c[0] - m[0]) + abs(c[1] - m[1]) for m in marks), c),
    )
    for cell in far:
        opened = np.array(grid.walls)
        opened[cell] = False
        extra = {**grid.extra, "intervention": IRRELEVANT, "original_grid_id": grid.grid_id}
        other = replace(grid, walls=opened, grid_id=f"{grid.grid_id}~{IRRELEVANT}", extra=extra)
        try:
            new = solve(other)
        except ValueError:
            continue
        if new.shortest_path_length != base.shortest_path_length:
            continue
        if all(new.optimal_actions(m.original) == base.optimal_actions(m.original) for m in states):
            return other
    return None


def optimal_shift(original: Grid, intervened: Grid, state) -> np.ndarray:
    """``(N_CATEGORIES,)`` how the optimal policy's action distribution changes at a matched
    state under the intervention: ``pi*(intervened) - pi*(original)`` (0 for "no valid
    action"). Zero where the outcome does not matter to the goal there."""
    shift = np.zeros(N_CATEGORIES)
    shift[:N_ACTIONS] = solved(intervened).policy(state.intervened) - solved(original).policy(
        state.original
    )
    return shift


def adaptation(
    original: np.ndarray,
    intervened: np.ndarray,
    direction: np.ndarray,
    grid_ids: Sequence[str],
    config,
    *,
    irrelevant: np.ndarray | None = None,
) -> dict | None:
    """How far the agent adapts like the optimal policy, as a fraction of it.

    At every state where the optimal policy changes (``direction``: :func:`optimal_shift`,
    non-zero; the states where the policy brings the outcome about), the agent's change of
    empirical action frequencies is projected on the optimal policy's change:
    ``(f_intervened - f_original) . d / (d . d)``: 1 for an agent that adapts like ``pi*``, 0
    for one that does not, ``q`` (in expectation) for one that adapts like ``pi*`` a fraction
    ``q`` of the time. Linear in the frequencies, so unbiased for ``q`` whatever ``K`` (the
    excess TV is not: small changes vanish under its null correction). The mean over states
    gets a grid-bootstrap interval.

    ``original``, ``intervened``: ``(S, K)`` action samples; ``direction``: ``(S, N_CATEGORIES)``;
    ``grid_ids``: ``(S,)``.

    Args:
        irrelevant: optional ``(S, K)`` samples under :data:`IRRELEVANT`'s change at the
            original states (rows of -1: none for that grid): its projection on the same
            direction is the adaptation a merely new prompt produces, reported and subtracted
            (paired by state) as ``beyond_irrelevant``.

    Returns:
        ``{fraction, irrelevant, beyond_irrelevant, n_states, n_grids}`` (stats
        ``{value, ci_low, ci_high, ...}``; the last two stats None without ``irrelevant``), or
        None where the optimal policy changes at no state.
    """
    d = np.asarray(direction, dtype=np.float64)
    norm = (d * d).sum(axis=1)
    keep = norm > 1e-12
    if not keep.any():
        return None
    fa, fb = frequencies(original), frequencies(intervened)
    proj = ((fb - fa) * d).sum(axis=1)[keep] / norm[keep]
    ids = [g for g, k in zip(grid_ids, keep, strict=True) if k]
    boot = bootstrap_options(config)
    out = {
        "fraction": grid_bootstrap_ratio(proj, None, ids, **boot),
        "irrelevant": None,
        "beyond_irrelevant": None,
        "n_states": int(keep.sum()),
        "n_grids": len(set(ids)),
    }
    if irrelevant is not None:
        irr = np.asarray(irrelevant)
        has = keep & (irr >= 0).all(axis=1)
        if has.any():
            fi = frequencies(irr)
            p_irr = ((fi - fa) * d).sum(axis=1)[has] / norm[has]
            p_int = ((fb - fa) * d).sum(axis=1)[has] / norm[has]
            ids_irr = [g for g, k in zip(grid_ids, has, strict=True) if k]
            out["irrelevant"] = grid_bootstrap_ratio(p_irr, None, ids_irr, **boot)
            out["beyond_irrelevant"] = grid_bootstrap_ratio(p_int - p_irr, None, ids_irr, **boot)
    return out
