"""The map agent (``bundled:map``): the positive control of the anchor probes and patches.

Its full cognitive map (walls, agent, goal) is at the pre-reasoning anchors by construction
(:mod:`activations.agent.map_supervision`); the default agent's anchors hold much less. Both are
measured the same way on held-out grids (seeds never used in training, split by grid), and the
default agent's figures are printed beside the map agent's (``pytest -s``).
"""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from activations.agent.bundled import (
    BUNDLED_AGENTS,
    DEFAULT_BUNDLED,
    bundled_agent_dir,
    bundled_weights_digest,
    load_bundled_agent,
)
from activations.agent.harmony import HarmonyTokenIds, find_anchors, render_prompt
from activations.agent.prompts import build_messages
from activations.gridworld.core import CellType
from activations.gridworld.generator import generate_grid
from activations.gridworld.text import padded_cell_types, render

MAP_AGENT = "bundled:map"
SIZES = (7, 9, 11)
DENSITIES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
PROBE_SEED = 9_300_001  # never a training seed: training grids come from their own streams


@pytest.fixture(scope="module")
def probing_set():
    """Held-out prompt-only states: grids of sizes 7-11 at every density, the agent at its
    start cell or at a random open cell, labels on the 15 x 15 canvas."""
    from dataclasses import replace

    from activations.gridworld.core import State

    rng = np.random.default_rng(PROBE_SEED)
    grids, states = [], []
    for index in range(300):
        grid = generate_grid(SIZES[index % 3], DENSITIES[(index // 3) % 6], rng)
        open_cells = np.argwhere(~grid.walls)
        cell = tuple(int(v) for v in open_cells[rng.integers(len(open_cells))])
        if cell == grid.goal:
            cell = grid.start
        grids.append(grid)
        states.append(replace(State(grid.start), agent=cell))
    labels = np.stack([padded_cell_types(g, s) for g, s in zip(grids, states, strict=True)])
    return grids, states, labels.astype(np.uint8)


def anchor_activations(name: str, grids, states, layer: int) -> np.ndarray:
    """``(N, 3, d_model)`` residual stream after block ``layer`` at the pre-reasoning anchors."""
    from activations.capture import make_backend
    from activations.capture.base import TokenBatch

    model, tokenizer = load_bundled_agent("cpu", name)
    special = HarmonyTokenIds.from_tokenizer(tokenizer)
    sequences, positions = [], []
    for grid, state in zip(grids, states, strict=True):
        messages = build_messages(render(grid, state), variant=grid.variant, has_key=False)
        ids = tokenizer(render_prompt(messages, "low"), add_special_tokens=False)["input_ids"]
        sequences.append(ids)
        positions.append(list(find_anchors(ids, special).pre_reasoning))
    backend = make_backend("hooks", model, tokenizer)
    out = []
    for start in range(0, len(sequences), 50):
        batch = TokenBatch.from_sequences(
            sequences[start : start + 50], positions[start : start + 50], tokenizer.pad_token_id
        )
        out.append(backend.capture(batch, [layer])[layer].float().numpy())
    return np.concatenate(out)


def probe_figures(acts: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Per-cell MLP probe vs the per-cell majority on the last 60 grids (trained on the rest):
    cell accuracy on grid cells, agent and goal top-1 localisation."""
    from probes.cell_probes import MajorityCellBaseline
    from probes.per_cell import PerCellProbe

    train, test = np.arange(240), np.arange(240, len(labels))
    probe = PerCellProbe(
        family="mlp", hidden_size=256, class_balance="none", early_stopping=False,
        max_epochs=60, random_state=0,
    ).fit(acts[train], labels[train])  # fmt: skip
    majority = MajorityCellBaseline(strategy="per_cell").fit(acts[train], labels[train])
    inside = labels[test] != CellType.PADDING
    proba = probe.predict_proba(acts[test])
    classes = list(probe.classes_)

    def top1(cell_type: CellType) -> float:
        scores = np.where(inside, proba[..., classes.index(cell_type)], -1.0)
        flat = scores.reshape(len(test), -1).argmax(1)
        truth = (labels[test] == cell_type).reshape(len(test), -1).argmax(1)
        return float((flat == truth).mean())

    return {
        "probe": float((probe.predict(acts[test]) == labels[test])[inside].mean()),
        "majority": float((majority.predict(acts[test]) == labels[test])[inside].mean()),
        "agent_top1": top1(CellType.AGENT),
        "goal_top1": top1(CellType.GOAL),
    }


def test_map_agent_is_registered_small_and_loads_offline():
    directory = bundled_agent_dir(MAP_AGENT)
    assert MAP_AGENT in BUNDLED_AGENTS and DEFAULT_BUNDLED == "bundled"
    assert bundled_weights_digest(MAP_AGENT) != bundled_weights_digest(DEFAULT_BUNDLED)
    assert sum(p.stat().st_size for p in directory.glob("*.safetensors")) <= 20 * 2**20
    for name in ("MODEL_CARD.md", "evaluation.json", "training_log.json"):
        assert (directory / name).is_file(), name
    model, _ = load_bundled_agent("cpu", MAP_AGENT)
    assert type(model).__name__ == "GptOssForCausalLM"


def test_anchor_probe_finds_the_map_agent_s_map(probing_set):
    """The positive control: at the pre-reasoning anchors (block 2) the per-cell MLP probe beats
    the per-cell majority by a clear margin and localises the agent and the goal on the map
    agent; the default agent is measured the same way and reported beside it."""
    grids, states, labels = probing_set
    figures = {
        name: probe_figures(anchor_activations(name, grids, states, 2), labels)
        for name in (MAP_AGENT, DEFAULT_BUNDLED)
    }
    print({name: {k: round(v, 3) for k, v in f.items()} for name, f in figures.items()})
    mapped, default = figures[MAP_AGENT], figures[DEFAULT_BUNDLED]
    assert mapped["probe"] >= mapped["majority"] + 0.08, mapped
    assert mapped["agent_top1"] >= 0.6 and mapped["goal_top1"] >= 0.6, mapped
    assert mapped["probe"] - mapped["majority"] > default["probe"] - default["majority"], figures
    assert mapped["goal_top1"] > default["goal_top1"] + 0.3, figures


@pytest.mark.slow
def test_anchor_patches_flip_the_map_agent_s_actions(goalprobe_cli, tmp_path):
    """Patching the pre-reasoning anchors at every block with an agent- or goal-moved
    counterfactual and regenerating the reasoning moves the map agent's action into the
    counterfactual's optimal set on disjoint pairs and leaves control pairs alone; the default
    agent (reported beside it) does not move."""
    grids = tmp_path / "grids.jsonl"
    result = goalprobe_cli("grids", "--out", grids, "--sizes", "7,9", "--densities", "0,0.2,0.4",
                           "--per-cell", 2, "--seed", 9_400_001, "--min-distance", 3)  # fmt: skip
    assert result.exit_code == 0, result.output
    rates = {}
    for name in (MAP_AGENT, DEFAULT_BUNDLED):
        out = tmp_path / name.replace(":", "_")
        result = goalprobe_cli("patch", "--grids", grids, "--model", name, "--out", out,
                               "--sites", "pre_reasoning", "--layers", "all",
                               "--directions", "cf_to_base", "--regenerate",
                               "--max-new-tokens", 80, "--backend", "hooks",
                               "--n-resamples", 100)  # fmt: skip
        assert result.exit_code == 0, result.output
        with (out / "patch_summary.csv").open(encoding="utf-8") as handle:
            rows = [r for r in csv.DictReader(handle) if r["mode"] == "regenerated"]
        rates[name] = {
            r["kind"]: float(
                r["into_source_optimal_rate"]
                if r["kind"] == "disjoint"
                else r["action_changed_rate"]
            )
            for r in rows
        }
    print(rates)
    assert rates[MAP_AGENT]["disjoint"] >= 0.4, rates
    assert rates[MAP_AGENT]["control"] <= 0.25, rates
    assert rates[MAP_AGENT]["disjoint"] > rates[DEFAULT_BUNDLED]["disjoint"] + 0.3, rates
    assert torch.get_num_threads() >= 1
