"""A small but real run directory for the viewer tests (no model, no network).

* grids: a seeded grid set from the grid world (``generate_grid_set`` + ``write_grid_set``);
* rollouts: ``run_rollouts`` with :class:`NoisyOptimalBackend`, a scripted backend that reads the
  grid from the prompt, plans with the exact optimal policy and acts optimally with probability
  ``1 - epsilon`` (else uniformly), writing its plan as the reasoning;
* activations: a real store (``StoreWriter``) with random activations and the labels
  ``episode_labels`` computes from the trajectories;
* decoded maps: ``write_decoded_maps`` with probabilities from a perturbed one-hot of the true
  label maps (agent and goal mass blurred onto neighbours, as the study's probes do), one file
  per (family, stage, layer), some rows left out;
* predicted plans: ``write_predicted_plans`` with the plan labels, some tokens replaced;
* patching: ``write_results`` with records for the first steps of the first episode;
* the decision stage's per-step lens: ``write_decision_steps`` for the first episode's steps but
  its last, with a planted decision time.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from goalprobe.activations.store import RowBatch, StoreLayout, StoreWriter
from goalprobe.activations.store.schema import episode_labels
from goalprobe.agents.backend import Completion
from goalprobe.agents.reasoning import final_text, reasoning_text
from goalprobe.agents.rollout import RolloutConfig, run_rollouts
from goalprobe.agents.trajectories import read_trajectories
from goalprobe.gridworld.core import Action, CellType
from goalprobe.gridworld.generator import GridSetConfig, generate_grid_set
from goalprobe.gridworld.io import write_grid_set
from goalprobe.gridworld.optimal import solve
from goalprobe.gridworld.text import parse

STAGES = ("pre_reasoning", "post_reasoning")
LAYERS = (3, 5)
D_MODEL = 8


class NoisyOptimalBackend:
    """A scripted agent: optimal with probability ``1 - epsilon``, else a uniform action."""

    def __init__(self, epsilon: float = 0.3) -> None:
        self.epsilon = epsilon

    def describe(self) -> dict:
        return {"class": "NoisyOptimalBackend", "epsilon": self.epsilon}

    def generate(self, batch, sampling, seeds=None):
        out = []
        for i, messages in enumerate(batch):
            seed = seeds[i] if seeds is not None else sampling.seed
            rng = np.random.default_rng(seed)
            lines = messages[-1].content.splitlines()
            top = next(j for j, line in enumerate(lines) if line.startswith("  0 "))
            n = len(lines[top].split())
            text = "\n".join(lines[top : top + n + 1])
            if "G" not in text.split():
                # standing on a false-belief grid's stale goal: the prompt draws no goal
                action = Action(int(rng.integers(4)))
                out.append(_completion("No goal is drawn.", final_text(action)))
                continue
            grid, state = parse(text)
            policy = solve(grid)
            _, plan = policy.optimal_trajectory(rng, start=state)
            optimal = sorted(policy.optimal_actions(state))
            if rng.random() < self.epsilon:
                action = Action(int(rng.integers(4)))
            else:
                action = optimal[int(rng.integers(len(optimal)))]
            reasoning = reasoning_text(grid, state, plan[:5] or [action], key_variant=False)
            final = final_text(action)
            out.append(_completion(reasoning, final))
        return out


def _completion(reasoning: str, final: str) -> Completion:
    return Completion(
        prompt_token_ids=[1, 2, 3],
        generated_token_ids=[4, 5, 6],
        text=reasoning + final,
        reasoning=reasoning,
        final=final,
        token_ids_source="model",
        finish_reason="stop",
    )


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def synthetic_maps(labels: np.ndarray, classes: tuple[int, ...], noise: float, rng) -> np.ndarray:
    """``(N, 15, 15, C)`` probabilities: a perturbed one-hot of ``labels`` with blurred A and G."""
    onehot = (labels[..., None] == np.asarray(classes)[None, None, None, :]).astype(np.float64)
    logits = 4.0 * onehot
    for cell_type in (CellType.AGENT, CellType.GOAL):
        k = classes.index(int(cell_type))
        mask = onehot[..., k]
        blur = np.zeros_like(mask)
        blur[:, 1:, :] += mask[:, :-1, :]
        blur[:, :-1, :] += mask[:, 1:, :]
        blur[:, :, 1:] += mask[:, :, :-1]
        blur[:, :, :-1] += mask[:, :, 1:]
        logits[..., k] += 2.5 * blur
    logits += rng.normal(0.0, noise, size=logits.shape)
    return _softmax(logits).astype(np.float32)


def position_readouts(labels: np.ndarray, rng) -> dict:
    """``agent`` / ``goal`` ``(N, 15, 15)``: position-probe-like cell distributions peaked on
    the true agent and goal cells of ``labels`` (softmax of a one-hot plus noise), with the
    :class:`~goalprobe.probes.decoded_maps.Readout` that names them."""
    from goalprobe.probes.decoded_maps import POSITION_READOUT, Readout

    out = {}
    for name, cell_type in (("agent", CellType.AGENT), ("goal", CellType.GOAL)):
        logits = 5.0 * (labels == int(cell_type)) + rng.normal(0.0, 0.5, size=labels.shape)
        flat = logits.reshape(len(labels), -1)
        out[name] = _softmax(flat).reshape(labels.shape).astype(np.float32)
    out["readout"] = Readout(agent=POSITION_READOUT, goal=POSITION_READOUT)
    return out


def write_lens_steps(root: Path, episodes, rng) -> None:
    """The decision stage's per-step lens file for every step of the first episode but its last
    (which the viewer must say was not read): the reasoning split into chunks of 40
    characters, a lens that names another action on the first half of the chunks and the step's
    action on the second half (a planted decision time), written by the stage's own writer."""
    from goalprobe.probes.decision_steps import step_record, write_decision_steps

    records = []
    steps = [s for s in episodes[0].steps if s.action is not None][:-1]
    layers = 2
    for s in steps:
        text = s.reasoning or ""
        texts = [text[i : i + 40] for i in range(0, len(text), 40)]
        ends = [min(10 * (i + 1), 10 * len(texts)) - 1 for i in range(len(texts))]
        action = Action[s.action]
        probs = np.full((layers, len(texts) + 1, 4), 0.1, dtype=np.float64)
        for i in range(len(texts) + 1):
            named = action if 2 * i >= len(texts) else Action((int(action) + 1) % 4)
            probs[:, i, int(named)] = 0.7
        probs += rng.uniform(0, 0.01, size=probs.shape)
        fractions = [(e + 1) / (10 * len(texts)) for e in ends]
        key = (s.grid_id, s.episode, s.step)
        records.append(step_record(key, action, 10 * len(texts), ends, fractions, texts, probs))
    write_decision_steps(
        root / "decision" / "steps.jsonl", records, agent="scripted", chunk=10, layers=layers
    )


def build_run(
    root: Path,
    *,
    sizes=(7, 9),
    densities=(0.2, 0.6),
    per_cell: int = 1,
    episodes_per_grid: int = 2,
    seed: int = 0,
    min_distance: int = 7,
) -> Path:
    """Write a complete run directory under ``root`` and return it."""
    from goalprobe.probes.decoded_maps import write_decoded_maps
    from goalprobe.probes.patching.results import summarize, write_results
    from goalprobe.probes.plan_metrics import write_predicted_plans

    rng = np.random.default_rng(seed)
    grids = generate_grid_set(
        GridSetConfig(
            sizes=tuple(sizes),
            densities=tuple(densities),
            n_per_cell=per_cell,
            seed=seed,
            min_distance=min_distance,
        )
    )
    write_grid_set(root / "grids" / "grids.jsonl", grids)
    traj = root / "rollouts" / "trajectories.jsonl"
    report = run_rollouts(
        grids,
        NoisyOptimalBackend(0.3),
        RolloutConfig(episodes_per_grid=episodes_per_grid, seed=seed),
        traj,
        progress=False,
    )
    episodes = list(read_trajectories(traj))
    labels: dict[str, list] = {}
    first = 0
    for ep in episodes:
        for name, values in episode_labels(ep, first).items():
            labels.setdefault(name, []).append(values)
        first += len(ep.steps)
    lab = {k: np.concatenate(v) for k, v in labels.items()}
    n = len(lab["step"])
    lab["seq_len"] = np.full(n, 64, dtype=np.int32)
    layout = StoreLayout(stages=STAGES, layers=LAYERS, d_model=D_MODEL)
    with StoreWriter(
        root / "activations" / "activations.h5",
        layout,
        {"model_id": "none", "trajectory_file": traj.name, "trajectory_steps": n},
    ) as writer:
        writer.append(
            RowBatch(
                acts={
                    s: {
                        layer: rng.normal(size=(n, 3, D_MODEL)).astype(np.float32)
                        for layer in LAYERS
                    }
                    for s in STAGES
                },
                positions={s: np.zeros((n, 3), np.int32) for s in STAGES},
                present={s: np.ones(n, bool) for s in STAGES},
                labels=lab,
            )
        )

    classes = (0, 1, 2, 3, 6)
    extra = np.random.default_rng(seed + 1)  # its own stream: the other files stay as they were
    cells = lab["cell_types"].astype(np.int64)
    keep = np.ones(n, bool)
    keep[n - 2 :] = False  # the last steps have no decoded map: the viewer must say so
    rows = np.flatnonzero(keep)
    for family, base_noise in (("mlp", 0.6), ("linear", 1.4)):
        for stage in STAGES:
            for layer in LAYERS:
                noise = (
                    base_noise
                    * (1.6 if stage == "post_reasoning" else 1.0)
                    * (1.2 if layer == LAYERS[0] else 1.0)
                )
                probs = synthetic_maps(cells[rows], classes, noise, rng)
                argmax = np.asarray(classes)[probs.argmax(-1)]
                accuracy = float((argmax == cells[rows]).mean())
                card = {
                    "schema": "goalprobe.probe_card",
                    "schema_version": 1,
                    "class": "CoordinateCellProbe",
                    "hyperparameters": {"family": family},
                    "fitted": {"classes_": list(classes)},
                    "metrics": {
                        "models": {
                            "probe": {
                                "accuracy": {
                                    "value": accuracy,
                                    "ci_low": accuracy - 0.02,
                                    "ci_high": accuracy + 0.02,
                                }
                            },
                            # the controls a probe sweep scores beside the probe
                            "majority": {"accuracy": {"value": 0.55}},
                            "prior_size": {"accuracy": {"value": 0.58}},
                            "prior_size_density": {"accuracy": {"value": 0.6}},
                            "shuffled": {"accuracy": {"value": 0.5}},
                        }
                    },
                    "activations": {
                        "store_path": "",
                        "store_checksum": "",
                        "stage": stage,
                        "layer": layer,
                    },
                }
                path = root / "probes" / "decoded" / f"{family}_{stage.split('_')[0]}_L{layer}.h5"
                # the mlp family's files carry the position probes' read-out (decoded-map
                # schema 2), the linear family's do not (the cell probe's channels)
                readouts = position_readouts(cells[rows], extra) if family == "mlp" else {}
                write_decoded_maps(path, probs, rows, card, **readouts)

    target = lab["plan"].astype(np.int8)
    grid_of_row = lab["grid_id"].astype(str)
    unique_grids = sorted(set(grid_of_row.tolist()))
    split_of_grid = {g: i % 3 for i, g in enumerate(unique_grids)}
    split = np.asarray([split_of_grid[g] for g in grid_of_row], dtype=np.int8)
    plans_path = root / "plans" / "predicted" / "plan_decoder.h5"
    for stage in STAGES:
        for n_layers in (1, 2):
            predicted = target.copy()
            flip = rng.random(predicted.shape) < (0.15 if n_layers == 2 else 0.3)
            predicted[flip & (predicted < 4)] = rng.integers(
                0, 4, size=int((flip & (predicted < 4)).sum())
            )
            run = f"{stage}/layer{LAYERS[-1]}/decoder{n_layers}"
            card = {
                "schema": "goalprobe.plan_decoder",
                "hyperparameters": {"n_layers": n_layers},
                "provenance": {"stage": stage, "layer": LAYERS[-1], "kind": "decoder"},
            }
            write_predicted_plans(plans_path, run, predicted, np.arange(n), card=card, split=split)

    ep0 = episodes[0]
    records = []
    for step in ep0.steps[:2]:
        for direction in ("base_to_cf", "cf_to_base"):
            for site in ("grid", "pre_reasoning", "answer"):
                for layers in ("3", "5", "all"):
                    recovered = (
                        float(rng.uniform(-0.2, 1.0))
                        if layers == "all"
                        else float(rng.uniform(-0.1, 0.3))
                    )
                    records.append(
                        {
                            "pair_id": f"{step.grid_id}/{step.step}/agent",
                            "base_id": f"{step.run_id}/{step.grid_id}/{step.episode}/{step.step}",
                            "grid_id": step.grid_id,
                            "kind": "disjoint",
                            "moved": "agent",
                            "direction": direction,
                            "site": site,
                            "layers": layers,
                            "n_positions": 3,
                            "mode": "teacher_forced",
                            "source_values": "live",
                            "target_action": "UP",
                            "source_action": "DOWN",
                            "patched_action": "DOWN" if recovered > 0.5 else "UP",
                            "target_optimal": ["UP"],
                            "source_optimal": ["DOWN"],
                            "reference_optimal": ["DOWN"],
                            "invalid": False,
                            "action_changed": recovered > 0.5,
                            "into_source_optimal": recovered > 0.5,
                            "into_reference_optimal": recovered > 0.5,
                            "in_target_optimal": recovered <= 0.5,
                            "ld_target": -1.0,
                            "ld_source": 1.0,
                            "ld_patched": -1.0 + 2 * recovered,
                            "recovered": recovered,
                            "patched_probs": [0.25, 0.25, 0.25, 0.25],
                        }
                    )
    write_results(
        root / "patching", records, summarize(records, n_resamples=50), {"run_id": report.run_id}
    )
    (root / "patching" / "results.json").write_text(
        (root / "patching" / "patch_results.json").read_text(encoding="utf-8"), encoding="utf-8"
    )
    (root / "scoring").mkdir(exist_ok=True)
    (root / "scoring" / "belief.json").write_text(
        json.dumps({"acc_gt": {"value": 0.8, "ci_low": 0.7, "ci_high": 0.9, "n": n}}),
        encoding="utf-8",
    )
    write_false_belief(root, seed=seed)
    write_lens_steps(root, episodes, extra)
    return root


def write_false_belief(root: Path, *, seed: int = 0) -> None:
    """The false_belief stage's grids, episodes (the scripted agent, which plans on the grid its
    prompt draws), the probe-reading part of its results and every step's decoded map, with a
    stand-in probe that decodes exactly what the prompt drew (the shown grid); the last step of
    each episode and the steps on a stale goal have no decoded map (the viewer must say so)."""
    from goalprobe.gridworld.false_belief import (
        FALSE_BELIEF,
        FalseBeliefSetConfig,
        generate_false_belief_set,
        pair_facts,
    )
    from goalprobe.gridworld.text import cell_types
    from goalprobe.probes.scoring.false_belief import decoded_cells, decoded_table

    grids = generate_false_belief_set(FalseBeliefSetConfig(pairs_per_kind=1, seed=seed))
    write_grid_set(root / "false_belief" / "grids.jsonl", grids)
    maps = {g.grid_id: cell_types(g.prompt_grid) for g in grids}
    cells = [
        row
        for g in grids
        if pair_facts(g)["role"] == FALSE_BELIEF
        for row in decoded_cells(g, maps[g.grid_id])
    ]
    results = {
        "schema": "goalprobe.false_belief/1",
        "decoding": {
            "available": True,
            "table": decoded_table(cells),
            "cells": cells,
            "maps": {k: v.tolist() for k, v in maps.items()},
        },
    }
    (root / "false_belief" / "results.json").write_text(json.dumps(results), encoding="utf-8")

    from goalprobe.gridworld.text import padded_cell_types
    from goalprobe.probes.decoded_maps import write_step_maps

    traj = root / "false_belief" / "trajectories.jsonl"
    config = RolloutConfig(episodes_per_grid=2, horizon_steps=4, seed=seed)
    run_rollouts(grids, NoisyOptimalBackend(0.2), config, traj, progress=False)
    by_id = {g.grid_id: g for g in grids}
    keys, probs = [], []
    for episode in read_trajectories(traj):
        for s in episode.steps[:-1]:
            shown = by_id[s.grid_id].prompt_grid
            if s.agent_row_col == shown.goal:
                continue  # as in the stage: a prompt on the shown goal draws no goal
            drawn = padded_cell_types(shown, s.state)
            keys.append((s.grid_id, s.episode, s.step))
            probs.append(np.eye(len(CellType), dtype=np.float32)[drawn])
    write_step_maps(
        root / "false_belief" / "decoded_maps.h5",
        keys,
        np.stack(probs),
        classes=list(range(len(CellType))),
        stage="pre_reasoning",
        layer=LAYERS[-1],
        probe="stand-in: the shown grid",
    )


def shared_run(tmp_path_factory) -> Path:
    """The fixture run, built once per pytest session (both viewer test files share it)."""
    root = tmp_path_factory.getbasetemp() / "viewer-run"
    done = root / ".built"
    if not done.exists():
        if root.exists():
            import shutil

            shutil.rmtree(root)
        root.mkdir(parents=True)
        build_run(root)
        done.write_text("ok\n")
    return root


def offline_page(browser, width: int, height: int):
    """A page that aborts every non-``file:`` request and collects console errors.

    Returns:
        ``(page, requests, problems)``: the page, the URLs it tried to fetch off disk (all
        aborted), and its console errors and uncaught exceptions.
    """
    context = browser.new_context(viewport={"width": width, "height": height})
    requests: list[str] = []
    context.route(
        "**/*",
        lambda route: (
            (requests.append(route.request.url), route.abort())
            if not route.request.url.startswith("file:")
            else route.continue_()
        ),
    )
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    return page, requests, problems
