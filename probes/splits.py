"""Train/validation/test splits by grid, and label shuffles by grid for control probes.

Every step of a grid lands in one split: the steps of one grid share walls, goal and most of
their activations, so a row-level split would leak the test grids into training. All functions
are seeded and pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np


@dataclass(frozen=True)
class GridSplit:
    """Sorted int64 row indices of the training, validation (carved from the training grids;
    maybe empty) and test grids of a split by grid."""

    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray

    def check_disjoint(self, grid_ids: np.ndarray) -> None:
        """Raise ``ValueError`` when two parts share a row or a grid (of ``grid_ids (N,)``)."""
        ids = np.asarray(grid_ids)
        parts = {"train": self.train, "validation": self.validation, "test": self.test}
        for (a, rows_a), (b, rows_b) in combinations(parts.items(), 2):
            shared_rows = np.intersect1d(rows_a, rows_b)
            if shared_rows.size:
                raise ValueError(f"{a} and {b} share {shared_rows.size} rows")
            shared = np.intersect1d(ids[rows_a], ids[rows_b])
            if shared.size:
                raise ValueError(
                    f"{a} and {b} share {shared.size} grids (first: {shared[0]!r}); "
                    "a split must keep every step of a grid in one part"
                )


def _grid_strata(grid_ids: np.ndarray, strata: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Unique grids (sorted) and, per grid, its stratum (constant within the grid)."""
    grids, inverse = np.unique(grid_ids, return_inverse=True)
    if strata is None:
        return grids, np.zeros(len(grids), dtype=np.int64)
    strata = np.asarray(strata)
    if strata.shape != grid_ids.shape:
        raise ValueError(f"strata has shape {strata.shape}, grid_ids has {grid_ids.shape}")
    _, strata_codes = np.unique(strata, return_inverse=True)
    per_grid = np.full(len(grids), -1, dtype=np.int64)
    per_grid[inverse] = strata_codes
    mismatch = strata_codes != per_grid[inverse]
    if mismatch.any():
        row = int(np.flatnonzero(mismatch)[0])
        raise ValueError(
            f"stratum varies within grid {grid_ids[row]!r} (row {row}); "
            "stratify by a per-grid quantity such as grid size"
        )
    return grids, per_grid


def _split(grid_ids: np.ndarray, row_grid: np.ndarray, test_grid, val_grid) -> GridSplit:
    """The checked :class:`GridSplit` of per-grid test and validation masks."""
    split = GridSplit(
        train=np.flatnonzero(~test_grid[row_grid] & ~val_grid[row_grid]),
        validation=np.flatnonzero(val_grid[row_grid]),
        test=np.flatnonzero(test_grid[row_grid]),
    )
    split.check_disjoint(grid_ids)
    return split


def _assign(n_grids: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask choosing ``round(fraction * n_grids)`` grids (at least one when asked)."""
    k = int(round(fraction * n_grids))
    if fraction > 0 and k == 0 and n_grids > 1:
        k = 1
    k = min(k, n_grids - 1) if n_grids > 1 else 0
    mask = np.zeros(n_grids, dtype=bool)
    mask[rng.permutation(n_grids)[:k]] = True
    return mask


def split_by_grid(
    grid_ids: np.ndarray,
    *,
    test_fraction: float = 0.2,
    validation_fraction: float = 0.0,
    stratify: np.ndarray | None = None,
    random_state: int = 0,
) -> GridSplit:
    """Split rows into train/validation/test so that no grid spans two parts: ``test_fraction``
    of the grids (not rows), then ``validation_fraction`` of the *training* grids, within each
    stratum of ``stratify`` (an optional ``(N,)`` per-grid value such as the grid size)."""
    ids = np.asarray(grid_ids)
    if ids.ndim != 1:
        raise ValueError(f"grid_ids must be 1-D, got shape {ids.shape}")
    fractions = {"test_fraction": test_fraction, "validation_fraction": validation_fraction}
    for name, frac in fractions.items():
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"{name} must lie in [0, 1), got {frac}")
    grids, grid_strata = _grid_strata(ids, stratify)
    rng = np.random.default_rng(random_state)
    test_grid = np.zeros(len(grids), dtype=bool)
    val_grid = np.zeros(len(grids), dtype=bool)
    for s in np.unique(grid_strata):
        members = np.flatnonzero(grid_strata == s)
        in_test = _assign(len(members), test_fraction, rng)
        test_grid[members[in_test]] = True
        rest = members[~in_test]
        val_grid[rest[_assign(len(rest), validation_fraction, rng)]] = True
    return _split(ids, np.searchsorted(grids, ids), test_grid, val_grid)


def grid_folds(
    grid_ids: np.ndarray,
    n_folds: int,
    *,
    validation_fraction: float = 0.0,
    stratify: np.ndarray | None = None,
    random_state: int = 0,
) -> list[GridSplit]:
    """K-fold cross-fitting by grid: every grid is a test grid in exactly one fold.

    Grids are permuted within each stratum and dealt to the ``n_folds`` folds in turn; each
    fold's validation grids are carved from its training grids as in :func:`split_by_grid`.
    The folds' test parts partition the rows.
    """
    ids = np.asarray(grid_ids)
    grids, grid_strata = _grid_strata(ids, stratify)
    if not 2 <= n_folds <= len(grids):
        raise ValueError(f"n_folds must lie in [2, {len(grids)} grids], got {n_folds}")
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must lie in [0, 1), got {validation_fraction}")
    rng = np.random.default_rng(random_state)
    fold = np.zeros(len(grids), dtype=np.int64)
    offset = 0
    for s in np.unique(grid_strata):
        members = rng.permutation(np.flatnonzero(grid_strata == s))
        fold[members] = (np.arange(len(members)) + offset) % n_folds
        offset += len(members)  # the next stratum starts where this one stopped
    row_grid = np.searchsorted(grids, ids)
    out = []
    for k in range(n_folds):
        val_grid = np.zeros(len(grids), dtype=bool)
        for s in np.unique(grid_strata):
            rest = np.flatnonzero((grid_strata == s) & (fold != k))
            val_grid[rest[_assign(len(rest), validation_fraction, rng)]] = True
        out.append(_split(ids, row_grid, fold == k, val_grid))
    return out


def carve_validation(
    rows: np.ndarray, grid_ids: np.ndarray, fraction: float, random_state: int
) -> tuple[np.ndarray, np.ndarray]:
    """Split training ``rows`` into sorted ``(fit_rows, validation_rows)`` by grid, ``fraction``
    of the training grids held out (``grid_ids`` indexes the full arrays)."""
    rows = np.asarray(rows, dtype=np.int64)
    ids = np.asarray(grid_ids)[rows]
    if np.unique(ids).size < 2:
        raise ValueError(
            f"cannot carve a validation split by grid from {np.unique(ids).size} training grid(s); "
            "provide more grids or disable early stopping"
        )
    split = split_by_grid(ids, test_fraction=fraction, random_state=random_state)
    return rows[split.train], rows[split.test]


def sattolo_cycle(n: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random cyclic permutation of ``range(n)`` (a derangement for ``n >= 2``)."""
    perm = np.arange(n)
    for i in range(n - 1, 0, -1):
        j = int(rng.integers(i))  # j < i: never a fixed point
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def shuffle_by_grid(
    values: np.ndarray,
    grid_ids: np.ndarray,
    *,
    strata: np.ndarray | None = None,
    random_state: int = 0,
) -> np.ndarray:
    """Shuffle per-row targets across grids, keeping each grid's targets together.

    Grids are permuted by a random cyclic permutation (Sattolo's algorithm, a derangement)
    within each stratum of ``strata`` (e.g. grid size, so a padded label map stays on a grid of
    its size); the ``i``-th row of grid ``g`` receives the target of the ``i``-th row
    (cyclically) of grid ``pi(g)``: the shuffled-label control of Hewitt & Liang (2019) at the
    level the data are dependent at. ValueError when a stratum holds a single grid.
    """
    values = np.asarray(values)
    ids = np.asarray(grid_ids)
    if values.shape[0] != ids.shape[0]:
        raise ValueError(f"values has {values.shape[0]} rows, grid_ids has {ids.shape[0]}")
    grids, grid_strata = _grid_strata(ids, strata)
    row_grid = np.searchsorted(grids, ids)
    rng = np.random.default_rng(random_state)
    partner = np.arange(len(grids))
    for s in np.unique(grid_strata):
        members = np.flatnonzero(grid_strata == s)
        if len(members) < 2:
            raise ValueError(
                f"stratum {s} holds one grid ({grids[members[0]]!r}): a shuffled control needs "
                "at least two grids per stratum (grid size)"
            )
        partner[members] = members[sattolo_cycle(len(members), rng)]
    order = np.argsort(row_grid, kind="stable")
    starts = np.searchsorted(row_grid[order], np.arange(len(grids)))
    counts = np.bincount(row_grid, minlength=len(grids))
    rank = np.empty(len(ids), dtype=np.int64)
    rank[order] = np.arange(len(ids)) - np.repeat(starts, counts)
    src_grid = partner[row_grid]
    source_rows = order[starts[src_grid] + rank % counts[src_grid]]
    return values[source_rows].copy()
