"""Trained subspace interventions (issue 41, item 5) on the control agent: the interchange is
the full patch at full rank and nothing at rank 0, a trained basis stays orthonormal and lowers
the counterfactual-completion loss, and the geometry helpers say "aligned" and "not aligned"
where they must."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from goalprobe.activations.capture import make_backend
from goalprobe.gridworld.generator import generate_grid
from goalprobe.probes.patching.counterfactuals import (
    CounterfactualConfig,
    base_from_grid,
    build_counterfactuals,
)
from goalprobe.probes.patching.experiment import PatchConfig, PatchingContext, prepare_pairs
from goalprobe.probes.steering import (
    DasConfig,
    anchor_values,
    interchange,
    interchange_patch,
    natural_r2,
    principal_angles,
    random_basis,
    train_subspace,
)


@pytest.fixture(scope="module")
def map_pairs():
    from goalprobe.agents.bundled import load_bundled_agent

    model, tokenizer = load_bundled_agent(directory="bundled:map")
    backend = make_backend("hooks", model, tokenizer)
    rng = np.random.default_rng(3)
    bases = [base_from_grid(generate_grid(7, 0.2, rng, grid_id=f"d{i}")) for i in range(2)]
    pairs = build_counterfactuals(bases, CounterfactualConfig(control_per_move=0))
    context = PatchingContext(backend, PatchConfig(reasoning="greedy", max_new_tokens=160))
    kept, _ = prepare_pairs(pairs, context)
    assert len(kept) >= 2
    return backend, kept


def test_interchange_spans_nothing_to_the_full_patch():
    rng = np.random.default_rng(0)
    h_base, h_cf = (torch.as_tensor(rng.standard_normal((3, 8)), dtype=torch.float32) for _ in "ab")
    full = random_basis(8, 8, seed=1)
    assert torch.allclose(full @ full.T, torch.eye(8), atol=1e-5)
    assert torch.allclose(interchange(h_base, h_cf, full), h_cf, atol=1e-5)
    one = random_basis(8, 1, seed=1)
    moved = interchange(h_base, h_cf, one) - h_base
    assert torch.linalg.matrix_rank(moved) == 1  # only along the one direction
    assert torch.equal(random_basis(8, 2, seed=4), random_basis(8, 2, seed=4))


def test_a_trained_basis_is_orthonormal_and_lowers_the_loss(map_pairs):
    backend, kept = map_pairs
    basis, losses = train_subspace(kept[:2], backend, DasConfig(block=2, rank=2, steps=4))
    assert basis.shape == (2, backend.d_model)
    assert torch.allclose(basis @ basis.T, torch.eye(2), atol=1e-4)
    assert losses[-1] < losses[0]
    assert all(p.requires_grad for p in backend.model.parameters())  # restored
    patch = interchange_patch(kept[0], 2, None)
    assert torch.allclose(patch.values[0], anchor_values(kept[0], 2)[1])


def test_principal_angles_and_natural_variation_say_aligned_and_not():
    rng = np.random.default_rng(0)
    directions = rng.standard_normal((4, 16))
    inside = np.linalg.qr(directions.T)[0].T[:2]
    assert principal_angles(inside, directions).max() < 1e-4
    orthogonal = np.linalg.qr(np.concatenate([directions.T, rng.standard_normal((16, 2))], 1))[0]
    assert principal_angles(orthogonal.T[4:6], directions).min() > 89.9
    labels = rng.integers(0, 5, (200, 2))
    signal = np.eye(5)[labels[:, 0]] @ rng.standard_normal((5, 16))
    x = signal + 0.01 * rng.standard_normal((200, 16))
    along = np.linalg.qr(signal.T)[0].T[:1]
    assert natural_r2(x, labels, along) > 0.9
    noise = rng.standard_normal((200, 16))
    assert natural_r2(noise, labels, along) < 0.1
