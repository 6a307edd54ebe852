"""Goal-distance regressors (study appendix E.3): activation -> shortest-path distance to goal.

``family="linear"`` is ridge regression on standardised activations; ``"quadratic"`` kernel
ridge with a degree-2 polynomial kernel (closed form), which reaches every quadratic form of the
activations, so a distance ``sum_ij p_agent(i) p_goal(j) D(i, j)`` between linearly decoded
positions is within its reach (a linear read-out of a distance is not); ``"mlp"`` two layers
with a ReLU trained with AdamW on the standardised target, early-stopped on validation grids.
Evaluate with :func:`goalprobe.probes.metrics.evaluate_distance`; choose ``alpha`` on training
grids only (e.g. ``GridSearchCV`` with ``GroupKFold`` and ``groups``).
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import numpy as np
import torch
from goalprobe.probes.families import store_params
from goalprobe.probes.training import (
    Standardiser,
    as_feature_matrix,
    early_stopping_split,
    fit_standardiser,
    load_module_tensors,
    module_tensors,
    seeded_module,
    torch_seed,
    train_estimator,
    validation_mean,
)
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.kernel_ridge import KernelRidge
from sklearn.linear_model import Ridge
from sklearn.utils.validation import check_is_fitted


class GoalDistanceRegressor(RegressorMixin, BaseEstimator):
    """Regress the shortest-path distance to the goal from the anchor activations.

    ``family``: ``"linear"`` (ridge), ``"quadratic"`` (degree-2 kernel ridge) or ``"mlp"``;
    ``alpha``: the ridge penalty; the other parameters train the MLP as
    :class:`~goalprobe.probes.cell_probes.CoordinateCellProbe`'s do.

    Fitted attributes: ``n_features_in_``, ``feature_mean_``/``feature_scale_ (F,)``,
    ``target_mean_``/``target_scale_``; linear: ``coef_ (F,)``, ``intercept_`` (standardised
    features); quadratic: ``dual_coef_ (M,)``, ``support_ (M, F)`` (the standardised training
    rows); MLP: ``module_``, ``history_``, ``n_epochs_``, ``best_epoch_``.
    """

    def __init__(
        self,
        family: Literal["linear", "quadratic", "mlp"] = "linear",
        alpha: float = 1.0,
        hidden_size: int = 1024,
        learning_rate: float = 1e-3,
        weight_decay: float = 1e-2,
        max_epochs: int = 50,
        batch_size: int = 256,
        early_stopping: bool = True,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 5,
        tol: float = 1e-4,
        device: str = "cpu",
        progress: bool = False,
        random_state: int = 0,
    ) -> None:
        store_params(self, locals())

    def _kernel(self) -> KernelRidge:
        """The quadratic family's kernel ridge: ``(x . y / F + 1) ** 2`` on standardised rows
        (the product of two linear read-outs, plus each alone)."""
        return KernelRidge(
            alpha=self.alpha, kernel="poly", degree=2, gamma=1.0 / self.n_features_in_, coef0=1.0
        )

    def _build_module(self, n_features: int) -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(n_features, self.hidden_size),
            torch.nn.ReLU(),
            torch.nn.Linear(self.hidden_size, 1),
        )

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None):
        """Fit on activations and ``(N,)`` distances; ``groups`` (grid ids) is required by the MLP
        with ``early_stopping``."""
        X2 = as_feature_matrix(X)
        target = np.asarray(y, dtype=np.float64)
        if target.shape != (X2.shape[0],):
            raise ValueError(f"y must have shape ({X2.shape[0]},), got {target.shape}")
        if not np.isfinite(target).all():
            row = int(np.flatnonzero(~np.isfinite(target))[0])
            raise ValueError(f"y[{row}] = {target[row]} is not a finite distance")
        if self.family not in ("linear", "quadratic", "mlp"):
            raise ValueError(f"family must be 'linear', 'quadratic' or 'mlp', got {self.family!r}")
        rng = np.random.default_rng(self.random_state)
        mlp = self.family == "mlp"
        fit_rows, val_rows = early_stopping_split(self, X2.shape[0], groups, rng, applies=mlp)
        self.n_features_in_ = X2.shape[1]
        self.feature_mean_, self.feature_scale_ = fit_standardiser(X2, fit_rows)
        self.target_mean_ = float(target[fit_rows].mean())
        self.target_scale_ = float(target[fit_rows].std()) or 1.0
        device = self.device if mlp else "cpu"
        standardise = Standardiser(self.feature_mean_, self.feature_scale_, device)
        if self.family == "linear":
            ridge = Ridge(alpha=self.alpha).fit(standardise(X2, fit_rows).numpy(), target[fit_rows])
            self.coef_ = ridge.coef_.astype(np.float64)
            self.intercept_ = float(ridge.intercept_)
            return self
        if self.family == "quadratic":
            support = standardise(X2, fit_rows).double().numpy()
            z = (target[fit_rows] - self.target_mean_) / self.target_scale_
            kernel = self._kernel()
            self.dual_coef_ = kernel.fit(support, z).dual_coef_.astype(np.float64)
            self.support_ = support.astype(np.float32)
            return self

        z = torch.from_numpy(((target - self.target_mean_) / self.target_scale_).astype(np.float32))
        self.module_ = seeded_module(
            lambda: self._build_module(self.n_features_in_), torch_seed(rng)
        ).to(self.device)

        def squared_errors(rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            pred = self.module_(standardise(X2, rows))[:, 0]
            return ((pred - z[rows].to(self.device)) ** 2).sum(), torch.tensor(float(len(rows)))

        validation_loss = None
        if len(val_rows):
            validation_loss = partial(validation_mean, val_rows, self.batch_size, squared_errors)
        self.history_, self.best_epoch_ = train_estimator(
            self,
            self.module_,
            n_examples=len(fit_rows),
            batch_loss=lambda pos: squared_errors(fit_rows[pos]),
            validation_loss=validation_loss,
            rng=rng,
        )
        self.n_epochs_ = len(self.history_)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predicted distances: ``(N,)`` float64."""
        check_is_fitted(self, "feature_mean_")
        X2 = as_feature_matrix(X)
        if X2.shape[1] != self.n_features_in_:
            raise ValueError(
                f"acts have {X2.shape[1]} features, the regressor was fitted on {self.n_features_in_}"
            )
        out = np.empty(X2.shape[0], dtype=np.float64)
        device = self.device if self.family == "mlp" else "cpu"
        standardise = Standardiser(self.feature_mean_, self.feature_scale_, device)
        with torch.inference_mode():
            for start in range(0, X2.shape[0], self.batch_size):
                rows = np.arange(start, min(start + self.batch_size, X2.shape[0]))
                x = standardise(X2, rows)
                if self.family == "linear":
                    out[rows] = x.double().numpy() @ self.coef_ + self.intercept_
                elif self.family == "quadratic":
                    gram = self._kernel()._get_kernel(
                        x.double().numpy(), self.support_.astype(np.float64)
                    )
                    out[rows] = (gram @ self.dual_coef_) * self.target_scale_ + self.target_mean_
                else:
                    z = self.module_(x)[:, 0].double().cpu().numpy()
                    out[rows] = z * self.target_scale_ + self.target_mean_
        return out

    def _fitted_state(self) -> tuple[dict[str, np.ndarray], dict]:
        check_is_fitted(self, "feature_mean_")
        tensors = {"feature_mean": self.feature_mean_, "feature_scale": self.feature_scale_}
        meta: dict = {
            "n_features_in_": int(self.n_features_in_),
            "target_mean_": self.target_mean_,
            "target_scale_": self.target_scale_,
        }
        if self.family == "linear":
            tensors["coef"] = self.coef_
            meta["intercept_"] = self.intercept_
        elif self.family == "quadratic":
            tensors.update(dual_coef=self.dual_coef_, support=self.support_)
        else:
            tensors.update(module_tensors(self.module_, "module."))
            meta.update(
                history_=self.history_, n_epochs_=self.n_epochs_, best_epoch_=int(self.best_epoch_)
            )
        return tensors, meta

    def _restore(self, tensors: dict[str, np.ndarray], meta: dict) -> None:
        self.n_features_in_ = int(meta["n_features_in_"])
        self.target_mean_ = float(meta["target_mean_"])
        self.target_scale_ = float(meta["target_scale_"])
        self.feature_mean_ = tensors["feature_mean"]
        self.feature_scale_ = tensors["feature_scale"]
        if self.family == "linear":
            self.coef_ = tensors["coef"]
            self.intercept_ = float(meta["intercept_"])
            return
        if self.family == "quadratic":
            self.dual_coef_ = tensors["dual_coef"]
            self.support_ = tensors["support"]
            return
        module = load_module_tensors(self._build_module(self.n_features_in_), tensors, "module.")
        self.module_ = module.to(self.device).eval()
        self.history_ = list(meta["history_"])
        self.n_epochs_ = int(meta["n_epochs_"])
        self.best_epoch_ = int(meta["best_epoch_"])
