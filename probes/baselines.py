"""Baselines conditioned on what a probe's input trivially encodes: the grid's size and obstacle
density (the prompt's length gives the size, the wall count the density).

Grids of several sizes share one padded canvas, so a per-cell majority over every grid predicts
``PADDING`` inside the larger grids and understates the prior. :class:`CellPrior` predicts the
per-cell class frequencies of the training grids of the same size (``by="size"``) or size and
density (``"size_density"``); its most probable ``AGENT`` / ``GOAL`` cell is the localisation
baseline. :class:`GroupMeanRegressor` predicts the group's mean goal distance. An unseen group
backs off (size and density -> size -> every grid). Build their input with :func:`covariates`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from goalprobe.gridworld.core import CellType
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.validation import check_is_fitted

Conditioning = Literal["none", "size", "size_density"]
"""What a baseline conditions on."""

_DENSITY_DECIMALS = 3


def covariates(grid_sizes: np.ndarray, densities: np.ndarray) -> np.ndarray:
    """``(N, 2)`` float64 ``[grid size, density]`` (NaN density where unknown)."""
    sizes = np.asarray(grid_sizes, dtype=np.float64).reshape(-1)
    dens = np.asarray(densities, dtype=np.float64).reshape(-1)
    if sizes.shape != dens.shape:
        raise ValueError(f"grid_sizes {sizes.shape} and densities {dens.shape} differ")
    return np.stack([sizes, dens], axis=1)


def _check_covariates(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != 2:
        raise ValueError(f"X must be (N, 2) [grid size, density] covariates, got {X.shape}")
    if not np.all(np.isfinite(X[:, 0])) or (X[:, 0] < 1).any():
        raise ValueError("X[:, 0] must hold positive grid sizes")
    return X


def _keys(X: np.ndarray, by: Conditioning) -> list[list[tuple]]:
    """Per row, its group keys from the finest to the coarsest (the back-off order)."""
    sizes = X[:, 0].astype(np.int64)
    dens = np.round(X[:, 1], _DENSITY_DECIMALS)
    finest = ("size_density", "size", "none").index(by)  # the keys finer than ``by`` left out
    return [
        [("size_density", size, "nan" if np.isnan(d) else d), ("size", size), ("all",)][finest:]
        for size, d in zip(sizes.tolist(), dens.tolist(), strict=True)
    ]


def _check_by(by: str) -> None:
    if by not in ("none", "size", "size_density"):
        raise ValueError(f"by must be 'none', 'size' or 'size_density', got {by!r}")


class CellPrior(ClassifierMixin, BaseEstimator):
    """Per-cell class frequencies of the training label maps of the same group of grids
    (``by``: ``"none"``, ``"size"`` or ``"size_density"``). Fitted: ``classes_``, ``groups_``
    (group key -> ``(S, S, C)`` float32), ``map_side_``, ``n_features_in_``."""

    def __init__(self, by: Conditioning = "size_density"):
        self.by = by

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> CellPrior:
        """Count class frequencies of ``y`` ``(N, S, S)`` within each group of ``X``."""
        _check_by(self.by)
        X = _check_covariates(X)
        labels = np.asarray(y)
        if labels.ndim != 3 or labels.shape[0] != X.shape[0]:
            raise ValueError(f"y must be (N, S, S) label maps for {X.shape[0]} rows")
        self.classes_ = np.unique(labels).astype(np.uint8)
        onehot = (labels[..., None] == self.classes_).astype(np.float64)
        members: dict[tuple, list[int]] = {}
        for row, keys in enumerate(_keys(X, self.by)):
            for key in keys:
                members.setdefault(key, []).append(row)
        self.groups_ = {
            key: onehot[rows].mean(axis=0).astype(np.float32) for key, rows in members.items()
        }
        self.map_side_ = int(labels.shape[1])
        self.n_features_in_ = 2
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """``(N, S, S, C)`` float32: each row's group frequencies (backing off when unseen), and
        ``PADDING`` with probability 1 outside the grid when the class exists."""
        check_is_fitted(self, "groups_")
        X = _check_covariates(X)
        out = np.empty((X.shape[0], self.map_side_, self.map_side_, len(self.classes_)), np.float32)
        padding = np.flatnonzero(self.classes_ == CellType.PADDING)
        for row, keys in enumerate(_keys(X, self.by)):
            key = next(k for k in keys if k in self.groups_)
            out[row] = self.groups_[key]
            n = int(X[row, 0])
            if padding.size and n < self.map_side_:
                outside = np.ones((self.map_side_, self.map_side_), dtype=bool)
                outside[:n, :n] = False
                out[row][outside] = 0.0
                out[row][outside, padding[0]] = 1.0
        return out

    def predict(self, X: np.ndarray) -> np.ndarray:
        """``(N, S, S)`` uint8: the most frequent class at each cell."""
        return self.classes_[self.predict_proba(X).argmax(axis=-1)]


class GroupMeanRegressor(RegressorMixin, BaseEstimator):
    """The mean target of the training rows of the same group of grids (``by`` as
    :class:`CellPrior`'s). Fitted: ``means_`` (group key -> mean), ``n_features_in_``."""

    def __init__(self, by: Conditioning = "size_density"):
        self.by = by

    def fit(self, X: np.ndarray, y: np.ndarray) -> GroupMeanRegressor:
        """Average ``y`` ``(N,)`` within each group of ``X``."""
        _check_by(self.by)
        X = _check_covariates(X)
        target = np.asarray(y, dtype=np.float64).reshape(-1)
        if target.shape[0] != X.shape[0]:
            raise ValueError(f"y has {target.shape[0]} rows, X has {X.shape[0]}")
        sums: dict[tuple, list[float]] = {}
        for value, keys in zip(target.tolist(), _keys(X, self.by), strict=True):
            for key in keys:
                sums.setdefault(key, []).append(value)
        self.means_ = {key: float(np.mean(v)) for key, v in sums.items()}
        self.n_features_in_ = 2
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """``(N,)`` float64 group means (backing off when a group is unseen)."""
        check_is_fitted(self, "means_")
        X = _check_covariates(X)
        return np.asarray(
            [self.means_[next(k for k in keys if k in self.means_)] for keys in _keys(X, self.by)]
        )


def uniform_top1(cell_types: np.ndarray, grid_sizes: np.ndarray) -> np.ndarray:
    """``(N,)`` chance that a uniformly random non-wall cell of each row's grid is a given
    object's cell: ``1 / #non-wall cells`` (the agent and the goal stand on non-wall cells)."""
    labels = np.asarray(cell_types)
    sizes = np.asarray(grid_sizes, dtype=np.int64)
    open_cells = [np.count_nonzero(labels[i, :n, :n] != CellType.WALL) for i, n in enumerate(sizes)]
    return 1.0 / np.maximum(np.array(open_cells, dtype=np.float64), 1.0)
