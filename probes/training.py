"""Shared torch machinery of the probes: standardisation, seeded modules, the training loop.

:func:`train_module` trains any module on minibatches of examples with a weighted loss, AdamW
and optional early stopping on validation grids (the best state restored): the MLP cell probes,
the distance MLP and the plan decoder. The convex linear cell probes use :func:`fit_lbfgs`.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Literal

import numpy as np
import scipy.optimize
import torch
from goalprobe.probes.splits import carve_validation
from sklearn.preprocessing import StandardScaler
from tqdm.auto import tqdm

BatchLoss = Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor]]
"""Maps a batch of example positions to ``(sum of weighted losses, sum of weights)``."""

Batching = Literal["slices", "even"]
"""How an epoch's permutation becomes minibatches: ``"slices"``, consecutive ``batch_size``
slices, sorted within a batch (cheap gathers); ``"even"``, ``ceil(n / batch_size)`` batches of
near-equal size in permutation order."""


def as_feature_matrix(X: np.ndarray, *, name: str = "acts") -> np.ndarray:
    """``(N, n_anchors, d_model)`` or ``(N, F)`` float activations as ``(N, F)`` (anchors
    concatenated, a view when possible); ``name`` is the array's name in error messages."""
    arr = np.asarray(X)
    if arr.ndim == 3:
        arr = arr.reshape(arr.shape[0], -1)
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be (N, n_anchors, d_model) or (N, features), got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must be floating point, got dtype {arr.dtype}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} has no rows")
    return arr


def fit_standardiser(
    X: np.ndarray, rows: np.ndarray, *, chunk_rows: int = 512
) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, scale)`` ``(F,)`` float32 over the training ``rows`` of ``X``, ``chunk_rows`` at a
    time in float64 (no float64 copy of ``X``); zero-variance features get scale 1."""
    scaler = StandardScaler()
    for start in range(0, len(rows), chunk_rows):
        scaler.partial_fit(X[np.sort(rows[start : start + chunk_rows])].astype(np.float64))
    return scaler.mean_.astype(np.float32), scaler.scale_.astype(np.float32)


class Standardiser:
    """Applies a fitted ``(F,)`` mean and scale to gathered example rows, on a device."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, device: str) -> None:
        self.mean = torch.from_numpy(np.ascontiguousarray(mean, dtype=np.float32)).to(device)
        self.scale = torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32)).to(device)
        self.device = device

    def __call__(self, X: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        """``(len(rows), F)`` float32 standardised rows of ``X``."""
        block = torch.from_numpy(np.ascontiguousarray(X[rows]))
        block = block.to(device=self.device, dtype=torch.float32)
        return (block - self.mean) / self.scale


def module_tensors(module: torch.nn.Module, prefix: str) -> dict[str, np.ndarray]:
    """``module``'s state as numpy arrays named ``prefix + key`` (for safetensors)."""
    state = module.state_dict().items()
    return {f"{prefix}{k}": v.detach().cpu().contiguous().numpy() for k, v in state}


def load_module_tensors(module: torch.nn.Module, tensors: dict, prefix: str) -> torch.nn.Module:
    """Load the arrays of ``tensors`` named ``prefix + key`` into ``module`` (strict)."""
    state = {
        k.removeprefix(prefix): torch.from_numpy(np.array(v))
        for k, v in tensors.items()
        if k.startswith(prefix)
    }
    module.load_state_dict(state, strict=True)
    return module


def seeded_module(build: Callable[[], torch.nn.Module], seed: int) -> torch.nn.Module:
    """Build a module with parameters drawn from ``seed`` without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def torch_seed(rng: np.random.Generator) -> int:
    """A torch seed drawn from a numpy generator (keeps one seed per estimator)."""
    return int(rng.integers(2**31 - 1))


def early_stopping_split(
    estimator, n: int, groups, rng: np.random.Generator, *, applies: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """``(fit rows, validation rows)`` of ``n`` examples: validation grids of ``groups`` carved by
    the estimator's ``validation_fraction`` when it early-stops (and ``applies``), else none."""
    rows = np.arange(n)
    if not (applies and estimator.early_stopping):
        return rows, rows[:0]
    if groups is None:
        raise ValueError(
            "early_stopping needs grid ids (groups=) to carve the validation split by grid; "
            "pass groups or set early_stopping=False"
        )
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"groups must have shape ({n},), got {groups.shape}")
    return carve_validation(rows, groups, estimator.validation_fraction, torch_seed(rng))


def validation_mean(
    rows: np.ndarray, batch_size: int, loss_sums: Callable[[np.ndarray], tuple]
) -> float:
    """``sum(loss) / sum(weight)`` of ``loss_sums(batch) -> (loss sum, weight sum)`` over
    ``rows`` in batches of ``batch_size``, without gradients (a ``validation_loss``)."""
    total, weight = 0.0, 0.0
    with torch.inference_mode():
        for start in range(0, len(rows), batch_size):
            loss, w = loss_sums(rows[start : start + batch_size])
            total += float(loss)
            weight += float(w)
    return total / weight


def train_module(
    module: torch.nn.Module,
    *,
    n_examples: int,
    batch_loss: BatchLoss,
    validation_loss: Callable[[], float] | None,
    max_epochs: int,
    batch_size: int,
    learning_rate: float,
    weight_decay: float,
    n_iter_no_change: int,
    tol: float,
    rng: np.random.Generator,
    progress: bool,
    description: str,
    batching: Batching = "slices",
    fused: bool = True,
) -> tuple[list[dict], int]:
    """Train ``module`` in place with AdamW on shuffled minibatches of examples.

    Each step minimises ``sum(w*l) / sum(w)`` of :data:`BatchLoss` over positions
    ``0..n_examples-1``; with ``validation_loss`` (a weighted mean) training stops after
    ``n_iter_no_change`` epochs without a decrease of at least ``tol`` and the best state is
    loaded back. ``description`` labels the progress bar and the divergence error; ``fused``
    picks PyTorch's fused AdamW kernel (the two round differently: an estimator keeps its own).

    Returns ``(history, best_epoch)``: per epoch ``{epoch, train_loss, validation_loss,
    seconds}``, and the 1-based epoch kept. Raises FloatingPointError when a loss is not finite.
    """
    if max_epochs < 1:
        raise ValueError(f"max_epochs must be >= 1, got {max_epochs}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if batching not in ("slices", "even"):
        raise ValueError(f"batching must be 'slices' or 'even', got {batching!r}")
    optimiser = torch.optim.AdamW(
        module.parameters(),
        lr=learning_rate,
        weight_decay=weight_decay,
        **({"fused": True} if fused else {}),
    )
    history: list[dict] = []
    best_loss, best_state, best_epoch, stale = np.inf, None, max_epochs, 0
    epochs = tqdm(range(1, max_epochs + 1), desc=description, disable=not progress, leave=False)
    for epoch in epochs:
        started = time.perf_counter()
        module.train()
        order = rng.permutation(n_examples)
        total, weight = 0.0, 0.0
        if batching == "even":
            batches = np.array_split(order, max(1, math.ceil(n_examples / batch_size)))
        else:
            batches = [
                np.sort(order[start : start + batch_size])
                for start in range(0, n_examples, batch_size)
            ]
        for positions in tqdm(batches, desc=f"epoch {epoch}", disable=not progress, leave=False):
            loss_sum, weight_sum = batch_loss(positions)
            if float(weight_sum) <= 0:
                continue
            optimiser.zero_grad(set_to_none=True)
            (loss_sum / weight_sum).backward()
            optimiser.step()
            total += float(loss_sum.detach())
            weight += float(weight_sum)
        train_loss = total / weight if weight > 0 else float("nan")
        val_loss = None
        if validation_loss is not None:
            module.eval()
            val_loss = float(validation_loss())
        if (weight > 0 and not math.isfinite(train_loss)) or (
            val_loss is not None and not math.isfinite(val_loss)
        ):
            raise FloatingPointError(
                f"{description}: training diverged at epoch {epoch} (train loss {train_loss}, "
                f"validation loss {val_loss}); lower the learning rate (now {learning_rate})"
            )
        history.append(
            {
                "epoch": epoch,
                "train_loss": train_loss,
                "validation_loss": val_loss,
                "seconds": time.perf_counter() - started,
            }
        )
        epochs.set_postfix(
            train=f"{train_loss:.4f}", val="-" if val_loss is None else f"{val_loss:.4f}"
        )
        if val_loss is None:
            continue
        if val_loss < best_loss - tol:
            best_loss, best_epoch, stale = val_loss, epoch, 0
            best_state = copy.deepcopy(module.state_dict())
        else:
            stale += 1
            if stale >= n_iter_no_change:
                break
    if best_state is not None:
        module.load_state_dict(best_state)
    else:
        best_epoch = len(history)
    module.eval()
    return history, best_epoch


_ESTIMATOR_TRAINING = (
    "max_epochs",
    "batch_size",
    "learning_rate",
    "weight_decay",
    "n_iter_no_change",
    "tol",
    "progress",
)


def train_estimator(estimator, module: torch.nn.Module, **kwargs) -> tuple[list[dict], int]:
    """:func:`train_module` with the estimator's own training parameters, labelled with its
    class name; ``kwargs``: the rest of :func:`train_module`'s arguments."""
    params = {name: getattr(estimator, name) for name in _ESTIMATOR_TRAINING}
    return train_module(module, **params, description=type(estimator).__name__, **kwargs)


def fit_lbfgs(
    module: torch.nn.Module,
    *,
    objective: Callable[[], torch.Tensor],
    l2: float,
    max_iter: int,
    tol: float = 1e-9,
) -> dict:
    """Minimise a convex full-batch objective over ``module``'s parameters with L-BFGS
    (:func:`scipy.optimize.minimize`, ``L-BFGS-B``), in float64, from all-zero parameters.

    Nothing random enters, and with ``l2 > 0`` the optimum is unique, so neither a seed nor the
    thread count moves the result beyond the tolerance. ``objective``: the data term as a
    scalar tensor with gradients; every parameter (biases too) is under ``l2 / 2 * sum(w**2)``;
    ``tol``: the solver's ``gtol`` (``ftol`` a thousandth of it). The module is float32 again
    afterwards. Returns ``{"n_iter", "converged", "loss", "message"}``.
    """
    module.double()
    params = list(module.named_parameters())
    for _, p in params:
        torch.nn.init.zeros_(p)
    sizes = [p.numel() for _, p in params]

    def assign(theta: np.ndarray) -> None:
        with torch.no_grad():
            for (_, p), chunk in zip(params, np.split(theta, np.cumsum(sizes)[:-1]), strict=True):
                p.copy_(torch.from_numpy(chunk.reshape(p.shape)))

    def value_and_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
        assign(theta)
        module.zero_grad(set_to_none=True)
        loss = objective()
        for _, p in params:
            loss = loss + 0.5 * l2 * (p * p).sum()
        loss.backward()
        grad = np.concatenate(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).numpy()
                for _, p in params
            ]
        )
        return float(loss.detach()), grad.astype(np.float64)

    result = scipy.optimize.minimize(
        value_and_grad,
        np.zeros(sum(sizes), dtype=np.float64),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": int(max_iter), "gtol": tol, "ftol": tol * 1e-3, "maxcor": 20},
    )
    assign(result.x)
    module.zero_grad(set_to_none=True)
    module.float()
    return {
        "n_iter": int(result.nit),
        "converged": bool(result.success),
        "loss": float(result.fun),
        "message": str(result.message),
    }
