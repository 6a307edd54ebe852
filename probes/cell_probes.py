"""Cell-type probes: decode a cognitive map (one ``CellType`` per grid cell) from activations.

Input: ``acts (N, n_anchors, d_model)`` (flattened to ``F = n_anchors * d_model`` features) and
label maps ``(N, S, S)`` uint8 ``CellType``. Output: class probabilities ``(N, S, S, C)`` over
``classes_``. Every probe type (``family="linear"`` or ``"mlp"``) shares :class:`CellProbeBase`:
the same data, split, class balancing and training loop.

* :class:`CoordinateCellProbe` (the study's, section 5.1): ``[act, row, col] -> class`` queried
  at every cell; linear is multinomial logistic regression, mlp two layers with a ReLU.
* :class:`PerCellProbe` (Othello-GPT style): one head per cell reading ``act``; linear
  ``logits[n, p, c] = einsum("nf,pfc->npc", act, W) + b[p, c]`` (the linear world-model probes
  of Nanda et al., 2023), mlp a shared ``Linear(F, H)`` + ReLU, then per-cell heads (Li et al.,
  2023). It can read a different direction at every cell, so even the linear family can
  localise the agent and goal.

``grid_size=None`` gives a *general* probe over the whole canvas (``PADDING`` is a class);
``grid_size=n`` a *size-specific* one over the top-left ``n x n`` cells (fitting checks that
every map is a grid of exactly that size).

**Factorised first layer.** ``W [act; coord] + b = (W_act act) + (W_coord coord + b)``: the act
part once per example, the coordinate part once per cell, their broadcast sum the hidden layer
(~``S^2`` times cheaper than ``N * S^2`` materialised rows; ``materialise=True`` runs those).

**Class balance.** ``"upsample"`` (the study's) draws each minority class up to the largest with
replacement (seeded), applied as integer per-(example, cell) loss weights; ``"weighted_loss"``
uses their expectation ``n_max / n_c``; ``"none"`` weights 1. The linear family is convex and
fitted by L-BFGS to convergence (seed-free, expected weights); the MLP trains with AdamW.

**Coordinates.** ``"raw"`` (the study's): ``(row, col)`` standardised; ``"onehot"``: ``2 S``
features. A *linear* coordinate-conditioned probe adds a cell bias to an act score that is the
same at every cell, so it cannot place the agent or goal (the study's 39% accuracy).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
import torch.nn.functional as F
from goalprobe.gridworld.core import CellType
from goalprobe.probes.families import store_params
from goalprobe.probes.training import (
    Standardiser,
    as_feature_matrix,
    early_stopping_split,
    fit_lbfgs,
    fit_standardiser,
    load_module_tensors,
    module_tensors,
    seeded_module,
    torch_seed,
    train_estimator,
    validation_mean,
)
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

if TYPE_CHECKING:
    from goalprobe.stats.shapes import (
        CellLabels,
        CellProbs,
        FeatureMatrix,
        GridIds,
        ResidualActs,
    )

Family = Literal["linear", "mlp"]
CoordinateEncoding = Literal["raw", "onehot"]
ClassBalance = Literal["upsample", "weighted_loss", "none"]

N_CELL_TYPES = len(CellType)

_FITTED_COUNTS = ("n_features_in_", "map_side_", "n_epochs_", "best_epoch_")
"""The integer fitted attributes a cell probe's card records."""


def cell_row_col(side: int) -> np.ndarray:
    """``(side * side, 2)`` int64 ``(row, col)`` of every cell in row-major order."""
    rows, cols = np.divmod(np.arange(side * side), side)
    return np.stack([rows, cols], axis=1).astype(np.int64)


def coordinate_features(side: int, encoding: CoordinateEncoding) -> np.ndarray:
    """``(S * S, K)`` float32 coordinate part of the probe input for every cell of a ``side x side``
    map: ``"raw"`` (standardised row, col; ``K = 2``) or ``"onehot"`` (``K = 2 S``).
    """
    rc = cell_row_col(side).astype(np.float64)
    if encoding == "raw":
        scale = rc.std(axis=0)
        return ((rc - rc.mean(axis=0)) / np.where(scale > 0, scale, 1.0)).astype(np.float32)
    if encoding == "onehot":
        eye = np.eye(side, dtype=np.float32)
        return np.concatenate([eye[rc[:, 0].astype(int)], eye[rc[:, 1].astype(int)]], axis=1)
    raise ValueError(f"coordinates must be 'raw' or 'onehot', got {encoding!r}")


def validate_label_maps(
    y: np.ndarray, grid_size: int | None, *, name: str = "labels"
) -> np.ndarray:
    """Check ``(N, S, S)`` integer ``CellType`` maps and return the cells a probe reads as uint8:
    all of them (``grid_size=None``), or the top-left ``n x n`` (every map must be a grid of
    exactly that size). ``name`` is the array's name in error messages."""
    arr = np.asarray(y)
    if arr.ndim != 3 or arr.shape[1] != arr.shape[2]:
        raise ValueError(f"{name} must be square maps (N, S, S), got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer CellType values, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= N_CELL_TYPES):
        bad = np.argwhere((arr < 0) | (arr >= N_CELL_TYPES))[0]
        raise ValueError(
            f"{name}[{bad[0]}, {bad[1]}, {bad[2]}] = {arr[tuple(bad)]} is not a CellType "
            f"(0..{N_CELL_TYPES - 1})"
        )
    arr = arr.astype(np.uint8, copy=False)
    if grid_size is None:
        return arr
    side = arr.shape[1]
    if grid_size > side:
        raise ValueError(f"grid_size {grid_size} exceeds the {name} canvas side {side}")
    inside = arr[:, :grid_size, :grid_size]
    outside = np.ones((side, side), dtype=bool)
    outside[:grid_size, :grid_size] = False
    wrong_out = (arr[:, outside] != CellType.PADDING).any(axis=1)
    wrong_in = (inside == CellType.PADDING).any(axis=(1, 2))
    wrong = np.flatnonzero(wrong_out | wrong_in)
    if wrong.size:
        raise ValueError(
            f"{name} row {wrong[0]} is not a {grid_size} x {grid_size} grid ({wrong.size} such rows): "
            "a size-specific probe needs maps with padding exactly outside the top-left "
            f"{grid_size} x {grid_size} cells; select the rows of that grid size"
        )
    return inside


class CellProbeBase(ClassifierMixin, BaseEstimator):
    """Fitting, decoding and persistence shared by the cell-probe families.

    Subclasses declare their hyperparameters in ``__init__`` (scikit-learn convention) and
    implement :meth:`_build_module`; the module maps standardised ``(B, F)`` features to
    ``(B, P, C)`` logits, ``P`` the number of cells read.
    """

    def _build_module(self, n_features: int, side: int, n_classes: int) -> torch.nn.Module:
        raise NotImplementedError

    def _example_logits(self, X: np.ndarray) -> Callable[[np.ndarray], torch.Tensor]:
        """Closure: example rows of ``X`` -> ``(B, P, C)`` logits with the fitted module."""
        standardise = Standardiser(self.feature_mean_, self.feature_scale_, self.device)
        return lambda rows: self.module_(standardise(X, rows))

    def _training_logits(
        self, X: np.ndarray, fit_rows: np.ndarray
    ) -> Callable[[np.ndarray], torch.Tensor]:
        """Closure: positions into ``fit_rows`` -> ``(B, P, C)`` logits (with gradients)."""
        logits = self._example_logits(X)
        return lambda pos: logits(fit_rows[pos])

    def fit(self, X: ResidualActs | FeatureMatrix, y: CellLabels, groups: GridIds | None = None):
        """Fit on activations and label maps ``(N, S, S)``; ``groups`` (grid ids) is required with
        ``early_stopping`` (the validation split is carved by grid)."""
        X2 = as_feature_matrix(X)
        labels = validate_label_maps(y, self.grid_size)
        if labels.shape[0] != X2.shape[0]:
            raise ValueError(f"acts has {X2.shape[0]} rows but labels has {labels.shape[0]}")
        if self.class_balance not in ("upsample", "weighted_loss", "none"):
            raise ValueError(
                f"class_balance must be 'upsample', 'weighted_loss' or 'none', got {self.class_balance!r}"
            )
        rng = np.random.default_rng(self.random_state)
        n = X2.shape[0]
        linear = self.family == "linear"
        fit_rows, val_rows = early_stopping_split(self, n, groups, rng, applies=not linear)

        present = np.unique(labels)  # validation rows included: they must be encodable too
        classes = present if self.classes is None else np.asarray(sorted(self.classes))
        missing = np.setdiff1d(present, classes)
        if missing.size:
            raise ValueError(
                f"labels contain classes {missing.tolist()} that are not in classes={self.classes}"
            )
        self.classes_ = classes.astype(np.uint8)
        lookup = np.zeros(N_CELL_TYPES, dtype=np.int64)
        lookup[self.classes_] = np.arange(len(self.classes_))
        side = labels.shape[1]
        codes = lookup[labels.reshape(n, side * side)]
        n_classes = len(self.classes_)

        counts = np.bincount(codes[fit_rows].ravel(), minlength=n_classes)
        if self.class_balance == "none":
            self.class_weights_ = np.ones(n_classes, dtype=np.float32)
        else:
            ratio = np.divide(counts.max(), counts, out=np.zeros(n_classes), where=counts > 0)
            self.class_weights_ = ratio.astype(np.float32)
        fit_codes = codes[fit_rows]
        if self.class_balance == "upsample" and not linear:
            fit_weights = _upsampling_multiplicities(fit_codes, counts, rng)
        else:
            fit_weights = self.class_weights_[fit_codes]

        self.n_features_in_ = X2.shape[1]
        self.map_side_ = side
        self.feature_mean_, self.feature_scale_ = fit_standardiser(X2, fit_rows)
        self.module_ = seeded_module(
            lambda: self._build_module(self.n_features_in_, side, n_classes), torch_seed(rng)
        ).to(self.device)

        fit_targets = torch.from_numpy(fit_codes)
        fit_w = torch.from_numpy(np.ascontiguousarray(fit_weights, dtype=np.float32))
        if linear:
            self._fit_linear(X2, fit_rows, fit_targets, fit_w)
            return self
        train_logits = self._training_logits(X2, fit_rows)

        def batch_loss(pos: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            logits = train_logits(pos)
            target = fit_targets[pos].to(self.device)
            w = fit_w[pos].to(self.device)
            return _weighted_ce(logits, target, w), w.sum()

        validation_loss = None
        if len(val_rows):
            val_logits = self._example_logits(X2)
            val_targets = torch.from_numpy(codes)
            val_w = torch.from_numpy(self.class_weights_[codes])

            def val_sums(rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
                w = val_w[rows].to(self.device)
                return _weighted_ce(val_logits(rows), val_targets[rows].to(self.device), w), w.sum()

            validation_loss = partial(validation_mean, val_rows, self.batch_size, val_sums)

        self.history_, self.best_epoch_ = train_estimator(
            self,
            self.module_,
            n_examples=len(fit_rows),
            batch_loss=batch_loss,
            validation_loss=validation_loss,
            rng=rng,
        )
        self.n_epochs_ = len(self.history_)
        return self

    def _fit_linear(
        self, X: np.ndarray, fit_rows: np.ndarray, targets: torch.Tensor, weights: torch.Tensor
    ) -> None:
        """Weighted multinomial logistic regression fitted by L-BFGS from zero on every training
        row, ``weight_decay`` the L2 strength on the weighted mean loss (biases included)."""
        if self.max_iter < 1:
            raise ValueError(f"max_iter must be >= 1, got {self.max_iter}")
        standardise = Standardiser(self.feature_mean_, self.feature_scale_, self.device)
        module, chunk = self.module_, max(1, self.batch_size) * 8
        total_weight = float(weights.double().sum())
        if total_weight <= 0:
            raise ValueError("the training rows carry no weight (no labelled cells)")

        def logits(rows: np.ndarray) -> torch.Tensor:
            if getattr(self, "materialise", False):
                table = self.materialised_rows(X, rows).double()
                return module.forward_rows(table).reshape(len(rows), self.map_side_**2, -1)
            return module(standardise(X, rows).double())

        def objective() -> torch.Tensor:
            total = torch.zeros((), dtype=torch.float64, device=self.device)
            for start in range(0, len(fit_rows), chunk):
                sl = slice(start, start + chunk)
                w = weights[sl].to(self.device, torch.float64)
                total = total + _weighted_ce(logits(fit_rows[sl]), targets[sl].to(self.device), w)
            return total / total_weight

        # the biases penalised too: a class a cell never shows (padding outside every grid)
        # keeps a finite optimum instead of a bias that L-BFGS would chase to infinity
        solver = fit_lbfgs(
            module, objective=objective, l2=self.weight_decay, max_iter=self.max_iter
        )
        self.module_ = module.eval()
        self.history_ = [{"solver": "lbfgs", **solver}]
        self.n_epochs_ = self.best_epoch_ = solver["n_iter"]
        self.converged_ = solver["converged"]

    def decision_function(self, X: ResidualActs | FeatureMatrix) -> CellProbs:
        """``(N, S, S, C)`` float32 logits over ``classes_``."""
        check_is_fitted(self, "module_")
        X2 = as_feature_matrix(X)
        if X2.shape[1] != self.n_features_in_:
            raise ValueError(
                f"acts have {X2.shape[1]} features, the probe was fitted on {self.n_features_in_}"
            )
        logits = self._example_logits(X2)
        out = np.empty((X2.shape[0], self.map_side_**2, len(self.classes_)), dtype=np.float32)
        self.module_.eval()
        with torch.inference_mode():
            for start in range(0, X2.shape[0], self.batch_size):
                rows = np.arange(start, min(start + self.batch_size, X2.shape[0]))
                out[rows] = logits(rows).float().cpu().numpy()
        side = self.map_side_
        return out.reshape(X2.shape[0], side, side, len(self.classes_))

    def predict_proba(self, X: ResidualActs | FeatureMatrix) -> CellProbs:
        """Class probabilities per cell: ``(N, S, S, C)`` float32 over ``classes_``."""
        logits = torch.from_numpy(self.decision_function(X))
        return torch.softmax(logits, dim=-1).numpy()

    def predict(self, X: ResidualActs | FeatureMatrix) -> CellLabels:
        """Cognitive map: the most probable ``CellType`` per cell, ``(N, S, S)`` uint8."""
        return self.classes_[self.decision_function(X).argmax(axis=-1)]

    def score(self, X: np.ndarray, y: np.ndarray, sample_weight=None) -> float:
        """Accuracy over every queried cell (padding included for a general probe)."""
        if sample_weight is not None:
            raise ValueError("score does not support sample_weight")
        return float(np.mean(self.predict(X) == validate_label_maps(y, self.grid_size)))

    def _fitted_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Arrays (for safetensors) and JSON metadata that restore the fitted probe exactly."""
        check_is_fitted(self, "module_")
        tensors = module_tensors(self.module_, "module.")
        tensors.update(
            feature_mean=self.feature_mean_,
            feature_scale=self.feature_scale_,
            classes=self.classes_,
            class_weights=self.class_weights_,
        )
        counts = {k: int(getattr(self, k)) for k in _FITTED_COUNTS}
        meta = {"classes_": [int(c) for c in self.classes_], **counts, "history_": self.history_}
        return tensors, meta

    def _restore(self, tensors: dict[str, np.ndarray], meta: dict) -> None:
        """Inverse of :meth:`_fitted_state` on an unfitted instance with the same params."""
        for key in _FITTED_COUNTS:
            setattr(self, key, int(meta[key]))
        self.history_ = list(meta["history_"])
        self.feature_mean_ = tensors["feature_mean"]
        self.feature_scale_ = tensors["feature_scale"]
        self.classes_ = tensors["classes"].astype(np.uint8)
        self.class_weights_ = tensors["class_weights"]
        module = self._build_module(self.n_features_in_, self.map_side_, len(self.classes_))
        self.module_ = load_module_tensors(module, tensors, "module.").to(self.device).eval()


def _weighted_ce(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``sum(weight * cross_entropy)`` over ``(B, P, C)`` logits and ``(B, P)`` targets."""
    n_classes = logits.shape[-1]
    losses = F.cross_entropy(logits.reshape(-1, n_classes), target.reshape(-1), reduction="none")
    return (losses * weight.reshape(-1)).sum()


def _upsampling_multiplicities(
    codes: np.ndarray, counts: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """``(M, P)`` float32 multiplicities of the (example, cell) rows ``codes`` when every class
    smaller than the largest (``counts``) is resampled with replacement to the largest count."""
    flat = codes.ravel()
    weights = np.ones(flat.shape, dtype=np.float32)
    n_max = counts.max()
    for c in np.flatnonzero((counts > 0) & (counts < n_max)):
        members = np.flatnonzero(flat == c)
        draws = np.bincount(rng.integers(len(members), size=n_max), minlength=len(members))
        weights[members] = draws
    return weights.reshape(codes.shape)


class _FactorisedReluHead(torch.autograd.Function):
    """``relu(per_example[:, None] + per_cell[None]) @ weight.T + bias``, chunked and recomputed.

    The ``(B, P, H)`` hidden activations (the MLP's only large tensor) are built a few examples
    at a time so a chunk stays in cache, never stored, and rebuilt in the backward pass.
    Gradients equal autograd's.
    """

    @staticmethod
    def forward(ctx, per_example, per_cell, weight, bias, chunk):
        n, n_cells, n_classes = per_example.shape[0], per_cell.shape[0], weight.shape[0]
        out = per_example.new_empty((n, n_cells, n_classes))
        for start in range(0, n, chunk):
            hidden = per_example[start : start + chunk, None, :] + per_cell
            torch.matmul(hidden.relu_(), weight.T, out=out[start : start + chunk])
        out += bias
        ctx.save_for_backward(per_example, per_cell, weight)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx, grad_out):
        per_example, per_cell, weight = ctx.saved_tensors
        n_classes, width = weight.shape
        grad_example = torch.empty_like(per_example)
        grad_cell = torch.zeros_like(per_cell)
        grad_weight = torch.zeros_like(weight)
        for start in range(0, per_example.shape[0], ctx.chunk):
            stop = start + ctx.chunk
            hidden = (per_example[start:stop, None, :] + per_cell).relu_()
            g = grad_out[start:stop]
            grad_weight.addmm_(g.reshape(-1, n_classes).T, hidden.reshape(-1, width))
            grad_hidden = torch.ops.aten.threshold_backward(torch.matmul(g, weight), hidden, 0)
            torch.sum(grad_hidden, dim=1, out=grad_example[start:stop])
            grad_cell += grad_hidden.sum(dim=0)
        return grad_example, grad_cell, grad_weight, grad_out.sum(dim=(0, 1)), None


def _chunk_examples(per_cell: torch.Tensor, n_examples: int) -> int:
    """Examples per chunk of :class:`_FactorisedReluHead`: about 1 MiB on one CPU thread (stays in
    cache), 8 MiB per thread with several (amortises the pool's fork/join), all on a GPU."""
    if per_cell.is_cuda:
        return n_examples
    threads = torch.get_num_threads()
    budget = 2**20 if threads == 1 else 2**23 * threads
    return max(1, budget // (per_cell.numel() * per_cell.element_size()))


class _CoordinateConditionedNet(torch.nn.Module):
    """``[act, coord] -> logits`` with a factorised first layer (see the module docstring).

    The first layer is ``Linear(F + K, width)`` split into ``act_weight (width, F)``,
    ``coord_weight (width, K)`` and ``bias``, initialised as that ``Linear``. ``coordinates``:
    ``(P, K)`` features of the queried cells; ``hidden_size``: None for the linear family.
    """

    def __init__(
        self, n_features: int, coordinates: torch.Tensor, n_classes: int, hidden_size: int | None
    ) -> None:
        super().__init__()
        self.register_buffer("coordinates", coordinates)
        width = n_classes if hidden_size is None else hidden_size
        first = torch.nn.Linear(n_features + coordinates.shape[1], width)
        self.act_weight = torch.nn.Parameter(first.weight.detach()[:, :n_features].clone())
        self.coord_weight = torch.nn.Parameter(first.weight.detach()[:, n_features:].clone())
        self.bias = torch.nn.Parameter(first.bias.detach().clone())
        self.head = None if hidden_size is None else torch.nn.Linear(hidden_size, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: (B, F)`` standardised acts -> ``(B, P, C)`` logits (factorised)."""
        per_example = x @ self.act_weight.T  # (B, H): once per example
        per_cell = self.coordinates @ self.coord_weight.T + self.bias  # (P, H): once per cell
        if self.head is None:
            return per_example[:, None, :] + per_cell[None, :, :]  # (B, P, C)
        chunk = _chunk_examples(per_cell, x.shape[0])
        return _FactorisedReluHead.apply(
            per_example, per_cell, self.head.weight, self.head.bias, chunk
        )

    def forward_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows: (B * P, F + K)`` materialised ``[act, coord]`` rows -> ``(B * P, C)`` logits."""
        weight = torch.cat([self.act_weight, self.coord_weight], dim=1)
        hidden = torch.nn.functional.linear(rows, weight, self.bias)
        if self.head is None:
            return hidden
        return self.head(torch.relu(hidden))


class CoordinateCellProbe(CellProbeBase):
    """The study's coordinate-conditioned probe: ``[act, row, col] -> CellType`` at every cell.

    Args:
        family: ``"linear"`` (logistic regression on ``[act, coord]``) or ``"mlp"`` (two layers).
        hidden_size: MLP hidden width (1024 in the study).
        coordinates: ``"raw"`` (the study's) or ``"onehot"``.
        grid_size: None for a general probe over the padded canvas; ``n`` for a size-specific
            probe over the top-left ``n x n`` cells.
        classes: ``CellType`` values to predict; None: those in the training labels.
        class_balance: ``"upsample"`` (the study's), ``"weighted_loss"`` or ``"none"``.
        learning_rate, max_epochs, batch_size, n_iter_no_change, tol: the MLP's AdamW loop
            (:func:`goalprobe.probes.training.train_estimator`; a batch brings all its cells).
        weight_decay: AdamW weight decay (MLP); the L2 strength on the mean loss (linear).
        early_stopping, validation_fraction: stop on the loss of validation grids carved from
            the training grids (MLP).
        max_iter: L-BFGS iterations at most (linear; fitted to convergence, seed-free).
        materialise: run the naive path that builds one row per (example, cell).
        device, progress: torch device; progress bars.
        random_state: seed of the validation carve, upsampling draws, initialisation and batches.

    Fitted attributes: ``classes_ (C,)`` uint8, ``n_features_in_``, ``map_side_``,
    ``feature_mean_``/``feature_scale_ (F,)``, ``class_weights_ (C,)``, ``module_``,
    ``history_``, ``n_epochs_``, ``best_epoch_``.
    """

    def __init__(
        self,
        family: Family = "mlp",
        hidden_size: int = 1024,
        coordinates: CoordinateEncoding = "raw",
        grid_size: int | None = None,
        classes: tuple[int, ...] | None = None,
        class_balance: ClassBalance = "upsample",
        learning_rate: float = 1e-3,
        weight_decay: float = 1e-2,
        max_epochs: int = 20,
        batch_size: int = 128,
        early_stopping: bool = True,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 3,
        tol: float = 1e-4,
        max_iter: int = 1000,
        materialise: bool = False,
        device: str = "cpu",
        progress: bool = False,
        random_state: int = 0,
    ) -> None:
        store_params(self, locals())

    def _build_module(self, n_features: int, side: int, n_classes: int) -> torch.nn.Module:
        if self.family not in ("linear", "mlp"):
            raise ValueError(f"family must be 'linear' or 'mlp', got {self.family!r}")
        coords = torch.from_numpy(coordinate_features(side, self.coordinates))
        hidden = self.hidden_size if self.family == "mlp" else None
        return _CoordinateConditionedNet(n_features, coords, n_classes, hidden)

    def materialised_rows(self, X: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        """The naive input of example ``rows``: ``(B * P, F + K)`` float32 ``[act, coord]`` rows,
        example-major."""
        check_is_fitted(self, "module_")
        acts = Standardiser(self.feature_mean_, self.feature_scale_, self.device)(X, rows)
        coords = self.module_.coordinates
        n_cells = coords.shape[0]
        return torch.cat([acts.repeat_interleave(n_cells, dim=0), coords.repeat(len(rows), 1)], 1)

    def _example_logits(self, X: np.ndarray) -> Callable[[np.ndarray], torch.Tensor]:
        if not self.materialise:
            return super()._example_logits(X)
        n_cells = self.map_side_**2

        def logits(rows: np.ndarray) -> torch.Tensor:
            out = self.module_.forward_rows(self.materialised_rows(X, rows))
            return out.reshape(len(rows), n_cells, -1)

        return logits

    def _training_logits(
        self, X: np.ndarray, fit_rows: np.ndarray
    ) -> Callable[[np.ndarray], torch.Tensor]:
        if not self.materialise:
            return super()._training_logits(X, fit_rows)
        # the naive dataset: every training (example, cell) row, built once up front
        n_cells = self.map_side_**2
        n_inputs = self.n_features_in_ + self.module_.coordinates.shape[1]
        table = torch.empty((len(fit_rows) * n_cells, n_inputs), device=self.device)
        for start in range(0, len(fit_rows), self.batch_size):
            part = fit_rows[start : start + self.batch_size]
            table[start * n_cells : (start + len(part)) * n_cells] = self.materialised_rows(X, part)
        cell = torch.arange(n_cells)

        def logits(pos: np.ndarray) -> torch.Tensor:
            index = (torch.from_numpy(pos)[:, None] * n_cells + cell).reshape(-1)
            out = self.module_.forward_rows(table[index])
            return out.reshape(len(pos), n_cells, -1)

        return logits


class _PerCellNet(torch.nn.Module):
    """``(B, F)`` standardised acts -> ``(B, P, C)`` logits with one head per cell (``hidden_size``
    None: linear heads on ``act``)."""

    def __init__(self, n_features: int, n_cells: int, n_classes: int, hidden_size: int | None):
        super().__init__()
        self.trunk = None if hidden_size is None else torch.nn.Linear(n_features, hidden_size)
        fan_in = n_features if hidden_size is None else hidden_size
        bound = 1.0 / math.sqrt(fan_in)
        self.weight = torch.nn.Parameter(
            torch.empty(n_cells, fan_in, n_classes).uniform_(-bound, bound)
        )
        self.bias = torch.nn.Parameter(torch.empty(n_cells, n_classes).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: (B, F)`` -> ``(B, P, C)`` logits."""
        if self.trunk is not None:
            x = torch.relu(self.trunk(x))
        return torch.einsum("bf,pfc->bpc", x, self.weight) + self.bias


class PerCellProbe(CellProbeBase):
    """One head per cell reading the activation (no coordinate input).

    ``family``: ``"linear"`` (per-cell logistic regression) or ``"mlp"`` (a shared hidden layer
    of ``hidden_size``, per-cell heads); the other parameters and the fitted attributes as
    :class:`goalprobe.probes.cell_probes.CoordinateCellProbe`'s.
    """

    def __init__(
        self,
        family: Family = "linear",
        hidden_size: int = 1024,
        grid_size: int | None = None,
        classes: tuple[int, ...] | None = None,
        class_balance: ClassBalance = "upsample",
        learning_rate: float = 1e-3,
        weight_decay: float = 1e-2,
        max_epochs: int = 20,
        batch_size: int = 128,
        early_stopping: bool = True,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 3,
        tol: float = 1e-4,
        max_iter: int = 1000,
        device: str = "cpu",
        progress: bool = False,
        random_state: int = 0,
    ) -> None:
        store_params(self, locals())

    def _build_module(self, n_features: int, side: int, n_classes: int) -> torch.nn.Module:
        if self.family not in ("linear", "mlp"):
            raise ValueError(f"family must be 'linear' or 'mlp', got {self.family!r}")
        hidden = self.hidden_size if self.family == "mlp" else None
        return _PerCellNet(n_features, side * side, n_classes, hidden)


class MajorityCellBaseline(ClassifierMixin, BaseEstimator):
    """Control probe that ignores activations: training class frequencies.

    ``strategy``: ``"per_cell"`` (frequencies at each cell: the stronger baseline on a padded
    canvas) or ``"global"`` (one distribution for every cell); ``grid_size`` as in
    :class:`CoordinateCellProbe`. Fitted: ``classes_``, ``frequencies_ (S, S, C)``,
    ``n_features_in_``, ``map_side_``.
    """

    def __init__(
        self, strategy: Literal["per_cell", "global"] = "per_cell", grid_size: int | None = None
    ):
        store_params(self, locals())

    def fit(self, X: ResidualActs | FeatureMatrix, y: CellLabels, groups: GridIds | None = None):
        """Count class frequencies of ``y`` ``(N, S, S)``; ``X`` only fixes ``n_features_in_``."""
        X2 = as_feature_matrix(X)
        labels = validate_label_maps(y, self.grid_size)
        self.classes_ = np.unique(labels).astype(np.uint8)
        onehot = labels[..., None] == self.classes_
        freq = onehot.mean(axis=0)
        if self.strategy == "global":
            freq = np.broadcast_to(freq.mean(axis=(0, 1)), freq.shape)
        elif self.strategy != "per_cell":
            raise ValueError(f"strategy must be 'per_cell' or 'global', got {self.strategy!r}")
        self.frequencies_ = np.ascontiguousarray(freq, dtype=np.float32)
        self.n_features_in_ = X2.shape[1]
        self.map_side_ = labels.shape[1]
        return self

    def predict_proba(self, X: ResidualActs | FeatureMatrix) -> CellProbs:
        """``(N, S, S, C)`` float32: the fitted frequencies for every example."""
        check_is_fitted(self, "frequencies_")
        n = as_feature_matrix(X).shape[0]
        return np.broadcast_to(self.frequencies_, (n, *self.frequencies_.shape)).copy()

    def predict(self, X: ResidualActs | FeatureMatrix) -> CellLabels:
        """``(N, S, S)`` uint8: the most frequent class (per cell or overall)."""
        return self.classes_[self.predict_proba(X).argmax(axis=-1)]

    score = CellProbeBase.score

    def _fitted_state(self) -> tuple[dict[str, np.ndarray], dict]:
        check_is_fitted(self, "frequencies_")
        tensors: dict[str, np.ndarray] = {
            "classes": self.classes_,
            "frequencies": self.frequencies_,
        }
        counts = {k: int(getattr(self, k)) for k in ("n_features_in_", "map_side_")}
        return tensors, {"classes_": [int(c) for c in self.classes_], **counts}

    def _restore(self, tensors: dict[str, np.ndarray], meta: dict) -> None:
        self.classes_ = tensors["classes"].astype(np.uint8)
        self.frequencies_ = tensors["frequencies"]
        for key in ("n_features_in_", "map_side_"):
            setattr(self, key, int(meta[key]))
