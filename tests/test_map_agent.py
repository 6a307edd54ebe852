"""The positive control (issue 15): the map agent's anchors hold the map, the shipped agent's
hold the agent's position only, and the same measurements tell them apart.

Both agents are measured the same way on held-out grids (seeds never used in training; the
training stream draws its own grids): a cell-type probe and agent/goal position probes at the
pre-reasoning anchors (prompt-only activations, split by grid), and activation patching of the
anchors at every block with agent- or goal-moved counterfactuals under regenerated greedy
reasoning (the study's protocol: optimal on both sides before patching, disjoint optimal sets
for the pairs that should flip, controls that should not). The figures of the full-size
measurement are in the agents' model cards (``scripts/measure_anchor_map.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from activations.agent.bundled import load_bundled_agent
from activations.agent.harmony import HarmonyTokenIds, find_anchors, render_prompt
from activations.agent.prompt_states import sample_states
from activations.agent.prompts import build_messages
from activations.capture import make_backend
from activations.capture.base import TokenBatch
from activations.gridworld.generator import generate_grid
from activations.gridworld.text import padded_cell_types, render
from probes.cell_probes import CoordinateCellProbe, MajorityCellBaseline
from probes.patching.counterfactuals import (
    CounterfactualConfig,
    base_from_grid,
    build_counterfactuals,
)
from probes.patching.experiment import PatchConfig, PatchingContext, prepare_pairs, run_patching
from probes.position import PositionPrior, PositionProbe

pytestmark = pytest.mark.slow

SIZE = 9
"""Grid side of the probing set (one canvas, so the cell probe reads one label grid)."""

PROBE_LAYER = 1
"""Block whose output at the anchors is probed (the map agent's map read-out reads 1 and 2)."""


@pytest.fixture(scope="module")
def agents():
    return {name: load_bundled_agent("cpu", name) for name in ("bundled", "bundled:map")}


def anchor_activations(model, tokenizer, grids, states) -> np.ndarray:
    """``(N, 3 * d_model)`` block ``PROBE_LAYER`` output at the pre-reasoning anchors."""
    special = HarmonyTokenIds.from_tokenizer(tokenizer)
    sequences, positions = [], []
    for grid, state in zip(grids, states, strict=True):
        messages = build_messages(render(grid, state), variant=grid.variant, has_key=False)
        ids = tokenizer(render_prompt(messages, "low"), add_special_tokens=False)["input_ids"]
        sequences.append(ids)
        positions.append(list(find_anchors(ids, special).pre_reasoning))
    batch = TokenBatch.from_sequences(sequences, positions, pad_id=tokenizer.pad_token_id)
    acts = make_backend("hooks", model, tokenizer).capture(batch, [PROBE_LAYER])[PROBE_LAYER]
    return acts.float().numpy().reshape(len(grids), -1)


@pytest.fixture(scope="module")
def decodability(agents):
    """Per agent: cell accuracy of the probe and of the per-cell majority, and agent and goal
    top-1 of the position probes and of the position prior, on 80 held-out test grids."""
    rng = np.random.default_rng(15_000_001)
    n_grids, n_train = 400, 320
    grids = [
        generate_grid(SIZE, float(rng.choice([0.0, 0.2, 0.4, 0.6, 0.8])), rng)
        for _ in range(n_grids)
    ]
    # one state per grid: a random reachable agent cell (the start when there is no other)
    states = [sample_states(grid, 2, seed=index)[-1] for index, grid in enumerate(grids)]
    labels = np.stack(
        [padded_cell_types(g, s)[:SIZE, :SIZE] for g, s in zip(grids, states, strict=True)]
    )
    agent = np.asarray([s.agent for s in states])
    goal = np.asarray([g.goal for g in grids])
    train, test = np.arange(n_train), np.arange(n_train, n_grids)  # one state per grid
    sizes = np.full(n_grids, SIZE)
    out = {}
    for name, (model, tokenizer) in agents.items():
        acts = anchor_activations(model, tokenizer, grids, states)
        probe = CoordinateCellProbe(
            family="mlp", hidden_size=256, grid_size=SIZE, coordinates="onehot",
            class_balance="none", early_stopping=False, max_epochs=150, random_state=0,
        ).fit(acts[train], labels[train])  # fmt: skip
        majority = MajorityCellBaseline(strategy="per_cell", grid_size=SIZE)
        majority.fit(acts[train], labels[train])
        figures = {
            "cells": float((probe.predict(acts[test]) == labels[test]).mean()),
            "cells_majority": float((majority.predict(acts[test]) == labels[test]).mean()),
        }
        for obj, where in (("agent", agent), ("goal", goal)):
            predicted = PositionProbe().fit(acts[train], where[train]).predict(acts[test])
            prior = PositionPrior().fit(sizes[train], where[train]).predict(sizes[test])
            figures[obj] = float((predicted == where[test]).all(axis=1).mean())
            figures[f"{obj}_prior"] = float((prior == where[test]).all(axis=1).mean())
        out[name] = figures
    print("\nanchor decodability (block 1, 80 test grids):", out)
    return out


@pytest.fixture(scope="module")
def causality(agents):
    """Per agent: regenerated actions under an all-block patch of the pre-reasoning anchors
    (cf -> base): the share of disjoint pairs whose action moves into the counterfactual's
    optimal set, and of control pairs whose action changes."""
    rng = np.random.default_rng(15_000_002)
    grids = [
        generate_grid(
            int(rng.choice([7, 9])), float(rng.choice([0.0, 0.2, 0.4])), rng,
            min_distance=3, grid_id=f"pc{i}",
        )
        for i in range(16)
    ]  # fmt: skip
    pairs = build_counterfactuals(
        [base_from_grid(g) for g in grids],
        CounterfactualConfig(disjoint_per_move=1, control_per_move=1, random_state=3),
    )
    config = PatchConfig(
        sites=("pre_reasoning",), layers=("all",), directions=("cf_to_base",),
        reasoning="greedy", require_optimal=True, regenerate=True, max_new_tokens=80,
    )  # fmt: skip
    out = {}
    for name, (model, tokenizer) in agents.items():
        context = PatchingContext(make_backend("hooks", model, tokenizer), config)
        items, report = prepare_pairs(pairs, context)
        records, _ = run_patching(items, context)
        regenerated = [r for r in records if r.mode == "regenerated"]
        disjoint = [r for r in regenerated if r.kind == "disjoint"]
        control = [r for r in regenerated if r.kind == "control"]
        out[name] = {
            "n_disjoint": len(disjoint),
            "flipped": float(np.mean([r.into_source_optimal for r in disjoint])),
            "n_control": len(control),
            "control_changed": float(np.mean([r.action_changed for r in control])),
            "kept": report.n_kept,
        }
    print("\nanchor patching (all blocks, regenerated, greedy):", out)
    return out


def test_map_agent_anchors_hold_the_map(decodability):
    """The map agent's anchors hold walls, the agent and the goal; the shipped agent's hold the
    agent's position but neither the goal nor the walls beyond the per-cell prior."""
    m, shipped = decodability["bundled:map"], decodability["bundled"]
    assert m["cells"] >= m["cells_majority"] + 0.10, m
    assert m["agent"] >= 0.6 and m["goal"] >= 0.6, m
    assert m["agent"] > m["agent_prior"] + 0.4 and m["goal"] > m["goal_prior"] + 0.4, m
    # the contrast the positive control exists for
    assert m["goal"] >= shipped["goal"] + 0.3, (m, shipped)
    assert m["cells"] >= shipped["cells"] + 0.05, (m, shipped)


def test_patching_map_agent_anchors_moves_its_action(causality):
    """Patching the map agent's anchors with a counterfactual's moves its regenerated action
    into the counterfactual's optimal set and leaves control pairs alone; the same patch on
    the shipped agent, which reads A and G from the grid while it reasons, does not."""
    m, shipped = causality["bundled:map"], causality["bundled"]
    assert m["n_disjoint"] >= 8 and m["n_control"] >= 8, m
    assert m["flipped"] >= 0.5, m
    assert m["control_changed"] <= 0.25, m
    assert shipped["flipped"] <= 0.15, shipped
