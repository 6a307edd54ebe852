"""One-shot transformer plan decoder (study, section 5.3 and appendix E.5).

From the three anchor-token activations of one stage and layer, the decoder predicts the next
``T = 10`` executed actions of the trajectory (then ``END``) all at once:

* each token activation ``h_i`` (``d_model``) goes through a shared bottleneck,
  ``LayerNorm(Linear(d_model -> d_bottleneck))`` (``d_bottleneck = 1024`` in the study);
* a ``torch.nn.TransformerDecoder`` (1, 2 or 4 layers, 8 heads) runs ``T`` learned query
  embeddings, one per plan step, which cross-attend over the three bottlenecked tokens;
* a linear head maps each query slot to logits over ``{UP, DOWN, LEFT, RIGHT, END}``.

**One-shot, never autoregressive.** The decoder input is the learned queries, never predicted
actions, so no step conditions on another step's prediction and any multi-step structure in the
output must come from the activations. The query slots do self-attend to each other (no
causal mask), as in the study's Transformer decoder: the queries are learned embeddings,
identical for every example, and no slot ever sees a predicted or true action, so
self-attention mixes only hidden states computed from the activations and leaks no label. It
is decoder capacity, not a channel for continuation heuristics over predicted actions; the
capacity sweep (1, 2, 4 layers) is the control for computation done by the decoder itself.

The cross-attention sees the three tokens as a set (no positional embedding on the memory), as
in the study. The decoder layers are pre-LayerNorm (``norm_first=True``) with a final
LayerNorm, for stable training at width 1024. Training minimises token cross-entropy over the
``T`` steps with ``PAD`` ignored (AdamW), stops early on validation loss and restores the best
epoch; decoding is the per-step argmax (deterministic), made canonical (tokens after the first
predicted ``END`` become ``PAD``). Inputs are standardised per (token, feature) with statistics
fitted on the training set. Label format and metrics: :mod:`probes.plan_metrics`.

Artefacts: a fitted decoder is a safetensors file plus a JSON card next to it
(:meth:`PlanDecoder.save` / :meth:`PlanDecoder.load`); predicted plans go to HDF5 for the
viewer (:func:`write_predicted_plans`). Nothing is pickled.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import h5py
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from sklearn.base import BaseEstimator, clone
from sklearn.preprocessing import StandardScaler
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted
from torch import nn

from activations.gridworld.core import PLAN_HORIZON, PLAN_PAD
from activations.store import ActivationStore
from probes.plan_metrics import (
    N_PLAN_CLASSES,
    PLAN_TOKENS,
    PlanMetrics,
    canonical_plans,
    majority_plan,
    plan_metrics,
    plan_metrics_by_group,
    truncate_plans,
    validate_plans,
)
from probes.splits import GridSplit, split_by_grid

logger = logging.getLogger(__name__)

CARD_SCHEMA = "goalprobe.plan_decoder"
"""``schema`` field of a plan-decoder JSON card and safetensors metadata."""
CARD_SCHEMA_VERSION = 1
"""Version of the card / safetensors layout; bumped on any incompatible change."""
PREDICTED_PLANS_SCHEMA = "goalprobe.predicted_plans"
"""``schema`` attribute of a predicted-plans HDF5 file."""
PREDICTED_PLANS_SCHEMA_VERSION = 1
"""Version of the predicted-plans HDF5 layout."""
SPLIT_NAMES: tuple[str, ...] = ("train", "validation", "test")
"""Meaning of the ``split`` codes 0, 1, 2 in predicted-plans files."""

_IGNORE_INDEX = -100
_SCALER_CHUNK = 1024


# --------------------------------------------------------------------------------------------
# The network


class PlanDecoderNetwork(nn.Module):
    """Bottleneck + query-slot Transformer decoder + per-step head.

    Args:
        d_model: width of the input activations.
        d_bottleneck: width of the bottleneck and of the decoder.
        n_layers: decoder layers.
        n_heads: attention heads per layer (must divide ``d_bottleneck``).
        horizon: ``T``, number of query slots (plan steps).
        dim_feedforward: hidden width of each decoder layer's MLP.
        dropout: dropout inside the decoder layers.
    """

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
        """Plan logits.

        Args:
            acts: ``(batch, n_tokens, d_model)`` standardised activations.

        Returns:
            ``(batch, T, 5)`` logits over UP, DOWN, LEFT, RIGHT, END.
        """
        memory = self.bottleneck(acts)
        queries = self.queries.unsqueeze(0).expand(acts.shape[0], -1, -1)
        # no tgt_mask: the queries are learned embeddings, not predicted actions (one-shot)
        return self.head(self.decoder(queries, memory))


# --------------------------------------------------------------------------------------------
# The estimator


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return resolved


def _check_acts(X: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(X)
    if arr.ndim != 3:
        raise ValueError(f"{name} must be 3-D (N, n_tokens, d_model), got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must be floating point, got dtype {arr.dtype}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} holds no examples")
    return arr


class PlanDecoder(BaseEstimator):
    """One-shot transformer plan decoder (scikit-learn conventions).

    Args:
        n_layers: Transformer decoder layers (1, 2 or 4 in the study).
        n_heads: attention heads per layer (8 in the study).
        d_bottleneck: width of the shared bottleneck and of the decoder (1024 in the study).
        horizon: ``T``, plan steps decoded (10 in the study); longer labels are truncated.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        batch_size: training batch size.
        max_epochs: upper bound on training epochs.
        patience: epochs without a lower validation loss before stopping.
        dropout: dropout inside the decoder layers.
        ffn_multiplier: decoder MLP width as a multiple of ``d_bottleneck`` (2 gives 2048 at
            width 1024, PyTorch's default).
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``.
        random_state: seed of initialisation, dropout and batch order; ``None`` draws one.

    Fitted attributes:
        network_: the trained :class:`PlanDecoderNetwork` (on CPU after fitting/loading).
        input_mean_, input_scale_: ``(n_tokens, d_model)`` float32 standardisation.
        n_tokens_in_: tokens per example (3 in the study).
        n_features_in_: ``d_model``.
        classes_: ``(5,)`` the predicted tokens 0..4 (UP, DOWN, LEFT, RIGHT, END).
        history_: one dict per epoch: ``epoch``, ``train_loss``, ``validation_loss`` (``None``
            without a validation set).
        best_epoch_: the epoch whose weights were kept (1-based).
        best_validation_loss_: its validation loss, ``None`` without a validation set.
        n_epochs_: epochs run.
        seed_: the seed actually used.
    """

    def __init__(
        self,
        n_layers: int = 2,
        n_heads: int = 8,
        d_bottleneck: int = 1024,
        horizon: int = PLAN_HORIZON,
        lr: float = 3e-4,
        weight_decay: float = 1e-2,
        batch_size: int = 64,
        max_epochs: int = 100,
        patience: int = 10,
        dropout: float = 0.1,
        ffn_multiplier: float = 2.0,
        device: str = "auto",
        random_state: int | None = 0,
    ) -> None:
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.d_bottleneck = d_bottleneck
        self.horizon = horizon
        self.lr = lr
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.dropout = dropout
        self.ffn_multiplier = ffn_multiplier
        self.device = device
        self.random_state = random_state

    # ---- helpers -----------------------------------------------------------------------

    def _check_hyperparameters(self) -> None:
        for name in ("n_layers", "n_heads", "d_bottleneck", "horizon", "batch_size", "max_epochs"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_bottleneck % self.n_heads:
            raise ValueError(
                f"d_bottleneck={self.d_bottleneck} is not divisible by n_heads={self.n_heads}"
            )
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1, got {self.patience}")
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
        arr = _check_acts(X, "X")
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

    # ---- fit / predict -----------------------------------------------------------------

    def fit(
        self,
        X: np.ndarray,
        y: np.ndarray,
        X_val: np.ndarray | None = None,
        y_val: np.ndarray | None = None,
    ) -> PlanDecoder:
        """Train on ``(X, y)``, early-stopping on ``(X_val, y_val)``.

        Args:
            X: ``(N, n_tokens, d_model)`` float16/32 activations (three anchor tokens).
            y: ``(N, T')`` int plan labels with ``T' >= horizon`` (truncated to ``horizon``).
            X_val: ``(M, n_tokens, d_model)`` validation activations from grids not in ``X``;
                without them the decoder trains ``max_epochs`` epochs and keeps the last.
            y_val: ``(M, T')`` validation plans.

        Returns:
            self.
        """
        self._check_hyperparameters()
        X = _check_acts(X, "X")
        y = truncate_plans(y, self.horizon)
        if len(y) != len(X):
            raise ValueError(f"X has {len(X)} examples but y has {len(y)}")
        if (X_val is None) != (y_val is None):
            raise ValueError("pass both X_val and y_val, or neither")
        has_val = X_val is not None
        if has_val:
            X_val = _check_acts(X_val, "X_val")
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
        if has_val:
            x_val = self._standardise(X_val, device)
            t_val = self._loss_targets(y_val, device)

        fork_devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=fork_devices):
            torch.manual_seed(self.seed_)
            network = self._build_network(self.n_features_in_).to(device)
            optimiser = torch.optim.AdamW(
                network.parameters(), lr=self.lr, weight_decay=self.weight_decay
            )
            loss_fn = nn.CrossEntropyLoss(ignore_index=_IGNORE_INDEX)
            order_rng = np.random.default_rng(self.seed_)
            history: list[dict] = []
            best_loss, best_state, best_epoch, waited = math.inf, None, 0, 0
            for epoch in range(1, self.max_epochs + 1):
                network.train()
                total, count = 0.0, 0
                for idx in np.array_split(
                    order_rng.permutation(len(X)), max(1, math.ceil(len(X) / self.batch_size))
                ):
                    index = torch.from_numpy(idx).to(device)
                    logits = network(x_train[index])
                    loss = loss_fn(logits.reshape(-1, N_PLAN_CLASSES), t_train[index].reshape(-1))
                    optimiser.zero_grad(set_to_none=True)
                    loss.backward()
                    optimiser.step()
                    total += loss.item() * len(idx)
                    count += len(idx)
                record = {"epoch": epoch, "train_loss": total / count, "validation_loss": None}
                if has_val:
                    val_loss = self._mean_loss(network, x_val, t_val)
                    record["validation_loss"] = val_loss
                if not all(math.isfinite(v) for v in record.values() if v is not None):
                    raise FloatingPointError(
                        f"plan decoder training diverged at epoch {epoch} ({record}); "
                        f"lower lr (now {self.lr})"
                    )
                history.append(record)
                logger.debug("plan decoder epoch %d: %s", epoch, record)
                if not has_val:
                    best_epoch = epoch
                    continue
                if val_loss < best_loss:
                    best_loss, best_epoch, waited = val_loss, epoch, 0
                    best_state = copy.deepcopy(network.state_dict())
                else:
                    waited += 1
                    if waited >= self.patience:
                        break
            if best_state is not None:
                network.load_state_dict(best_state)

        network.eval()
        self.network_ = network.cpu()
        self.history_ = history
        self.n_epochs_ = len(history)
        self.best_epoch_ = best_epoch
        self.best_validation_loss_ = float(best_loss) if has_val else None
        return self

    def _mean_loss(self, network: nn.Module, x: torch.Tensor, targets: torch.Tensor) -> float:
        """Token cross-entropy averaged over all non-PAD tokens of ``x``."""
        network.eval()
        loss_fn = nn.CrossEntropyLoss(ignore_index=_IGNORE_INDEX, reduction="sum")
        total, count = 0.0, int((targets != _IGNORE_INDEX).sum())
        with torch.inference_mode():
            for start in range(0, len(x), max(self.batch_size, 256)):
                logits = network(x[start : start + max(self.batch_size, 256)])
                t = targets[start : start + len(logits)]
                total += float(loss_fn(logits.reshape(-1, N_PLAN_CLASSES), t.reshape(-1)))
        return total / max(count, 1)

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Per-step class probabilities.

        Args:
            X: ``(N, n_tokens, d_model)`` activations.

        Returns:
            ``(N, T, 5)`` float32 over UP, DOWN, LEFT, RIGHT, END.
        """
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

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Argmax plans in the plan format (``PAD`` after the first predicted ``END``).

        Args:
            X: ``(N, n_tokens, d_model)`` activations.

        Returns:
            ``(N, T)`` int8 plans.
        """
        return canonical_plans(self.predict_proba(X).argmax(-1))

    # ---- artefacts ---------------------------------------------------------------------

    def save(
        self,
        path: str | Path,
        *,
        metrics: dict | None = None,
        provenance: dict | None = None,
    ) -> Path:
        """Write ``<path>`` (safetensors weights) and ``<path>`` with suffix ``.json`` (card).

        Args:
            path: the ``.safetensors`` file to write.
            metrics: JSON-ready evaluation results to record in the card.
            provenance: where the training data came from (store file, stage, layer, split).

        Returns:
            the card's path.
        """
        check_is_fitted(self, "network_")
        path = Path(path)
        if path.suffix != ".safetensors":
            raise ValueError(f"{path}: a plan decoder is saved to a .safetensors file")
        tensors = {
            f"network.{k}": v.detach().cpu().contiguous()
            for k, v in self.network_.state_dict().items()
        }
        tensors["input_mean"] = torch.from_numpy(self.input_mean_)
        tensors["input_scale"] = torch.from_numpy(self.input_scale_)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(
            tensors,
            str(path),
            metadata={"schema": CARD_SCHEMA, "schema_version": str(CARD_SCHEMA_VERSION)},
        )
        card = {
            "schema": CARD_SCHEMA,
            "schema_version": CARD_SCHEMA_VERSION,
            "estimator": "probes.plan_decoder.PlanDecoder",
            "weights_file": path.name,
            "weights_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "versions": {"goalprobe": _version("goalprobe"), "torch": torch.__version__},
            "hyperparameters": self.get_params(),
            "fitted": {
                "n_tokens_in": self.n_tokens_in_,
                "n_features_in": self.n_features_in_,
                "seed": self.seed_,
                "n_epochs": self.n_epochs_,
                "best_epoch": self.best_epoch_,
                "best_validation_loss": self.best_validation_loss_,
                "history": self.history_,
            },
            "tokens": PLAN_TOKENS,
            "metrics": metrics or {},
            "provenance": provenance or {},
        }
        card_path = path.with_suffix(".json")
        card_path.write_text(json.dumps(card, indent=2, allow_nan=False) + "\n")
        return card_path

    @classmethod
    def load(cls, path: str | Path, *, device: str | None = None) -> PlanDecoder:
        """Rebuild a decoder written by :meth:`save`.

        Args:
            path: the ``.safetensors`` file (its card is the same path with suffix ``.json``).
            device: overrides the saved ``device`` hyperparameter (e.g. ``"cpu"``).

        Returns:
            a fitted :class:`PlanDecoder` predicting exactly as the saved one.
        """
        path = Path(path)
        card_path = path.with_suffix(".json")
        if not card_path.exists():
            raise FileNotFoundError(f"{path}: card {card_path} is missing")
        card = read_card(card_path)
        params = dict(card["hyperparameters"])
        if device is not None:
            params["device"] = device
        decoder = cls(**params)
        fitted = card["fitted"]
        tensors = load_file(str(path))
        for key in ("input_mean", "input_scale"):
            if key not in tensors:
                raise ValueError(f"{path}: tensor {key!r} is missing")
        network = decoder._build_network(int(fitted["n_features_in"]))
        state = {
            k.removeprefix("network."): v for k, v in tensors.items() if k.startswith("network.")
        }
        try:
            network.load_state_dict(state, strict=True)
        except RuntimeError as err:
            raise ValueError(
                f"{path}: weights do not match the card's hyperparameters: {err}"
            ) from err
        network.eval()
        decoder.network_ = network
        decoder.input_mean_ = tensors["input_mean"].numpy()
        decoder.input_scale_ = tensors["input_scale"].numpy()
        decoder.n_tokens_in_ = int(fitted["n_tokens_in"])
        decoder.n_features_in_ = int(fitted["n_features_in"])
        decoder.classes_ = np.arange(N_PLAN_CLASSES)
        decoder.seed_ = int(fitted["seed"])
        decoder.n_epochs_ = int(fitted["n_epochs"])
        decoder.best_epoch_ = int(fitted["best_epoch"])
        decoder.best_validation_loss_ = fitted["best_validation_loss"]
        decoder.history_ = list(fitted["history"])
        return decoder


def read_card(path: str | Path) -> dict:
    """Read and check a plan-decoder JSON card.

    Args:
        path: the ``.json`` card.

    Returns:
        the card as a dict.
    """
    path = Path(path)
    try:
        card = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON (line {err.lineno}): {err.msg}") from err
    if card.get("schema") != CARD_SCHEMA:
        raise ValueError(f"{path}: schema {card.get('schema')!r} is not {CARD_SCHEMA!r}")
    if card.get("schema_version") != CARD_SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema_version {card.get('schema_version')!r} is not supported "
            f"(this goalprobe reads {CARD_SCHEMA_VERSION})"
        )
    for key in ("hyperparameters", "fitted"):
        if key not in card:
            raise ValueError(f"{path}: field {key!r} is missing")
    return card


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------------------------
# Predicted plans HDF5 (for the viewer)


@dataclass(frozen=True, eq=False)
class PredictedPlans:
    """One run's predicted plans as stored in HDF5.

    Attributes:
        plans: ``(N, T)`` int8 predicted plans (plan format).
        row_ids: ``(N,)`` int64 rows of the activation store they were predicted for.
        split: ``(N,)`` int8 codes into :data:`SPLIT_NAMES`, or None when not recorded.
        card: the decoder card (hyperparameters, metrics, provenance).
    """

    plans: np.ndarray
    row_ids: np.ndarray
    split: np.ndarray | None
    card: dict


def write_predicted_plans(
    path: str | Path,
    run_name: str,
    plans: np.ndarray,
    row_ids: np.ndarray,
    *,
    card: dict,
    split: np.ndarray | None = None,
    overwrite: bool = False,
) -> None:
    """Add one run's predicted plans to an HDF5 file (created when missing).

    Layout: file attributes ``schema``, ``schema_version``, ``tokens`` (JSON), ``split_names``
    (JSON); group ``runs/<run_name>`` with datasets ``plans (N, T) int8``, ``row_ids (N,)
    int64``, optional ``split (N,) int8``, and attributes ``card`` (JSON), ``horizon``.

    Args:
        path: the ``.h5`` file.
        run_name: group name under ``runs/`` (may contain ``/``), e.g. ``"post/layer15/decoder2"``.
        plans: ``(N, T)`` predicted plans.
        row_ids: ``(N,)`` int store rows.
        card: JSON-ready card of the decoder that produced them.
        split: ``(N,)`` optional split codes (0 train, 1 validation, 2 test).
        overwrite: replace an existing run of that name instead of raising.
    """
    plans = validate_plans(plans, name=f"plans of run {run_name!r}")
    row_ids = np.asarray(row_ids)
    if row_ids.shape != (len(plans),) or not np.issubdtype(row_ids.dtype, np.integer):
        raise ValueError(
            f"row_ids must be ({len(plans)},) integers, got {row_ids.shape} {row_ids.dtype}"
        )
    if split is not None:
        split = np.asarray(split)
        if split.shape != (len(plans),) or ((split < 0) | (split >= len(SPLIT_NAMES))).any():
            raise ValueError(f"split must be ({len(plans)},) codes in 0..{len(SPLIT_NAMES) - 1}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "a") as f:
        if "schema" in f.attrs:
            _check_plans_file(f, path)
        else:
            f.attrs["schema"] = PREDICTED_PLANS_SCHEMA
            f.attrs["schema_version"] = PREDICTED_PLANS_SCHEMA_VERSION
            f.attrs["tokens"] = json.dumps(PLAN_TOKENS)
            f.attrs["split_names"] = json.dumps(list(SPLIT_NAMES))
        name = f"runs/{run_name}"
        if name in f:
            if not overwrite:
                raise ValueError(f"{path}: run {run_name!r} already exists (pass overwrite=True)")
            del f[name]
        group = f.create_group(name)
        group.create_dataset("plans", data=plans, dtype=np.int8)
        group.create_dataset("row_ids", data=row_ids.astype(np.int64))
        if split is not None:
            group.create_dataset("split", data=split.astype(np.int8))
        group.attrs["card"] = json.dumps(card, allow_nan=False)
        group.attrs["horizon"] = plans.shape[1]


def _check_plans_file(f: h5py.File, path: Path) -> None:
    if f.attrs.get("schema") != PREDICTED_PLANS_SCHEMA:
        raise ValueError(
            f"{path}: schema {f.attrs.get('schema')!r} is not {PREDICTED_PLANS_SCHEMA!r}"
        )
    if int(f.attrs.get("schema_version", -1)) != PREDICTED_PLANS_SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema_version {f.attrs.get('schema_version')!r} is not supported "
            f"(this goalprobe reads {PREDICTED_PLANS_SCHEMA_VERSION})"
        )


def list_predicted_plan_runs(path: str | Path) -> list[str]:
    """Names of the runs in a predicted-plans HDF5 file, sorted."""
    path = Path(path)
    names: list[str] = []
    with h5py.File(path, "r") as f:
        _check_plans_file(f, path)
        if "runs" in f:
            f["runs"].visititems(
                lambda name, obj: (
                    names.append(name) if isinstance(obj, h5py.Group) and "plans" in obj else None
                )
            )
    return sorted(names)


def read_predicted_plans(path: str | Path, run_name: str) -> PredictedPlans:
    """Read one run written by :func:`write_predicted_plans`."""
    path = Path(path)
    with h5py.File(path, "r") as f:
        _check_plans_file(f, path)
        name = f"runs/{run_name}"
        if name not in f:
            raise KeyError(f"{path}: no run {run_name!r}")
        group = f[name]
        return PredictedPlans(
            plans=group["plans"][()].astype(np.int8),
            row_ids=group["row_ids"][()].astype(np.int64),
            split=group["split"][()].astype(np.int8) if "split" in group else None,
            card=json.loads(group.attrs["card"]),
        )


# --------------------------------------------------------------------------------------------
# Capacity sweep


@dataclass(frozen=True, eq=False)
class PlanDataset:
    """Activations and plan labels of one stage and layer, as a sweep loader returns them.

    Attributes:
        acts: ``(N, n_tokens, d_model)`` float16/32 anchor-token activations.
        plans: ``(N, T')`` int8 plan labels (``T' >= horizon``).
        grid_ids: ``(N,)`` grid of each row (splits and bootstrap are by grid).
        row_ids: ``(N,)`` int row of each example in the activation store.
        sizes: ``(N,)`` grid sizes for the breakdown, or None.
        densities: ``(N,)`` obstacle densities for the breakdown, or None.
        provenance: JSON-ready description of the source (store file, model, stage, layer).
    """

    acts: np.ndarray
    plans: np.ndarray
    grid_ids: np.ndarray
    row_ids: np.ndarray
    sizes: np.ndarray | None = None
    densities: np.ndarray | None = None
    provenance: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.acts)
        _check_acts(self.acts, "acts")
        validate_plans(self.plans)
        for name in ("plans", "grid_ids", "row_ids", "sizes", "densities"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} rows but acts has {n}")


PlanLoader = Callable[[str, int], PlanDataset]
"""``load(stage, layer) -> PlanDataset``: how the sweep gets its data."""


class StorePlanLoader:
    """A :data:`PlanLoader` reading an activation store (``goalprobe extract``).

    Rows are those holding the stage (``present``); each row is one trajectory step, labelled
    with the ``plan`` from that step on.

    Args:
        path: the store ``.h5`` file.
        first_step_only: keep only step 0 of each episode (one example per trajectory, as in
            the study) instead of every step.
    """

    def __init__(self, path: str | Path, *, first_step_only: bool = False) -> None:
        self.path = Path(path)
        self.first_step_only = first_step_only
        with ActivationStore(self.path) as store:  # fail early on a bad file
            self.stages, self.layers = store.stages, store.layers
            self.attrs = dict(store.attrs)

    def __call__(self, stage: str, layer: int) -> PlanDataset:
        """Activations ``(N, 3, d_model)`` float16 and labels of ``stage`` and ``layer``."""
        with ActivationStore(self.path) as store:
            rows = store.select(stage)
            fields = ["plan", "grid_id", "grid_size", "density", "step"]
            labels = store.labels(fields, rows)
            if self.first_step_only:
                keep = labels["step"] == 0
                rows = rows[keep]
                labels = {k: v[keep] for k, v in labels.items()}
            if len(rows) == 0:
                raise ValueError(f"{self.path}: no rows hold stage {stage!r}")
            acts = store.read(stage, layer, rows)
        densities = labels["density"].astype(np.float64)
        provenance = {
            "store": str(self.path),
            "stage": stage,
            "layer": int(layer),
            "n_rows": int(len(rows)),
            "first_step_only": self.first_step_only,
            **{
                key: self.attrs.get(key)
                for key in (
                    "model_id",
                    "model_revision",
                    "backend",
                    "created",
                    "package_version",
                    "trajectory_file",
                    "trajectory_sha256",
                )
                if key in self.attrs
            },
        }
        return PlanDataset(
            acts=acts,
            plans=labels["plan"].astype(np.int8),
            grid_ids=labels["grid_id"].astype(str),
            row_ids=rows,
            sizes=labels["grid_size"].astype(np.int64),
            densities=None if np.isnan(densities).all() else np.round(densities, 6),
            provenance=provenance,
        )


@dataclass(frozen=True)
class PlanSweepConfig:
    """What the capacity sweep trains and how it evaluates."""

    stages: tuple[str, ...] = ("pre_reasoning", "post_reasoning")
    """Stages passed to the loader (pre- and post-reasoning anchors)."""
    layers: tuple[int, ...] = (7, 15, 23)
    """Residual-stream layers passed to the loader."""
    decoder_layers: tuple[int, ...] = (1, 2, 4)
    """Decoder capacities (Transformer decoder layers) trained for every stage and layer."""
    control_decoder_layers: tuple[int, ...] = (2,)
    """Capacities that also get the shuffled-activation control; empty to skip it."""
    test_fraction: float = 0.15
    """Fraction of grids held out for the reported metrics (within each grid size)."""
    validation_fraction: float = 0.15
    """Fraction of the remaining (non-test) grids used for early stopping."""
    n_bootstrap: int = 1000
    """Grid-bootstrap resamples for the confidence intervals (0: none)."""
    confidence_level: float = 0.95
    """Coverage of the intervals."""
    random_state: int = 0
    """Seed of the split, the decoders, the shuffle and the bootstrap."""


@dataclass(frozen=True, eq=False)
class PlanRun:
    """One evaluated predictor of the sweep.

    Attributes:
        name: ``"<stage>/layer<layer>/<kind>"`` (+ ``<decoder_layers>`` for trained decoders).
        stage, layer: the activations' stage and layer.
        kind: ``"decoder"``, ``"shuffled_control"`` (decoder trained on activations shuffled
            across examples) or ``"majority_plan"`` (the most frequent training plan for all).
        decoder_layers: the decoder's capacity; None for the majority plan (no decoder).
        metrics: test-split :class:`PlanMetrics`.
        by_size, by_density: test metrics per grid size / density (empty when unknown).
        best_epoch: the kept epoch; None for the majority plan.
        model_path: the saved ``.safetensors`` file, or None when nothing was written.
    """

    name: str
    stage: str
    layer: int
    kind: str
    decoder_layers: int | None
    metrics: PlanMetrics
    by_size: dict[str, PlanMetrics]
    by_density: dict[str, PlanMetrics]
    best_epoch: int | None
    model_path: str | None

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {
            "name": self.name,
            "stage": self.stage,
            "layer": self.layer,
            "kind": self.kind,
            "decoder_layers": self.decoder_layers,
            "best_epoch": self.best_epoch,
            "model_path": self.model_path,
            "metrics": self.metrics.to_dict(),
            "by_size": {k: v.to_dict() for k, v in self.by_size.items()},
            "by_density": {k: v.to_dict() for k, v in self.by_density.items()},
        }


@dataclass(frozen=True, eq=False)
class PlanSweepResult:
    """All runs of a sweep plus what they were trained with.

    Attributes:
        config: the :class:`PlanSweepConfig`.
        decoder_params: the template decoder's hyperparameters.
        runs: every evaluated predictor, in training order.
        splits: per ``"<stage>/layer<layer>"``, the number of rows and grids in each split.
    """

    config: PlanSweepConfig
    decoder_params: dict
    runs: list[PlanRun]
    splits: dict[str, dict]

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {
            "schema": "goalprobe.plan_sweep",
            "schema_version": 1,
            "config": asdict(self.config),
            "decoder_params": self.decoder_params,
            "splits": self.splits,
            "runs": [run.to_dict() for run in self.runs],
        }


def _split_codes(split: GridSplit, n: int) -> np.ndarray:
    """``(n,)`` int8 split code of each row (0 train, 1 validation, 2 test)."""
    codes = np.zeros(n, dtype=np.int8)
    codes[split.validation] = 1
    codes[split.test] = 2
    return codes


def _ids_digest(ids: np.ndarray) -> str:
    joined = "\n".join(sorted(str(v) for v in np.unique(ids)))
    return hashlib.sha256(joined.encode()).hexdigest()


@dataclass(frozen=True, eq=False)
class _TestSet:
    """The test rows of one stage and layer, and how to score predictions on them."""

    plans: np.ndarray
    grid_ids: np.ndarray
    sizes: np.ndarray | None
    densities: np.ndarray | None
    metric_kw: dict

    def evaluate(self, pred: np.ndarray) -> tuple[PlanMetrics, dict, dict]:
        """Overall metrics and the breakdowns by size and by density."""
        by = [
            {}
            if groups is None
            else plan_metrics_by_group(pred, self.plans, self.grid_ids, groups, **self.metric_kw)
            for groups in (self.sizes, self.densities)
        ]
        return plan_metrics(pred, self.plans, self.grid_ids, **self.metric_kw), by[0], by[1]


def run_plan_sweep(
    load: PlanLoader,
    config: PlanSweepConfig = PlanSweepConfig(),
    decoder: PlanDecoder | None = None,
    *,
    out_dir: str | Path | None = None,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
) -> PlanSweepResult:
    """Train and evaluate decoders of every capacity on every stage and layer.

    For each ``(stage, layer)``: load the data, split it by grid, evaluate the majority-plan
    baseline (the most frequent *training* plan), train one decoder per capacity in
    ``config.decoder_layers`` (early stopping on the validation grids) and, per capacity in
    ``config.control_decoder_layers``, the same decoder on activations permuted across examples
    (train and validation rows; the test rows stay intact). Everything is scored on the test
    grids only. The split is :func:`probes.splits.split_by_grid`, stratified by grid size when
    sizes are known; it depends only on the set of grids, so all stages and layers share it.

    Args:
        load: ``load(stage, layer) -> PlanDataset``.
        config: the sweep.
        decoder: template estimator (cloned; ``n_layers`` and ``random_state`` are set per run).
        out_dir: when given, writes ``models/<run>.safetensors`` + ``.json`` cards,
            ``predicted_plans.h5`` (all rows of every trained run, with split codes) and
            ``sweep.json``.
        overwrite: replace existing artefacts in ``out_dir`` instead of raising.
        progress: called with a short message before each training run.

    Returns:
        :class:`PlanSweepResult`.
    """
    template = decoder if decoder is not None else PlanDecoder()
    say = progress or (lambda message: None)
    out = Path(out_dir) if out_dir is not None else None
    plans_path = out / "predicted_plans.h5" if out is not None else None
    if out is not None:
        existing = [p for p in (plans_path, out / "sweep.json") if p.exists()]
        if existing and not overwrite:
            raise FileExistsError(f"{existing[0]} exists; pass overwrite=True to replace it")
        if plans_path.exists():
            plans_path.unlink()
    metric_kw = {
        "n_bootstrap": config.n_bootstrap,
        "confidence_level": config.confidence_level,
        "random_state": config.random_state,
    }
    runs: list[PlanRun] = []
    splits: dict[str, dict] = {}
    for stage in config.stages:
        for layer in config.layers:
            data = load(stage, layer)
            plans = truncate_plans(data.plans, template.horizon)
            grid_ids = np.asarray(data.grid_ids)
            split = split_by_grid(
                grid_ids,
                test_fraction=config.test_fraction,
                validation_fraction=config.validation_fraction,
                stratify=data.sizes,
                random_state=config.random_state,
            )
            for part, rows in zip(
                SPLIT_NAMES, (split.train, split.validation, split.test), strict=True
            ):
                if len(rows) == 0:
                    raise ValueError(
                        f"{stage}/layer{layer}: the {part} split is empty "
                        f"({len(np.unique(grid_ids))} grids); use more grids"
                    )
            key = f"{stage}/layer{layer}"
            split_info = {
                part: {
                    "n_rows": int(len(rows)),
                    "n_grids": int(len(np.unique(grid_ids[rows]))),
                    "grid_ids_sha256": _ids_digest(grid_ids[rows]),
                }
                for part, rows in zip(
                    SPLIT_NAMES, (split.train, split.validation, split.test), strict=True
                )
            }
            splits[key] = split_info
            test = split.test
            evaluation = _TestSet(
                plans[test],
                grid_ids[test],
                None if data.sizes is None else np.asarray(data.sizes)[test],
                None if data.densities is None else np.asarray(data.densities)[test],
                metric_kw,
            )

            majority = np.tile(majority_plan(plans[split.train]), (len(test), 1))
            m, by_size, by_density = evaluation.evaluate(majority)
            runs.append(
                PlanRun(
                    name=f"{key}/majority_plan",
                    stage=stage,
                    layer=layer,
                    kind="majority_plan",
                    decoder_layers=None,
                    metrics=m,
                    by_size=by_size,
                    by_density=by_density,
                    best_epoch=None,
                    model_path=None,
                )
            )

            jobs = [("decoder", k) for k in config.decoder_layers]
            jobs += [("shuffled_control", k) for k in config.control_decoder_layers]
            for kind, n_layers in jobs:
                name = f"{key}/{kind}{n_layers}"
                say(f"training {name}")
                X_train, X_val = data.acts[split.train], data.acts[split.validation]
                if kind == "shuffled_control":
                    rng = np.random.default_rng(config.random_state)
                    X_train = X_train[rng.permutation(len(X_train))]
                    X_val = X_val[rng.permutation(len(X_val))]
                est = clone(template).set_params(
                    n_layers=n_layers, random_state=config.random_state
                )
                est.fit(X_train, plans[split.train], X_val, plans[split.validation])
                pred_all = est.predict(data.acts)
                m, by_size, by_density = evaluation.evaluate(pred_all[test])
                model_path = None
                if out is not None:
                    provenance = {
                        "data": data.provenance,
                        "stage": stage,
                        "layer": layer,
                        "kind": kind,
                        "split": split_info,
                        "split_config": {
                            "validation_fraction": config.validation_fraction,
                            "test_fraction": config.test_fraction,
                            "random_state": config.random_state,
                        },
                    }
                    weights = out / "models" / f"{name.replace('/', '__')}.safetensors"
                    if weights.exists() and not overwrite:
                        raise FileExistsError(f"{weights} exists; pass overwrite=True")
                    card_path = est.save(
                        weights, metrics={"test": m.to_dict()}, provenance=provenance
                    )
                    model_path = str(weights)
                    write_predicted_plans(
                        plans_path,
                        name,
                        pred_all,
                        np.asarray(data.row_ids),
                        card=read_card(card_path),
                        split=_split_codes(split, len(plans)),
                    )
                runs.append(
                    PlanRun(
                        name=name,
                        stage=stage,
                        layer=layer,
                        kind=kind,
                        decoder_layers=n_layers,
                        metrics=m,
                        by_size=by_size,
                        by_density=by_density,
                        best_epoch=est.best_epoch_,
                        model_path=model_path,
                    )
                )
    result = PlanSweepResult(config, template.get_params(), runs, splits)
    if out is not None:
        (out / "sweep.json").write_text(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    return result
