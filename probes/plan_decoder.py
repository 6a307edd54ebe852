"""One-shot transformer plan decoder (study, section 5.3 and appendix E.5).

From the three anchor-token activations of one stage and layer it predicts the next ``T = 10``
executed actions (then ``END``) at once: each token goes through a shared bottleneck
``LayerNorm(Linear(d_model -> d_bottleneck))``; a pre-LayerNorm ``torch.nn.TransformerDecoder``
(1, 2 or 4 layers, 8 heads) runs ``T`` learned queries that cross-attend over the three tokens
(a set: no positional embedding); a linear head gives logits over ``{UP, DOWN, LEFT, RIGHT,
END}``.

**One-shot, never autoregressive.** The queries are learned embeddings, never actions, so any
multi-step structure must come from the activations; the capacity sweep controls for
computation done by the decoder itself.

Training minimises token cross-entropy (``PAD`` ignored); inputs are standardised per (token,
feature) on the training set; decoding is the per-step argmax, made canonical
(:func:`~goalprobe.probes.plan_metrics.canonical_plans`).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from goalprobe.gridworld.core import PLAN_HORIZON, PLAN_PAD
from goalprobe.probes.families import store_params
from goalprobe.probes.plan_metrics import N_PLAN_CLASSES, canonical_plans, truncate_plans
from goalprobe.probes.training import (
    load_module_tensors,
    module_tensors,
    train_estimator,
    validation_mean,
)
from sklearn.base import BaseEstimator
from sklearn.preprocessing import StandardScaler
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted
from torch import nn

if TYPE_CHECKING:
    from goalprobe.stats.shapes import PlanProbs, PlanTargets, ResidualActs

_IGNORE_INDEX = -100
_SCALER_CHUNK = 1024
_FITTED_COUNTS = ("n_tokens_in", "n_features_in", "seed", "n_epochs", "best_epoch")
"""The card's integer fitted fields (the attribute of each: the name plus ``_``)."""


class PlanDecoderNetwork(nn.Module):
    """Bottleneck + query-slot Transformer decoder + per-step head (parameters as
    :class:`PlanDecoder`'s; ``d_model`` the width of the input activations)."""

    def __init__(
        self,
        d_model: int,
        d_bottleneck: int,
        n_layers: int,
        n_heads: int,
        horizon: int,
        dim_feedforward: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.bottleneck = nn.Sequential(
            nn.Linear(d_model, d_bottleneck), nn.LayerNorm(d_bottleneck)
        )
        self.queries = nn.Parameter(torch.randn(horizon, d_bottleneck) * 0.02)
        layer = nn.TransformerDecoderLayer(
            d_model=d_bottleneck,
            nhead=n_heads,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            batch_first=True,
            norm_first=True,
        )
        self.decoder = nn.TransformerDecoder(layer, n_layers, norm=nn.LayerNorm(d_bottleneck))
        self.head = nn.Linear(d_bottleneck, N_PLAN_CLASSES)

    def forward(self, acts: torch.Tensor) -> torch.Tensor:
        """``(batch, n_tokens, d_model)`` standardised activations -> ``(batch, T, 5)`` logits."""
        memory = self.bottleneck(acts)
        queries = self.queries.unsqueeze(0).expand(acts.shape[0], -1, -1)
        # no tgt_mask: the queries are learned embeddings, not predicted actions (one-shot)
        return self.head(self.decoder(queries, memory))


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return resolved


def check_plan_acts(X: np.ndarray, name: str) -> np.ndarray:
    """``X`` as an array after checking it is ``(N, n_tokens, d_model)`` float with ``N > 0``."""
    arr = np.asarray(X)
    if arr.ndim != 3:
        raise ValueError(f"{name} must be 3-D (N, n_tokens, d_model), got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must be floating point, got dtype {arr.dtype}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} holds no examples")
    return arr


def _token_loss(network: nn.Module, x: torch.Tensor, targets: torch.Tensor, rows: np.ndarray):
    """``(summed token cross-entropy, non-PAD tokens)`` of the examples ``x[rows]``."""
    index = torch.from_numpy(rows).to(x.device)
    t = targets[index].reshape(-1)
    logits = network(x[index]).reshape(-1, N_PLAN_CLASSES)
    loss = nn.functional.cross_entropy(logits, t, ignore_index=_IGNORE_INDEX, reduction="sum")
    return loss, (t != _IGNORE_INDEX).sum()


class PlanDecoder(BaseEstimator):
    """One-shot transformer plan decoder (scikit-learn conventions).

    Args:
        n_layers, n_heads, d_bottleneck: decoder layers (1, 2 or 4 in the study), heads per
            layer (8) and the width of the bottleneck and decoder (1024).
        horizon: ``T``, plan steps decoded (10 in the study); longer labels are truncated.
        learning_rate, weight_decay: AdamW's.
        batch_size, max_epochs: batch size (epochs split into near-equal batches) and bound.
        n_iter_no_change, tol: early stopping patience and improvement, with a validation set.
        dropout: dropout inside the decoder layers.
        ffn_multiplier: decoder MLP width as a multiple of ``d_bottleneck``.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``.
        progress: show tqdm bars while training.
        random_state: seed of initialisation, dropout and batch order; ``None`` draws one.

    Fitted attributes: ``network_`` (on CPU), ``input_mean_``/``input_scale_ (n_tokens,
    d_model)``, ``n_tokens_in_``, ``n_features_in_``, ``classes_`` (0..4), ``history_`` (per
    epoch ``epoch``, ``train_loss``, ``validation_loss``, ``seconds``), ``best_epoch_``
    (1-based), ``best_validation_loss_`` (None without validation), ``n_epochs_``, ``seed_``.
    """

    def __init__(
        self,
        n_layers: int = 2,
        n_heads: int = 8,
        d_bottleneck: int = 1024,
        horizon: int = PLAN_HORIZON,
        learning_rate: float = 3e-4,
        weight_decay: float = 1e-2,
        batch_size: int = 64,
        max_epochs: int = 100,
        n_iter_no_change: int = 10,
        tol: float = 0.0,
        dropout: float = 0.1,
        ffn_multiplier: float = 2.0,
        device: str = "auto",
        progress: bool = False,
        random_state: int | None = 0,
    ) -> None:
        store_params(self, locals())

    def _check_hyperparameters(self) -> None:
        names = "n_layers n_heads d_bottleneck horizon batch_size max_epochs n_iter_no_change"
        for name in names.split():
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_bottleneck % self.n_heads:
            raise ValueError(
                f"d_bottleneck={self.d_bottleneck} is not divisible by n_heads={self.n_heads}"
            )
        if self.tol < 0:
            raise ValueError(f"tol must be >= 0, got {self.tol}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.ffn_multiplier <= 0:
            raise ValueError(f"ffn_multiplier must be > 0, got {self.ffn_multiplier}")

    def _build_network(self, d_model: int) -> PlanDecoderNetwork:
        return PlanDecoderNetwork(
            d_model=d_model,
            d_bottleneck=self.d_bottleneck,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            horizon=self.horizon,
            dim_feedforward=max(1, round(self.ffn_multiplier * self.d_bottleneck)),
            dropout=self.dropout,
        )

    def _standardise(self, X: np.ndarray, device: torch.device) -> torch.Tensor:
        """``(N, n_tokens, d_model)`` -> standardised float32 tensor on ``device``."""
        out = torch.empty(X.shape, dtype=torch.float32, device=device)
        mean, scale = self.input_mean_, self.input_scale_
        for start in range(0, len(X), _SCALER_CHUNK):
            chunk = (X[start : start + _SCALER_CHUNK].astype(np.float32) - mean) / scale
            out[start : start + len(chunk)] = torch.from_numpy(chunk).to(device)
        return out

    def _check_predict_input(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "network_")
        arr = check_plan_acts(X, "X")
        if arr.shape[1:] != (self.n_tokens_in_, self.n_features_in_):
            raise ValueError(
                f"X has {arr.shape[1]} tokens of width {arr.shape[2]}; the decoder was fitted on "
                f"{self.n_tokens_in_} tokens of width {self.n_features_in_}"
            )
        return arr

    @staticmethod
    def _loss_targets(plans: np.ndarray, device: torch.device) -> torch.Tensor:
        targets = torch.from_numpy(plans.astype(np.int64))
        targets[targets == PLAN_PAD] = _IGNORE_INDEX
        return targets.to(device)

    def fit(
        self,
        X: ResidualActs,
        y: PlanTargets,
        *,
        X_val: ResidualActs | None = None,
        y_val: PlanTargets | None = None,
    ) -> PlanDecoder:
        """Train on activations ``X (N, n_tokens, d_model)`` and plans ``y (N, T' >= horizon)``,
        early-stopping on ``(X_val, y_val)`` from other grids (without: ``max_epochs`` epochs,
        the last kept)."""
        self._check_hyperparameters()
        X = check_plan_acts(X, "X")
        y = truncate_plans(y, self.horizon)
        if len(y) != len(X):
            raise ValueError(f"X has {len(X)} examples but y has {len(y)}")
        if (X_val is None) != (y_val is None):
            raise ValueError("pass both X_val and y_val, or neither")
        if X_val is not None and y_val is not None:
            X_val = check_plan_acts(X_val, "X_val")
            y_val = truncate_plans(y_val, self.horizon)
            if X_val.shape[1:] != X.shape[1:]:
                raise ValueError(f"X_val has shape {X_val.shape[1:]} per example, X {X.shape[1:]}")
            if len(y_val) != len(X_val):
                raise ValueError(f"X_val has {len(X_val)} examples but y_val has {len(y_val)}")

        device = _resolve_device(self.device)
        self.seed_ = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        self.n_tokens_in_, self.n_features_in_ = int(X.shape[1]), int(X.shape[2])
        self.classes_ = np.arange(N_PLAN_CLASSES)

        scaler = StandardScaler()
        flat = X.reshape(len(X), -1)
        for start in range(0, len(flat), _SCALER_CHUNK):
            scaler.partial_fit(flat[start : start + _SCALER_CHUNK].astype(np.float32))
        shape = (self.n_tokens_in_, self.n_features_in_)
        self.input_mean_ = scaler.mean_.reshape(shape).astype(np.float32)
        self.input_scale_ = scaler.scale_.reshape(shape).astype(np.float32)

        x_train = self._standardise(X, device)
        t_train = self._loss_targets(y, device)

        # one torch stream for initialisation and dropout, seeded, without touching the caller's
        fork_devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=fork_devices):
            torch.manual_seed(self.seed_)
            network = self._build_network(self.n_features_in_).to(device)
            validation_loss = None
            if X_val is not None and y_val is not None:
                x_val = self._standardise(X_val, device)
                val_sums = partial(_token_loss, network, x_val, self._loss_targets(y_val, device))
                # the token cross-entropy averaged over every non-PAD validation token
                rows, chunk = np.arange(len(x_val)), max(self.batch_size, 256)
                validation_loss = partial(validation_mean, rows, chunk, val_sums)
            history, best_epoch = train_estimator(
                self,
                network,
                n_examples=len(X),
                batch_loss=partial(_token_loss, network, x_train, t_train),
                validation_loss=validation_loss,
                rng=np.random.default_rng(self.seed_),
                batching="even",
                fused=False,
            )

        self.network_ = network.cpu()
        self.history_ = history
        self.n_epochs_ = len(history)
        self.best_epoch_ = best_epoch
        self.best_validation_loss_ = (
            float(history[best_epoch - 1]["validation_loss"])
            if validation_loss is not None
            else None
        )
        return self

    def predict_proba(self, X: ResidualActs) -> PlanProbs:
        """``(N, T, 5)`` float32 per-step probabilities over UP, DOWN, LEFT, RIGHT, END."""
        X = self._check_predict_input(X)
        device = _resolve_device(self.device)
        network = self.network_.to(device).eval()
        outputs = []
        with torch.inference_mode():
            for start in range(0, len(X), 512):
                x = self._standardise(X[start : start + 512], device)
                outputs.append(torch.softmax(network(x), dim=-1).cpu().numpy())
        self.network_ = network.cpu()
        return np.concatenate(outputs).astype(np.float32)

    def predict(self, X: ResidualActs) -> PlanTargets:
        """``(N, T)`` int8 argmax plans in the plan format (``PAD`` after the first ``END``)."""
        return canonical_plans(self.predict_proba(X).argmax(-1))

    def _fitted_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Arrays (for safetensors) and JSON metadata that restore the fitted decoder exactly."""
        check_is_fitted(self, "network_")
        tensors = module_tensors(self.network_, "network.")
        tensors["input_mean"] = self.input_mean_
        tensors["input_scale"] = self.input_scale_
        meta = {key: getattr(self, f"{key}_") for key in _FITTED_COUNTS}
        meta.update(best_validation_loss=self.best_validation_loss_, history=self.history_)
        return tensors, meta

    def _restore(self, tensors: dict[str, np.ndarray], meta: dict) -> None:
        """Inverse of :meth:`_fitted_state`; ValueError when the tensors do not fit."""
        for key in ("input_mean", "input_scale"):
            if key not in tensors:
                raise ValueError(f"tensor {key!r} is missing")
        network = self._build_network(int(meta["n_features_in"]))
        try:
            load_module_tensors(network, tensors, "network.")
        except RuntimeError as err:
            raise ValueError(f"weights do not match the hyperparameters: {err}") from err
        self.network_ = network.eval()
        self.input_mean_ = np.asarray(tensors["input_mean"], dtype=np.float32)
        self.input_scale_ = np.asarray(tensors["input_scale"], dtype=np.float32)
        for key in _FITTED_COUNTS:
            setattr(self, f"{key}_", int(meta[key]))
        self.classes_ = np.arange(N_PLAN_CLASSES)
        self.best_validation_loss_ = meta["best_validation_loss"]
        self.history_ = list(meta["history"])
