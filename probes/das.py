"""Trained subspace interventions (distributed alignment search, DAS) at the pre-reasoning
anchors (Geiger et al. 2024, with the controls of Makelov et al. 2024).

A rank-``k`` subspace with orthonormal basis ``W`` is *interchanged*, ``h_base <- h_base + W^T W
(h_cf - h_base)``, at the three anchors of one block, and ``W`` is trained so that the patched
base run produces the counterfactual's completion (cross-entropy of its reasoning and answer,
teacher-forced; the prompt before the anchors runs once from a KV cache, the model frozen).
:func:`interchange_patch` evaluates like the patching experiment (greedy regeneration, the share
of held-out disjoint pairs moved) beside the full patch and a random subspace
(:func:`random_basis`); :func:`principal_angles` compares with the position probes' directions
and :func:`natural_r2` checks that the subspace varies with the variable on natural inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from goalprobe.activations.capture.base import (
    Patch,
    ResidualBackend,
    block_output,
    decoder_layers_path,
    get_submodule_path,
)
from goalprobe.probes.patching.experiment import PreparedPair


@dataclass(frozen=True)
class DasConfig:
    """How to train a subspace."""

    block: int = 2
    """The decoder block whose output is interchanged at the anchors."""
    rank: int = 1
    """The subspace's dimension ``k``."""
    steps: int = 30
    """Passes over the training pairs."""
    learning_rate: float = 0.02
    """Adam's step size."""
    seed: int = 0
    """The initial basis's seed."""

    def __post_init__(self) -> None:
        if self.rank < 1 or self.steps < 1 or self.learning_rate <= 0:
            raise ValueError("rank and steps must be >= 1 and learning_rate > 0")


def anchors(pair: PreparedPair) -> np.ndarray:
    """The base's three pre-reasoning anchor positions (the prompt's last three tokens)."""
    return np.asarray(pair.base.sequence.anchors.pre_reasoning, dtype=np.int64)


def anchor_values(pair: PreparedPair, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h_base, h_cf)``, each ``(3, d_model)``: both sides' clean block output at the
    anchors (the prompts align, so the positions are the same)."""
    where = anchors(pair)
    return (
        pair.base.clean.values([block], where)[0].float(),
        pair.cf.clean.values([block], where)[0].float(),
    )


def interchange(h_base: torch.Tensor, h_cf: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """``h_base + (h_cf - h_base) W^T W`` for a basis ``W`` (``k x d``, orthonormal rows)."""
    return h_base + (h_cf - h_base) @ basis.T @ basis


def random_basis(d_model: int, rank: int, seed: int) -> torch.Tensor:
    """``(rank, d_model)`` orthonormal rows spanning a uniformly random subspace (seeded)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d_model, rank)))
    return torch.as_tensor(q.T, dtype=torch.float32)


def interchange_patch(pair: PreparedPair, block: int, basis: torch.Tensor | None) -> Patch:
    """The anchors of ``pair``'s base run with the subspace interchanged (``basis`` None: the
    full patch, every direction)."""
    h_base, h_cf = anchor_values(pair, block)
    values = h_cf if basis is None else interchange(h_base, h_cf, basis)
    return Patch((block,), torch.as_tensor(anchors(pair)), values[None])


def _training_items(pairs: Sequence[PreparedPair], backend: ResidualBackend, block: int):
    """Per pair: ``(prefix ids, suffix ids, first loss row, h_base, h_cf)``."""
    items = []
    for pair in pairs:
        prompt = np.asarray(pair.base.prompt_ids, dtype=np.int64)
        ids = np.concatenate([prompt, np.asarray(pair.cf.completion_ids, dtype=np.int64)])
        start = int(anchors(pair)[0])
        first = len(prompt) - 1 - start  # the suffix row predicting the first completion token
        h_base, h_cf = anchor_values(pair, block)
        items.append((ids[:start], ids[start:], first, h_base, h_cf))
    return items


def train_subspace(
    pairs: Sequence[PreparedPair],
    backend: ResidualBackend,
    config: DasConfig,
    *,
    progress=None,
) -> tuple[torch.Tensor, list[float]]:
    """Train ``W`` on ``pairs`` with the hooks backend's model frozen; returns ``(basis (rank,
    d_model), mean loss per step)``."""
    from goalprobe.activations.capture.gradients import gradient_mode

    if not pairs:
        raise ValueError("no training pairs")
    torch.manual_seed(config.seed)
    layer = torch.nn.Linear(backend.d_model, config.rank, bias=False)
    torch.nn.utils.parametrizations.orthogonal(layer)
    optimizer = torch.optim.Adam(layer.parameters(), lr=config.learning_rate)
    items = _training_items(pairs, backend, config.block)
    blocks = get_submodule_path(backend.model, decoder_layers_path(backend.model))
    block = blocks[config.block]  # type: ignore[index]
    current: dict[str, torch.Tensor] = {}

    def hook(module, args, output):
        hidden = block_output(output)
        if hidden.shape[1] < 3 or "basis" not in current:
            return None
        own = hidden[0, :3]
        mixed = interchange(own, current["cf"].to(own.dtype), current["basis"].to(own.dtype))
        new = torch.cat([mixed[None], hidden[:, 3:]], dim=1)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    handle = block.register_forward_hook(hook)
    losses: list[float] = []
    try:
        with gradient_mode(backend.model):
            for step in range(config.steps):
                optimizer.zero_grad()
                total = 0.0
                for prefix, suffix, first, _, h_cf in items:
                    current["basis"] = layer.weight
                    current["cf"] = h_cf
                    cache = backend._prefix_kv(prefix, 1)
                    logits = backend.model(
                        torch.as_tensor(suffix, device=backend.device)[None],
                        **{backend.cache_keyword(): cache, "use_cache": True},
                    ).logits[0]
                    targets = torch.as_tensor(suffix[first + 1 :], device=logits.device)
                    loss = torch.nn.functional.cross_entropy(logits[first:-1].float(), targets)
                    (loss / len(items)).backward()
                    total += float(loss.detach())
                    current.clear()
                optimizer.step()
                losses.append(total / len(items))
                if progress is not None:
                    progress(step, config.steps, losses[-1])
    finally:
        handle.remove()
        current.clear()
    return layer.weight.detach().clone(), losses


def principal_angles(basis: torch.Tensor | np.ndarray, directions: np.ndarray) -> np.ndarray:
    """Principal angles (degrees, ascending) between the row space of ``basis`` and the span
    of ``directions`` (rows: e.g. the position probes' weight vectors)."""
    import scipy.linalg

    a = np.asarray(basis, dtype=np.float64).T
    b = np.asarray(directions, dtype=np.float64).T
    return np.sort(np.degrees(scipy.linalg.subspace_angles(a, b)))


def natural_r2(
    activations: np.ndarray,
    labels: np.ndarray,
    basis: torch.Tensor | np.ndarray,
    *,
    folds: int = 5,
    seed: int = 0,
) -> float:
    """Cross-validated R^2 of the subspace coordinates of natural ``activations (N, d)``
    predicted from one-hot categorical ``labels (N, m)`` (e.g. the agent's and goal's rows and
    columns): near 0 for a subspace that does not vary with the variable."""
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import KFold, cross_val_predict
    from sklearn.preprocessing import OneHotEncoder

    z = np.asarray(activations, dtype=np.float64) @ np.asarray(basis, dtype=np.float64).T
    x = OneHotEncoder(handle_unknown="ignore").fit_transform(np.asarray(labels))
    predicted = cross_val_predict(
        Ridge(alpha=1.0), x, z, cv=KFold(folds, shuffle=True, random_state=seed)
    ).reshape(z.shape)
    residual = ((z - predicted) ** 2).sum()
    total = ((z - z.mean(axis=0)) ** 2).sum()
    return float(1.0 - residual / total) if total > 0 else float("nan")
