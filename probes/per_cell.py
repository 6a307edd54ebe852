"""Per-cell probes (Othello-GPT style): one classification head per grid cell reading ``act``.

``family="linear"``: ``logits[n, p, c] = einsum("nf,pfc->npc", act, W) + b[p, c]`` (the linear
world-model probes of Nanda et al., 2023); ``"mlp"``: a shared ``Linear(F, H)`` + ReLU, then
per-cell heads (Li et al., 2023). Unlike the coordinate-conditioned probe it can read a
different direction at every cell, so even the linear family can localise the agent and goal;
both share :mod:`goalprobe.probes.cell_probes`' fitting, decoding and persistence.
"""

from __future__ import annotations

import math

import torch
from goalprobe.probes.cell_probes import CellProbeBase, ClassBalance, Family
from goalprobe.probes.training import store_params


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
