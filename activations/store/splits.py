"""Seeded train/validation/test assignment of *grids* (never of rows).

All steps of a grid share its walls and goal, so rows of one grid must land in one split.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

DEFAULT_FRACTIONS: dict[str, float] = {"train": 0.8, "val": 0.1, "test": 0.1}
"""Fractions of grids per split used when none are given."""


def grid_split(
    grid_ids: Iterable[str],
    fractions: Mapping[str, float] = DEFAULT_FRACTIONS,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Assign every distinct grid to one split, seeded.

    Args:
        grid_ids: grid id of every row (repeats are fine; only distinct ids matter).
        fractions: split name -> fraction of grids; fractions are non-negative and sum to 1.
            Counts are rounded by largest remainder, and every split with a positive fraction
            gets at least one grid.
        seed: seed of the permutation of the sorted distinct ids.

    Returns:
        ``{split: (n_split,) array of grid ids (str), sorted}``; the parts are disjoint and
        cover every grid. Pass one to ``ActivationStore.select(grid_ids=...)``.
    """
    names = list(fractions)
    values = np.asarray([float(fractions[n]) for n in names], dtype=np.float64)
    if not names or (values < 0).any() or not np.isclose(values.sum(), 1.0, atol=1e-9):
        raise ValueError(f"fractions must be non-negative and sum to 1, got {dict(fractions)}")
    grids = np.unique(np.asarray([str(g) for g in grid_ids], dtype=object).astype(str))
    n = len(grids)
    positive = int((values > 0).sum())
    if n < positive:
        raise ValueError(
            f"{n} distinct grid(s) cannot fill {positive} splits with positive fractions"
        )
    exact = values * n
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    for i in order[: n - counts.sum()]:
        counts[i] += 1
    for i in np.flatnonzero((values > 0) & (counts == 0)):
        donor = int(np.argmax(counts))
        counts[donor] -= 1
        counts[i] += 1
    shuffled = grids[np.random.default_rng(seed).permutation(n)]
    out: dict[str, np.ndarray] = {}
    start = 0
    for name, count in zip(names, counts, strict=True):
        out[name] = np.sort(shuffled[start : start + count])
        start += count
    return out
